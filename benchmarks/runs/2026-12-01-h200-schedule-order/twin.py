"""A graph captured on R4's uniform twin, replayed with R4's lengths: right answer, and its time beside R4's own graph."""
import json, statistics, sys
import torch, triton.testing
sys.path.insert(0, "gpu_run")
import mla_dcp
from mla_dcp import bench

DL, DR, W, SCALE = 512, 64, 8, 192 ** -0.5
ragged, twin = bench.lengths_of("R4"), bench.lengths_of("R4u")
cfg = mla_dcp.VerifyConfig(num_heads=64, qlen=4, block_size=64, max_model_len=W * max(ragged), dcp_world_size=W,
                           dcp_rank=0, kv_lora_rank=DL, rope_dim=DR, softmax_scale=SCALE)


def table_for(lengths):
    need = [-(-n // 64) for n in lengths]
    order = torch.randperm(sum(need), device="cuda").to(torch.int32)
    t = torch.zeros(len(lengths), cfg.min_table_blocks, dtype=torch.int32, device="cuda")
    s = 0
    for i, c in enumerate(need):
        t[i, :c] = order[s:s + c]; s += c
    return t, sum(need)


t_ragged, n1 = table_for(ragged)
t_twin, n2 = table_for(twin)
kv = torch.randn(max(n1, n2), 64, DL + DR, device="cuda").bfloat16()
q = torch.randn(len(ragged) * 4, 64, DL + DR, device="cuda", dtype=torch.bfloat16)
seq = torch.empty(len(ragged), dtype=torch.int32, device="cuda")
table = torch.empty_like(t_ragged)


def step():
    return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq, table), q, kv)


def capture(lengths, t):
    seq.copy_(torch.tensor([W * n for n in lengths], dtype=torch.int32)); table.copy_(t)
    step(); step(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    return g, out


def timed(g):
    return statistics.median(triton.testing.do_bench(g.replay, warmup=10, rep=100, return_mode="median")
                             for _ in range(3)) * 1e3


g_twin, out_twin = capture(twin, t_twin)
seq.copy_(torch.tensor([W * n for n in ragged], dtype=torch.int32)); table.copy_(t_ragged)
g_twin.replay(); torch.cuda.synchronize()
want = step()
same = bool(torch.equal(out_twin[0], want[0]) and torch.equal(out_twin[1], want[1]))
us_twin_on_ragged = timed(g_twin)
g_own, _ = capture(ragged, t_ragged)
us_own = timed(g_own)
print(json.dumps({"twin_graph_on_R4_equal_eager": same, "twin_graph_us": round(us_twin_on_ragged, 2),
                  "own_graph_us": round(us_own, 2), "ratio": round(us_twin_on_ragged / us_own, 3)}))
