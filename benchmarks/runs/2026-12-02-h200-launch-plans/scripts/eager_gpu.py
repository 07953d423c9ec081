# Is the eager C7 step bound by the host or the GPU? Host wall vs GPU span of back-to-back steps; kernel list.
import sys, time, torch, mla_dcp
from mla_dcp import bench
from torch.profiler import profile, ProfilerActivity
for name in sys.argv[1:]:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg; seq_lens, table, q, kv, scale = case.inputs[0]
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    fns = {"step": lambda: mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale),
           "view": lambda: mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype),
           "verify": lambda: mla_dcp.verify(cfg, view, q, kv, scale)}
    with torch.inference_mode():
        for label, fn in fns.items():
            for _ in range(50): fn()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t = time.perf_counter(); a.record()
            for _ in range(1000): fn()
            b.record(); host = (time.perf_counter() - t) * 1e3
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            for _ in range(200):
                fn(); torch.cuda.synchronize()
            lat = (time.perf_counter() - t2) / 200 * 1e6
            print(f"{name} {label:7s} host {host:8.2f} us/call  gpu span {a.elapsed_time(b):8.2f} us/call  synced latency {lat:8.2f} us", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20): fns["step"]()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
