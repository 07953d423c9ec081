"""Launch compiled Triton and Gluon kernels without re-binding every call.

``kernel[grid](*args, **options)`` binds and specialises every argument,
builds a cache-key string and looks the compiled kernel up again on every
call: 19 us of host time for a three-argument kernel on the H200's host, and
several times that for the attention kernels' twenty arguments and two
tensor descriptors, against 7 us for the compiled kernel's own launcher.
:func:`launch` keeps, per kernel, the compiled kernel that Triton chose for
each *specialisation key* and calls its launcher directly.

The key holds everything Triton's choice depends on, computed from the
arguments the same way Triton does: per tensor its dtype and whether its
address is 16-byte aligned; per integer whether it is 1, divisible by 16
and in int32 range; per tensor descriptor its dtype, box, layout, shape and
strides; the options (constexprs, warps, stages, dependent launch) by name;
the current device. Anything the key does not cover (another argument type,
a launch hook such as Proton's, the interpreter) takes Triton's own path.
A key finer than Triton's only costs a second entry for the same compiled
kernel; one coarser would launch a kernel specialised for other arguments,
so tests/test_fast_launch.py pins each component.

This leans on Triton internals that have been stable from 3.4 to 3.9
(``JITFunction.params``, ``CompiledKernel.run/function/packed_metadata``,
the launcher taking every parameter in signature order). Where they are
missing, or a compiled kernel's signature does not list exactly the
kernel's parameters, the kernel falls back to ``kernel[grid]`` with one
warning. ``MLA_DCP_FAST_LAUNCH=0`` turns the fast path off.

Below the compiled kernel's launcher, where its layout is Triton 3.6's (the
NVIDIA driver's ``_BASE_ARGS_FORMAT``, tensor descriptors expanded by a
closure around the C launcher), :func:`launch` calls the C launcher itself:
the Python wrapper's scratch allocation (none for these kernels) and its
per-launch encoding of every tensor descriptor (``cuTensorMapEncodeTiled``
behind a Python call, a few us each) go away. An encoded descriptor is a
function of its base address and of the fields the key already fixes, so
one is kept per (entry, descriptor, address). Other Triton versions call
the compiled kernel's launcher as before.

A :class:`Replay` repeats a recorded launch for callers that keep their own
plan keyed by everything :func:`launch` keys on but the pointers'
alignment, which its :class:`Bound` launch checks itself: the launchers'
plans (ops/launchers.py).
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import warnings

import torch

from triton.runtime.jit import JITFunction

from mla_dcp.ops import native

try:  # Triton >= 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None

__all__ = ["launch", "Bound", "Replay", "Sequence", "rebased", "recording", "recording_step", "note_scratch",
           "plan_cache", "keep", "enabled", "clear"]

enabled = os.environ.get("MLA_DCP_FAST_LAUNCH", "1") != "0" and _knobs is not None

# (id(kernel), device, argument keys, options) -> (run, function, packed metadata, the values of the
# parameters after the positional ones, compiled kernel). Kernels are module-level objects that live
# as long as the process, so their ids are stable (a JITFunction hashes its source's digest: slower).
_ENTRIES: dict = {}
# Kernels that take Triton's path (by id; value: why).
_SLOW: dict[int, str] = {}
_I32_MIN, _I32_MAX, _U64_HALF = -(1 << 31), (1 << 31) - 1, 1 << 63
_TENSOR = torch.Tensor


class _Unkeyed(Exception):
    """An argument the specialisation key does not cover."""


def clear() -> None:
    """Forget every cached compiled-kernel handle, and every plan kept by a
    launcher (the next launches bind again)."""
    _ENTRIES.clear()
    for plans in _PLANS:
        plans.clear()


# Launchers' plan caches (each from plan_cache()), emptied by clear().
_PLANS: list[dict] = []


def plan_cache() -> dict:
    """A new dict for a launcher's plans (its Bound launches), emptied by :func:`clear`."""
    plans: dict = {}
    _PLANS.append(plans)
    return plans


