"""Host time per verify step: eager, and compiled without CUDA graphs.

    python benchmarks/probes/host_time.py OUT_DIR [C7 C4 ...] [--profile]

Each figure is the wall time per call of 1,000 back-to-back calls with no
synchronisation between them (``bench.host_time``, the bench's `host` column) (the GPU work of C7 is ~14 us, so the host is
what is timed there). `--profile` adds a cProfile of each path by function.
Writes OUT_DIR/host_time.json (and profile_*.txt).
"""
import json
import pathlib
import sys

import torch

import _ab
from mla_dcp import bench
from mla_dcp.ops import native

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
names = [a for a in sys.argv[2:] if not a.startswith("--")] or ["C7"]
profile = "--profile" in sys.argv


def profiled(label, fn):
    (out_dir / f"profile_{label}.txt").write_text(_ab.profile_text(fn))


if native.enabled and native.wait() is None:     # built before anything is timed
    print(f"native plans unavailable: {native.error()}", flush=True)
result = {"env": bench.environment(), "us_per_call": {}}
for name in names:
    # Each config's steps share one code object: without a reset the second config would time a
    # graph traced with a dynamic batch (compiled_batches.py times that one on purpose).
    torch._dynamo.reset()
    step, pieces, compiled, case = _ab.step_pieces(name)   # build_view + verify, and its parts
    seq_lens = case.inputs[0][0]
    pieces["compiled step (no CUDA graph)"] = compiled
    rows = {}
    for label, fn in pieces.items():
        with torch.inference_mode():
            rows[label] = round(bench.host_time(fn) * 1e6, 2)
        print(f"{name} {label:32s} {rows[label]:8.2f} us", flush=True)
    # Lengths change: the compiled step must not recompile.
    torch._dynamo.utils.counters.clear()
    seq_lens.sub_(1)
    with torch.inference_mode():
        compiled()
    seq_lens.add_(1)
    rows["recompiles when lengths change"] = int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))
    result["us_per_call"][name] = rows
    if profile:
        with torch.inference_mode():
            profiled(f"{name}_eager", step)
            profiled(f"{name}_compiled", compiled)
(out_dir / "host_time.json").write_text(json.dumps(result, indent=1))
