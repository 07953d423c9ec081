"""Descriptor (TMA) attention kernel vs the pointer kernel, side by side.

    python scripts/tma_probe.py OUT_DIR [C1,C2,...] [round]

Per config: the tuned pointer plan, then TMA variants (stages, KV tile,
warp specialisation, 64-row tiles for the 32-row class). Each variant's
segment partials are checked against the pointer kernel's merged output;
times are the attention kernel alone under a CUDA graph (bench helpers).
Writes OUT_DIR/tma_probe.json after every variant.
"""
import dataclasses
import json
import pathlib
import sys
import time

import torch

from mla_dcp import bench
from mla_dcp.ops import library as ops
from mla_dcp.ops import tiles

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["C1", "C2", "C4", "C7", "C3", "C5"]
probe_round = sys.argv[3] if len(sys.argv) > 3 else "1"
result = {"env": bench.environment(), "ceilings": bench.measure_ceilings(), "rows": []}


def merged(case):
    fn = bench.attention_fns(case)[0]
    seg = fn()
    return ops.merge_segments(*seg, torch.bfloat16)[0].float()


def variants(tuned: tiles.AttentionPlan, key: str):
    yield "pointer(tuned)", tuned
    if probe_round == "2":
        yield from variants_round2(tuned)
        return
    if tuned.block_m == 64:
        base = dataclasses.replace(tuned, tma=True)
        yield "tma s2", dataclasses.replace(base, num_stages=2)
        yield "tma s3", dataclasses.replace(base, num_stages=3)
        yield "tma s2 ws", dataclasses.replace(base, num_stages=2, warp_specialize=True)
        yield "tma s3 ws", dataclasses.replace(base, num_stages=3, warp_specialize=True)
        yield "tma bn32 s3", dataclasses.replace(base, block_n=32, num_stages=3)
        yield "tma bn32 s4", dataclasses.replace(base, block_n=32, num_stages=4)
    else:
        base = dataclasses.replace(tuned, tma=True)
        yield "tma m32 bn32 s3", base
        yield "tma m32 bn64 s2", dataclasses.replace(base, block_n=64, num_stages=2, ctas_per_sm=2)
        yield "tma m64 bn64 s2 w8", tiles.AttentionPlan(64, 64, 8, 2, ctas_per_sm=1, token_ns=60.0, tma=True)
        yield "tma m64 bn64 s2 w4", tiles.AttentionPlan(64, 64, 4, 2, ctas_per_sm=1, token_ns=60.0, tma=True)
        yield "tma m64 ws", tiles.AttentionPlan(64, 64, 8, 2, ctas_per_sm=1, token_ns=60.0, tma=True,
                                                warp_specialize=True)


def variants_round2(tuned: tiles.AttentionPlan):
    """Second round: one stage with 128-token tiles (q + one 128x576 tile
    fit in shared memory), single-stage variants for fp8's spills, and
    the segment count of the latency case."""
    if tuned.block_m == 64:
        base = dataclasses.replace(tuned, tma=True)
        yield "tma s2", dataclasses.replace(base, num_stages=2)
        yield "tma bn128 s1", dataclasses.replace(base, block_n=128, num_stages=1)
        yield "tma s1", dataclasses.replace(base, num_stages=1)
        yield "pointer s1", dataclasses.replace(tuned, num_stages=1)
        yield "pointer bn128 s1", dataclasses.replace(tuned, block_n=128, num_stages=1)
    else:
        for fill in (0, 1, 2):
            yield f"pointer min_fill {fill}", dataclasses.replace(tuned, min_fill=fill)
        yield "pointer m32 bn64 s2", dataclasses.replace(tuned, block_n=64, num_stages=2)
        yield "pointer m32 bn32 s2", dataclasses.replace(tuned, num_stages=2)


def stage_times(case) -> dict:
    """Each launch of the step alone under a CUDA graph (the latency case)."""
    import mla_dcp

    seq_lens, table, q, kv, scale = case.inputs[0]
    cfg = case.cfg
    view = mla_dcp.build_view(cfg, seq_lens, table)
    ns = mla_dcp.num_segments_for(cfg, table.shape[0], q.device, q.dtype, kv.dtype)
    seg = ops.segmented_attention(q, kv, scale, view.row_lens, view.page_table, cfg.qlen, bench.DL, ns, cfg.scale)
    fns = {
        "row_lens": lambda: ops.row_lens(seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave),
        "expand_pages": lambda: ops.expand_pages(table, cfg.block_size, cfg.max_local_len),
        "merge_segments": lambda: ops.merge_segments(*seg, q.dtype),
        "empty_graph_copy_1elem": lambda: seq_lens[:1].clone(),
    }
    return {name: bench.time_fn(bench._graphed([fn])[0], rep_ms=40) * 1e6 for name, fn in fns.items()}


