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
"""

from __future__ import annotations

import os
import warnings

import torch

from triton.runtime.jit import JITFunction

try:  # Triton >= 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover
    _knobs = None

__all__ = ["launch", "enabled", "clear"]

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
    """Forget every cached compiled-kernel handle (the next launches bind again)."""
    _ENTRIES.clear()


def _arg_key(arg):
    """The key of a non-tensor argument (:func:`launch` keys tensors inline)."""
    kind = type(arg)
    if kind is int:
        return arg == 1, arg & 15 == 0, _I32_MIN <= arg <= _I32_MAX, arg < _U64_HALF
    if kind is float or kind is bool or arg is None:
        return kind
    if hasattr(arg, "block_shape") and hasattr(arg, "base"):
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


def _signature_names(compiled) -> list[str] | None:
    signature = getattr(getattr(compiled, "src", None), "signature", None)
    return list(signature) if isinstance(signature, dict) else None


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
        entry = (compiled.run, compiled.function, compiled.packed_metadata, tuple(tail), compiled)
    except (_Unkeyed, AttributeError) as why:
        _SLOW[id(kernel)] = str(why)
        warnings.warn(f"mla_dcp: {getattr(kernel, '__name__', kernel)} launches through Triton's binder on every "
                      f"call (the fast path does not fit this Triton: {why})", RuntimeWarning, stacklevel=3)
        return compiled
    _ENTRIES[key] = entry
    return compiled


def launch(kernel, grid: tuple, *args, **options):
    """``kernel[grid](*args, **options)``; repeated calls with the same
    specialisation key call the compiled kernel's launcher directly.

    ``args`` are the kernel's leading parameters in order, ``options`` the
    rest by name (constexprs, ``num_warps``, ``launch_pdl``, ...). Returns
    the compiled kernel, as ``kernel[grid]`` does."""
    if not enabled or id(kernel) in _SLOW or _hooked():
        return kernel[grid](*args, **options)
    if not isinstance(kernel, JITFunction):   # e.g. interpreted (TRITON_INTERPRET=1)
        _SLOW[id(kernel)] = "not a JITFunction"
        return kernel[grid](*args, **options)
    try:
        device = _device_index()
        # Tensors inline (most arguments): a function call each costs more than the key itself.
        key = (id(kernel), device,
               tuple([(a.dtype, not a.data_ptr() & 15) if type(a) is _TENSOR else _arg_key(a) for a in args]),
               tuple(options.items()))
        entry = _ENTRIES.get(key)
    except (_Unkeyed, TypeError):  # TypeError: an unhashable option
        return kernel[grid](*args, **options)
    if entry is None:
        return _fill(kernel, key, grid, args, options)
    run, function, metadata, tail, compiled = entry
    count = len(grid)
    run(grid[0], grid[1] if count > 1 else 1, grid[2] if count > 2 else 1, _current_stream(device), function,
        metadata, None, None, None, *args, *tail)
    return compiled
