"""The native plans (mla_dcp.ops.native, native_plans.cpp) on the CPU.

A native plan launches with the parameters laid out by hand, so what can go
wrong is the layout (a parameter in the wrong place or of the wrong width
reads as another kernel's arguments) and a stale match (a call whose tensors
have another layout than the recorded one). These tests build the module,
lay out launches of stand-in compiled kernels (no GPU: :meth:`Plan.pack`
returns the bytes a launch would pass) and compare them byte for byte with
the layout Triton 3.6's launcher uses, and check that every layout change
makes a plan refuse the call. The launches themselves run on the GPU
(tests/test_gpu.py: bitwise-equal results with and without the plans).
"""

import os
import pathlib
import struct
import subprocess
import sys
import types

import pytest
import torch

from mla_dcp.ops import fast_launch, native


@pytest.fixture(scope="module")
def built():
    module = native.wait()
    assert module is not None, native.error()
    return module


def _le(code, value):
    return struct.pack("<" + code, value)


def test_parameter_layout_follows_triton_36():
    signature = ["*bf16", "i32", "constexpr", "fp32", "tensordesc<bf16[64, 128]>", "i1", "*fp32", "i64", "bf16"]
    items = [("tensor", 3), ("constant", -5), ("constant", 64), ("constant", 0.5),
             ("descriptor", 0, [100, 576, 576, 1]), ("constant", True), ("tensor", 9), ("constant", 1 << 40),
             ("constant", 1.5)]
    layout = native.parameter_layout(signature, items, [{"swizzle": 3}])
    bf16_of_1_5 = struct.unpack("<I", struct.pack("<f", 1.5))[0] >> 16
    assert layout == [
        ("tensor", 3),
        (2, 4, int.from_bytes(_le("i", -5), "little")),
        (2, 4, int.from_bytes(_le("f", 0.5), "little")),
        ("descriptor", 0), (2, 4, 100), (2, 4, 576), (2, 8, 576), (2, 8, 1),
        (2, 1, 1),
        ("tensor", 9),
        (2, 8, 1 << 40),
        (2, 2, bf16_of_1_5),
        (2, 8, 0), (2, 8, 0),      # global and profile scratch: none
    ]


@pytest.mark.parametrize("signature, items, meta, why", [
    (["*bf16"], [("constant", 3.0)], [], "pointer parameter given float"),
    (["i32"], [("tensor", 0)], [], "a tensor for a i32 parameter"),
    (["tensordesc<bf16[64, 64]>"], [("descriptor", 0, [1, 2, 3, 4])], [None], "without Triton's metadata"),
    (["tensordesc<bf16[64, 64]>"], [("descriptor", 0, [1, 2, 3])], [{}], "rank"),
    (["i32", "i32"], [("constant", 1)], [], "1 values for 2 parameters"),
    (["u128"], [("constant", 1)], [], "parameter type u128"),
])
def test_parameter_layout_refuses_what_it_does_not_lay_out(signature, items, meta, why):
    with pytest.raises(native._Unfit, match=why):
        native.parameter_layout(signature, items, meta)


def _sequence(sources, outputs, scratch_bytes=1024, offsets=(0, 512)):
    """A fast Sequence-like plan of two launches of stand-in compiled kernels."""
    def entry(signature, descriptors=(), tail=(), metadata=(4, 1, 2048), pdl=False):
        compiled = types.SimpleNamespace(src=types.SimpleNamespace(signature=dict(enumerate(signature))))
        return types.SimpleNamespace(raw=object(), compiled=compiled, descriptors=descriptors, tail=tail,
                                     metadata=metadata, function=0xABC0, pdl=pdl, coop=False)

    def make(desc, meta):   # Triton's encoder: the map, then the shape and strides the launcher passes
        base = desc.base.data_ptr()
        return [bytes([base & 0xFF]) * 128, *desc.shape, *desc.strides]

    desc_fields = {"shape": [8, 16], "strides": [16, 1], "block_shape": [4, 16]}
    count = len(sources)
    first = entry(["*bf16", "tensordesc<bf16[4, 16]>", "i32", "constexpr", "*fp32", "constexpr"],
                  descriptors=((1, {"swizzle": 0}, make),), tail=(64,))
    second = entry(["*fp32", "*u8", "fp32", "*i32"], pdl=True)
    launches = [
        [None, (3,), {}, first, ((0, 0), (1, (types.SimpleNamespace, 0, desc_fields)), (2, 7), (2, 1),
                                 (0, count))],
        [None, (2, 5), {}, second, ((0, count - 1), (0, count + 1), (2, 0.25), (0, 2))],
    ]
    return types.SimpleNamespace(fast=True, launches=launches, nbytes=scratch_bytes, offsets=offsets,
                                 outputs=outputs)


