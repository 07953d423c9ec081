# Eager replays (launchers' plans, C-launcher path) against the full path and Triton's binder: bitwise.
import sys, torch, mla_dcp
from mla_dcp import bench
from mla_dcp.ops import fast_launch, launchers

def step(case, i=0):
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[i]
    return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale)

bad = 0
for name in sys.argv[1:]:
    case = bench.make_case(name, torch.bfloat16)
    with torch.inference_mode():
        fast_launch.clear(); fast_launch.enabled = True
        first = step(case)                      # full path, makes plans
        replay = step(case)                     # replays
        kernel = getattr(launchers.last_attention_kernel, "name", None)
        entries = [type(e.raw).__name__ if e.raw is not None else None for e in fast_launch._ENTRIES.values()]
        fast_launch.clear(); fast_launch.enabled = False
        binder = step(case)                     # Triton's binder every launch
        fast_launch.enabled = True; fast_launch.clear()
        step(case)
        # a graph captured over replays, then replayed
        g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step(case)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            graphed = step(case)
        g.replay(); torch.cuda.synchronize()
    same = all(torch.equal(a.view(torch.uint8) if a.dtype != torch.float32 else a.view(torch.int32),
                           b.view(torch.uint8) if b.dtype != torch.float32 else b.view(torch.int32))
               for x in (replay, binder, graphed) for a, b in zip(first, x))
    bad += not same
    print(f"{name:6s} kernel {kernel} bitwise {'same' if same else 'DIFFERENT'} C-launcher entries {entries}", flush=True)
print("plancheck", "FAILED" if bad else "ok")
