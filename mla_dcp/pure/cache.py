"""Writing new tokens into a rank's paged cache (DESIGN.md stage 1's placement, for writes).

A verify step's new tokens are the last ``qlen`` positions of each request,
``seq_lens[b] - qlen + t`` for row ``(b, t)``: global position ``p`` goes to
rank ``(p // I) % W`` at rank-local position ``j = (p // (W*I)) * I + p % I``,
slot ``block_table[b, j // block_size] * block_size + j % block_size``. Every
other rank skips it (slot -1), as it does a row before the request's first
position and a position at or past ``max_model_len``.
"""

from __future__ import annotations

import torch

from mla_dcp import _fp8_ds_mla
from mla_dcp.pure.placement import local_position, owner_rank

__all__ = ["cache_slots", "write_cache", "to_cache_dtype"]


def cache_slots(seq_lens: torch.Tensor, block_table: torch.Tensor, qlen: int, world: int, rank: int,
                interleave: int, block_size: int, max_model_len: int) -> torch.Tensor:
    """int64 [B*qlen]: the slot of row ``(b, t)``'s token in this rank's cache, -1 where another
    rank holds it, where it has no position (``seq_lens[b] < qlen - t``), where its position is
    ``max_model_len`` or more, or where its local position lies past the block table's columns."""
    batch = seq_lens.shape[0]
    t = torch.arange(qlen, device=seq_lens.device, dtype=torch.int64)
    positions = seq_lens.to(torch.int64)[:, None] - qlen + t[None, :]                 # [B, qlen]
    local = local_position(positions.clamp_min(0), world, interleave)
    column = torch.div(local, block_size, rounding_mode="floor")
    held = (positions >= 0) & (positions < max_model_len)
    held &= owner_rank(positions.clamp_min(0), world, interleave) == rank
    held &= column < block_table.shape[1]
    blocks = block_table.to(torch.int64).gather(1, column.clamp_max(max(block_table.shape[1] - 1, 0))) \
        if block_table.shape[1] else torch.zeros_like(column)
    slots = blocks * block_size + local % block_size
    return torch.where(held, slots, -1).reshape(batch * qlen)


def to_cache_dtype(latent: torch.Tensor, dtype: torch.dtype, kv_scale: torch.Tensor | None) -> torch.Tensor:
    """``latent`` as the cache stores it: divided by ``kv_scale`` and saturated to the format's
    largest finite value for an fp8 cache (an engine's e4m3 write; NaN stays NaN), else cast."""
    if kv_scale is None:
        return latent.to(dtype)
    limit = torch.finfo(dtype).max
    return (latent.float() / kv_scale.float()).clamp(-limit, limit).to(dtype)


def write_cache(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor,
                kv_scale: torch.Tensor | None = None) -> None:
    """Write ``latent`` [N, D] into ``kv_cache`` [num_blocks, block_size, D] at ``slots`` [N]
    (rows with slot -1 are skipped); in place. A uint8 cache holds DeepSeek's fp8 layout for sparse
    MLA (``mla_dcp._fp8_ds_mla``: e4m3 latent, a float32 scale per 128 values, bf16 rope)."""
    keep = slots >= 0
    flat = kv_cache.view(-1, kv_cache.shape[-1])
    if kv_cache.dtype == torch.uint8:
        # DeepSeek's fp8 layout for sparse MLA: e4m3 latent with a scale per 128 values, bf16 rope.
        latent_rank, _ = _fp8_ds_mla.split(kv_cache.shape[-1], latent.shape[-1])
        flat[slots[keep]] = _fp8_ds_mla.encode(latent[keep], latent_rank)
    elif kv_cache.element_size() == 1:
        # Indexed writes of fp8 tensors lack CPU kernels in some torch builds: write the bytes.
        flat.view(torch.uint8)[slots[keep]] = to_cache_dtype(latent[keep], kv_cache.dtype, kv_scale).view(torch.uint8)
    else:
        flat[slots[keep]] = to_cache_dtype(latent[keep], kv_cache.dtype, kv_scale)
