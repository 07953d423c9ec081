"""A compiled step over many batch sizes (GPU): graphs traced, failures, and host time.

    python benchmarks/probes/compiled_batches.py OUT_DIR [C4 R3 R1 ...]

For each config, its step on its first b requests (the same config, slices of its inputs) under
``torch.compile(fullgraph=True)`` without CUDA graphs: host us per call (``bench.host_time``) of
the graph traced for the whole batch (static shapes), then, after calls at smaller sizes (the
batch becomes a dynamic dimension), of the dynamic graph at the whole batch, beside the eager step;
over the sizes, how many graphs were traced, whether each size equals eager bit for bit, and the
first size that failed (torch.compile's recompile limit). Writes OUT_DIR/compiled_batches.json.

Two trees in turns (one process a run; host time drifts between processes, so alternate):

    for turn in 1 2 3; do for tree in old new; do
        PYTHONPATH=$PWD/$tree_dir:$PWD python benchmarks/probes/compiled_batches.py $OUT/$tree-$turn C4 R1
    done; done
    python benchmarks/probes/compiled_batches.py --summary old=$OUT/old-* new=$OUT/new-*

``--summary LABEL=DIR ...`` prints each timing's median per label and config (a label may repeat).
"""
import json
import pathlib
import statistics
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import native


TIMINGS = ("eager us", "compiled, static batch us", "compiled, dynamic batch us")


def summary(args):
    """Medians of each timing per label and config, and the graphs traced, from runs' JSON."""
    runs = {}
    for arg in args:
        label, _, folder = arg.partition("=")
        result = json.loads((pathlib.Path(folder) / "compiled_batches.json").read_text())
        for name, row in result["configs"].items():
            runs.setdefault((name, label), []).append(row)
    print("| config | tree | runs | graphs | first failure | " + " | ".join(TIMINGS) + " |")
    print("| --- | --- | ---: | --- | --- |" + " ---: |" * len(TIMINGS))
    for (name, label), rows in runs.items():
        medians = [statistics.median([r[t] for r in rows if t in r]) if any(t in r for r in rows) else None
                   for t in TIMINGS]
        print(f"| {name} | {label} | {len(rows)} | {sorted({r['graphs'] for r in rows})} | "
              f"{sorted({str(r['first failure']) for r in rows})} | "
              + " | ".join("-" if m is None else f"{m:.1f}" for m in medians) + " |")


def main():
    if sys.argv[1:2] == ["--summary"]:
        return summary(sys.argv[2:])
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    if native.enabled and native.wait() is None:
        print(f"native plans unavailable: {native.error()}", flush=True)
    result = {"env": bench.environment(), "configs": {}}
    for name in sys.argv[2:] or ["C4", "R3", "R1"]:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        full = seq_lens.shape[0]

        def step(seq_lens, table, q):
            view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
            return mla_dcp.verify(cfg, view, q, kv, scale)

        def args(b):
            return seq_lens[:b], table[:b], q[:b * cfg.qlen]

        row = {}
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(step, fullgraph=True)
        with torch.inference_mode():
            row["eager us"] = round(bench.host_time(lambda: step(*args(full))) * 1e6, 2)
            row["compiled, static batch us"] = round(bench.host_time(lambda: compiled(*args(full))) * 1e6, 2)
            sizes = [b for b in range(full - 1, 0, -1)][:14] + [full]
            equal, failed = [], None
            for b in sizes:
                try:
                    got = compiled(*args(b))
                except Exception as error:      # the recompile limit, under fullgraph=True
                    failed = f"batch {b}: {type(error).__name__}"
                    break
                want = step(*args(b))
                equal.append(bool(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])))
            row["sizes"] = sizes
            row["all equal to eager"] = all(equal)
            row["first failure"] = failed
            row["graphs"] = int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))
            if failed is None:
                row["compiled, dynamic batch us"] = round(bench.host_time(lambda: compiled(*args(full))) * 1e6, 2)
        print(name, row, flush=True)
        result["configs"][name] = row
    (out_dir / "compiled_batches.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