def _rebased(kind, fields, base):
    desc = types.SimpleNamespace(**fields)
    desc.base = base
    return desc


def _sources():
    q = torch.zeros(8, 16, dtype=torch.bfloat16)
    scale = None
    lens = torch.zeros(5, dtype=torch.int32)
    out = torch.zeros(6, dtype=torch.float32)
    return (q, scale, lens, out)


def test_plan_packs_each_launch_as_the_launcher_does(built):
    sources = _sources()
    sequence = _sequence(sources, outputs=((6,), torch.float32))
    plan = native.plan_of(sequence, sources, 3, _rebased)
    assert plan is not None and plan.num_launches == 2
    q, _, lens, out = sources
    scratch = 1 << 32
    first = plan.pack(0, sources, scratch)
    expected = (_le("Q", q.data_ptr()) + bytes([q.data_ptr() & 0xFF]) * 128 + _le("i", 8) + _le("i", 16)
                + _le("q", 16) + _le("q", 1) + _le("i", 7) + _le("Q", scratch) + _le("Q", 0) + _le("Q", 0))
    assert first == expected
    second = plan.pack(1, sources, scratch)
    assert second == (_le("Q", out.data_ptr()) + _le("Q", scratch + 512) + _le("f", 0.25) + _le("Q", lens.data_ptr())
                      + _le("Q", 0) + _le("Q", 0))
    # Another base gets its own map (encoded once, then kept).
    moved = (torch.ones(8, 16, dtype=torch.bfloat16),) + sources[1:]
    assert plan.pack(0, moved, scratch)[8:136] == bytes([moved[0].data_ptr() & 0xFF]) * 128


def test_plan_refuses_every_other_layout(built):
    sources = _sources()
    sequence = _sequence(sources, outputs=((6,), torch.float32))
    plan = native.plan_of(sequence, sources, 3, _rebased)
    q, scale, lens, out = sources
    assert plan.matches(sources) and plan.matches(sources[:3])
    storage = torch.zeros(8 * 16 + 1, dtype=torch.bfloat16)

    class Sub(torch.Tensor):
        pass

    others = {
        "dtype": q.to(torch.float16),
        "shape": torch.zeros(8, 8, dtype=torch.bfloat16),
        "strides": torch.zeros(16, 8, dtype=torch.bfloat16).t(),
        "alignment": storage[1:].view(8, 16),
        "none for a tensor": None,
        "requires grad": torch.zeros(8, 16, dtype=torch.bfloat16, requires_grad=True),
        "a subclass": q.as_subclass(Sub),
    }
    for why, other in others.items():
        assert not plan.matches((other, scale, lens)), why
    assert not plan.matches((q, lens, lens)), "a tensor for None"
    assert not plan.matches((q, scale, lens, out, out)), "more sources than recorded"
    assert plan.run(0, (q, scale)) is None, "fewer inputs"
    with pytest.raises(ValueError):
        plan.pack(0, (q, scale, lens.to(torch.int64), out), 0)


def test_plan_of_refuses_launches_it_cannot_lay_out(built):
    sources = _sources()
    sequence = _sequence(sources, outputs=((6,), torch.float32))
    sequence.launches[1][3].raw = None      # another Triton's launcher
    assert native.plan_of(sequence, sources, 3, _rebased) is None
    sequence = _sequence(sources, outputs=((6,), torch.float32))
    sequence.launches[0][3].metadata = (4, 2, 0)     # a cluster launch
    assert native.plan_of(sequence, sources, 3, _rebased) is None
    sequence.fast = False
    assert native.plan_of(sequence, sources, 3, _rebased) is None


def test_run_without_a_driver_raises_rather_than_crashing(built):
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("a CUDA driver is present: the launch is tested on the GPU")
    sources = _sources()
    plan = native.plan_of(_sequence(sources, outputs=((6,), torch.float32)), sources, 3, _rebased)
    with pytest.raises(RuntimeError, match="no CUDA driver"):
        plan.run(0, sources[:3])


