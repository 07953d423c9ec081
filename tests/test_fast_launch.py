"""The fast launch path's cache keys (mla_dcp.ops.fast_launch).

A real ``JITFunction`` (parsed on the CPU, never compiled) whose ``kernel[grid]``
is replaced by a recorder stands for a kernel: each test asserts when a call
reuses a cached compiled kernel and when it must go back through Triton
(which then picks the specialisation). A reused handle for another dtype,
alignment, integer class, option or device would launch a kernel compiled
for other arguments: these are the cases where fast launch paths corrupt
memory. The real launcher is exercised on the GPU (tests/test_gpu.py).
"""

import types
import warnings

import pytest
import torch
from triton.runtime.jit import JITFunction

from mla_dcp.ops import fast_launch


def _source(x_ptr, y_ptr, n, scale, A, B=7, C=3):  # parsed by JITFunction, never run
    pass


class Recorder(JITFunction):
    """``kernel[grid](...)`` records the call and returns a fake compiled kernel."""

    def __init__(self):
        super().__init__(_source)
        self.slow_calls = []
        self.fast_calls = []
        self.signature = {p.name: "?" for p in self.params}

    def __getitem__(self, grid):
        def runner(*args, **options):
            self.slow_calls.append((grid, args, options))
            compiled = types.SimpleNamespace(function="fn", packed_metadata="md",
                                             src=types.SimpleNamespace(signature=dict(self.signature)))
            compiled.run = lambda *launch: self.fast_calls.append(launch)
            return compiled
        return runner


@pytest.fixture
def kernel(monkeypatch):
    fast_launch.clear()
    monkeypatch.setattr(fast_launch, "enabled", True)
    monkeypatch.setattr(fast_launch, "_device_index", lambda: 0)
    monkeypatch.setattr(fast_launch, "_current_stream", lambda device: 1000 + device)
    return Recorder()


def _x(dtype=torch.float32, offset=0):
    return torch.zeros(64, dtype=dtype)[offset:]


def test_a_repeated_call_launches_the_compiled_kernel_with_every_parameter_in_order(kernel):
    x, y = _x(), _x()
    fast_launch.launch(kernel, (4, 2), x, y, 32, 0.5, A=5, num_warps=4)
    assert len(kernel.slow_calls) == 1 and kernel.fast_calls == []
    x2, y2 = _x(), _x()
    compiled = fast_launch.launch(kernel, (4, 2), x2, y2, 64, 0.25, A=5, num_warps=4)
    assert len(kernel.slow_calls) == 1
    (call,) = kernel.fast_calls
    # grid padded to three, the current stream, the handle, no hook, then every
    # parameter: the positional ones as given, the constexprs by name and default.
    assert call[:9] == (4, 2, 1, 1000, "fn", "md", None, None, None)
    assert call[9] is x2 and call[10] is y2 and call[11:] == (64, 0.25, 5, 7, 3)
    assert compiled.function == "fn"


@pytest.mark.parametrize("change", [
    "dtype", "misaligned pointer", "int becomes 1", "int loses 16-divisibility", "int leaves int32",
    "option value", "option added", "device", "float becomes int"])
def test_what_triton_specialises_on_never_reuses_a_handle(kernel, monkeypatch, change):
    base = dict(x=_x(), y=_x(), n=32, scale=0.5, options=dict(A=5))
    fast_launch.launch(kernel, (1,), base["x"], base["y"], base["n"], base["scale"], **base["options"])
    other = dict(base, options=dict(base["options"]))
    if change == "dtype":
        other["x"] = _x(torch.float16)
    elif change == "misaligned pointer":
        other["x"] = _x(torch.float32, offset=1)      # 4 bytes past a 16-byte boundary
    elif change == "int becomes 1":
        other["n"] = 1
    elif change == "int loses 16-divisibility":
        other["n"] = 33
    elif change == "int leaves int32":
        other["n"] = 1 << 33
    elif change == "option value":
        other["options"]["A"] = 6
    elif change == "option added":
        other["options"]["B"] = 8
    elif change == "device":
        monkeypatch.setattr(fast_launch, "_device_index", lambda: 1)
    elif change == "float becomes int":
        other["scale"] = 2
    fast_launch.launch(kernel, (1,), other["x"], other["y"], other["n"], other["scale"], **other["options"])
    assert len(kernel.slow_calls) == 2 and kernel.fast_calls == [], change


