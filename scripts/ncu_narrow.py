"""A few launches of the narrow Gluon kernel on one benchmark config, for Nsight Compute:

    ncu -k regex:narrow --launch-skip 2 -c 1 --set full -o REPORT python3 scripts/ncu_narrow.py C2 [ns]

(C2: e4m3 cache, 32-row tiles; C4: bf16.)"""
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp._shapes import page_size_for
from mla_dcp.ops import narrow

name = sys.argv[1]
ns = int(sys.argv[2]) if len(sys.argv) > 2 else 2
case = bench.make_case(name, torch.bfloat16)
cfg = case.cfg
seq_lens, table, q, kv, scale = case.inputs[0]
view = mla_dcp.build_view(cfg, seq_lens, table)
rows, heads, _ = q.shape
outs = (torch.empty(rows, heads, ns, cfg.kv_lora_rank, device="cuda"), torch.empty(rows, heads, ns, device="cuda"),
        torch.empty(rows, heads, ns, device="cuda"))
for _ in range(4):
    narrow.launch(q, kv, scale, view.row_lens, view.page_table, cfg.qlen, cfg.kv_lora_rank, ns, cfg.scale, outs,
                  False, page_size_for(kv.shape[1]), 32)
torch.cuda.synchronize()