def latency_study(case) -> list:
    """C7: the whole step under a graph per segment count and merge split."""
    from mla_dcp.ops import launchers

    rows = []
    saved = launchers._MERGE_SPLIT_BLOCK_D, launchers._MERGE_SPLIT_WARPS
    base_cfg = case.cfg
    m = base_cfg.qlen * base_cfg.num_heads
    tuned = tiles.attention_plan(m, bench.DL, torch.bfloat16, torch.bfloat16, base_cfg.page_size,
                                 torch.device("cuda"))
    plans = {"tuned": tuned,
             "m16 bn32 s2": tiles.AttentionPlan(16, 32, 4, 2, ctas_per_sm=4, token_ns=131.4, min_fill=4),
             "m16 bn64 s1": tiles.AttentionPlan(16, 64, 4, 1, ctas_per_sm=4, token_ns=131.4, min_fill=4),
             "m32 bn64 s1": dataclasses.replace(tuned, block_n=64, num_stages=1)}
    for ns in (32, 64):
        for block_d, warps in ((64, 4), (64, 2), (32, 1), (128, 8)):
            for label, plan in plans.items():
                if label != "tuned" and (block_d, warps) != (64, 4):
                    continue
                launchers._MERGE_SPLIT_BLOCK_D, launchers._MERGE_SPLIT_WARPS = block_d, warps
                case.cfg = dataclasses.replace(base_cfg, num_segments=ns)
                with tiles.forced_plan(plan):
                    us = bench.time_fn(bench._rotating(bench._graphed(bench.step_fns(case))), rep_ms=60) * 1e6
                rows.append({"segments": ns, "merge_block_d": block_d, "merge_warps": warps, "plan": label,
                             "step_graph_us": us})
                print(json.dumps(rows[-1]), flush=True)
    launchers._MERGE_SPLIT_BLOCK_D, launchers._MERGE_SPLIT_WARPS = saved
    case.cfg = base_cfg
    return rows


for name in names:
    case = bench.make_case(name, torch.bfloat16)
    _, table, q, kv, _ = case.inputs[0]
    cfg = case.cfg
    m = cfg.qlen * cfg.num_heads
    tuned = tiles.attention_plan(m, bench.DL, q.dtype, kv.dtype, cfg.page_size, q.device)
    key = tiles.shape_class(m, bench.DL, q.dtype, kv.dtype, cfg.page_size)
    floor = max((case.kv_bytes + case.io_bytes) / result["ceilings"]["copy_bytes_per_s"],
                case.flops / result["ceilings"]["bf16_flops_per_s"])
    reference = None
    if probe_round == "3":
        result["c7_latency"] = latency_study(case)
        (out_dir / "tma_probe.json").write_text(json.dumps(result, indent=1))
        continue
    if probe_round == "2" and name == "C7":
        result["c7_stages_us"] = stage_times(case)
        print(json.dumps(result["c7_stages_us"]), flush=True)
    for label, plan in variants(tuned, key):
        row = {"config": name, "class": key, "variant": label, "plan": dataclasses.asdict(plan),
               "floor_us": floor * 1e6}
        started = time.time()
        try:
            with tiles.forced_plan(plan):
                got = merged(case)
                row["compiler"] = bench.compiler_report()
                row["segments"] = tiles.segment_choice(cfg.max_pages, table.shape[0], m, bench.DL, q.dtype,
                                                       kv.dtype, cfg.page_size, q.device)[0]
                row["attention_graph_us"] = bench.time_fn(bench._rotating(bench._graphed(bench.attention_fns(case))),
                                                          rep_ms=60) * 1e6
                row["step_graph_us"] = bench.time_fn(bench._rotating(bench._graphed(bench.step_fns(case))),
                                                     rep_ms=60) * 1e6
            row["step_over_floor"] = row["step_graph_us"] / row["floor_us"]
            if reference is None:
                reference = got
            err = (got - reference).abs().max().item()
            row["max_abs_diff_vs_pointer"] = err
            row["ref_max_abs"] = reference.abs().max().item()
            row["nan"] = bool(got.isnan().any())
        except Exception as failure:
            row["error"] = f"{type(failure).__name__}: {str(failure)[:400]}"
        row["wall_s"] = time.time() - started
        result["rows"].append(row)
        print(json.dumps({k: row.get(k) for k in ("config", "variant", "attention_graph_us", "step_graph_us",
                                                   "step_over_floor", "max_abs_diff_vs_pointer", "error", "wall_s")}),
              flush=True)
        (out_dir / "tma_probe.json").write_text(json.dumps(result, indent=1))
    del case
    torch.cuda.empty_cache()
