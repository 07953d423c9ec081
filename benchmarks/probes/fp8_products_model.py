"""Accuracy of multiplying in e4m3 (an fp8-products mode), modelled on the CPU.

    python benchmarks/probes/fp8_products_model.py OUT_DIR [--tokens 4096] [--heads 16,128]

Models the roundings such a kernel would apply, against float64 attention over
the same dequantised e4m3 cache (what the exact mode computes): the latent part
of q quantised to e4m3 with a scale per tensor, per row or per (row, head)
(amax / 448), the rope part kept in bf16; P = exp(s - max) quantised to e4m3
after scaling by 1, 256 or 448 (a power of two keeps the rescale exact); the
normaliser the sum of P in float32 or of the quantised P; or P as two e4m3
terms (``split``: two fp8 products for P.V), or P.V in bf16 (``bf16``: only
q.K in e4m3); and q as two e4m3 terms too. Writes a table of
out's relative L2 and max error and lse's max error per choice, the numbers a
kernel's design picks its granularity from. The softmax max is the row's final
one (a kernel's running max rescales P by powers between tiles; its roundings
are of the same size).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to e4m3 (saturating at +-448) and back, in float64."""
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).to(torch.float64)


def quantise_q(q_lat: torch.Tensor, granularity: str, terms: int = 1) -> torch.Tensor:
    """q_lat [T, H, Dl] float64 -> its e4m3 rounding times its scale (``terms``
    2: plus the rounding of the remainder, at its own scale: two fp8 products)."""
    dims = {"tensor": (0, 1, 2), "row": (1, 2), "row_head": (2,)}[granularity]
    scale = q_lat.abs().amax(dim=dims, keepdim=True).clamp_min(1e-30) / E4M3_MAX
    hi = e4m3(q_lat / scale) * scale
    if terms == 1:
        return hi
    rest = q_lat - hi
    rest_scale = rest.abs().amax(dim=dims, keepdim=True).clamp_min(1e-30) / E4M3_MAX
    return hi + e4m3(rest / rest_scale) * rest_scale


def attention(q_lat, q_rope, k_lat, k_rope, v, softmax_scale, p_scale=None, p_sum="float32"):
    """Rows [T, H] over keys [N]; out [T, H, Dl], lse [T, H] (natural log)."""
    s = (torch.einsum("thd,nd->thn", q_lat, k_lat) + torch.einsum("thd,nd->thn", q_rope, k_rope)) * softmax_scale
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - m)
    if p_scale is None:
        weights, denom = p, p.sum(-1, keepdim=True)
    elif p_sum == "split":
        # P as two e4m3 terms (hi + the e4m3 rounding of the rest): two fp8 products for P.V.
        hi = e4m3(p * p_scale)
        weights = (hi + e4m3(p * p_scale - hi)) / p_scale
        denom = p.float().sum(-1, keepdim=True).double()
    elif p_sum == "bf16":
        # P.V at the 16-bit rate (only q.K in e4m3); and q as two e4m3 terms too.
        weights = p.to(torch.bfloat16).double()
        denom = p.float().sum(-1, keepdim=True).double()
    else:
        p8 = e4m3(p * p_scale) / p_scale
        weights = p8
        denom = (p.float().sum(-1, keepdim=True).double() if p_sum == "float32" else p8.sum(-1, keepdim=True))
    out = torch.einsum("thn,nd->thd", weights, v) / denom
    lse = (m.squeeze(-1) + torch.log(p.sum(-1)))
    return out, lse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--heads", default="16,128")
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(args.seed)
    dl, dr, kv_scale = 512, 64, 1 / 64
    softmax_scale = (128 + 64) ** -0.5
    cache = (torch.randn(args.tokens, dl + dr, generator=g) / kv_scale).to(E4M3).to(torch.float64) * kv_scale
    k_lat, k_rope = cache[:, :dl], cache[:, dl:]
    rows = []
    for heads in [int(h) for h in args.heads.split(",")]:
        q = torch.randn(args.rows, heads, dl + dr, generator=g).to(torch.bfloat16).to(torch.float64)
        q_lat, q_rope = q[..., :dl], q[..., dl:]
        want_out, want_lse = attention(q_lat, q_rope, k_lat, k_rope, k_lat, softmax_scale)
        cases = [("exact products", "-", None, "-")]
        cases += [(f"q per {gran}", gran, ps, psum) for gran in ("tensor", "row", "row_head")
                  for ps, psum in ((1.0, "float32"), (256.0, "float32"), (256.0, "quantised"), (448.0, "float32"),
                                   (256.0, "split"), (1.0, "bf16"))]
        cases += [("q per row_head, two terms", "row_head2", 256.0, "float32"),
                  ("q per row_head, two terms", "row_head2", 256.0, "split")]
        for label, gran, p_scale, p_sum in cases:
            if gran == "-":
                q_used = q_lat
            elif gran == "row_head2":
                q_used = quantise_q(q_lat, "row_head", terms=2)
            else:
                q_used = quantise_q(q_lat, gran)
            out, lse = attention(q_used, q_rope, k_lat, k_rope, k_lat, softmax_scale, p_scale, p_sum)
            rel_l2 = float(torch.linalg.vector_norm(out - want_out) / torch.linalg.vector_norm(want_out))
            rows.append({"heads": heads, "tokens": args.tokens, "case": label, "p_scale": p_scale, "p_sum": p_sum,
                         "out_rel_l2": rel_l2, "out_max_abs": float((out - want_out).abs().max()),
                         "out_max_ref": float(want_out.abs().max()),
                         "lse_max_abs": float((lse - want_lse).abs().max())})
    lines = ["| H | case | P scale | normaliser | out rel L2 | out max abs (max |out|) | lse max abs |",
             "| ---: | --- | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['heads']} | {r['case']} | {r['p_scale'] if r['p_scale'] else '-'} | {r['p_sum']} | "
                     f"{r['out_rel_l2']:.2e} | {r['out_max_abs']:.2e} ({r['out_max_ref']:.2e}) | "
                     f"{r['lse_max_abs']:.2e} |")
    table = "\n".join(lines) + "\n"
    (args.out / "fp8_products_model.json").write_text(json.dumps(rows, indent=1))
    (args.out / "fp8_products_model.md").write_text(table)
    print(table)
    return 0 if all(math.isfinite(r["out_rel_l2"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