def test_a_failed_build_leaves_the_python_path(tmp_path):
    code = ("import warnings\n"
            "from mla_dcp.ops import native\n"
            "with warnings.catch_warnings(record=True) as caught:\n"
            "    warnings.simplefilter('always')\n"
            "    assert native.wait() is None\n"
            "print(repr(native.error()))\n"
            "print(any('Python launch path' in str(w.message) for w in caught))\n")
    env = dict(os.environ, CXX="false", MLA_DCP_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    error, warned = done.stdout.splitlines()[:2]
    assert "false failed" in error and warned == "True"
    assert not list(pathlib.Path(tmp_path).glob("*.so")) and not list(pathlib.Path(tmp_path).glob("*.partial")), \
        "no half-built module is left behind"


def test_disabled_never_builds(tmp_path):
    code = "from mla_dcp.ops import native\nassert native.wait() is None and native.error() is None\n"
    env = dict(os.environ, MLA_DCP_NATIVE="0", MLA_DCP_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not list(pathlib.Path(tmp_path).iterdir())


def test_concurrent_builds_share_one_compile(tmp_path):
    """Processes that start together (a DCP job's ranks) compile once: the others wait for the
    build lock and load its module."""
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "cxx"
    wrapper.write_text(f"#!/bin/sh\necho run >> {log}\nexec c++ \"$@\"\n")
    wrapper.chmod(0o755)
    code = "from mla_dcp.ops import native\nassert native.wait() is not None, native.error()\n"
    env = dict(os.environ, CXX=str(wrapper), MLA_DCP_CACHE_DIR=str(tmp_path / "cache"))
    # What a process that exited mid-build leaves: removed by the next build.
    (tmp_path / "cache").mkdir()
    target_name = native._module_name()
    stale = tmp_path / "cache" / f"{target_name}.abc123.partial"
    stale.write_bytes(b"half a module")
    runs = [subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err
    assert log.read_text().split() == ["run"]
    assert len(list((tmp_path / "cache").glob("*.so"))) == 1
    assert not stale.exists() and not list((tmp_path / "cache").glob("*.partial"))


def test_plan_returns_views_of_its_inputs_as_python_slices_them(built):
    """build_view's page table, when it is the block table's first columns, is sliced by the plan:
    the same view Python's ``t[:, :end]`` makes (storage, offset, strides), of this call's tensor."""
    sources = _sources()
    plan = native.plan_of(_sequence(sources, outputs=((6,), torch.float32)), sources, 3, _rebased)
    plan.add_slice(0, 1, 5)
    table = torch.arange(8 * 16, dtype=torch.float32).view(8, 16)[1:].to(torch.bfloat16)
    q = torch.zeros(8, 16, dtype=torch.bfloat16)
    q.copy_(torch.arange(8 * 16, dtype=torch.bfloat16).view(8, 16))
    (view,) = plan.views((q, None, sources[2]))
    want = q[:, :5]
    assert view.data_ptr() == want.data_ptr() and view.stride() == want.stride() and view.shape == want.shape
    assert view.untyped_storage().data_ptr() == q.untyped_storage().data_ptr() and torch.equal(view, want)
    assert plan.views((table, None, sources[2])) is None      # another layout: refused, as run() is
    for bad in ((1, 0, 1), (0, 2, 1), (0, 1, 17), (3, 0, 1)):  # None, no such dim, past the end, an output
        with pytest.raises(ValueError, match="slice outside"):
            plan.add_slice(*bad)


def test_outputs_apart_unless_the_caller_owns_them(built, monkeypatch):
    """A Sequence's native plan allocates each output apart (what an op returns may alias nothing:
    torch.compile checks), unless its caller set ``separate`` False (the API's own outputs: one
    block); every new Sequence starts separate."""
    monkeypatch.setattr(fast_launch, "rebased", _rebased)   # the stand-in descriptors' rebuild
    sources = _sources()
    for separate, mode in ((True, native.SEPARATE), (False, 2)):
        sequence = _sequence(sources, outputs=((6,), torch.float32))
        sequence.native, sequence.native_tried, sequence.separate = None, False, separate
        fast_launch.Sequence.make_native(sequence, sources, 3)
        assert sequence.native_tried and sequence.native.allocation == mode
    inp, out = torch.zeros(4), torch.zeros(4)
    made = fast_launch.Sequence.of([(object(), (1,), (inp, out), {})], (inp, out), (), (out,))
    assert made is not None and made.separate is True


def test_each_descriptor_argument_keeps_its_own_fields(built):
    """Two launches of one kernel with descriptors over the same source at the same position but
    other fields (another box, say) get the maps of their own fields, not one shared encoder's."""
    sources = _sources()
    sequence = _sequence(sources, outputs=((6,), torch.float32))
    first = sequence.launches[0]

    def make(desc, meta):   # the map says which box it was encoded for
        return [bytes([desc.block_shape[0]]) * 128, *desc.shape, *desc.strides]

    entry = types.SimpleNamespace(**vars(first[3]))
    entry.descriptors = ((1, {"swizzle": 0}, make),)
    other = {"shape": [8, 16], "strides": [16, 1], "block_shape": [2, 16]}
    own = {"shape": [8, 16], "strides": [16, 1], "block_shape": [4, 16]}
    template = list(first[4])
    sequence.launches = [
        [None, (3,), {}, entry, tuple(template[:1] + [(1, (types.SimpleNamespace, 0, own))] + template[2:])],
        [None, (3,), {}, entry, tuple(template[:1] + [(1, (types.SimpleNamespace, 0, other))] + template[2:])],
    ]
    plan = native.plan_of(sequence, sources, 3, _rebased)
    assert plan is not None
    assert plan.pack(0, sources, 0)[8:136] == bytes([4]) * 128
    assert plan.pack(1, sources, 0)[8:136] == bytes([2]) * 128


@pytest.mark.parametrize("allocation", [0, 1, 2])
def test_outputs_are_the_tensors_torch_empty_makes(built, allocation):
    """However a plan allocates (2, its default: one block for a call's outputs; 1: one allocation
    an output; 0: at::empty each), each output has its recorded dtype, shape and contiguous
    strides, its own bytes (no two overlap; aligned as the allocator aligns, and in one block each at
    a multiple of 512 bytes from its start), and is an inference tensor
    exactly when made under inference mode; a new call gets new memory."""
    recorded = (torch.zeros(3, dtype=torch.int32), torch.zeros(5, 4, dtype=torch.bfloat16),
                torch.zeros(2, 3, 7, dtype=torch.float32), torch.zeros(0, dtype=torch.int32),
                torch.zeros(1, dtype=torch.uint8))
    lens = torch.zeros(4, dtype=torch.int32)
    plan = built.Plan((lens, *recorded), 1, 0)
    plan.allocation = allocation
    assert plan.allocation == allocation
    with pytest.raises(ValueError, match="allocation is 0, 1 or 2"):
        plan.allocation = 3
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            made = plan.run(0, (lens,))
            again = plan.run(0, (lens,))
        assert len(made) == len(recorded)
        spans = []
        for got, want in zip(made, recorded):
            assert (got.dtype, got.shape, got.stride(), got.device, got.requires_grad) == (
                want.dtype, want.shape, want.stride(), want.device, False)
            assert got.is_inference() == (mode is torch.inference_mode)
            assert got.data_ptr() % 64 == 0 or got.numel() == 0     # the CPU allocator's alignment
            if got.numel():
                spans.append((got.data_ptr(), got.data_ptr() + got.nbytes))
        spans.sort()
        assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans
        with mode():
            for got in made:
                got.fill_(7)     # each writable over its whole extent, without touching the others
        for got, want in zip(made, recorded):
            assert torch.equal(got, torch.full_like(want, 7))
        held = {t.data_ptr() for t in made if t.numel()}
        assert held.isdisjoint(t.data_ptr() for t in again if t.numel())
        if allocation == 2:     # one block: every output over one storage
            base = made[0].untyped_storage().data_ptr()
            assert {t.untyped_storage().data_ptr() for t in made} == {base}
            assert all((t.data_ptr() - base) % 512 == 0 for t in made if t.numel())
            assert all(t.data_ptr() + t.nbytes <= base + t.untyped_storage().nbytes() for t in made if t.numel())


def test_a_call_under_a_mode_or_the_profiler_returns_none(built):
    """A dispatch mode, a function mode or the profiler expects to see the ops: under each, the C++
    call refuses (None, the Python path) before it allocates; outside them it serves again."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Function(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    lens = torch.zeros(4, dtype=torch.int32)
    plan = built.Plan((lens, torch.zeros(3, dtype=torch.int32)), 1, 0)
    assert plan.run(0, (lens,)) is not None
    for mode in (Dispatch, Function):
        with mode():
            assert plan.run(0, (lens,)) is None, mode
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert plan.run(0, (lens,)) is None
    assert plan.run(0, (lens,)) is not None