def keep(plans: dict, key, plan, limit: int) -> None:
    """``plans[key] = plan``, the cache emptied first once it holds ``limit`` plans (layouts that
    keep changing, a new batch size a call, start over rather than pile up)."""
    if len(plans) >= limit:
        plans.clear()
    plans[key] = plan


def _arg_key(arg):
    """The key of a non-tensor argument (:func:`launch` keys tensors inline)."""
    kind = type(arg)
    if kind is int:
        return arg == 1, arg & 15 == 0, _I32_MIN <= arg <= _I32_MAX, arg < _U64_HALF
    if kind is float or kind is bool or arg is None:
        return kind
    if _is_descriptor(arg):
        # A tensor descriptor (built afresh for each launch: nothing to memoise by identity).
        base = arg.base
        return (kind, base.dtype, not base.data_ptr() & 15, tuple(arg.block_shape), tuple(arg.shape),
                tuple(arg.strides), getattr(arg, "layout", None), getattr(arg, "padding", None),
                getattr(arg, "round_f32_to_tf32", None))
    raise _Unkeyed(kind.__name__)


def _hooked() -> bool:
    """Whether a launch hook (a profiler such as Proton) is installed: a
    callable, or since Triton 3.7 a non-empty ``HookChain``."""
    runtime = _knobs.runtime
    return bool(getattr(runtime.launch_enter_hook, "calls", runtime.launch_enter_hook)
                or getattr(runtime.launch_exit_hook, "calls", runtime.launch_exit_hook))


def _device_index() -> int:
    return torch.cuda.current_device()


def _current_stream(device: int) -> int:
    return torch._C._cuda_getCurrentRawStream(device)


# The bindings themselves where the build has them (each call is on the eager hot path; a Python
# frame around it costs more than it does), the functions above where it has not (a CPU build).
# torch._C._cuda_getDevice initialises CUDA lazily, as torch.cuda.current_device does.
_device_index = getattr(torch._C, "_cuda_getDevice", None) or _device_index
_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _current_stream


def _signature_names(compiled) -> list[str] | None:
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    return list(signature) if isinstance(signature, dict) else None


class _Entry:
    """A compiled kernel's launch for one specialisation key."""

    __slots__ = ("run", "function", "metadata", "tail", "compiled", "raw", "coop", "pdl", "descriptors", "encoded")

    def __init__(self, compiled, tail, nargs):
        run = compiled.run
        self.run, self.function, self.metadata = run, compiled.function, compiled.packed_metadata
        self.tail, self.compiled = tail, compiled
        self.raw, self.coop, self.pdl, self.descriptors = _raw_launcher(run, nargs)
        self.encoded: dict = {}

    def __call__(self, grid, stream, args):
        count = len(grid)
        gx, gy, gz = grid[0], grid[1] if count > 1 else 1, grid[2] if count > 2 else 1
        if self.raw is None:
            self.run(gx, gy, gz, stream, self.function, self.metadata, None, None, None, *args, *self.tail)
            return
        if self.descriptors:
            args = self._expanded(args)
        self.raw(gx, gy, gz, stream, self.function, self.coop, self.pdl, None, None, self.metadata, None, None, None,
                 *args, *self.tail)

    def _expanded(self, args):
        """``args`` with each tensor descriptor replaced by what the C launcher takes for it."""
        out = list(args)
        encoded = self.encoded
        for position, meta, make in reversed(self.descriptors):
            desc = args[position]
            key = (position, desc.base.data_ptr())
            fields = encoded.get(key)
            if fields is None:
                fields = make(desc, meta)
                if meta is not None:      # without metadata the fields hold the tensor itself: not kept
                    if len(encoded) >= _MAX_ENCODED:
                        encoded.clear()
                    encoded[key] = fields
            out[position:position + 1] = fields
        return out


