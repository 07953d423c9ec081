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
from mla_dcp._dtypes import is_fp8
from mla_dcp.pure.attention import _exact_fn, _pairwise_sum
from mla_dcp.pure.paging import page_size_for
from mla_dcp.pure.placement import local_position, owner_rank

__all__ = ["sparse_attention"]

# Elements of the oracle's [rows, topk, D] gather at once (a top-2048 row of 576 columns is 1.2M).
_GATHER_ELEMENTS = 1 << 23


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
    out = torch.empty(rows, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=q.device)
    exp = (lambda x: _exact_fn(torch.exp, x)) if invariant else torch.exp                     # noqa: E731
    step = max(1, _GATHER_ELEMENTS // max(1, indices.shape[1] * dim * max(1, heads if invariant else 1)))
    for lo in range(0, rows, step):
        sel = slice(lo, min(lo + step, rows))
        listed = indices[sel].long()                                                        # [R, K]
        request = torch.arange(lo, sel.stop, device=q.device) // qlen
        mine = (listed >= 0) & (owner_rank(listed.clamp(min=0), world, interleave) == rank)
        local = local_position(listed.clamp(min=0), world, interleave)
        window = row_lens[sel].long()[:, None]
        seen = mine & (local < window) & (local < max_pages * page)
        pages = page_table[request].long().gather(1, (local // page).clamp(0, max(max_pages - 1, 0)))
        slots = torch.where(seen, pages * page + local % page, 0)
        if ds_layout:
            keys = _fp8_ds_mla.decode(flat[slots], kv_lora_rank, dim - kv_lora_rank)
        else:
            keys = (flat.view(torch.uint8)[slots].view(flat.dtype) if is_fp8(flat.dtype) else flat[slots]).float()
        queries = q[sel].float()                                                            # [R, H, D]
        if invariant:
            scores = _pairwise_sum(queries[:, :, None, :] * keys[:, None, :, :])            # [R, H, K]
        else:
            scores = torch.einsum("rhd,rkd->rhk", queries, keys)
        scores = scores * (softmax_scale * value_scale)
        visible = seen[:, None, :]
        poisoned = (visible & ~torch.isfinite(scores)).any(dim=-1)
        poisoned |= (row_lens[sel].long() > max_pages * page)[:, None]
        scores = torch.where(visible & torch.isfinite(scores), scores, -math.inf)
        top = scores.amax(dim=-1)
        weights = exp(scores - torch.where(top == -math.inf, 0.0, top)[..., None])
        total = _pairwise_sum(weights) if invariant else weights.sum(dim=-1)
        values = torch.where(visible.transpose(1, 2) & torch.isfinite(keys), keys, 0.0)[..., :kv_lora_rank]
        if invariant:
            summed = _pairwise_sum(weights[..., None, :] * values.transpose(1, 2)[:, None])
        else:
            summed = torch.einsum("rhk,rkd->rhd", weights, values)
        summed = summed * value_scale
        rows_out = torch.where(total[..., None] > 0, summed / total.clamp(min=1e-30)[..., None], 0.0)
        rows_lse = torch.where(total > 0, top + torch.log(total.clamp(min=1e-30)), -math.inf)
        out[sel] = torch.where(poisoned[..., None], math.nan, rows_out).to(q.dtype)
        lse[sel] = torch.where(poisoned, math.nan, rows_lse)
    return out, lse
