# Host cost of op registration styles and of Triton launch paths (H200 host).
import inspect, time, torch, triton, triton.language as tl
import torch._library.custom_ops as co
print(inspect.getsource(co)[:0])
src = inspect.getsource(co.CustomOpDef.register_kernel)
i = src.find("def backend_impl"); print(src[i:i+2200])
from triton.runtime import jit
print(inspect.getsource(jit.JITFunction.run))
import triton.compiler.compiler as cc
print(inspect.getsource(cc.CompiledKernel.launch_metadata)); print(inspect.getsource(cc.CompiledKernel.__getitem__))

def per_call(fn, n=3000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    e = time.perf_counter() - t; torch.cuda.synchronize(); return e / n * 1e6

x = torch.zeros(64, device="cuda")
@torch.library.custom_op("probe::a", mutates_args=())
def a(x: torch.Tensor) -> torch.Tensor: return torch.empty_like(x)
@a.register_fake
def _(x): return torch.empty_like(x)
@a.register_kernel("cuda")
def _(x): return torch.empty_like(x)

@torch.library.custom_op("probe::b", mutates_args=())
def b(x: torch.Tensor) -> torch.Tensor: return torch.empty_like(x)
@b.register_fake
def _(x): return torch.empty_like(x)
lib = torch.library.Library("probe", "FRAGMENT")
lib.impl("b", lambda x: torch.empty_like(x), "CUDA")

lib2 = torch.library.Library("probe2", "DEF")
lib2.define("c(Tensor x) -> Tensor")
lib2.impl("c", lambda x: torch.empty_like(x), "CUDA")
lib2.impl("c", lambda x: torch.empty_like(x), "Meta")

@torch.library.custom_op("probe::d", mutates_args=())
def d(x: torch.Tensor) -> torch.Tensor: return torch.empty_like(x)
@d.register_fake
def _(x): return torch.empty_like(x)
d.register_autograd(lambda ctx, g: None, setup_context=lambda ctx, inputs, output: None)
lib.impl("d", lambda x: torch.empty_like(x), "CUDA")

cases = {"torch.empty_like": lambda: torch.empty_like(x),
         "custom_op+register_kernel": lambda: torch.ops.probe.a.default(x),
         "custom_op+Library.impl CUDA": lambda: torch.ops.probe.b.default(x),
         "custom_op+autograd+Library.impl": lambda: torch.ops.probe.d.default(x),
         "Library define+impl": lambda: torch.ops.probe2.c.default(x)}
for mode in ("plain", "no_grad", "inference_mode"):
    ctx = {"plain": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}[mode]
    with ctx():
        for k, f in cases.items():
            print(f"{mode:15s} {k:34s} {per_call(f):7.2f} us")
def three(fn):
    def g(x):
        return fn(fn(fn(x)))
    return g
for k in ("custom_op+register_kernel", "custom_op+Library.impl CUDA", "custom_op+autograd+Library.impl", "Library define+impl"):
    op = {"custom_op+register_kernel": torch.ops.probe.a.default, "custom_op+Library.impl CUDA": torch.ops.probe.b.default,
          "custom_op+autograd+Library.impl": torch.ops.probe.d.default, "Library define+impl": torch.ops.probe2.c.default}[k]
    cf = torch.compile(three(op), fullgraph=True)
    with torch.inference_mode():
        print(f"compiled x3 {k:34s} {per_call(lambda: cf(x)):7.2f} us")
cf = torch.compile(lambda x: x, fullgraph=True)
print(f"compiled identity {per_call(lambda: cf(x)):7.2f} us")

@triton.jit
def k(x_ptr, n, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr, PDL: tl.constexpr):
    o = tl.arange(0, 64); tl.store(x_ptr + o, tl.load(x_ptr + o) + A, mask=o < n)
kw = dict(A=1, B=2, C=3, PDL=False)
ck = k[(1,)](x, 64, **kw)
print(f"kernel[grid] launch            {per_call(lambda: k[(1,)](x, 64, **kw)):7.2f} us")
stream = torch.cuda.current_stream().cuda_stream
args = (x, 64, 1, 2, 3, False)
run, fn, md = ck.run, ck.function, ck.packed_metadata
print(f"ck.run direct                  {per_call(lambda: run(1, 1, 1, stream, fn, md, None, None, None, *args)):7.2f} us")
raw = torch._C._cuda_getCurrentRawStream
print(f"ck.run + raw stream            {per_call(lambda: run(1, 1, 1, raw(0), fn, md, None, None, None, *args)):7.2f} us")
print(f"raw stream query               {per_call(lambda: raw(0)):7.2f} us")
print(f"torch.cuda.current_device      {per_call(lambda: torch.cuda.current_device()):7.2f} us")
print(f"x.data_ptr                     {per_call(lambda: x.data_ptr()):7.2f} us")
print(f"x.view(8,8)                    {per_call(lambda: x.view(8, 8)):7.2f} us")
print(f"x[:32]                         {per_call(lambda: x[:32]):7.2f} us")
print(f"torch.empty(64)                {per_call(lambda: torch.empty(64, device=x.device)):7.2f} us")
dev = x.device
print(f"torch.empty((64,), dev, i32)   {per_call(lambda: torch.empty((64,), dtype=torch.int32, device=dev)):7.2f} us")
print(f"x.new_empty                    {per_call(lambda: x.new_empty((64,))):7.2f} us")
print(f"x.shape, stride, dtype         {per_call(lambda: (x.shape, x.stride(), x.dtype, x.device)):7.2f} us")
torch.testing.assert_close(x, x)
