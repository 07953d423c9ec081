import sys, time, torch, mla_dcp
from mla_dcp import bench
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
for name in sys.argv[1:]:
    case = bench.make_case(name, torch.bfloat16)
    seq_lens, table, q, kv, scale = case.inputs[0]
    cfg = case.cfg
    def step():
        return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale)
    with torch.inference_mode():
        c = torch.compile(step, fullgraph=True)
        c()
        guards = _debug_get_cache_entry_list(step.__code__)[0].guard_manager
        for _ in range(100): guards.check({})
        t = time.perf_counter()
        for _ in range(3000): guards.check({})
        print(f"{name} guard check {(time.perf_counter()-t)/3000*1e6:.2f} us", flush=True)
        print(f"{name} host compiled {bench.host_time(c)*1e6:.2f} us", flush=True)