# Encoded descriptors kept per entry (a layer's cache each, say) before the oldest are dropped.
_MAX_ENCODED = 256


def _raw_launcher(run, nargs: int):
    """(C launcher, cooperative, PDL, descriptors) where ``run`` has Triton 3.6's
    layout and needs no scratch memory; (None, ...) otherwise (call ``run``).

    ``descriptors``: (position, metadata, encoder) of each tensor descriptor
    parameter, all among the ``nargs`` positional arguments."""
    none = (None, None, None, ())
    try:
        if run.global_scratch_size or run.profile_scratch_size or getattr(run, "num_ctas", 1) != 1:
            return none
        coop, pdl, launch = bool(run.launch_cooperative_grid), bool(run.launch_pdl), run.launch
        module = sys.modules.get(type(run).__module__)
        if getattr(module, "_BASE_ARGS_FORMAT", None) != _BASE_ARGS_FORMAT:
            return none
        code = getattr(launch, "__code__", None)
        if code is None:              # the C launcher itself: no descriptor parameter
            return launch, coop, pdl, ()
        if code.co_freevars != ("launcher", "tensordesc_indices", "tensordesc_meta"):
            return none
        cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in launch.__closure__)))
        make = launch.__globals__.get("make_tensordesc_arg")
        indices, metas = sorted(cells["tensordesc_indices"]), cells["tensordesc_meta"]
        if (make is None or make.__code__.co_argcount != 2 or len(metas) != len(indices)
                or (indices and indices[-1] >= nargs)):
            return none
        return cells["launcher"], coop, pdl, tuple((i, meta, make) for i, meta in zip(indices, metas))
    except (AttributeError, TypeError, ValueError):
        return none


# The C launcher's leading arguments in Triton 3.6's NVIDIA driver: grid, stream, function,
# cooperative, PDL, two scratch buffers, metadata, launch metadata, two hooks.
_BASE_ARGS_FORMAT = "iiiKKppOOOOOO"


def _fill(kernel, key, grid, args, options):
    """Launch through Triton (compiling if needed); remember the compiled
    kernel's launcher for ``key``."""
    compiled = kernel[grid](*args, **options)
    if not hasattr(compiled, "packed_metadata"):   # not a compiled kernel's launch
        _SLOW[id(kernel)] = "no compiled kernel"
        return compiled
    try:
        params = kernel.params
        names = [p.name for p in params]
        if _signature_names(compiled) != names or len(args) > len(names):
            raise _Unkeyed("signature")
        tail = []
        for param in params[len(args):]:
            if param.name in options:
                tail.append(options[param.name])
            elif param.has_default:
                tail.append(param.default)
            else:
                raise _Unkeyed(f"no value for {param.name}")
        entry = _Entry(compiled, tuple(tail), len(args))
    except (_Unkeyed, AttributeError) as why:
        _SLOW[id(kernel)] = str(why)
        warnings.warn(f"mla_dcp: {getattr(kernel, '__name__', kernel)} launches through Triton's binder on every "
                      f"call (the fast path does not fit this Triton: {why})", RuntimeWarning, stacklevel=3)
        return compiled
    _ENTRIES[key] = entry
    return compiled


def _key(kernel, device, args, options):
    # Tensors inline (most arguments): a function call each costs more than the key itself.
    return (id(kernel), device,
            tuple([(a.dtype, not a.data_ptr() & 15) if type(a) is _TENSOR else _arg_key(a) for a in args]),
            tuple(options.items()))


