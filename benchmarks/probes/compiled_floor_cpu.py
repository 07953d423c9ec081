"""What torch.compile itself costs a step, on a CPU: every mla_dcp op's CPU
kernel is replaced by its fake (allocations only), so what is timed is the
host path: the API, the dispatcher and the compiled function's wrappers.

    python benchmarks/probes/compiled_floor_cpu.py

Prints us per call (3,000-5,000 calls): the eager step, the compiled step, a
compiled function that returns its input, one with one custom op, and the
compiled step's guard check alone; then what a compiled graph of one op costs
by its kind of kernel: an op of the same schema with a Python kernel and with a
C++ one (built with torch.utils.cpp_extension.load_inline; needs a C++
compiler), beside ``empty_like``, which inductor lowers itself.
"""
import tempfile
import time

import torch

import _ab
import mla_dcp

_LIB = _ab.cpu_fakes()
cfg, seq_lens, table, q, kv = _ab.cpu_c7_case(softmax_scale=0.1)
W, QLEN = cfg.dcp_world_size, cfg.qlen


def step():
    return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype), q, kv)


def one_op():
    return torch.ops.mla_dcp.row_lens(seq_lens, QLEN, W, 0, 1)


def per_call(label, fn, n=4000):
    for _ in range(50):
        fn()
    started = time.perf_counter()
    for _ in range(n):
        fn()
    print(f"{label:36s} {(time.perf_counter() - started) / n * 1e6:7.2f} us", flush=True)


with torch.inference_mode():
    compiled = torch.compile(step, fullgraph=True)
    per_call("eager step", step)
    per_call("compiled step", compiled)
    per_call("compiled: return the input", torch.compile(lambda: q, fullgraph=True))
    per_call("compiled: one custom op", torch.compile(one_op, fullgraph=True))
    per_call("eager: that op", one_op)
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    guards = _debug_get_cache_entry_list(step.__code__)[0].guard_manager
    per_call("compiled step's guard check", lambda: guards.check({}))

# One op, two kernels: does a C++ kernel make a compiled graph's op cheaper?
from torch.utils.cpp_extension import load_inline  # noqa: E402

load_inline("floor_probe_cpp", is_python_module=False, build_directory=tempfile.mkdtemp(), cpp_sources=r"""
#include <torch/library.h>
#include <ATen/ATen.h>
at::Tensor two(const at::Tensor& x) { return at::empty({2}, x.options()); }
TORCH_LIBRARY(floor_probe_cpp, m) { m.def("two(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(floor_probe_cpp, CPU, m) { m.impl("two", two); }
TORCH_LIBRARY_IMPL(floor_probe_cpp, Meta, m) { m.impl("two", two); }
""")
_PY = torch.library.Library("floor_probe_py", "DEF")
_PY.define("two(Tensor x) -> Tensor")
for key in ("CPU", "Meta"):
    _PY.impl("two", lambda x: x.new_empty(2), key)
with torch.inference_mode():
    for label, fn in (("op with a Python kernel", lambda x: torch.ops.floor_probe_py.two(x)),
                      ("op with a C++ kernel", lambda x: torch.ops.floor_probe_cpp.two(x)),
                      ("empty_like (inductor's own)", torch.empty_like)):
        per_call("eager: " + label, lambda: fn(seq_lens))
        compiled_fn = torch.compile(fn, fullgraph=True)
        per_call("compiled: " + label, lambda: compiled_fn(seq_lens))
