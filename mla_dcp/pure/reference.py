"""Attention in global coordinates: the answer DCP must reproduce.

Shares no formula with the DCP stages: it sees each request's whole key
sequence in global order and applies the causal mask by position
(key position <= query position), not through rank-local lengths.
"""

from __future__ import annotations

import math

import torch

__all__ = ["reference_attention"]


def reference_attention(
    q: torch.Tensor,
    global_kv: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    qlen: int,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | float | None = None,
    key_mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
    causal: bool = True,
    block_mask: torch.Tensor | None = None,
    row_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal MLA attention of verify rows over each request's global keys.

    Parameters
    ----------
    q : [B*qlen, H, Dl+Dr]
    global_kv : [B, max_len, Dl+Dr]
        Request ``b``'s keys at global positions ``0..L_b-1``; what lies past
        ``L_b`` is never read.
    seq_lens : int [B]
        Global lengths, verify tokens included: row ``(b, t)`` is the token at
        global position ``L_b - qlen + t``.
    kv_scale : per-tensor dequantization scale, or None.
    key_mask : bool [B, max_len] or None
        Restricts attention to some global positions (e.g. those one DCP rank
        holds), giving that rank's partial result in global coordinates.
    dtype : torch.dtype
        Precision of the arithmetic (float64 by default).
    causal : bool
        True: key position <= query position. False (a non-causal draft
        block): every row sees all of its request's keys.

    Returns
    -------
    out : ``dtype`` [B*qlen, H, Dl]; 0 for rows with no key; NaN for a
        poisoned row (a visible score that is not finite: NaN or inf in the
        query or in a key the row sees).
    lse : ``dtype`` [B*qlen, H], natural log; -inf for rows with no key;
        NaN for a poisoned row.
    """
    batch, max_len, _ = global_kv.shape
    heads = q.shape[1]
    keys = global_kv.to(dtype)
    if kv_scale is not None:
        keys = keys * torch.as_tensor(kv_scale, dtype=dtype, device=keys.device).reshape(())
    queries = q.to(dtype).view(batch, qlen, heads, q.shape[-1])
    key_pos = torch.arange(max_len, device=q.device)
    query_pos = seq_lens.long()[:, None] - qlen + torch.arange(qlen, device=q.device)   # [B, q]
    in_request = key_pos[None, :] < seq_lens.long()[:, None]                             # [B, N]
    if key_mask is not None:
        in_request = in_request & key_mask
    mask = in_request[:, None, :].expand(-1, qlen, -1)
    if block_mask is not None:
        # Key position -> its column in the block (out of range: before the block, always seen).
        column = key_pos[None, :] - (seq_lens.long()[:, None] - qlen)                     # [B, N]
        in_block = (column >= 0)[:, None, :]
        picked = block_mask.to(q.device).expand(batch, qlen, qlen).gather(
            2, column.clamp(0, qlen - 1)[:, None, :].expand(-1, qlen, -1))
        mask = mask & (~in_block | picked)
    elif causal:
        mask = mask & (key_pos[None, None, :] <= query_pos[:, :, None])
    if row_mask is not None:
        mask = mask & row_mask
    keys = torch.where(in_request[..., None], keys, 0.0)
    scores = torch.einsum("bthd,bnd->bthn", queries, keys) * softmax_scale
    poisoned = (mask[:, :, None, :] & ~torch.isfinite(scores)).any(dim=-1)                # [B, q, H]
    scores = torch.where(mask[:, :, None, :] & torch.isfinite(scores), scores, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.where(mask[:, :, None, :], torch.exp(scores - torch.where(torch.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    out = torch.einsum("bthn,bnd->bthd", probs, torch.where(torch.isfinite(keys), keys, 0.0)[..., :kv_lora_rank])
    out = torch.where(poisoned[..., None], math.nan, out)
    lse = torch.where(poisoned, math.nan, lse)
    return out.reshape(batch * qlen, heads, kv_lora_rank), lse.reshape(batch * qlen, heads)
