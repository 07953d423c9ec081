"""Input validation of the public API: shapes, dtypes and devices only.

Nothing here reads a tensor's values, so validation never syncs the host
with the device and stays valid inside a captured CUDA graph.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mla_dcp.pure.attention import is_fp8

QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _shape_text(dims: Sequence[object]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def require_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def require_dtype(name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype], what: str | None = None) -> None:
    if tensor.dtype not in allowed:
        expected = what or " or ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must have dtype {expected}, got {tensor.dtype}")


def require_shape(name: str, tensor: torch.Tensor, expected: Sequence[object]) -> None:
    """``expected`` holds ints (exact) and strings (free, named in the message)."""
    ok = tensor.dim() == len(expected) and all(
        not isinstance(want, int) or have == want for have, want in zip(tensor.shape, expected))
    if not ok:
        raise ValueError(f"{name} must have shape {_shape_text(expected)}, got {list(tensor.shape)}")


def require_same_device(**tensors: torch.Tensor | None) -> None:
    present = {name: t for name, t in tensors.items() if t is not None}
    first_name, first = next(iter(present.items()))
    for name, tensor in present.items():
        if tensor.device != first.device:
            raise ValueError(
                f"{name} must be on the same device as {first_name} ({first.device}), got {tensor.device}")


def require_kv_scale(kv_scale: torch.Tensor | None, kv_cache: torch.Tensor) -> None:
    if kv_scale is None:
        if is_fp8(kv_cache.dtype):
            raise ValueError(
                f"kv_scale is required for an fp8 kv_cache ({kv_cache.dtype}): pass the float32 [1] "
                f"per-tensor dequantization scale, got None")
        return
    require_tensor("kv_scale", kv_scale)
    require_dtype("kv_scale", kv_scale, (torch.float32,))
    require_shape("kv_scale", kv_scale, [1])


def require_kernel_layout(q: torch.Tensor, kv_cache: torch.Tensor) -> None:
    """Kernels address the cache as one row per token slot: the last dims
    contiguous, blocks evenly strided (a view of [num_slots, Dqk])."""
    if q.stride(-1) != 1:
        raise ValueError(f"q must be contiguous in its last dim, got strides {tuple(q.stride())}")
    if kv_cache.stride(-1) != 1 or kv_cache.stride(0) != kv_cache.shape[1] * kv_cache.stride(1):
        raise ValueError(
            f"kv_cache must be contiguous in its last dim with blocks evenly strided "
            f"(stride(0) == block_size * stride(1)), got strides {tuple(kv_cache.stride())}")
