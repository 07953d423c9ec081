"""Host time per step with stages 3 and 4 as one op (``verify`` today) against
the same step calling the two ops (attention, then the segment merge), eager
and compiled without CUDA graphs, in alternating turns in one process.

    python benchmarks/probes/merged_op_ab.py OUT_DIR [C4 R1 R3 ...]

Each figure: ``bench.host_time`` (1,000 back-to-back calls, no sync), the
median over 5 turns. Also checks that both steps give the same bits.
Writes OUT_DIR/merged_op_ab.json.
"""
import json
import pathlib
import statistics
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import library as ops

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
names = sys.argv[2:] or ["C4", "R1", "R3"]
result = {"env": bench.environment(), "us_per_call": {}}
for name in names:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[0]

    merged = bench.step_fns(case)[0]   # build_view + verify on these inputs

    def two_ops():
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        seg = ops.stage.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen,
                                            cfg.kv_lora_rank, cfg.scale, cfg.schedule_chunk, cfg.fp8_products)
        return ops.stage.merge_segments(*seg, view.segments, q.dtype, cfg.batch_invariant)

    fns = {"merged eager": merged, "two ops eager": two_ops,
           "merged compiled": torch.compile(merged, fullgraph=True),
           "two ops compiled": torch.compile(two_ops, fullgraph=True)}
    with torch.inference_mode():
        outs = {label: fn() for label, fn in fns.items()}
        same = all(torch.equal(o[0], outs["two ops eager"][0]) and torch.equal(o[1], outs["two ops eager"][1])
                   for o in outs.values())
        times = {label: [] for label in fns}
        for _ in range(5):
            for label, fn in fns.items():
                times[label].append(bench.host_time(fn) * 1e6)
    rows = {label: round(statistics.median(v), 2) for label, v in times.items()}
    rows["all turns"] = {label: [round(x, 1) for x in v] for label, v in times.items()}
    rows["same bits"] = same
    for label in fns:
        print(f"{name} {label:20s} {rows[label]:8.2f} us  turns {rows['all turns'][label]}", flush=True)
    print(f"{name} same bits: {same}", flush=True)
    result["us_per_call"][name] = rows
(out_dir / "merged_op_ab.json").write_text(json.dumps(result, indent=1))
