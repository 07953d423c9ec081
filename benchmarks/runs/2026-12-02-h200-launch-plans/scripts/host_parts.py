# Host cost of the eager step's parts and of the primitives they are made of (H200 host).
import sys, time, json
import torch, triton, triton.language as tl
import mla_dcp
from mla_dcp import bench, api
from mla_dcp.ops import launchers, fast_launch, library

def per_call(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    e = time.perf_counter() - t; torch.cuda.synchronize(); return e / n * 1e6

res = {}
def rec(k, fn, n=2000):
    res[k] = round(per_call(fn, n), 2); print(f"{k:48s} {res[k]:8.2f} us", flush=True)

x = torch.zeros(4096, device="cuda"); y = torch.zeros(64, 16, 512, device="cuda")
dev = x.device
rec("torch.empty 1-d", lambda: torch.empty(64, dtype=torch.int32, device=dev))
rec("torch.empty 3-d", lambda: torch.empty(64, 16, 512, dtype=torch.float32, device=dev))
rec("torch.empty 3-d, device index int", lambda: torch.empty((64, 16, 512), dtype=torch.float32, device=0))
rec("slice view x[:8]", lambda: x[:8])
rec("as_strided", lambda: x.as_strided((8, 4), (4, 1), 16))
rec("view(dtype)", lambda: x.view(torch.int32))
rec("data_ptr", lambda: x.data_ptr())
rec("stride()", lambda: y.stride())
rec("shape", lambda: y.shape)
rec("is_cuda+dtype", lambda: (y.is_cuda, y.dtype))
rec("current_device", lambda: torch.cuda.current_device())
rec("raw stream", lambda: torch._C._cuda_getCurrentRawStream(0))
rec("is_compiling", lambda: torch.compiler.is_compiling())
rec("_plain_eager_cuda", lambda: library._plain_eager_cuda(y))

@triton.jit
def k3(a, b, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(b + o, tl.load(a + o, mask=o < n), mask=o < n)

a = torch.zeros(256, device="cuda"); b = torch.zeros(256, device="cuda")
c = k3[(1,)](a, b, 100, BLOCK=256)
rec("k3[grid]", lambda: k3[(1,)](a, b, 100, BLOCK=256))
rec("fast_launch k3", lambda: fast_launch.launch(k3, (1,), a, b, 100, BLOCK=256))
stream = torch._C._cuda_getCurrentRawStream(0)
run, fn, md = c.run, c.function, c.packed_metadata
rec("compiled.run k3", lambda: run(1, 1, 1, stream, fn, md, None, None, None, a, b, 100, 256))
raw = run.launch
coop, pdl = run.launch_cooperative_grid, run.launch_pdl
print("k3 scratch", run.global_scratch_size, run.profile_scratch_size, "raw", raw)
rec("mod.launch k3 (tensors)", lambda: raw(1, 1, 1, stream, fn, coop, pdl, None, None, md, None, None, None, a, b, 100, 256) if False else None)
import inspect
print(inspect.signature(run.__call__))
try:
    rec("mod.launch k3", lambda: raw(1, 1, 1, stream, fn, coop, pdl, None, None, md, None, None, None, a, b, 100, 256))
except Exception as e:
    print("raw launch fails", repr(e))
    # launch(gridX, gridY, gridZ, stream, function, coop, pdl, gscratch, pscratch, *args) where args = metadata, hooks..., kernel args
pa, pb = a.data_ptr(), b.data_ptr()
try:
    rec("mod.launch k3 int ptrs", lambda: raw(1, 1, 1, stream, fn, coop, pdl, None, None, md, None, None, None, pa, pb, 100, 256))
except Exception as e:
    print("raw int fails", repr(e))

for name in sys.argv[1:] or ["C7", "C4"]:
    case = bench.make_case(name, torch.bfloat16)
    cfg = case.cfg
    seq_lens, table, q, kv, scale = case.inputs[0]
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    with torch.inference_mode():
        rec(f"{name} step", lambda: mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale))
        rec(f"{name} build_view", lambda: mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype))
        rec(f"{name} verify", lambda: mla_dcp.verify(cfg, view, q, kv, scale))
        rec(f"{name} _validate_verify", lambda: api._validate_verify(cfg, view, q, kv, scale))
        rec(f"{name} schedule_shape", lambda: api.schedule_shape(cfg, seq_lens.shape[0], seq_lens.device, q.dtype, kv.dtype))
        num_items, programs = api.schedule_shape(cfg, seq_lens.shape[0], seq_lens.device, q.dtype, kv.dtype)
        rec(f"{name} launchers.step_metadata", lambda: launchers.step_metadata(seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.causal, cfg.page_size, cfg.max_pages, num_items, cfg.schedule_chunk, programs))
        args = (q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, cfg.kv_lora_rank, cfg.scale, cfg.schedule_chunk, cfg.fp8_products)
        rec(f"{name} launchers.segmented_attention", lambda: launchers.segmented_attention(*args))
        outs = launchers.segmented_attention(*args)
        rec(f"{name} attention_outputs", lambda: launchers.attention_outputs(q, cfg.kv_lora_rank, view.work.shape[0], cfg.qlen, False))
        rec(f"{name} launchers.merge_segments", lambda: launchers.merge_segments(*outs, view.segments, q.dtype))
        comp = launchers.last_attention_kernel
        print(name, "attention kernel", comp.name if hasattr(comp, "name") else comp, "scratch", comp.run.global_scratch_size, comp.run.profile_scratch_size)
        launch_fn = comp.run.launch
        print(name, "launch freevars", getattr(getattr(launch_fn, "__code__", None), "co_freevars", None))
        step = lambda: mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv, scale)
        compiled = torch.compile(step, fullgraph=True)
        rec(f"{name} compiled step", compiled, 1000)
        ident = torch.compile(lambda t: t, fullgraph=True)
        rec("compiled identity", lambda: ident(q), 1000)
        op_only = torch.compile(lambda t, s: torch.ops.mla_dcp.row_lens(s, 2, 1, 0, 1, True), fullgraph=True)
        rec("compiled one op (row_lens)", lambda: op_only(q, seq_lens), 1000)
        rec("op row_lens eager via dispatcher", lambda: torch.ops.mla_dcp.row_lens(seq_lens, 2, 1, 0, 1, True))
json.dump(res, open(sys.argv[0].replace(".py", ".json") if False else "/dev/null", "w"))
import os
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "host_parts.json"), "w"), indent=1)
