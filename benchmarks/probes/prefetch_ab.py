"""L2 prefetches ahead of the Gluon kernels' tile copies, in turns with none.

    python benchmarks/probes/prefetch_ab.py OUT_DIR [R1,R1u,R4,C4] [--settings 0:0,1:1,2:2] [--turns 4]

A setting ``S:N`` launches the seesaw kernel with ``PREFETCH = S`` (pairs
ahead) and the narrow one with ``PREFETCH = N`` (tiles past those in
flight); ``0:0`` is no prefetch. Per config, each setting's graphed step
(build_view + verify, rotating input copies as the bench does) is timed in
turns, beside the ceilings measured first; its outputs must be bitwise those
of the first setting (a prefetch moves no value). The launch plans are off
here (``MLA_DCP_FAST_LAUNCH=0``, ``MLA_DCP_NATIVE=0``): a plan would repeat
the setting it recorded. Writes OUT_DIR/prefetch_ab.json as it goes.
"""
import json
import os
import pathlib
import statistics
import sys

os.environ.setdefault("MLA_DCP_FAST_LAUNCH", "0")
os.environ.setdefault("MLA_DCP_NATIVE", "0")

import torch

from mla_dcp import bench
from mla_dcp.ops.gluon_kernels import narrow, seesaw


def use(setting: str) -> None:
    pairs, tiles = (int(v) for v in setting.split(":"))
    seesaw.PREFETCH_PAIRS, narrow.PREFETCH_TILES = pairs, tiles


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    options = {"--settings": "0:0,1:1,2:2", "--turns": "4"}
    for flag in list(options):
        if flag in args:
            at = args.index(flag)
            options[flag] = args[at + 1]
            del args[at:at + 2]
    names = (args[0] if args else "R1,R1u,R4,C4").split(",")
    settings = options["--settings"].split(",")
    turns = int(options["--turns"])
    result = {"env": bench.environment(), "ceilings": bench.measure_ceilings(), "settings": settings,
              "us": {}, "bitwise_equal": {}}
    ceil = result["ceilings"]
    print(f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, matmul {ceil['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s",
          flush=True)
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        floor = max(case.kv_bytes / ceil["copy_bytes_per_s"], case.flops / ceil["bf16_flops_per_s"]) * 1e6
        fns = bench.step_fns(case)
        replays, first, equal = {}, None, True
        with torch.inference_mode():
            for setting in settings:
                use(setting)
                out, lse = fns[0]()
                torch.cuda.synchronize()
                if first is None:
                    first = (out.clone(), lse.clone())
                else:
                    equal = equal and torch.equal(out, first[0]) and torch.equal(lse, first[1])
                replays[setting] = bench._rotating(bench._graphed(fns))
            times = {setting: [] for setting in settings}
            for turn in range(turns):
                order = settings[turn % len(settings):] + settings[:turn % len(settings)]
                for setting in order:
                    times[setting].append(bench.time_fn(replays[setting]) * 1e6)
        row = {setting: round(statistics.median(values), 2) for setting, values in times.items()}
        result["us"][name] = {"floor": round(floor, 2), **row}
        result["bitwise_equal"][name] = equal
        base = row[settings[0]]
        print(f"{name} floor {floor:.1f} us, bitwise equal {equal}: "
              + ", ".join(f"{s} {us:.1f} ({us / base:.3f}x)" for s, us in row.items()), flush=True)
        (out_dir / "prefetch_ab.json").write_text(json.dumps(result, indent=1))
        del replays, fns, case
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
