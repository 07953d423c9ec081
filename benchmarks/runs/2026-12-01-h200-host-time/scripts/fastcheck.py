# Fast launch vs Triton's binder vs the dispatcher op path: bitwise, per config; host us each way.
import sys, time, torch, mla_dcp
from mla_dcp import bench
from mla_dcp.ops import fast_launch
from mla_dcp.ops import library as ops
bad = 0
for name in sys.argv[1:]:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[0]
    def step():
        return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale)
    fast_launch.enabled = True
    a = [t.clone() for t in step()]; a2 = [t.clone() for t in step()]
    fast_launch.enabled = False
    b = [t.clone() for t in step()]
    fast_launch.enabled = True
    with torch.autograd.profiler.record_function("x"):
        pass
    # the dispatcher path: the op, not the launcher
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    if view.work.shape[0] == view.batch:
        c = ops.single_segment_attention(q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, 512, cfg.scale)
    else:
        parts = ops.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, 512, cfg.scale)
        c = ops.merge_segments(*parts, view.segments, q.dtype)
    torch.cuda.synchronize()
    same = all(torch.equal(x.view(torch.uint8) if x.dtype != torch.float32 else x.view(torch.int32),
                           y.view(torch.uint8) if y.dtype != torch.float32 else y.view(torch.int32))
               for x, y in zip(a + a + a, a2 + b + list(c)))
    bad += not same
    host = {}
    for flag in (True, False):
        fast_launch.enabled = flag
        host[flag] = bench.host_time(step) * 1e6
    fast_launch.enabled = True
    print(f"{name}: fast==fast {same}; host us fast {host[True]:.1f}, binder {host[False]:.1f}; entries {len(fast_launch._ENTRIES)} slow {fast_launch._SLOW}", flush=True)
print("ALL BITWISE" if not bad else f"{bad} MISMATCHED")
