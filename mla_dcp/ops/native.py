"""Recorded launch sequences replayed from C++ (``native_plans.cpp``).

A :class:`~mla_dcp.ops.fast_launch.Sequence` already launches a repeated
call's kernels by position, but each of its operations is still a Python
call: the outputs' and scratch buffer's ``torch.empty``, the argument tuple
of every launch, and Triton's C launcher parsing that tuple again (with a
driver query per pointer). :func:`plan_of` turns a Sequence whose launches
all have Triton 3.6's launcher layout into one C++ object whose ``run`` does
the whole call: checks each input's layout against the recorded one,
allocates the outputs from the caching allocator (in one block, or one allocation an output:
:data:`SEPARATE`), and calls ``cuLaunchKernelEx``
for every launch with the parameters laid out as Triton's launcher lays them
out (derived below from each compiled kernel's signature). A layout that
differs returns None and the caller takes the Python path.

The module compiles on first use, in a background thread (about 20 s with a
C++ compiler, torch's headers and the ``cuda.h`` Triton ships; no CUDA
toolkit), into a per-user cache keyed by the source's and torch's versions;
until it is ready, or where it cannot build (the first failure warns once),
every call takes the Python path. ``MLA_DCP_NATIVE=0`` turns it off;
:func:`wait` blocks until the build has finished (tests, benchmarks).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import pathlib
import re
import struct
import subprocess
import sys
import sysconfig
import tempfile
import threading
import warnings

import torch

__all__ = ["enabled", "module", "wait", "error", "plan_of", "parameter_layout", "refusals", "SEPARATE"]

enabled = os.environ.get("MLA_DCP_NATIVE", "1") != "0"

_SOURCE = pathlib.Path(__file__).with_name("native_plans.cpp")
# Plan.allocation: one allocation an output, from the recorded allocator (2, the default: one block
# for all of a call's outputs; 0: at::empty each).
SEPARATE = 1
_LOCK = threading.Lock()
_STATE: dict = {"module": None, "thread": None, "error": None}


def _cuda_include() -> str:
    """The directory of the ``cuda.h`` Triton's NVIDIA backend ships (the driver API's declarations)."""
    import triton.backends.nvidia as nvidia

    path = pathlib.Path(nvidia.__file__).parent / "include"
    if not (path / "cuda.h").is_file():
        raise FileNotFoundError(f"no cuda.h under {path}")
    return str(path)


def _cache_dir() -> pathlib.Path:
    root = os.environ.get("MLA_DCP_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mla_dcp")
    return pathlib.Path(root)


def _module_name() -> str:
    """The module's name: keyed by its source's, torch's and Python's versions."""
    digest = hashlib.sha256(_SOURCE.read_bytes() + torch.__version__.encode() + sys.version.encode()).hexdigest()
    return f"mla_dcp_native_{digest[:16]}"


def _build():
    """Compile (or find compiled) and import the module."""
    name = _module_name()
    target = _cache_dir() / (name + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        # One build at a time per cache (a DCP job's ranks start together): the others wait for it
        # and load its module. An OS lock, released if its holder dies mid-build.
        with open(target.parent / (name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.is_file():
                # Half-written modules of builds whose process exited mid-build (the build's thread
                # dies with it): only the lock's holder writes one.
                for stale in target.parent.glob(name + ".*.partial"):
                    stale.unlink(missing_ok=True)
                _compile(name, target)
    loader = importlib.machinery.ExtensionFileLoader(name, str(target))
    spec = importlib.util.spec_from_file_location(name, str(target), loader=loader)
    built = importlib.util.module_from_spec(spec)
    loader.exec_module(built)
    return built


def _compile(name: str, target: pathlib.Path) -> None:
    """Compile the module into ``target`` (the caller holds the build lock)."""
    from torch.utils import cpp_extension

    compiler = os.environ.get("CXX", "c++")
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"], _cuda_include()]
    libs = cpp_extension.library_paths()
    flags = [f"-DTORCH_EXTENSION_NAME={name}", "-DTORCH_API_INCLUDE_EXTENSION_H", "-O2", "-fPIC", "-shared",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    links = [*(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs), "-lc10", "-ltorch_cpu", "-ltorch",
             "-ltorch_python", "-ldl"]
    # A unique name, renamed into place: concurrent builds (several processes) never see half a file.
    handle, partial = tempfile.mkstemp(prefix=name + ".", suffix=".partial", dir=target.parent)
    os.close(handle)
    try:
        errors = []
        for standard in ("-std=c++20", "-std=c++17"):     # torch's headers want 17 (2.6) or 20 (2.13)
            done = subprocess.run([compiler, standard, *flags, *(f"-isystem{p}" for p in includes), str(_SOURCE),
                                   "-o", partial, *links], capture_output=True, text=True)
            if done.returncode == 0:
                break
            errors.append(done.stderr[-2000:])
        else:
            raise RuntimeError(f"{compiler} failed:\n" + "\n".join(errors))
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def _target() -> None:
    try:
        built = _build()
    except Exception as why:   # no compiler, no headers, no Triton backend: the Python path serves
        _STATE["error"] = f"{type(why).__name__}: {why}"
        warnings.warn(f"mla_dcp: eager calls take the Python launch path (the native plans did not build: "
                      f"{_STATE['error'][:500]})", RuntimeWarning, stacklevel=2)
        return
    _STATE["module"] = built


def module(start: bool = True):
    """The compiled module, or None: while it builds (the first call starts the
    build in a background thread), where it cannot build, or when disabled."""
    built = _STATE["module"]
    if built is not None or not enabled:
        return built
    if start and _STATE["thread"] is None:
        with _LOCK:
            if _STATE["thread"] is None:
                thread = threading.Thread(target=_target, name="mla_dcp-native-build", daemon=True)
                _STATE["thread"] = thread
                thread.start()
    return None


def wait(timeout: float | None = None):
    """Start the build if need be and wait for it; the module, or None (see :func:`error`)."""
    module()
    thread = _STATE["thread"]
    if thread is not None:
        thread.join(timeout)
    return _STATE["module"]


def error() -> str | None:
    """Why the module did not build (None: it built, or has not finished)."""
    return _STATE["error"]


# Bytes and packing of each scalar parameter type Triton's NVIDIA launcher knows.
_SCALARS = {"i1": (1, "b"), "i8": (1, "b"), "i16": (2, "h"), "i32": (4, "i"), "i64": (8, "q"), "u1": (1, "B"),
            "u8": (1, "B"), "u16": (2, "H"), "u32": (4, "I"), "u64": (8, "Q"), "fp16": (2, "e"), "fp32": (4, "f"),
            "f32": (4, "f"), "fp64": (8, "d")}
_DESCRIPTOR = re.compile(r"tensordesc<[^[>]*\[([^]]*)\]")
_SOURCE_KIND, _SCRATCH_KIND, _CONSTANT_KIND, _DESCRIPTOR_KIND = 0, 1, 2, 3
# Why plan_of last refused a sequence, by the name of the kernel it refused on: which calls
# stay on the Python path, for whoever profiles them.
refusals: dict = {}


class _Unfit(Exception):
    """A launch whose parameters this module does not lay out."""


def _constant(ty: str, value) -> tuple:
    if ty[0] == "*":
        if value is None or (type(value) is int and 0 <= value < 1 << 64):
            return (_CONSTANT_KIND, 8, value or 0)
        raise _Unfit(f"pointer parameter given {type(value).__name__}")
    if ty == "bf16":
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0] >> 16
        return (_CONSTANT_KIND, 2, bits)
    if ty not in _SCALARS:
        raise _Unfit(f"parameter type {ty}")
    size, code = _SCALARS[ty]
    if value is None or (code in "efd" and type(value) not in (int, float, bool)):
        raise _Unfit(f"{ty} parameter given {type(value).__name__}")
    packed = struct.pack("<" + code, value if code in "efd" else int(value))
    return (_CONSTANT_KIND, size, int.from_bytes(packed, "little"))


def parameter_layout(signature: list, items: list, descriptor_meta: list) -> list:
    """The kernel parameters, in the order Triton 3.6's NVIDIA launcher passes
    them, of one launch: ``signature`` the compiled kernel's parameter types
    (``compiled.src.signature``'s values), ``items`` what each parameter is,
    as ``("tensor", index)`` (an index the caller resolves to a source or the
    scratch buffer), ``("descriptor", index, fields)`` (the shape and strides
    the launcher passes after the map) or ``("constant", value)``; ``descriptor_meta`` the kernel's tensor-descriptor
    metadata, one per descriptor parameter, in order. Returns
    ``[(kind, size, value)]``: what :class:`Plan.add_launch` takes, with
    tensors still as ``("tensor", index)``. Raises ``_Unfit`` where a
    parameter is of a kind this does not lay out.

    Triton 3.6 expands a tensor descriptor with metadata into its encoded map
    (128 bytes), then its shape as i32 and strides as i64; skips constexprs;
    and ends every launch with two null scratch pointers."""
    if len(signature) != len(items):
        raise _Unfit(f"{len(items)} values for {len(signature)} parameters")
    layout, descriptors = [], 0
    for ty, item in zip(signature, items):
        if not isinstance(ty, str):
            raise _Unfit("a tuple parameter")
        if ty == "constexpr":
            continue
        if ty.startswith("tensordesc"):
            meta = descriptor_meta[descriptors] if descriptors < len(descriptor_meta) else None
            descriptors += 1
            match = _DESCRIPTOR.match(ty)
            if meta is None or match is None or item[0] != "descriptor":
                raise _Unfit("a tensor descriptor without Triton's metadata")
            ndim = match.group(1).count(",") + 1
            _, index, fields = item
            if len(fields) != 2 * ndim:
                raise _Unfit("a descriptor's rank")
            layout.append(("descriptor", index))
            layout += [_constant("i32", s) for s in fields[:ndim]] + [_constant("i64", s) for s in fields[ndim:]]
        elif item[0] == "tensor":
            if ty[0] != "*":
                raise _Unfit(f"a tensor for a {ty} parameter")
            layout.append(item)
        elif item[0] == "constant":
            layout.append(_constant(ty, item[1]))
        else:
            raise _Unfit(f"a {item[0]} for a {ty} parameter")
    if descriptors != len(descriptor_meta):
        raise _Unfit("descriptor metadata does not match the signature")
    return layout + [(_CONSTANT_KIND, 8, 0), (_CONSTANT_KIND, 8, 0)]


def plan_of(sequence, sources: tuple, inputs: int, rebased):
    """A native plan of ``sequence`` (a fast :class:`~mla_dcp.ops.fast_launch.Sequence`)
    for calls like the one of ``sources`` (its key's layouts; the first
    ``inputs`` are the call's inputs, the rest its outputs), or None: the
    module is not built, or a launch does not fit (not Triton 3.6's launcher
    layout, a parameter kind it does not lay out). ``rebased(kind, fields,
    base)`` rebuilds a recorded descriptor over another base tensor."""
    built = module()
    if built is None or not sequence.fast:
        return None
    count = len(sources)
    kernel = None
    try:
        plan = built.Plan(sources, inputs, sequence.nbytes)
        for kernel, grid, _options, entry, template in sequence.launches:
            if entry.raw is None:
                raise _Unfit("not Triton 3.6's launcher")
            compiled = entry.compiled
            signature = list(compiled.src.signature.values())
            metas = {position: (meta, make) for position, meta, make in entry.descriptors}
            items = []
            for position, (kind, value) in enumerate(template):
                if kind == 0:
                    items.append(("tensor", value))
                elif kind == 1:
                    desc_kind, at, fields = value
                    meta, make = metas.get(position, (None, None))
                    if meta is None:
                        raise _Unfit("a descriptor without metadata")
                    # One encoder (and its maps) per descriptor argument: its own fields.
                    def encode(base, desc_kind=desc_kind, fields=fields, meta=meta, make=make):
                        return make(rebased(desc_kind, fields, base), meta)[0]
                    index = plan.add_descriptor(at, encode)
                    # What the launcher passes after the map (the shape as the kernel sees it, the strides).
                    made = make(rebased(desc_kind, fields, sources[at]), meta)
                    items.append(("descriptor", index, list(made[1:])))
                else:
                    items.append(("constant", value))
            items += [("constant", v) for v in entry.tail]
            layout = parameter_layout(signature, items, [m for _, m, _ in entry.descriptors])
            params = []
            for item in layout:
                if item[0] == "tensor":
                    at = item[1]
                    params.append((_SOURCE_KIND, 8, at) if at < count
                                  else (_SCRATCH_KIND, 8, sequence.offsets[at - count]))
                elif item[0] == "descriptor":
                    params.append((_DESCRIPTOR_KIND, 128, item[1]))
                else:
                    params.append(item)
            num_warps, num_ctas, shared = entry.metadata
            if num_ctas != 1:
                raise _Unfit("a cluster launch")
            grid = tuple(grid) + (1,) * (3 - len(grid))
            plan.add_launch(entry.function, grid, 32 * num_warps, shared, entry.pdl, entry.coop, params)
    except (_Unfit, AttributeError, TypeError, ValueError, KeyError, IndexError, struct.error) as why:
        name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", repr(kernel))
        if len(refusals) < 64:
            refusals[name] = f"{type(why).__name__}: {why}"
        return None
    return plan
