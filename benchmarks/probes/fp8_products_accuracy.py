"""Accuracy of VerifyConfig(fp8_products=True) against float64, beside the exact mode.

    python benchmarks/probes/fp8_products_accuracy.py OUT_DIR [C2,R5,C3f8,C5f8]

On a GPU: each e4m3 benchmark config's first input (one DCP rank's step, as
``python -m mla_dcp.bench`` times it), verified in the exact mode and with
``fp8_products``, and the pure path's model of the mode on the same inputs;
each against float64 attention over the same dequantised cache (the cache's
own rounding is not counted). Prints and writes OUT_DIR/fp8_products_accuracy.json:
per config and mode, out's relative L2 error, its max error over the largest
|out|, and the largest LSE error; and the kernel's distance from the model.
"""
import dataclasses
import json
import pathlib
import sys

import torch

import mla_dcp
from mla_dcp import bench, pure


def reference(cfg, view, q, kv, kv_scale):
    """float64 attention of every row over its rank-local keys (view.row_lens), per request."""
    page = pure.page_size_for(kv.shape[1])
    pages = kv.reshape(-1, page, kv.shape[-1])
    batch = view.page_table.shape[0]
    out = torch.empty(q.shape[0], q.shape[1], cfg.kv_lora_rank, dtype=torch.float64, device=q.device)
    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float64, device=q.device)
    row_lens = view.row_lens.tolist()
    for b in range(batch):
        rows = slice(b * cfg.qlen, (b + 1) * cfg.qlen)
        longest = max(row_lens[rows])
        ids = view.page_table[b, :-(-longest // page)].long()
        keys = pages[ids].reshape(-1, kv.shape[-1])[:longest].double() * float(kv_scale)
        scores = torch.einsum("thd,nd->thn", q[rows].double(), keys) * cfg.softmax_scale
        lens = torch.tensor(row_lens[rows], device=q.device)
        scores = scores.masked_fill(torch.arange(longest, device=q.device)[None, None, :] >= lens[:, None, None],
                                    float("-inf"))
        lse[rows] = torch.logsumexp(scores, dim=-1)
        out[rows] = torch.einsum("thn,nd->thd", torch.softmax(scores, dim=-1), keys[:, :cfg.kv_lora_rank])
    return out, lse


def errors(out, lse, ref_out, ref_lse):
    d = out.double() - ref_out
    return {"out_rel_l2": (d.norm() / ref_out.norm()).item(),
            "out_max_rel": (d.abs().max() / ref_out.abs().max()).item(),
            "lse_max_abs": (lse.double() - ref_lse).abs().max().item()}


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (sys.argv[2] if len(sys.argv) > 2 else "C2,R5,C3f8,C5f8").split(",")
    result = {"env": bench.environment(), "configs": {}}
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        seq_lens, table, q, kv, kv_scale = case.inputs[0]
        report = {}
        for mode in (False, True):
            cfg = dataclasses.replace(case.cfg, fp8_products=mode)
            view = mla_dcp.build_view(cfg, seq_lens, table)
            if not report:
                ref_out, ref_lse = reference(cfg, view, q, kv, kv_scale)
            out, lse = mla_dcp.verify(cfg, view, q, kv, kv_scale)
            report["fp8_products" if mode else "exact"] = errors(out, lse, ref_out, ref_lse)
            if mode:
                model = pure.merge_segments(*pure.segmented_attention(
                    q, kv, view.row_lens, view.page_table, view.work, qlen=cfg.qlen, kv_lora_rank=cfg.kv_lora_rank,
                    softmax_scale=cfg.scale, kv_scale=kv_scale, fp8_products=True), view.segments, q.dtype)
                report["fp8_products_model"] = errors(*model, ref_out, ref_lse)
                report["kernel_vs_model_out_rel_l2"] = ((out.double() - model[0].double()).norm()
                                                        / model[0].double().norm()).item()
        result["configs"][name] = report
        print(name, json.dumps(report), flush=True)
        del case
        torch.cuda.empty_cache()
        (out_dir / "fp8_products_accuracy.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
