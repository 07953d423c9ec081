"""Masked verify blocks (token trees) in plain torch: the mask of a tree and the block's keys.

A masked block replaces the causal rule inside each request's verify block:
row ``t`` of request ``b`` sees every context key (global positions below
``L_b - qlen``) and the block's own keys ``j`` (position ``L_b - qlen + j``)
where ``mask[b, t, j]``. A token tree drafted EAGLE-style is the common case:
its nodes sit in the block in topological order, and a node sees its
ancestors and itself. The context goes through the ordinary non-causal
stages; the at most ``qlen`` block keys of a row are this module's
:func:`block_attention`, merged into the context's partial by stage 5's rule.
"""

from __future__ import annotations

import math

import torch

from mla_dcp.pure.attention import _gather_rows, gathered_attention, merge_ranks

__all__ = ["TREE_ROOT", "TREE_CONTEXT", "tree_mask", "block_attention"]

# ``parents`` entries of :func:`tree_mask` that are not a node's index.
TREE_ROOT = -1      # a node whose parent is the context (the block's first node, or several roots)
TREE_CONTEXT = -2   # no node: a context token in front of a shorter tree (a ragged request's block)


def tree_mask(parents: torch.Tensor) -> torch.Tensor:
    """bool [..., n, n]: the block mask of token trees given by their parents.

    ``parents`` int [..., n] (one tree per leading index, ``n = qlen``): entry
    ``i`` is node ``i``'s parent, a node ``< i`` (topological order), or
    :data:`TREE_ROOT` (-1) for a node hanging from the context, or
    :data:`TREE_CONTEXT` (-2) at the front of a tree of fewer than ``n``
    nodes (its block's first positions are the request's own context tokens,
    as :func:`mla_dcp.ragged_blocks` places a shorter request). Row ``t`` of a
    node sees the context entries and its ancestors and itself; a context
    entry's row sees the entries up to its own (the causal rule: those rows are
    context tokens). Values are not checked here (:func:`mla_dcp.tree_mask`
    checks them on request); no host sync.

    >>> tree_mask(torch.tensor([-1, 0, 0, 1])).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]
    >>> tree_mask(torch.tensor([-2, -1, 1])).int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    """
    parents = parents.long()
    n = parents.shape[-1]
    index = torch.arange(n, device=parents.device)
    context = parents == TREE_CONTEXT
    # Ancestors by walking every node's chain one parent at a time (n steps at most).
    seen = index[:, None] == index[None, :]
    seen = seen.expand(*parents.shape, n).clone()
    current = torch.where(context, -1, parents)
    for _ in range(max(n - 1, 0)):
        live = current >= 0
        seen |= live[..., None] & (current[..., None] == index)
        current = torch.where(live, parents.gather(-1, current.clamp(min=0)), -1)
        current = torch.where(current == TREE_CONTEXT, -1, current)
    causal = index[None, :] <= index[:, None]
    return torch.where(context[..., :, None], causal, seen | context[..., None, :])


def block_attention(q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                    slots: torch.Tensor, mask: torch.Tensor, seq_lens: torch.Tensor, *, qlen: int,
                    kv_lora_rank: int, softmax_scale: float, max_model_len: int,
                    kv_scale: torch.Tensor | None = None,
                    invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's attention over its request's block keys on this rank, merged into ``(out, lse)``.

    Parameters
    ----------
    q : [B*qlen, H, Dl+Dr]
    kv_cache : [num_blocks, block_size, Dl+Dr], q's dtype or fp8 (with ``kv_scale``)
    out, lse : [B*qlen, H, Dl] (q's dtype), float32 [B*qlen, H] natural log
        The rows' partial over everything else (the context): stage 5's
        inputs, empty (0, -inf) and poisoned (NaN) rows included.
    slots : int64 [B*qlen]
        Block key ``j`` of request ``b`` (global position ``L_b - qlen + j``) at
        ``slots[b*qlen + j]`` of ``kv_cache.view(-1, D)``; -1 where another
        rank holds it or it has no position (:func:`mla_dcp.pure.cache_slots`).
    mask : bool [B, qlen, qlen] (any strides)
        Row ``t`` of request ``b`` reads block key ``j`` where ``mask[b, t, j]``
        and the key is here.
    seq_lens : int32 [B]
        Global lengths: a request longer than ``max_model_len`` poisons its
        rows (NaN), as the static bound does in the other stages.
    invariant : bool
        Sums in an order fixed by the row alone (batch-invariant mode).

    Returns
    -------
    (out [B*qlen, H, Dl] in ``out``'s dtype, lse float32 [B*qlen, H] natural
    log): the merge of both partials. A row reading a key (or with a query)
    that gives a non-finite score is NaN in both; NaN in a key a row does not
    read changes nothing.
    """
    batch = seq_lens.shape[0]
    rows, heads, dim = q.shape
    device = q.device
    flat = kv_cache.reshape(-1, dim)
    overlong = seq_lens.long() > max_model_len
    # A request past the static bound reads no key (its block table need not cover it): NaN below.
    slots = torch.where(overlong.view(batch, 1).expand(batch, qlen).reshape(-1), -1, slots)
    where = slots.clamp(min=0)
    keys = _gather_rows(flat, where)
    keys = keys.view(batch, qlen, dim)
    seen = (mask.expand(batch, qlen, qlen) & (slots.view(batch, 1, qlen) >= 0)).reshape(rows, qlen)
    value_scale = kv_scale.float().reshape(()) if kv_scale is not None else torch.ones((), device=device)

    def keys_of(sel: slice) -> tuple[torch.Tensor, torch.Tensor]:
        # Each row's keys are its request's block keys.
        return keys[torch.arange(sel.start, sel.stop, device=device) // qlen], seen[sel]

    block_out, block_lse, poisoned = gathered_attention(q, keys_of, qlen, kv_lora_rank=kv_lora_rank,
                                                        scale=softmax_scale * value_scale, value_scale=value_scale,
                                                        invariant=invariant)
    poisoned |= overlong.repeat_interleave(qlen)[:, None]
    block_out = torch.where(poisoned[..., None], math.nan, block_out)
    block_lse = torch.where(poisoned, math.nan, block_lse)
    merged, merged_lse = merge_ranks(torch.stack([out.float(), block_out]), torch.stack([lse.float(), block_lse]))
    return merged.to(out.dtype), merged_lse
