import dataclasses, sys, time
import torch
import mla_dcp
from mla_dcp import pure
from mla_dcp.testing import make_problem
E4M3 = torch.float8_e4m3fn
for lens, qlen, heads, block, dtype in [((700, 2000, 130), 3, 128, 64, torch.bfloat16),
                                        ((700, 2000, 131, 45), 3, 128, 16, torch.float16)]:
    p = make_problem(list(lens), qlen=qlen, num_heads=heads, kv_lora_rank=512, rope_dim=64, block_size=block,
                     dtype=dtype, kv_dtype=E4M3, seed=5, softmax_scale=192 ** -0.5, device="cuda")
    sh = p.shards[0]
    res = {}
    for mode in (False, True):
        cfg = dataclasses.replace(sh.cfg, fp8_products=mode)
        view = mla_dcp.build_view(cfg, p.seq_lens, sh.block_table)
        t = time.time()
        out, lse = mla_dcp.verify(cfg, view, p.q, sh.kv_cache, p.kv_scale)
        torch.cuda.synchronize()
        res[mode] = (out, lse, time.time() - t)
    cfg = dataclasses.replace(sh.cfg, fp8_products=True)
    view = mla_dcp.build_view(cfg, p.seq_lens, sh.block_table)
    c = lambda t: t.cpu()
    model = pure.merge_segments(*pure.segmented_attention(c(p.q), c(sh.kv_cache), c(view.row_lens), c(view.page_table),
        c(view.work), qlen=cfg.qlen, kv_lora_rank=cfg.kv_lora_rank, softmax_scale=cfg.scale, kv_scale=c(p.kv_scale),
        fp8_products=True), c(view.segments), p.q.dtype)
    ref_out, ref_lse = (t.cpu() for t in p.reference(torch.float64))
    for mode, (out, lse, dt) in res.items():
        o = out.cpu().double()
        err = (o - ref_out).norm() / ref_out.norm()
        gap = (o - model[0].double()).norm() / ref_out.norm()
        lerr = (lse.cpu().double() - ref_lse).abs().max()
        print(f"lens={lens} block={block} {dtype} fp8_products={mode}: rel L2 vs f64 {err:.3e}, vs model {gap:.3e}, "
              f"lse max err {lerr:.3e}, nan {torch.isnan(out).sum().item()}, first call {dt:.2f}s", flush=True)
    merr = (model[0].double() - ref_out).norm() / ref_out.norm()
    print(f"  model vs f64 {merr:.3e}", flush=True)
