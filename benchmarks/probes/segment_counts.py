"""The graphed step at segment counts other than the schedule's own choice.

    python benchmarks/probes/segment_counts.py "R1:8/16/33,R4:8/16,C1:3" OUT.json

Per ``NAME:K1/K2/...``: the benchmark's config with its automatic segment
count (``auto``), then with ``VerifyConfig.num_segments`` fixed at each ``K``
(``B * K`` items), each graphed step timed twice in a row (the two readings
show the drift under the power cap). Prints one line per count and writes
OUT.json: ``{"NAME:K": [us, us]}``.
"""
import dataclasses
import json
import sys

import torch

from mla_dcp import bench


def main(specs: str, out_path: str) -> None:
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    out = {}
    for spec in specs.split(","):
        name, counts = spec.split(":")
        base = bench.make_case(name, torch.bfloat16)
        for k in ["auto"] + counts.split("/"):
            case = base if k == "auto" else dataclasses.replace(
                base, cfg=dataclasses.replace(base.cfg, num_segments=int(k)))
            steps = bench.step_fns(case)
            replay = bench._rotating(bench._graphed(steps))
            times = [bench.time_fn(replay) * 1e6 for _ in range(2)]
            out[f"{name}:{k}"] = times
            print(name, k, *(f"{t:.1f}" for t in times), flush=True)
        del base
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
