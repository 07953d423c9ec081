"""Dtype, layout and device facts every layer shares (a leaf: imports nothing of mla_dcp)."""

from __future__ import annotations

import torch

FP8_DTYPES = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name))


_CAPABILITIES: dict[int | None, tuple[int, int]] = {}


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """A CUDA device's compute capability, asked once per device: the query
    costs ~6 us of host time, and launches and input checks need it per call."""
    if device.index not in _CAPABILITIES:
        _CAPABILITIES[device.index] = torch.cuda.get_device_capability(device)
    return _CAPABILITIES[device.index]


def forget_capabilities() -> None:
    _CAPABILITIES.clear()


def layout_facts(t: torch.Tensor) -> tuple:
    """What a plan keys a tensor on: its layout, and whether its address is
    16-byte aligned (Triton specialises on that; a replayed launch passes
    the new address)."""
    return t.shape, t.stride(), t.dtype, t.device, not t.data_ptr() & 15


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def require_kernel_layout(q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    """Kernels address the cache as one row per token slot: the last dims
    contiguous, blocks evenly strided (a view of [num_slots, Dqk])."""
    if q.stride(-1) != 1:
        raise ValueError(f"q must be contiguous in its last dim, got strides {tuple(q.stride())}")
    if kv_cache.stride(-1) != 1 or kv_cache.stride(0) != kv_cache.shape[1] * kv_cache.stride(1):
        raise ValueError(
            f"kv_cache must be contiguous in its last dim with blocks evenly strided "
            f"(stride(0) == block_size * stride(1)), got strides {tuple(kv_cache.stride())}")
