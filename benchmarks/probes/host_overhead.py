"""Host time per call of each piece of an eager C7 step (no profiler), and of
the attention launcher on each kernel family (Triton, Gluon narrow, Gluon
seesaw on a 64-row shape) with the plan forced.

    python benchmarks/probes/host_overhead.py OUT_DIR

Loops of 2000 calls; the GPU work of each piece is a few us, so the host is
what is timed. Writes OUT_DIR/host_overhead.json.
"""
import json
import pathlib
import sys
import time

import torch
import triton

import mla_dcp
from mla_dcp import bench
from mla_dcp.api import _validate_verify
from mla_dcp.ops import launchers
from mla_dcp.ops.triton_kernels import kernels
from mla_dcp.ops import library as ops
from mla_dcp.ops import tiles
from mla_dcp.ops.gluon_kernels import helpers as gluon_helpers

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
case = bench.make_case("C7", torch.bfloat16)
seq_lens, table, q, kv, scale = case.inputs[0]
cfg = case.cfg
view = mla_dcp.build_view(cfg, seq_lens, table)
seg = ops.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, bench.DL, cfg.scale)
rows_out = torch.empty(2, dtype=torch.int32, device="cuda")


def per_call_us(fn, n=2000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / n * 1e6


pieces = {
    "whole eager step": lambda: mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table), q, kv, scale),
    "build_view": lambda: mla_dcp.build_view(cfg, seq_lens, table),
    "verify": lambda: mla_dcp.verify(cfg, view, q, kv, scale),
    "op row_lens": lambda: ops.row_lens(seq_lens, cfg.qlen, 8, 0, 1),
    "launcher row_lens": lambda: launchers.row_lens(seq_lens, cfg.qlen, 8, 0, 1),
    "bare row_lens_kernel launch": lambda: kernels.row_lens_kernel[(1,)](seq_lens, rows_out, 2, QLEN=2, WORLD=8,
                                                                       RANK=0, INTERLEAVE=1, BLOCK=256, PDL=False),
    "op schedule": lambda: ops.schedule(view.row_lens, cfg.qlen, cfg.page_size, cfg.max_pages, view.work.shape[0]),
    "op segmented_attention": lambda: ops.segmented_attention(q, kv, scale, view.row_lens, view.page_table,
                                                              view.work, cfg.qlen, bench.DL, cfg.scale),
    "launcher segmented_attention": lambda: launchers.segmented_attention(q, kv, scale, view.row_lens,
                                                                          view.page_table, view.work, cfg.qlen,
                                                                          bench.DL, cfg.scale),
    "op merge_segments": lambda: ops.merge_segments(*seg, view.segments, q.dtype),
    "launcher merge_segments": lambda: launchers.merge_segments(*seg, view.segments, q.dtype),
    "validate_verify": lambda: _validate_verify(cfg, view, q, kv, scale),
    "num_segments_for": lambda: mla_dcp.num_segments_for(cfg, 1, q.device, q.dtype, kv.dtype),
    "attention_plan": lambda: tiles.attention_plan(32, 512, q.dtype, kv.dtype, 64, q.device, 1),
    "torch.empty x3": lambda: (torch.empty(32, 64, 512, device="cuda"), torch.empty(32, 64, device="cuda"),
                               torch.empty(32, 64, device="cuda")),
    "get_device_capability": lambda: torch.cuda.get_device_capability(q.device),
}


def forced(plan, q_=q):
    def call():
        with tiles.forced_plan(plan):
            launchers.segmented_attention(q_, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen,
                                          bench.DL, cfg.scale)
    return call


# A 64-row shape on the same cache: 2 verify rows x 32 heads.
q64 = torch.randn(q.shape[0], 32, q.shape[2], device="cuda").to(q.dtype)
pieces.update({
    "launcher attention, Triton m16 (forced)": forced(tiles.AttentionPlan(16, 64, 4, 2)),
    "launcher attention, Gluon narrow16 (forced)": forced(tiles.AttentionPlan(16, 64, 4, 2, narrow=True)),
    "launcher attention, Triton tma m64 (forced)": forced(tiles.AttentionPlan(64, 64, 8, 2, tma=True), q64),
    "launcher attention, Gluon seesaw m64 (forced)": forced(tiles.AttentionPlan(64, 64, 8, 2, seesaw=True), q64),
    "gluon helpers.descriptors": lambda: gluon_helpers.descriptors(kv, bench.DL, 64),
})
result = {"env": bench.environment(), "us_per_call": {}}
for label, fn in pieces.items():
    result["us_per_call"][label] = round(per_call_us(fn), 2)
    print(f"{label:32s} {result['us_per_call'][label]:8.2f} us", flush=True)
(out_dir / "host_overhead.json").write_text(json.dumps(result, indent=1))
