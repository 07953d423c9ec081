"""Shape rules shared by every backend (no torch ops, no Triton)."""

from __future__ import annotations

# Kernels walk at most 128 tokens of one page per step; larger pages buy no
# more locality and make the static page count coarse.
MAX_PAGE_SIZE = 128

# The schedule's chunk search (pure.build_schedule and its kernel) halves an
# interval of page counts: 32 steps cover any int32.
SCHEDULE_SEARCH_STEPS = 32
# Columns of the schedule's ``work`` table (pure.build_schedule): per piece
# (request, first page, end page); the stream schedule adds, per attention
# program, its pieces [first, end).
WORK_COLUMNS = 3
STREAM_WORK_COLUMNS = 5
WORK_COLUMN_COUNTS = (WORK_COLUMNS, STREAM_WORK_COLUMNS)
# The stream's programs at most: its kernels cut the pages in 32-bit
# arithmetic, whose largest product is programs * (programs - 1).
STREAM_MAX_PROGRAMS = 46340
# fp8 products (VerifyConfig.fp8_products): the KV tile over which the
# kernels quantise P (the pure path rounds per tile of the same length) and
# P's fixed power-of-two scale into e4m3's range (P <= 1 against the running
# max; x256 keeps weights down to 2^-17 instead of flushing those below 2^-9).
FP8_PRODUCTS_TILE = 64
FP8_P_SCALE = 256.0
# Ragged blocks (DESIGN.md): in the map from tokens to rows, a token of no
# request (its results an empty row's) and a token no row holds (a request of
# more than qlen tokens; its results NaN). A row holding no token maps to -1.
RAGGED_NO_REQUEST = -1
RAGGED_NO_ROW = -2


def work_columns(programs: int) -> int:
    """Columns of a schedule's ``work`` table: the stream's (``programs > 0``) or one piece per program."""
    return STREAM_WORK_COLUMNS if programs > 0 else WORK_COLUMNS


def schedule_shape_for(batch: int, segments: int, stream: bool) -> tuple[int, int]:
    """(num_items, programs) of ``segments`` a request: with ``stream`` (the kernel runs several pieces
    a program), the stream's ``B * segments`` programs over ``B * segments + B`` rows; one piece a
    program otherwise, and for one segment, no request or more than STREAM_MAX_PROGRAMS programs."""
    if not stream or segments == 1 or batch == 0 or batch * segments > STREAM_MAX_PROGRAMS:
        return batch * segments, 0
    return batch * segments + batch, batch * segments


def check_schedule_shape(batch: int, num_items: int, max_pages: int, chunk: int = 0, programs: int = 0) -> int:
    """ValueError unless pure.build_schedule can lay out this static shape; its work columns."""
    if num_items < batch:
        raise ValueError(f"num_items must be >= the batch ({batch}), got {num_items}")
    if programs > 0:
        if chunk > 0:
            raise ValueError(f"chunk and programs cannot both be > 0, got chunk={chunk}, programs={programs}")
        if num_items < programs + batch:
            raise ValueError(f"num_items must be >= programs + B = {programs + batch}, got {num_items}")
    elif chunk > 0 and num_items < batch * cdiv(max_pages, chunk):
        raise ValueError(f"num_items must be >= B * cdiv(max_pages, chunk) = {batch * cdiv(max_pages, chunk)} "
                         f"for a fixed chunk of {chunk} pages, got {num_items}")
    return work_columns(programs)


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


# Batch-invariant mode cuts every request at the same token positions:
# segments of VerifyConfig.invariant_segment_tokens tokens from position 0,
# whatever the batch, the lengths or q. Unset, the length follows the heads
# (a static fact of the model, the same for a decode step and a verify
# step): 64 tokens a head, a power of two in [1024, 4096]. A segment's
# partial is heads x qlen x 512 floats, so tokens proportional to heads keep
# the partials' bytes a fixed share of the KV's; few heads make a step
# latency-bound, where shorter segments are more programs. Measured on the
# H200 (docs/performance.md, "What the batch-invariant mode costs"): at 16
# heads 1024 beat 4096 on C4, C7 and R1 (1.3-3x; R3 10% slower), at 64 and
# 128 heads 4096 beat 1024 and 2048.
INVARIANT_MIN_DEFAULT_TOKENS = 1024
INVARIANT_MAX_DEFAULT_TOKENS = 4096
INVARIANT_TOKENS_PER_HEAD = 64
INVARIANT_MAX_SEGMENT_TOKENS = 1 << 20


def invariant_segment_tokens_for(num_heads: int) -> int:
    """The batch-invariant mode's segment length when
    ``VerifyConfig.invariant_segment_tokens`` is None."""
    tokens = 1 << max(0, INVARIANT_TOKENS_PER_HEAD * num_heads - 1).bit_length()    # the next power of two
    return min(INVARIANT_MAX_DEFAULT_TOKENS, max(INVARIANT_MIN_DEFAULT_TOKENS, tokens))


def invariant_chunk_pages(page: int, tokens: int) -> int:
    """Pages per segment in batch-invariant mode."""
    return max(1, tokens // page)


def page_table_shape(block_table_shape, block_size: int, max_local_len: int) -> tuple[int, int]:
    """[B, max_pages] of the expanded page table; ValueError if the block
    table has too few columns to cover ``max_local_len`` tokens."""
    page = page_size_for(block_size)
    max_pages = cdiv(max_local_len, page)
    needed_blocks = cdiv(max_pages, block_size // page)
    if block_table_shape[-1] < needed_blocks:
        raise ValueError(
            f"block_table must have at least {needed_blocks} columns for max_local_len="
            f"{max_local_len} and block_size={block_size}, got {list(block_table_shape)}")
    return block_table_shape[0], max_pages
