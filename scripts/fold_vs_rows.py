"""The attention kernel alone, folded (one tile serves all verify rows of a
request) vs decode-style (one row per verify token, block table repeated per
row), timed in turns under CUDA graphs in one process, plus the merge of each.

    python scripts/fold_vs_rows.py OUT_DIR [C1,C3,C5]

The benchmark's decode-style step (attention + merge) came out 3-8% below
the folded step at H >= 64 (run ze); this separates the attention kernel
from the merge and repeats each timing three times in alternation, so that
drift between measurements shows. Writes OUT_DIR/fold_vs_rows.json.
"""
import dataclasses
import json
import pathlib
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import library as ops

out_dir = pathlib.Path(sys.argv[1])
out_dir.mkdir(parents=True, exist_ok=True)
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["C1", "C3", "C5"]
result = {"env": bench.environment(), "rows": []}


def attention_and_merge(case, decode_style: bool):
    """Per input: (attention alone, attention + merge) closures."""
    cfg, pairs = case.cfg, []
    for seq_lens, table, q, kv, scale in case.inputs:
        view = mla_dcp.build_view(cfg, seq_lens, table)
        pages, run_cfg = view.page_table, cfg
        if decode_style:   # as bench.decode_style_fns
            pages, run_cfg = pages.repeat_interleave(cfg.qlen, dim=0), dataclasses.replace(cfg, qlen=1)
        ns = mla_dcp.num_segments_for(run_cfg, pages.shape[0], q.device, q.dtype, kv.dtype)
        qlen = run_cfg.qlen

        def attn(view=view, pages=pages, q=q, kv=kv, scale=scale, ns=ns, qlen=qlen):
            return ops.segmented_attention(q, kv, scale, view.row_lens, pages, qlen, cfg.kv_lora_rank, ns, cfg.scale)

        def both(attn=attn, q=q):
            return ops.merge_segments(*attn(), q.dtype)
        pairs.append((attn, both, ns))
    return pairs


for name in names:
    case = bench.make_case(name, torch.bfloat16)
    row = {"config": name}
    kinds = {"folded": attention_and_merge(case, False), "decode-style": attention_and_merge(case, True)}
    row["segments"] = {k: v[0][2] for k, v in kinds.items()}
    graphs = {(k, part): bench._rotating(bench._graphed([p[i] for p in v]))
              for k, v in kinds.items() for i, part in ((0, "attn"), (1, "attn+merge"))}
    for turn in range(3):
        for key, fn in graphs.items():
            t = bench.time_fn(fn) * 1e6
            row.setdefault(f"{key[0]} {key[1]}", []).append(t)
            print(f"{name} turn {turn} {key[0]:>12} {key[1]:>10}: {t:.1f} us", flush=True)
    result["rows"].append(row)
    (out_dir / "fold_vs_rows.json").write_text(json.dumps(result, indent=1))