def launch(kernel, grid: tuple, *args, **options):
    """``kernel[grid](*args, **options)``; repeated calls with the same
    specialisation key call the compiled kernel's launcher directly.

    ``args`` are the kernel's leading parameters in order, ``options`` the
    rest by name (constexprs, ``num_warps``, ``launch_pdl``, ...). Returns
    the compiled kernel, as ``kernel[grid]`` does."""
    if _RECORDS is not None:
        _RECORDS.append((kernel, grid, args, options))
    if not enabled or id(kernel) in _SLOW or _hooked():
        return kernel[grid](*args, **options)
    if not isinstance(kernel, JITFunction):   # e.g. interpreted (TRITON_INTERPRET=1)
        _SLOW[id(kernel)] = "not a JITFunction"
        return kernel[grid](*args, **options)
    try:
        device = _device_index()
        key = _key(kernel, device, args, options)
        entry = _ENTRIES.get(key)
    except (_Unkeyed, TypeError):  # TypeError: an unhashable option
        return kernel[grid](*args, **options)
    if entry is None:
        return _fill(kernel, key, grid, args, options)
    entry(grid, _current_stream(device), args)
    return entry.compiled


# Where recording() collects launch() calls; None outside it.
_RECORDS: list | None = None


@contextlib.contextmanager
def recording():
    """Collect the (kernel, grid, args, options) of every :func:`launch` made
    inside the block (they still launch; an enclosing block sees them too)."""
    global _RECORDS
    outer, records = _RECORDS, []
    _RECORDS = records
    try:
        yield records
    finally:
        _RECORDS = outer
        if outer is not None:
            outer.extend(records)


# Where note_scratch() collects a recorded call's own buffers; None outside recording_step().
_NOTED: list | None = None


def note_scratch(*tensors) -> None:
    """Mark ``tensors`` as buffers a launcher allocated for its own later
    launches in the call being recorded (partials its merge consumes, never
    returned): a :class:`Sequence` may allocate them afresh, in one buffer."""
    if _NOTED is not None:
        _NOTED.extend(tensors)


@contextlib.contextmanager
def recording_step():
    """:func:`recording`, and the buffers :func:`note_scratch` marks in the
    block: yields (records, scratch)."""
    global _NOTED
    outer, noted = _NOTED, []
    _NOTED = noted
    try:
        with recording() as records:
            yield records, noted
    finally:
        _NOTED = outer
        if outer is not None:
            outer.extend(noted)


class Bound:
    """One kernel's launch with fixed grid, options and argument layout, made
    after a :func:`launch` of it (whose compiled kernel it then reuses). The
    caller's plan key must fix everything
    :func:`launch` keys on except the pointers' alignment (argument types,
    dtypes, integer values' classes, descriptor fields, options, device);
    a call checks the alignment of every tensor and descriptor base itself,
    and the current device, and takes :func:`launch` where either differs or
    a hook is installed."""

    __slots__ = ("kernel", "grid", "options", "entry", "device", "pointers", "aligned", "compiled")

    def __init__(self, kernel, grid, args, options):
        self.kernel, self.grid, self.options = kernel, grid, options
        self.compiled = self.entry = self.device = None
        self.pointers = tuple(i for i, a in enumerate(args) if type(a) is _TENSOR or _is_descriptor(a))
        self.aligned = _alignment(args, self.pointers)
        if (enabled and id(kernel) not in _SLOW and isinstance(kernel, JITFunction)
                and all(type(a) in _PLAIN for a in args if not _is_descriptor(a))):
            try:
                self.device = _device_index()
                self.entry = _ENTRIES.get(_key(kernel, self.device, args, options))
            except (_Unkeyed, TypeError):
                pass
        if self.entry is not None:
            self.compiled = self.entry.compiled

    def __call__(self, *args):
        entry = self.entry
        if (entry is None or _hooked() or _alignment(args, self.pointers) != self.aligned
                or _device_index() != self.device or not enabled):
            return launch(self.kernel, self.grid, *args, **self.options)
        if _RECORDS is not None:
            _RECORDS.append((self.kernel, self.grid, args, self.options))
        entry(self.grid, _current_stream(self.device), args)
        return self.compiled


# What a bound launch's arguments may be besides tensor descriptors (a tensor subclass takes launch()).
_PLAIN = (_TENSOR, int, float, bool, type(None))