def test_same_specialisation_other_addresses_and_values_reuse_the_handle(kernel):
    fast_launch.launch(kernel, (1,), _x(), _x(), 32, 0.5, A=5)
    fast_launch.launch(kernel, (1,), _x(offset=4), _x(), 48, -3.0, A=5)   # 16 bytes in: still aligned
    assert len(kernel.slow_calls) == 1 and len(kernel.fast_calls) == 1


def test_descriptors_key_on_box_dtype_and_layout(kernel):
    from triton.tools.tensor_descriptor import TensorDescriptor

    base = torch.zeros(64, 64, dtype=torch.float16)
    one = TensorDescriptor(base, [64, 64], [64, 1], [16, 64])
    fast_launch.launch(kernel, (1,), one, _x(), 32, 0.5, A=5)
    fast_launch.launch(kernel, (1,), TensorDescriptor(base, [64, 64], [64, 1], [16, 64]), _x(), 32, 0.5, A=5)
    assert len(kernel.slow_calls) == 1
    for other in (TensorDescriptor(base, [64, 64], [64, 1], [32, 64]),
                  TensorDescriptor(base.to(torch.bfloat16), [64, 64], [64, 1], [16, 64]),
                  TensorDescriptor(base, [32, 64], [64, 1], [16, 64])):
        fast_launch.launch(kernel, (1,), other, _x(), 32, 0.5, A=5)
    assert len(kernel.slow_calls) == 4


def _hook(metadata):
    pass


def test_hooks_unknown_arguments_and_the_switch_take_tritons_path(kernel, monkeypatch):
    fast_launch.launch(kernel, (1,), _x(), _x(), 32, 0.5, A=5)
    hooks = fast_launch._knobs.runtime.launch_enter_hook
    if hasattr(hooks, "add"):                                             # Triton >= 3.7: a chain of hooks
        hooks.add(_hook)
    else:
        monkeypatch.setattr(fast_launch._knobs.runtime, "launch_enter_hook", _hook)
    try:
        fast_launch.launch(kernel, (1,), _x(), _x(), 32, 0.5, A=5)
    finally:
        if hasattr(hooks, "add"):
            hooks.remove(_hook)
        else:
            monkeypatch.setattr(fast_launch._knobs.runtime, "launch_enter_hook", None)
    fast_launch.launch(kernel, (1,), [1, 2], _x(), 32, 0.5, A=5)           # not a keyed type
    monkeypatch.setattr(fast_launch, "enabled", False)
    fast_launch.launch(kernel, (1,), _x(), _x(), 32, 0.5, A=5)
    assert len(kernel.slow_calls) == 4 and kernel.fast_calls == []


