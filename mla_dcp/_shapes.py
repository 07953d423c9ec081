"""Shape rules shared by every backend (no torch ops, no Triton)."""

from __future__ import annotations

# Kernels walk at most 128 tokens of one page per step; larger pages buy no
# more locality and make the static page count coarse.
MAX_PAGE_SIZE = 128


def page_size_for(block_size: int) -> int:
    """``P = min(128, largest power of two dividing block_size)``.

    >>> [page_size_for(b) for b in (1, 16, 96, 1536)]
    [1, 16, 32, 128]
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    return min(MAX_PAGE_SIZE, block_size & -block_size)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
