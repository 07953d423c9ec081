"""Stage 2: physical KV blocks -> power-of-two pages (DESIGN.md, stage 2)."""

from __future__ import annotations

import torch

from mla_dcp._shapes import MAX_PAGE_SIZE, page_size_for, page_table_shape

__all__ = ["page_size_for", "expand_page_table", "MAX_PAGE_SIZE"]


def expand_page_table(block_table: torch.Tensor, block_size: int, max_local_len: int) -> torch.Tensor:
    """Expand each request's block table into a page table.

    The cache ``[num_blocks, block_size, D]`` is read as
    ``[num_blocks * S, P, D]`` with ``S = block_size // P`` (a view, no copy),
    and ``page_table[b, k] = block_table[b, k // S] * S + k % S``.

    Parameters
    ----------
    block_table : int32 [B, max_blocks]
        Physical blocks of this rank, in rank-local order. Entries past a
        request's length may hold anything; they are expanded, never read.
    block_size : int
    max_local_len : int
        Static bound on the rank-local length; fixes the width.

    Returns
    -------
    int32 [B, cdiv(max_local_len, P)]

    >>> expand_page_table(torch.tensor([[3, 5]], dtype=torch.int32), 256, 300).tolist()
    [[6, 7, 10]]
    """
    _, max_pages = page_table_shape(block_table.shape, block_size, max_local_len)
    pages_per_block = block_size // page_size_for(block_size)
    k = torch.arange(max_pages, device=block_table.device, dtype=torch.int32)
    blocks = block_table[:, (k // pages_per_block).long()]
    # int32 arithmetic on purpose: huge ids in unused entries may wrap, and
    # wrapped entries are never read.
    return (blocks * pages_per_block + k % pages_per_block).to(torch.int32)
