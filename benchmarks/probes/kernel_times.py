"""Each kernel's own GPU time in one verify step, per config.

    python benchmarks/probes/kernel_times.py OUT_DIR [C1,C4,C7,R1,R4]

The eager step (``bench.step_fns``: build_view + verify, the kernels a graph
of it replays) runs 20 times after a warm-up under ``torch.profiler``; each
kernel's mean device duration is printed per step, beside the step's summed
kernel time. Programmatic dependent launch is off here (``MLA_DCP_PDL=0``
unless set): with it a kernel starts before the one it follows ends and
waits inside, so its span would hold that wait (measured: C1's merge 138 us
with it, against its own ~20). This is what the issue-level target "the schedule's own kernel
<= 3 us" is read from (the bench's ``view`` column times the metadata
launches under a CUDA graph, the graph's launch included). Writes
OUT_DIR/kernel_times.json.
"""
import collections
import json
import os
import pathlib
import sys

os.environ.setdefault("MLA_DCP_PDL", "0")   # read at the device's first launch

import torch

from mla_dcp import bench

STEPS = 20


def kernel_times(fn) -> dict[str, float]:
    """Mean device us per step of each kernel ``fn`` launches."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            fn()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for row in prof.key_averages():
        if row.device_type == torch.autograd.DeviceType.CUDA:   # a kernel (or a device copy)
            us = getattr(row, "self_device_time_total", None)
            totals[row.key] += getattr(row, "self_cuda_time_total", 0.0) if us is None else us
    return {name: us / STEPS for name, us in sorted(totals.items(), key=lambda kv: -kv[1])}

def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (sys.argv[2] if len(sys.argv) > 2 else "C1,C4,C7,R1,R4").split(",")
    result = {"env": bench.environment(), "steps": STEPS, "us_per_step": {}}
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        with torch.inference_mode():
            times = kernel_times(bench.step_fns(case)[0])
        result["us_per_step"][name] = times
        parts = ", ".join(f"{kernel} {us:.1f}" for kernel, us in times.items())
        print(f"{name}: kernels {sum(times.values()):.1f} us ({parts})", flush=True)
        (out_dir / "kernel_times.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
