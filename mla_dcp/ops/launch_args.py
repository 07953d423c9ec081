"""Launch arguments every launcher shares (the Triton launchers and the
Gluon kernels' launch functions): programmatic dependent launch, the
attention kernels' output pointers. Host code only; imports no launcher, so
the kernel modules may use it without an import circle."""

from __future__ import annotations

import os

import torch

from mla_dcp._dtypes import cuda_capability as _capability
from mla_dcp._dtypes import forget_capabilities
from mla_dcp.ops import fast_launch
from mla_dcp.ops.triton_kernels import helpers as triton_helpers


def pdl_options(device: torch.device) -> dict:
    """Kernel arguments for programmatic dependent launch: on NVIDIA Hopper
    and later (compiled Triton), each kernel launches while the previous one
    in the stream finishes and waits for it in-kernel
    (triton_kernels.helpers.after_previous_kernel). ``MLA_DCP_PDL=0`` turns it off, e.g. to
    measure what it buys; like ``TRITON_INTERPRET``, it is read at a device's
    first launch (:func:`forget_devices` reads both again)."""
    options = _PDL_OPTIONS.get((device.type, device.index))
    if options is None:
        pdl = (device.type == "cuda" and torch.version.hip is None and os.environ.get("TRITON_INTERPRET") != "1"
               and triton_helpers.HAS_GRID_DEPENDENCY_CONTROL and os.environ.get("MLA_DCP_PDL", "1") != "0"
               and _capability(device)[0] >= 9)
        options = _PDL_OPTIONS[(device.type, device.index)] = {"PDL": pdl, "launch_pdl": pdl}
    return options


# Asked per launch: the environment reads cost ~3 us of host time.
_PDL_OPTIONS: dict[tuple[str, int | None], dict] = {}


def forget_devices() -> None:
    """Ask every device's capability and launch options again (the launchers'
    plans, made from them, too)."""
    forget_capabilities()
    _PDL_OPTIONS.clear()
    fast_launch.clear()


def kernel_outputs(outputs, finalize: bool):
    """The five output pointer arguments every attention kernel takes
    (seg_out, seg_max, seg_sum, out, lse) for ``outputs`` (the partials, or
    with ``finalize`` the merged pair), and the tensor passed for pointers a
    variant does not read."""
    unused = outputs[-1]
    return ((unused,) * 3 + tuple(outputs) if finalize else tuple(outputs) + (unused, unused)), unused