def test_a_compiled_signature_that_differs_falls_back_with_one_warning(kernel):
    kernel.signature = {"x_ptr": "*fp32", "y_ptr": "*fp32"}             # another Triton's layout
    with pytest.warns(RuntimeWarning, match="binder on every call"):
        fast_launch.launch(kernel, (1,), _x(), _x(), 32, 0.5, A=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fast_launch.launch(kernel, (1,), _x(), _x(), 32, 0.5, A=5)
    assert len(kernel.slow_calls) == 2 and kernel.fast_calls == []
    fast_launch._SLOW.pop(id(kernel))


def test_interpreted_kernels_take_tritons_path():
    calls = []

    class Interpreted:
        def __getitem__(self, grid):
            return lambda *args, **options: calls.append(grid)

    kernel = Interpreted()
    fast_launch.launch(kernel, (2,), _x())
    fast_launch.launch(kernel, (2,), _x())
    assert calls == [(2,), (2,)]
    fast_launch._SLOW.pop(id(kernel))


def test_a_bound_launch_checks_alignment_and_device_itself(kernel, monkeypatch):
    fast_launch.launch(kernel, (2,), _x(), _x(), 32, 0.5, A=5)
    bound = fast_launch.Bound(kernel, (2,), (_x(), _x(), 32, 0.5), dict(A=5))
    x2 = _x()
    bound(x2, _x(), 32, 0.5)
    assert len(kernel.slow_calls) == 1 and len(kernel.fast_calls) == 1 and kernel.fast_calls[0][9] is x2
    bound(_x(offset=1), _x(), 32, 0.5)                   # misaligned: Triton's path picks the specialisation
    assert len(kernel.slow_calls) == 2
    monkeypatch.setattr(fast_launch, "_device_index", lambda: 1)
    bound(_x(), _x(), 32, 0.5)                            # another current device
    assert len(kernel.slow_calls) == 3 and len(kernel.fast_calls) == 1


# A Sequence (a whole call's recorded launches, tests/test_eager_plans.py for its callers): in fast
# mode the compiled kernel's launcher receives every argument in order, scratch as addresses in one
# buffer; without handles each launch takes Triton's path with scratch tensors.

def test_a_sequence_launches_sources_by_position_and_scratch_in_one_buffer(kernel):
    x, out = torch.zeros(64), torch.zeros(8)
    s1, s2 = torch.empty(10), torch.empty(3, dtype=torch.int32)
    with fast_launch.recording_step() as (records, scratch):
        fast_launch.launch(kernel, (4,), x, s1, 32, 0.5, A=5)
        fast_launch.note_scratch(s1, s2)
        fast_launch.launch(kernel, (2, 3), s1, out, 1, 0.25, A=6, num_warps=2)
        fast_launch.launch(kernel, (1,), s2, out, 48, 0.25, A=6)
    assert len(records) == 3 and len(kernel.slow_calls) == 3
    sequence = fast_launch.Sequence.of(records, (x, out), scratch, (out,))
    assert sequence is not None and sequence.fast and sequence.usable()
    x2, out2 = torch.zeros(64), torch.zeros(8)
    sequence((x2, out2))
    assert len(kernel.slow_calls) == 3
    first, second, third = kernel.fast_calls
    assert first[:9] == (4, 1, 1, 1000, "fn", "md", None, None, None)
    assert first[9] is x2 and first[11:] == (32, 0.5, 5, 7, 3)
    base = first[10]
    assert isinstance(base, int) and base % 16 == 0
    assert second[:3] == (2, 3, 1) and second[9] == base and second[10] is out2 and second[11:13] == (1, 0.25)
    # s2 past s1's 40 bytes, at the allocator's alignment.
    assert third[9] == base + 512 and third[10] is out2 and third[11] == 48
    # An output no launch writes, or a tensor that is neither source nor scratch: no plan.
    assert fast_launch.Sequence.of(records, (x, out, torch.zeros(1)), scratch, (torch.zeros(1),)) is None
    assert fast_launch.Sequence.of(records, (x, out), [], (out,)) is None
    # Outputs must be the last sources; run() allocates them in the recorded layout and launches.
    assert fast_launch.Sequence.of(records, (out, x), scratch, (out,)) is None
    x3 = torch.zeros(64)
    made = sequence.run((x3,))
    assert len(made) == 1 and made[0] is not out and made[0] is not out2
    assert made[0].shape == out.shape and made[0].dtype == out.dtype
    fourth, fifth, sixth = kernel.fast_calls[3:]
    assert fourth[9] is x3 and fifth[10] is made[0] and sixth[10] is made[0]
    with fast_launch.recording():
        assert not sequence.usable()


def test_a_sequence_without_handles_launches_through_triton_with_scratch_tensors(kernel, monkeypatch):
    x, out, s1 = torch.zeros(64), torch.zeros(8), torch.empty(4, 2)
    with fast_launch.recording_step() as (records, scratch):
        fast_launch.launch(kernel, (4,), x, s1, 32, 0.5, A=5)
        fast_launch.note_scratch(s1)
        fast_launch.launch(kernel, (2,), s1, out, 32, 0.5, A=5)
    monkeypatch.setattr(fast_launch, "enabled", False)     # as where the fast path does not fit
    sequence = fast_launch.Sequence.of(records, (x, out), scratch, (out,))
    assert not sequence.fast
    x2, out2 = torch.zeros(64), torch.zeros(8)
    sequence((x2, out2))
    (g1, a1, o1), (g2, a2, o2) = kernel.slow_calls[-2:]
    assert a1[0] is x2 and a2[1] is out2 and a1[1] is a2[0] and a1[1] is not s1
    assert a1[1].shape == (4, 2) and a1[1].dtype == torch.float32 and a1[2:] == (32, 0.5) and o1 == {"A": 5}


def _one(x_ptr, A=1):  # parsed by JITFunction, never run
    pass


def test_a_sequence_rebuilds_descriptors_on_new_sources_and_keeps_one_argument_launches(kernel):
    # The fast path picks each launch's arguments from one tuple of the call's
    # values: descriptors over a source rebuilt on the new source, constants
    # in place, empty scratch at an address of its own, a one-argument launch a tuple.
    from triton.tools.tensor_descriptor import TensorDescriptor

    one = Recorder.__new__(Recorder)
    JITFunction.__init__(one, _one)
    one.slow_calls, one.fast_calls = [], []
    one.signature = {p.name: "?" for p in one.params}
    base, out = torch.zeros(64, 64, dtype=torch.float16), torch.zeros(8)
    empty = torch.empty(0)
    with fast_launch.recording_step() as (records, scratch):
        fast_launch.launch(kernel, (1,), TensorDescriptor(base, [64, 64], [64, 1], [16, 64]), out, 32, 0.5, A=5)
        fast_launch.note_scratch(empty)
        fast_launch.launch(one, (3,), empty, A=2)
        fast_launch.launch(kernel, (2,), out, TensorDescriptor(base, [64, 64], [64, 1], [16, 64]), 16, 0.25, A=6)
    sequence = fast_launch.Sequence.of(records, (base, out), scratch, (out,))
    assert sequence is not None and sequence.fast
    base2, out2 = torch.zeros(64, 64, dtype=torch.float16), torch.zeros(8)
    sequence((base2, out2))
    first, third = kernel.fast_calls
    (second,) = one.fast_calls
    assert first[9].base is base2 and first[9].block_shape == [16, 64] and first[10] is out2
    assert first[11:] == (32, 0.5, 5, 7, 3)
    assert second[:4] == (3, 1, 1, 1000) and len(second) == 11 and isinstance(second[9], int) and second[10] == 2
    assert third[9] is out2 and third[10].base is base2 and third[10] is not first[9]
    assert third[11:] == (16, 0.25, 6, 7, 3)


def test_an_argument_picker_returns_a_tuple_for_any_number_of_arguments():
    # operator.itemgetter returns the item itself for one index and refuses none.
    values = (10, 20, 30)
    assert fast_launch._picker([])(values) == ()
    assert fast_launch._picker([2])(values) == (30,)
    assert fast_launch._picker([2, 0, 0])(values) == (30, 10, 10)


def test_a_sequence_refuses_an_output_it_would_allocate_with_other_strides(kernel):
    """run() allocates outputs contiguous from their shapes, while a launch's strides are constants
    of the plan: an output recorded with other strides would be written with the wrong ones."""
    x, wide = torch.zeros(64), torch.zeros(4, 4)
    out = wide.t()
    with fast_launch.recording_step() as (records, scratch):
        fast_launch.launch(kernel, (4,), x, out, 32, 0.5, A=5)
    assert fast_launch.Sequence.of(records, (x, out), scratch, (out,)) is None
    contiguous = torch.zeros(4, 4)
    with fast_launch.recording_step() as (records, scratch):
        fast_launch.launch(kernel, (4,), x, contiguous, 32, 0.5, A=5)
    assert fast_launch.Sequence.of(records, (x, contiguous), scratch, (contiguous,)) is not None
