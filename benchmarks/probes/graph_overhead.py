"""What a one-step CUDA graph's time holds besides its kernels.

    python benchmarks/probes/graph_overhead.py OUT_DIR [C4,C7,C1]

The benchmark times each graph replay with triton's do_bench, which zeroes a
256 MiB buffer (its L2 flush) before every replay. On C4 that replay takes
~9 us more than the per-step time of eight steps in one graph, and the
narrow kernel's own span (first program's entry to last program's end, run
zv's timeline) is 80.6 us against 89.7 for the graphed kernel alone. This
times the step and the attention kernel alone, each replayed from its graph,
in one loop per variant of what runs between replays:

* ``do_bench``: the benchmark's own timing, for reference;
* ``flush``: the same flush, then the replay (should equal ``do_bench``);
* ``flush_gemm``: the flush, then a bf16 matmul (as an engine's projections
  run before attention: cuBLAS kernels leave the multiprocessors configured
  for large shared memory, the flush kernel does not), then the replay;
* ``flush_read``: a flush that reads 256 MiB instead of writing it, so
  that L2 holds no dirty lines for the replay to write back (do_bench's
  zeroing leaves up to L2's size of them);
* ``no_flush``: replays back to back (inputs still rotate through more than
  L2, so KV comes from DRAM either way);
* ``x8_per_step`` (steps only): the benchmark's eight steps in one graph.

The events bracket the replay alone in every variant. Writes
OUT_DIR/graph_overhead.json and prints one line per config and variant.
"""
import json
import pathlib
import statistics
import sys

import torch

from mla_dcp import bench

REPS = 300


def _timed(fn, before, flush: torch.Tensor | None) -> float:
    """Median seconds of ``fn`` between two events; the flush (zeroing ``flush``) and ``before``
    run ahead of the first event."""
    for _ in range(10):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(REPS)]
    for start, end in zip(starts, ends):
        if flush is not None:
            flush.zero_()
        before()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)) * 1e-3


def main(argv):
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    out = pathlib.Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    names = (argv[1] if len(argv) > 1 else "C4,C7,C1").split(",")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    variants = {"flush": (lambda: None, flush), "flush_gemm": (lambda: torch.mm(a, b), flush),
                "flush_read": (lambda: torch.amax(flush, dim=0), None),
                "no_flush": (lambda: None, None)}
    result = {}
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        for kind, fns in (("step", bench.step_fns(case)), ("attention", bench.attention_fns(case))):
            replay = bench._rotating(bench._graphed(fns))
            row = {"do_bench": bench.time_fn(replay) * 1e6}
            for variant, (before, flushed) in variants.items():
                row[variant] = _timed(replay, before, flushed) * 1e6
            if kind == "step":   # the benchmark's "graph x8" column: eight steps in one graph, per step
                sequence = bench._graphed_sequence(fns, bench.STEPS_PER_GRAPH)
                row["x8_per_step"] = bench.time_fn(sequence) / bench.STEPS_PER_GRAPH * 1e6
            result[f"{name} {kind}"] = row
            print(f"{name} {kind}: " + ", ".join(f"{k} {v:.1f} us" for k, v in row.items()), flush=True)
        (out / "graph_overhead.json").write_text(json.dumps(result, indent=1))
        del case


if __name__ == "__main__":
    main(sys.argv[1:])
