"""The composed pipeline in plain torch: stages 1-4 of one DCP rank's step."""

from __future__ import annotations

import torch

from mla_dcp.pure.attention import build_schedule, default_num_segments, merge_segments, segmented_attention
from mla_dcp.pure.paging import expand_page_table, page_size_for
from mla_dcp.pure.placement import verify_row_lens

__all__ = ["verify"]


def verify(q: torch.Tensor, kv_cache: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, *,
           qlen: int, world: int, rank: int, interleave: int, max_local_len: int, kv_lora_rank: int,
           softmax_scale: float, kv_scale: torch.Tensor | None = None,
           num_segments: int | None = None, causal: bool = True,
           fp8_products: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``merge_segments . segmented_attention . build_schedule . expand_page_table . verify_row_lens``.

    The oracle of :func:`mla_dcp.verify` with every static argument spelled
    out. Returns ``out`` [B*qlen, H, Dl] in q's dtype and ``lse`` float32
    [B*qlen, H], natural log (0 and -inf for rows with no key on this rank).
    """
    block_size = kv_cache.shape[1]
    row_lens = verify_row_lens(seq_lens, qlen, world, rank, interleave, causal=causal)
    page_table = expand_page_table(block_table, block_size, max_local_len)
    if num_segments is None:
        num_segments = default_num_segments(page_table.shape[1], page_size_for(block_size))
    work, segments = build_schedule(row_lens, qlen, page_size_for(block_size), page_table.shape[1],
                                    seq_lens.shape[0] * num_segments)
    partials = segmented_attention(q, kv_cache, row_lens, page_table, work, qlen=qlen, kv_lora_rank=kv_lora_rank,
                                   softmax_scale=softmax_scale, kv_scale=kv_scale, fp8_products=fp8_products)
    return merge_segments(*partials, segments, q.dtype)
