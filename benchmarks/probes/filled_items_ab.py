"""The graphed step with one-piece-a-program schedules filling their last round of programs
(``tiles.filled_items``) against the static item count alone, in turns, in one process.

    python benchmarks/probes/filled_items_ab.py OUT_DIR [R4,R4u,R2,C1,C3] [--turns N]

Per config and turn, each mode's graphed step (the benchmark's inputs, rotating copies), with the
copy and matmul ceilings measured in the same run; prints each mode's work items and writes
OUT_DIR/filled_items_ab.json.
"""
import json
import pathlib
import statistics
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import tiles

FILLED = tiles.filled_items


def static(items, batch, plan, m_size, device):
    return items


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    turns = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--turns=")), 3))
    out_dir = pathlib.Path(args[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (args[1] if len(args) > 1 else "R4,R4u,R2,C1,C3").split(",")
    result = {"env": bench.environment(), "ceilings": bench.measure_ceilings(), "configs": {}}
    for name in names:
        cases = {mode: bench.make_case(name, torch.bfloat16) for mode in ("static", "filled")}
        replays, items = {}, {}
        for mode, case in cases.items():
            tiles.filled_items = static if mode == "static" else FILLED
            seq_lens, table, q, kv, _ = case.inputs[0]
            items[mode] = mla_dcp.build_view(case.cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype).work.shape[0]
            replays[mode] = bench._rotating(bench._graphed(bench.step_fns(case)))
        times = {mode: [] for mode in cases}
        for turn in range(turns):
            for mode in (cases if turn % 2 == 0 else reversed(list(cases))):
                tiles.filled_items = static if mode == "static" else FILLED
                times[mode].append(bench.time_fn(replays[mode]) * 1e6)
        tiles.filled_items = FILLED
        medians = {mode: statistics.median(t) for mode, t in times.items()}
        result["configs"][name] = {"items": items, "graph_us": times, "median_us": medians}
        print(name, "items", items, {m: round(v, 1) for m, v in medians.items()},
              f"filled/static {medians['filled'] / medians['static']:.3f}", flush=True)
        (out_dir / "filled_items_ab.json").write_text(json.dumps(result, indent=1))
        del cases, replays


if __name__ == "__main__":
    main()
