"""Graphed verify step of ragged and uniform configs with only the public API (runs on either tree).
PYTHONPATH=TREE python ab2.py LABEL NAME=q:H:L1,L2,...[:fp8] ..."""
import json, math, statistics, sys
import torch, triton.testing
import mla_dcp

DL, DR, W, SCALE = 512, 64, 8, 192 ** -0.5


def ceilings():
    n = 1 << 30
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(src)
    c = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
    m = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return {"copy_TBps": 4 * n / c / 1e9, "bf16_TFLOPs": 2 * 8192 ** 3 / m / 1e9}


def case(qlen, heads, lengths, fp8, block=64):
    cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=block, max_model_len=W * max(lengths),
                               dcp_world_size=W, dcp_rank=0, kv_lora_rank=DL, rope_dim=DR, softmax_scale=SCALE)
    need = [-(-n // block) for n in lengths]
    kv_bytes = sum(lengths) * (DL + DR) * (1 if fp8 else 2)
    copies = max(1, min(16, math.ceil(4 * (60 << 20) / kv_bytes)))
    fns = []
    for _ in range(copies):
        order = torch.randperm(sum(need), device="cuda").to(torch.int32)
        table = torch.zeros(len(lengths), cfg.min_table_blocks, dtype=torch.int32, device="cuda")
        s = 0
        for i, c in enumerate(need):
            table[i, :c] = order[s:s + c]; s += c
        seq = torch.tensor([W * n for n in lengths], dtype=torch.int32, device="cuda")
        q = torch.randn(len(lengths) * qlen, heads, DL + DR, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(sum(need), block, DL + DR, device="cuda")
        scale = None
        if fp8:
            scale = torch.full((1,), 1 / 64, device="cuda"); kv = (kv / scale).to(torch.float8_e4m3fn)
        else:
            kv = kv.bfloat16()
        fns.append(lambda seq=seq, table=table, q=q, kv=kv, scale=scale: mla_dcp.verify(
            cfg, mla_dcp.build_view(cfg, seq, table), q, kv, scale))
    flops = 2 * qlen * heads * sum(lengths) * (DL + DR + DL)
    return fns, kv_bytes, flops


def graphed(fns, steps=8):
    for f in fns:
        f(); f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(steps):
            fns[i % len(fns)]()
    return g.replay


label = sys.argv[1]
out = {"label": label, "ceilings": ceilings()}
for spec in sys.argv[2:]:
    name, rest = spec.split("=")
    parts = rest.split(":")
    qlen, heads, lengths = int(parts[0]), int(parts[1]), [int(x) for x in parts[2].split(",")]
    fns, kv_bytes, flops = case(qlen, heads, lengths, "fp8" in parts[3:], 16 if "b16" in parts[3:] else 64)
    rep = graphed(fns)
    t = statistics.median(triton.testing.do_bench(rep, warmup=10, rep=100, return_mode="median") for _ in range(3))
    us = t * 1e3 / 8
    floor = max(kv_bytes / (out["ceilings"]["copy_TBps"] * 1e12), flops / (out["ceilings"]["bf16_TFLOPs"] * 1e12)) * 1e6
    out[name] = {"us": round(us, 2), "floor_us": round(floor, 2), "x_floor": round(us / floor, 3)}
    del fns, rep
    torch.cuda.empty_cache()
print(json.dumps(out))
