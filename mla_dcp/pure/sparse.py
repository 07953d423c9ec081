"""Token-sparse verify rows (DeepSeek Sparse Attention) in plain torch.

DeepSeek-V3.2's attention reads, for each query token, only the ``topk``
positions its indexer selected (each layer its own). A verify row ``(b, t)``
then attends to the positions listed in ``indices[b*q + t]`` (global token
positions, -1 for an unused entry) that lie in its window; under DCP each
rank reads the listed positions it holds and returns the usual partial
``(out, lse)``, merged across ranks by stage 5 as any other. The row's window
is the view's, and it still holds: a listed position at or past it is not
read, as the causal mask excludes it in the model's own attention (an indexer
asked for more positions than a short window has returns some past it).
"""

from __future__ import annotations

import math

import torch

from mla_dcp import _fp8_ds_mla
from mla_dcp.pure.attention import _gather_rows, gathered_attention
from mla_dcp.pure.paging import page_size_for
from mla_dcp.pure.placement import local_position, owner_rank

__all__ = ["sparse_attention"]


def sparse_attention(q: torch.Tensor, kv_cache: torch.Tensor, row_lens: torch.Tensor, page_table: torch.Tensor,
                     indices: torch.Tensor, *, qlen: int, world: int, rank: int, interleave: int, kv_lora_rank: int,
                     softmax_scale: float, kv_scale: torch.Tensor | None = None,
                     invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's attention of every verify row over the positions its indices list.

    Parameters
    ----------
    q : [B*qlen, H, Dl+Dr]
    kv_cache : [num_blocks, block_size, Dl+Dr], q's dtype or fp8 (with ``kv_scale``); or uint8
        [num_blocks, block_size, width] in DeepSeek's fp8 layout (``mla_dcp._fp8_ds_mla``)
    row_lens, page_table : the view's (int32 [B*qlen], int32 [B, max_pages])
        A listed position ``p`` held here is read at rank-local position
        ``j = local_position(p)`` if ``j < row_lens[row]`` (``p`` inside the
        row's window), and not at all otherwise.
    indices : int32 [B*qlen, topk]
        Global positions; negative entries list nothing. Each position at
        most once a row (a repeated one would count twice).
    invariant : bool
        Sums in an order fixed by the row alone (batch-invariant mode).

    Returns
    -------
    out [B*qlen, H, Dl] in q's dtype (0 for a row with no listed key here,
    NaN for a poisoned one) and lse float32 [B*qlen, H], natural log (-inf,
    NaN).
    """
    rows, heads, dim = q.shape
    page = page_size_for(kv_cache.shape[1])
    max_pages = page_table.shape[1]
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    ds_layout = kv_cache.dtype == torch.uint8
    value_scale = kv_scale.float().reshape(()) if kv_scale is not None else torch.ones((), device=q.device)

    def keys_of(sel: slice) -> tuple[torch.Tensor, torch.Tensor]:
        listed = indices[sel].long()                                                        # [r, K]
        request = torch.arange(sel.start, sel.stop, device=q.device) // qlen
        mine = (listed >= 0) & (owner_rank(listed.clamp(min=0), world, interleave) == rank)
        local = local_position(listed.clamp(min=0), world, interleave)
        seen = mine & (local < row_lens[sel].long()[:, None]) & (local < max_pages * page)
        pages = page_table[request].long().gather(1, (local // page).clamp(0, max(max_pages - 1, 0)))
        slots = torch.where(seen, pages * page + local % page, 0)
        if ds_layout:
            return _fp8_ds_mla.decode(flat[slots], kv_lora_rank, dim - kv_lora_rank), seen
        return _gather_rows(flat, slots), seen

    out, lse, poisoned = gathered_attention(q, keys_of, indices.shape[1], kv_lora_rank=kv_lora_rank,
                                            scale=softmax_scale * value_scale, value_scale=value_scale,
                                            invariant=invariant)
    # A row longer than the page table covers: a length past the static bound.
    poisoned |= (row_lens.long() > max_pages * page)[:, None]
    return (torch.where(poisoned[..., None], math.nan, out).to(q.dtype),
            torch.where(poisoned, math.nan, lse))
