"""Stages 3-5 in plain torch: segmented MLA attention and the two merges.

This is the oracle every backend is checked against and the CPU
implementation of the custom ops. It favours being obviously right over being
fast: float32 math, explicit masks, `where` (never a multiply by zero) to drop
what must not be read.
"""

from __future__ import annotations

import math

import torch

from mla_dcp.pure.paging import page_size_for

__all__ = [
    "default_num_segments",
    "segmented_attention",
    "merge_segments",
    "merge_ranks",
    "rank_weights",
    "weighted_sum",
    "LOG2E",
    "LN2",
]

LOG2E = math.log2(math.e)
LN2 = math.log(2.0)

# The oracle walks each segment's static span at once; this caps that span so
# a long static bound does not turn into one huge gather.
_PURE_SEGMENT_TOKENS = 4096

_FP8_DTYPES = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, name))


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in _FP8_DTYPES


def default_num_segments(max_pages: int, page_size: int) -> int:
    """Segment count of the pure path: spans of at most ~4096 static tokens."""
    return max(1, min(max_pages, -(-max_pages * page_size // _PURE_SEGMENT_TOKENS)))


def _gather_pages(paged_cache: torch.Tensor, page_ids: torch.Tensor) -> torch.Tensor:
    # fp8 tensors have no index kernels on every backend; gather the bytes.
    if is_fp8(paged_cache.dtype):
        return paged_cache.view(torch.uint8)[page_ids].view(paged_cache.dtype)
    return paged_cache[page_ids]


def segmented_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    row_lens: torch.Tensor,
    page_table: torch.Tensor,
    *,
    qlen: int,
    kv_lora_rank: int,
    num_segments: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unreduced MLA attention of every verify row over its pages, per segment.

    Parameters
    ----------
    q : [B*qlen, H, Dl+Dr], fp32/fp16/bf16
    kv_cache : [num_blocks, block_size, Dl+Dr], q's dtype or fp8
        Value = first ``kv_lora_rank`` columns of the key.
    row_lens : int32 [B*qlen]
        Rank-local visible length of each row.
    page_table : int32 [B, max_pages]
        Pages of ``P = page_size_for(block_size)`` tokens; see
        :func:`mla_dcp.pure.expand_page_table`.
    qlen, kv_lora_rank, num_segments : int
    softmax_scale : float
    kv_scale : float32 [1] or None
        Per-tensor dequantization scale of the cache (None: 1).

    Returns
    -------
    seg_out : float32 [B*qlen, H, NS, Dl]
        ``kv_scale * sum_k exp2(S2_k - seg_max) v_k``, unnormalized; unspecified
        (never to be read) where ``seg_sum == 0``.
    seg_max : float32 [B*qlen, H, NS]
        Base-2 running max ``max_k S2_k``; -inf for a segment with no key;
        NaN for a poisoned segment (DESIGN.md, "Poisoned rows"): NaN or inf
        in the query or in a key the row reads, scores that overflow, or a
        row longer than the page table covers (``max_pages * P``: a length
        beyond the static bound, which the host cannot check without a
        sync). Never +inf.
    seg_sum : float32 [B*qlen, H, NS]
        ``sum_k exp2(S2_k - seg_max)``; 0 for a segment with no key; NaN
        where ``seg_max`` is NaN.

    Here ``S2_k = softmax_scale * log2(e) * kv_scale * (q . k_k)`` (base 2).
    Segment ``s`` of request ``b`` covers pages ``[s*c, min((s+1)*c, n))`` with
    ``n = cdiv(row_lens[b*qlen + qlen-1], P)`` and ``c = cdiv(n, NS)``.
    """
    rows, heads, head_dim = q.shape
    batch, max_pages = page_table.shape
    page = page_size_for(kv_cache.shape[1])
    paged_cache = kv_cache.reshape(-1, page, head_dim)
    seg_pages = -(-max_pages // num_segments)
    device = q.device

    scale2 = softmax_scale * LOG2E
    value_scale = kv_scale.float() if kv_scale is not None else torch.ones(1, device=device)

    queries = q.float().view(batch, qlen, heads, head_dim)
    lens = row_lens.view(batch, qlen).long()
    # All rows of a request share segment bounds; its last row sees the most.
    # Lengths past the static bound (seq_lens beyond max_model_len) cannot be
    # caught on the host without a sync: read only the pages the table has,
    # and poison those rows' outputs with NaN below so the error is loud.
    n_pages = ((lens[:, -1] + page - 1) // page).clamp(max=max_pages)
    overflow = lens > max_pages * page                                                   # [B, q]
    pages_per_seg = (n_pages + num_segments - 1) // num_segments
    in_seg = torch.arange(seg_pages, device=device)
    in_page = torch.arange(page, device=device)

    outs, maxes, sums = [], [], []
    for seg in range(num_segments):
        page_idx = seg * pages_per_seg[:, None] + in_seg[None, :]                   # [B, sp]
        page_ok = (in_seg[None, :] < pages_per_seg[:, None]) & (page_idx < n_pages[:, None])
        table_col = page_idx.clamp(max=max_pages - 1)
        table_ids = page_table.gather(1, table_col).long()
        # A page id outside the cache (a bad block table) is never gathered:
        # its keys read as NaN, which poisons exactly the rows that see them.
        in_cache = (table_ids >= 0) & (table_ids < paged_cache.shape[0])
        page_ids = torch.where(page_ok & in_cache, table_ids, 0)
        keys = _gather_pages(paged_cache, page_ids).reshape(batch, seg_pages * page, head_dim)
        token_pos = (page_idx[:, :, None] * page + in_page).reshape(batch, seg_pages * page)   # [B, N]
        per_token = lambda pages: pages[:, :, None].expand(-1, -1, page).reshape(batch, seg_pages * page)  # noqa: E731
        # A request's last row sees the most keys: nothing past it is read.
        key_ok = per_token(page_ok) & (token_pos < lens[:, -1:])
        # Masked on load: NaN or garbage in slots a row must not read never
        # reaches the arithmetic.
        keys = torch.where(key_ok[:, :, None], keys.float(), 0.0)
        keys = torch.where((key_ok & ~per_token(in_cache))[:, :, None], math.nan, keys)
        visible = key_ok[:, None, :] & (token_pos[:, None, :] < lens[:, :, None])   # [B, q, N]
        scores = torch.einsum("bthd,bnd->bthn", queries, keys) * (scale2 * value_scale)
        seen = visible[:, :, None, :]
        # A visible score of -inf comes from inf in q or k (or an overflow):
        # it must poison the row, not vanish as a zero weight. NaN here makes
        # the max NaN; +inf makes the sum NaN (exp2(inf - inf)).
        scores = torch.where(seen, torch.where(scores == -math.inf, math.nan, scores), -math.inf)
        seg_max = scores.amax(dim=-1)                                                # [B, q, H]
        probs = torch.where(seen, torch.exp2(scores - seg_max[..., None]), 0.0)
        # The values serve every row of the request, and a row that masks a
        # token still multiplies its value by 0: 0 * NaN = NaN. A non-finite
        # value is zeroed; the rows that see it are poisoned by its key's score.
        values = keys[..., :kv_lora_rank]
        values = torch.where(torch.isfinite(values), values, 0.0)
        seg_out = torch.einsum("bthn,bnd->bthd", probs, values) * value_scale
        seg_sum = probs.sum(dim=-1)
        # Poisoned: NaN statistics, so that neither merge can take the row
        # for an empty one and drop it.
        poisoned = overflow[:, :, None] | torch.isnan(seg_sum)
        outs.append(torch.where(poisoned[..., None], math.nan, seg_out))
        maxes.append(torch.where(poisoned, math.nan, seg_max))
        sums.append(torch.where(poisoned, math.nan, seg_sum))

    seg_out = torch.stack(outs, dim=3).reshape(rows, heads, num_segments, kv_lora_rank)
    seg_max = torch.stack(maxes, dim=3).reshape(rows, heads, num_segments)
    seg_sum = torch.stack(sums, dim=3).reshape(rows, heads, num_segments)
    return seg_out, seg_max, seg_sum


def merge_segments(seg_out: torch.Tensor, seg_max: torch.Tensor, seg_sum: torch.Tensor,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine segment partials (base 2) into output and natural-log LSE.

    Parameters
    ----------
    seg_out : float32 [T, H, NS, Dl]
    seg_max, seg_sum : float32 [T, H, NS], base-2 statistics
    out_dtype : torch.dtype

    Returns
    -------
    out : out_dtype [T, H, Dl]; 0 for a row with no key.
    lse : float32 [T, H], **natural log** of ``sum_k exp(scale q.k)``; -inf
        for a row with no key. A poisoned segment (``seg_max`` NaN, or +inf,
        which stage 3 never writes) makes the row's out and lse NaN: only
        -inf means "no key".
    """
    top = seg_max.amax(dim=-1)
    top_finite = torch.where(torch.isfinite(top), top, 0.0)
    present = seg_max > -math.inf
    weight = torch.where(present, torch.exp2(seg_max - top_finite[..., None]), 0.0)
    total = (weight * seg_sum).sum(dim=-1)
    weighted = torch.where(present[..., None], weight[..., None] * seg_out, 0.0).sum(dim=-2)
    nonempty = total > 0
    out = torch.where(nonempty[..., None], weighted / total[..., None], 0.0)
    lse = torch.where(nonempty, LN2 * (top_finite + torch.log2(total)), -math.inf)
    corrupt = (torch.isnan(seg_max) | torch.isposinf(seg_max)).any(dim=-1)
    out = torch.where(corrupt[..., None], math.nan, out)
    lse = torch.where(corrupt, math.nan, lse)
    return out.to(out_dtype), lse.float()


def rank_weights(lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank's share of the merged softmax, from natural-log LSEs.

    Parameters
    ----------
    lses : [W, ...], natural log. -inf and +inf mean "no keys" (+inf is
        another kernel's convention, FlashMLA's, for an empty row); NaN means
        the rank's partial is poisoned.

    Returns
    -------
    weight : float32 [W, ...], ``exp(lse_r - G)``; exactly 0 for an empty
        rank; NaN for every rank where any rank is poisoned.
    merged_lse : float32 [...], ``G = logsumexp_r lse_r``, natural log; -inf
        where every rank is empty (no NaN on the way); NaN where any rank is
        poisoned.
    """
    lses = lses.float()
    poisoned = torch.isnan(lses).any(dim=0)
    lses = torch.where(torch.isnan(lses) | (lses == math.inf), -math.inf, lses)
    top = lses.amax(dim=0)
    top_finite = torch.where(torch.isfinite(top), top, 0.0)
    present = lses > -math.inf
    factor = torch.where(present, torch.exp(lses - top_finite), 0.0)
    total = factor.sum(dim=0)
    nonempty = total > 0
    merged_lse = torch.where(nonempty, top_finite + torch.log(total), -math.inf)
    weight = torch.where(nonempty, factor / total, 0.0)
    return torch.where(poisoned, math.nan, weight), torch.where(poisoned, math.nan, merged_lse)


def weighted_sum(weight: torch.Tensor, outs: torch.Tensor) -> torch.Tensor:
    """``sum_r weight_r * out_r`` in float32; a rank of weight 0 adds exactly 0,
    whatever its output holds (NaN included); a NaN weight (a poisoned row)
    makes the sum NaN."""
    return torch.where((weight != 0)[..., None], weight[..., None] * outs.float(), 0.0).sum(dim=0)


def merge_ranks(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-rank partial attention with their natural-log LSEs.

    Parameters
    ----------
    outs : [W, T, H, Dl], any float dtype
    lses : float32 [W, T, H], natural log. -inf and +inf mean "no keys";
        NaN means "poisoned" (DESIGN.md, stage 5).

    Returns
    -------
    out : [T, H, Dl] in ``outs.dtype``; exactly 0 where every rank is empty;
        NaN where any rank is poisoned.
    lse : float32 [T, H], natural log; -inf where every rank is empty; NaN
        where any rank is poisoned.
    """
    weight, merged_lse = rank_weights(lses)
    return weighted_sum(weight, outs).to(outs.dtype), merged_lse
