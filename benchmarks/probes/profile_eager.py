"""Host time of one eager verify step (build_view + verify), by function.

    python benchmarks/probes/profile_eager.py OUT_DIR [C7]

The GPU work of C7 is ~15 us; an eager step took ~540 us in the benchmark,
so the rest is host work: this shows where.
"""
import cProfile
import io
import pathlib
import pstats
import sys
import time

import torch

from mla_dcp import bench

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
name = sys.argv[2] if len(sys.argv) > 2 else "C7"
case = bench.make_case(name, torch.bfloat16)
step = bench.step_fns(case)[0]
for _ in range(50):
    step()
torch.cuda.synchronize()
started = time.perf_counter()
for _ in range(300):
    step()
torch.cuda.synchronize()
per_step_us = (time.perf_counter() - started) / 300 * 1e6
profiler = cProfile.Profile()
profiler.enable()
for _ in range(300):
    step()
torch.cuda.synchronize()
profiler.disable()
text = io.StringIO()
stats = pstats.Stats(profiler, stream=text)
stats.sort_stats("tottime").print_stats(30)
stats.sort_stats("cumulative").print_stats(40)
report = f"{name}: eager step {per_step_us:.1f} us (host-bound loop of 300)\n" + text.getvalue()
(out_dir / f"profile_{name}.txt").write_text(report)
print(report[:6000])