def _is_descriptor(arg) -> bool:
    return hasattr(arg, "block_shape") and hasattr(arg, "base")


def _alignment(args, positions) -> tuple:
    return tuple([not (a.data_ptr() if type(a) is _TENSOR else a.base.data_ptr()) & 15
                  for a in map(args.__getitem__, positions)])


class Replay:
    """A recorded launch (:func:`recording`) repeated for another call of the
    same plan: each argument is rebuilt from the call's *sources* (the
    tensors and floats it was found to be, by identity and by value), a
    descriptor over a source is rebuilt on the new source with the same
    fields, and every other argument (integers, flags) is a constant of the
    plan, so the plan's key must fix them (shapes, strides, sizes).

    ``Replay.of`` returns None where a launch does not fit: not exactly one
    launch, or a tensor or float that is not a source (a copy the launcher
    made, say)."""

    __slots__ = ("bound", "index", "descriptors", "constants")

    def __init__(self, bound, index, descriptors, constants):
        self.bound, self.index, self.descriptors, self.constants = bound, index, descriptors, constants

    @classmethod
    def of(cls, records, sources: tuple) -> "Replay | None":
        if len(records) != 1:
            return None
        kernel, grid, args, options = records[0]
        index, descriptors, constants = [], [], []
        count = len(sources)
        for arg in args:
            kind = type(arg)
            if kind is _TENSOR or kind is float:
                found = next((i for i, s in enumerate(sources)
                              if (s is arg if kind is _TENSOR else type(s) is float and s == arg)), None)
                if found is None:
                    return None
                index.append(found)
            elif _is_descriptor(arg):
                found = next((i for i, s in enumerate(sources) if s is arg.base), None)
                if found is None or type(arg.base) is not _TENSOR:
                    return None
                fields = {k: v for k, v in vars(arg).items() if k != "base"}
                index.append(-1 - len(descriptors))
                descriptors.append((type(arg), found, fields))
            elif kind in (int, bool) or arg is None:
                index.append(count + len(constants))
                constants.append(arg)
            else:
                return None
        return cls(Bound(kernel, grid, args, options), tuple(index), tuple(descriptors),
                   tuple(constants))

    def arguments(self, sources: tuple) -> list:
        """The launch's arguments for ``sources``."""
        values = sources + self.constants
        built = [rebased(kind, fields, sources[at]) for kind, at, fields in self.descriptors]
        return [values[i] if i >= 0 else built[-1 - i] for i in self.index]

    def __call__(self, sources: tuple):
        """Launch for ``sources``; returns the compiled kernel (as :func:`launch`)."""
        return self.bound(*self.arguments(sources))


def rebased(kind, fields: dict, base):
    """A descriptor of ``kind`` with ``fields`` over ``base`` (validated when the fields were)."""
    desc = object.__new__(kind)
    desc.__dict__.update(fields)
    desc.base = base
    return desc


