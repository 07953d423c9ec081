"""Host time per eager step with the API's step plans against without them, in turns.

    python benchmarks/probes/step_plans_ab.py OUT_DIR [C7 C4 R1 ...] [--turns N]

"without": ``api._planned`` returns False, so every call takes the full path
(validation, choices, the launchers' own plans); "with": a repeated layout
launches from its build_view and verify plans. Each figure is
``bench.host_time`` (1,000 back-to-back calls, no synchronisation), the
median over N turns (default 6; the modes take turns going first) of the
eager step, build_view and verify; also the step compiled with torch.compile (no CUDA graph), which the
plans do not touch (a control), and a bitwise check of both paths' outputs.
Writes OUT_DIR/step_plans_ab.json.
"""
import json
import pathlib
import statistics
import sys

import torch

import mla_dcp
from mla_dcp import api, bench


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    args = sys.argv[2:]
    turns = 6
    if "--turns" in args:
        at = args.index("--turns")
        turns = int(args[at + 1])
        del args[at:at + 2]
    names = args or ["C7", "C4", "R1"]
    planned = api._planned
    result = {"env": bench.environment(), "turns": turns, "us_per_call": {}, "bitwise_equal": {}}
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        step = bench.step_fns(case)[0]
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        pieces = {
            "eager step": step,
            "build_view": lambda: mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype),
            "verify": lambda: mla_dcp.verify(cfg, view, q, kv, scale),
        }
        compiled = torch.compile(step, fullgraph=True)
        times = {f"{label} {mode}": [] for label in (*pieces, "compiled step") for mode in ("without", "with")}
        outputs = {}
        with torch.inference_mode():
            for turn in range(turns):
                # ABBA: each mode goes first in every other turn, so neither
                # gains from running second (warm caches, clocks).
                for mode in (("without", "with") if turn % 2 == 0 else ("with", "without")):
                    api._planned = planned if mode == "with" else (lambda tensor, check: False)
                    try:
                        outputs[mode] = step()
                        for label, fn in pieces.items():
                            times[f"{label} {mode}"].append(bench.host_time(fn) * 1e6)
                        times[f"compiled step {mode}"].append(bench.host_time(compiled) * 1e6)
                    finally:
                        api._planned = planned
        rows = {label: round(statistics.median(values), 2) for label, values in times.items()}
        result["us_per_call"][name] = rows
        result["bitwise_equal"][name] = all(torch.equal(a, b) for a, b in zip(outputs["with"], outputs["without"]))
        for label, value in rows.items():
            print(f"{name} {label:28s} {value:8.2f} us", flush=True)
        print(f"{name} bitwise equal: {result['bitwise_equal'][name]}", flush=True)
    (out_dir / "step_plans_ab.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