def _picker(indices: list):
    """A function of a tuple returning the tuple of its items at ``indices``
    (``operator.itemgetter`` returns the item itself for one index, and takes no empty list)."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        only = indices[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*indices)


# Each scratch buffer's offset in a Sequence's one allocation: the caching
# allocator's own alignment, so an offset buffer is as aligned as an allocated one.
_SCRATCH_ALIGN = 512


class Sequence:
    """A whole call's recorded launches (:func:`recording_step`) repeated for a
    later call of the same plan: an eager step's host time is mostly its
    layers, allocations and launches, so a caller that keys a plan by every
    fact its call's choices read (shapes, strides, dtypes, devices, alignment
    and static arguments) runs all of its launches from here.

    Each launch argument is one of the call's *sources* (by identity: inputs
    and outputs, which the caller passes in a fixed order), a descriptor over
    a source (rebuilt with the same fields), a scratch buffer the launchers
    marked (:func:`note_scratch`), or a constant of the plan (integers,
    flags, floats: the key fixes them). Where every launch has a compiled
    kernel's handle, a call allocates its scratch buffers as one and passes
    their addresses; otherwise (the interpreter, a hook, another Triton) each
    launch takes :func:`launch` with scratch tensors of the recorded layouts.

    ``Sequence.of`` returns None where a call does not fit: no launch, a
    tensor argument that is neither a source nor marked scratch (a copy a
    launcher made, say), outputs that are not the last sources or that no
    launch writes, outputs or scratch that are not contiguous. :meth:`run` allocates
    the outputs (the recorded layouts) and launches."""

    __slots__ = ("launches", "scratch", "offsets", "nbytes", "device", "torch_device", "fast", "outputs",
                 "descriptors", "constants", "pickers", "native", "native_tried", "separate")

    @classmethod
    def of(cls, records, sources: tuple, scratch, outputs: tuple) -> "Sequence | None":
        if not records:
            return None
        scratch = list({id(t): t for t in scratch}.values())
        if any(type(t) is not _TENSOR or not t.is_contiguous() for t in scratch):
            return None
        count = len(sources)
        where = {id(s): i for i, s in enumerate(sources) if type(s) is _TENSOR}
        where.update({id(t): count + j for j, t in enumerate(scratch)})
        launches, seen = [], set()
        for kernel, grid, args, options in records:
            template = []
            for arg in args:
                kind = type(arg)
                if kind is _TENSOR:
                    at = where.get(id(arg))
                    if at is None:
                        return None
                    seen.add(at)
                    template.append((0, at))
                elif _is_descriptor(arg):
                    at = where.get(id(arg.base))
                    if at is None or at >= count or type(arg.base) is not _TENSOR:
                        return None
                    template.append((1, (type(arg), at, {k: v for k, v in vars(arg).items() if k != "base"})))
                elif kind in (int, bool, float) or arg is None:
                    template.append((2, arg))
                else:
                    return None
            launches.append([kernel, tuple(grid), options, None, tuple(template)])
        # Outputs are allocated afresh from their shapes (contiguous): a recorded one of other
        # strides would be launched on with the recorded strides as constants.
        if (len(outputs) > count or any(s is not t for s, t in zip(sources[count - len(outputs):], outputs))
                or any(where.get(id(t)) not in seen or not t.is_contiguous() for t in outputs)):
            return None
        plan = object.__new__(cls)
        plan.launches, plan.scratch = launches, [(t.shape, t.dtype) for t in scratch]
        plan.outputs = tuple((t.shape, t.dtype) for t in outputs)
        offsets, nbytes = [], 0
        for t in scratch:
            offsets.append(nbytes)
            nbytes += -(-t.numel() * t.element_size() // _SCRATCH_ALIGN) * _SCRATCH_ALIGN
        plan.offsets, plan.nbytes = tuple(offsets), nbytes
        plan.torch_device = next(s.device for s in sources if type(s) is _TENSOR)
        plan.device = plan.fast = plan.native = None
        plan.native_tried = False
        # Each output its own allocation in the native plan: what an op returns may alias nothing
        # (torch.compile checks); a caller whose outputs are its own (the API) may set False: one
        # block for all of a call's outputs, one allocation fewer each.
        plan.separate = True
        if enabled and all(isinstance(r[0], JITFunction) and id(r[0]) not in _SLOW for r in records):
            try:
                device = _device_index()
                entries = [_ENTRIES.get(_key(kernel, device, args, options)) for kernel, _, args, options in records]
            except (_Unkeyed, TypeError):
                entries = [None]
            if all(e is not None for e in entries):
                for _launch, entry in zip(launches, entries):
                    _launch[3] = entry
                plan.device, plan.fast = device, True
                plan._pick(count + len(scratch))
        return plan

    def _pick(self, sourced: int) -> None:
        """The fast path's argument tuples, one C call a launch: a call lays out
        ``sources + scratch addresses + rebuilt descriptors + constants`` once,
        and each launch's ``operator.itemgetter`` takes its arguments from it
        (building each launch's list argument by argument cost ~2 us a launch
        of 20 arguments, most of the plan's own Python)."""
        descriptors, constants, positions = [], [], []
        for _kernel, _grid, _options, _entry, template in self.launches:
            at = []
            for kind, value in template:
                if kind == 0:
                    at.append((0, value))
                elif kind == 1:
                    at.append((1, len(descriptors)))
                    descriptors.append(value)
                else:
                    at.append((2, len(constants)))
                    constants.append(value)
            positions.append(at)
        # Where each kind starts in the call's values.
        start = (0, sourced, sourced + len(descriptors))
        self.pickers = tuple(_picker([start[kind] + i for kind, i in at]) for at in positions)
        self.descriptors = tuple(descriptors)
        self.constants = tuple(constants)

    def usable(self) -> bool:
        """Whether this call may take the plan: no launch hook, not inside a
        recording, and (for handles) the fast path on and the plan's device current."""
        if _RECORDS is not None or _hooked():
            return False
        return not self.fast or (enabled and _device_index() == self.device)

    def make_native(self, sources: tuple, inputs: int) -> None:
        """Once the native module has built: this plan in C++ (ops/native.py), made from a call's
        ``sources`` (which the caller's key matched to the recorded ones; the first ``inputs`` are
        its inputs, the rest its outputs), allocating as :attr:`separate` says."""
        if native.module() is not None:
            self.native_tried = True
            self.native = native.plan_of(self, sources, inputs, rebased)
            if self.separate and self.native is not None:
                self.native.allocation = native.SEPARATE

    def run_native(self, inputs: tuple):
        """The outputs of the native plan's call for ``inputs``, or None: no native plan (yet), a layout
        it refuses, or a call that may not take it (see :meth:`usable`). Its own checks of every
        input's layout make it safe under a key coarser than the Sequence's."""
        planned = self.native
        if (planned is None or not native.enabled or _RECORDS is not None or _hooked()
                or _device_index() != self.device):
            return None
        return planned.run(_current_stream(self.device), inputs)

    def run(self, inputs: tuple) -> tuple:
        """Allocate the outputs and launch for ``inputs + outputs`` (the caller checked :meth:`usable`)."""
        planned = self.native
        if planned is not None and native.enabled:
            outputs = planned.run(_current_stream(self.device), inputs)
            if outputs is not None:
                return outputs
        device = self.torch_device
        outputs = tuple([torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs])
        self(inputs + outputs)
        if self.fast and not self.native_tried and native.enabled:
            self.make_native(inputs + outputs, len(inputs))
        return outputs

    def __call__(self, sources: tuple) -> None:
        """Launch every recorded launch for ``sources`` from Python (the caller checked :meth:`usable`)."""
        if self.fast:
            values = sources
            # Held until every launch is enqueued (the allocator may hand a freed block out again).
            buffer = (torch.empty(self.nbytes, dtype=torch.uint8, device=self.torch_device)
                      if self.nbytes else None)
            base = 0 if buffer is None else buffer.data_ptr()
            values += tuple([base + offset for offset in self.offsets])
            if self.descriptors:
                values += tuple([rebased(kind, fields, sources[at]) for kind, at, fields in self.descriptors])
            values += self.constants
            stream = _current_stream(self.device)
            for (_kernel, grid, _options, entry, _template), pick in zip(self.launches, self.pickers):
                entry(grid, stream, pick(values))
            del buffer
            return
        device = self.torch_device
        values = sources + tuple([torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.scratch])
        for kernel, grid, options, _entry, template in self.launches:
            launch(kernel, grid, *[v if k == 2 else values[v] if k == 0 else rebased(v[0], v[2], values[v[1]])
                                   for k, v in template], **options)
