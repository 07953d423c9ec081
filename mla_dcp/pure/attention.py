"""Stages 3-5 in plain torch: segmented MLA attention and the two merges.

This is the oracle every backend is checked against and the CPU
implementation of the custom ops. It favours being obviously right over being
fast: float32 math, explicit masks, `where` (never a multiply by zero) to drop
what must not be read.
"""

from __future__ import annotations

import math

import torch

from mla_dcp._dtypes import is_fp8
from mla_dcp._shapes import (FP8_P_SCALE, FP8_PRODUCTS_TILE, SCHEDULE_SEARCH_STEPS, STREAM_WORK_COLUMNS,
                             check_schedule_shape)
from mla_dcp.pure.paging import page_size_for

__all__ = [
    "default_num_segments",
    "build_schedule",
    "segmented_attention",
    "merge_segments",
    "merge_stacked_segments",
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

def default_num_segments(max_pages: int, page_size: int) -> int:
    """Segment count of the pure path: spans of at most ~4096 static tokens."""
    return max(1, min(max_pages, -(-max_pages * page_size // _PURE_SEGMENT_TOKENS)))




def _cdiv(a, b):
    return (a + b - 1) // b


def build_schedule(row_lens: torch.Tensor, qlen: int, page: int, max_pages: int,
                   num_items: int, chunk: int = 0, programs: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's work schedule (DESIGN.md stage 3, "Segments"), from the lengths on the device.

    Request ``b`` reads ``n_b = min(cdiv(row_lens[b*qlen + qlen-1], P), max_pages)``
    pages, cut into pieces (segments); each piece has its own partial slot
    and each attention program (one per tile of rows and ``work`` row) runs
    a run of consecutive pieces. Every request has at least one piece (an
    empty one writes its empty statistics) and shapes depend on
    ``num_items``, ``programs`` and the batch only. Two ways to cut:

    * ``programs > 0``, the stream: the step's pages, requests end to end,
      are cut into ``programs`` runs as even as possible (run ``r`` starts
      at page ``floor(r * total / programs)``: at most ``cdiv(total,
      programs)`` pages, and a uniform step's cuts fall on its request
      boundaries), and a run may cross requests (a request cut by a run's end continues
      in the next run). Every program gets the same number of pages whatever
      the lengths, so a ragged step costs what a uniform one of the same
      total does. Needs ``num_items >= programs + B`` (pieces at most
      ``programs + B - 1``). An empty request belongs to the run at its
      position (the last run at the stream's end).
    * ``programs == 0``, one piece per program: segments of ``c`` pages, the
      smallest ``c`` with ``sum_b max(1, cdiv(n_b, c)) <= num_items``, never
      spanning two requests; the full segments in request and page order,
      then each request's shorter last segment by decreasing length (ties:
      request order), then the unused items, so that short segments fill in
      around the long ones. ``chunk > 0`` (batch-invariant mode): segments
      of exactly ``chunk`` pages from page 0 whatever the step; then
      ``num_items >= B * cdiv(max_pages, chunk)``.

    Parameters
    ----------
    row_lens : int32 [B*qlen]
    qlen, page, max_pages, num_items : int
        ``num_items >= B`` (static): rows of ``work``, hence partial slots.
    chunk, programs : int
        See above; at most one of them is > 0.

    Returns
    -------
    work : int32 [num_items, 3], the stream's [num_items, 5]
        Columns 0-2, per piece ``i`` (partial slot ``i``): (request, first
        page, end page); unused rows read ``(0, 0, 0)``, an empty range whose
        slot no request merges. Three columns: program ``i`` runs piece
        ``i``. The stream's columns 3-4, per program ``i``: its pieces
        ``[first, end)``; the programs past the runs with pages have none
        (``[0, 0)``), so no program runs the unused rows: the kernels leave
        their partials unwritten (:func:`segmented_attention`).
    segments : int32 [B, 3]
        Per request: (first, full, tail). Its pieces in page order are
        ``first .. first + full - 1``, then piece ``tail`` if ``tail >= 0``
        (the rest, fewer than ``c`` pages, or the empty segment of a request
        with no page; the stream has no tail).

    >>> work, segments = build_schedule(torch.tensor([64, 640, 0], dtype=torch.int32), 1, 64, 16, 6)
    >>> work.tolist(), segments.tolist()
    ([[1, 0, 3], [1, 3, 6], [1, 6, 9], [0, 0, 1], [1, 9, 10], [2, 0, 0]], [[0, 0, 3], [0, 3, 4], [3, 0, 5]])
    >>> work, segments = build_schedule(torch.tensor([64, 640, 0], dtype=torch.int32), 1, 64, 16, 6, programs=3)
    >>> work.tolist(), segments.tolist()
    ([[0, 0, 1, 0, 2], [1, 0, 2, 2, 3], [1, 2, 6, 3, 5], [1, 6, 10, 0, 0], [2, 0, 0, 0, 0], [0, 0, 0, 0, 0]], [[0, 1, -1], [1, 3, -1], [4, 1, -1]])
    """
    lens = row_lens.view(-1, qlen)[:, -1].long()
    check_schedule_shape(lens.shape[0], num_items, max_pages, chunk, programs)
    pages = _cdiv(lens.clamp(min=0), page).clamp(max=max_pages)                          # [B]
    if programs > 0:
        return _stream_schedule(pages, num_items, programs)
    return _segment_schedule(pages, max_pages, num_items, chunk)


def _stream_schedule(pages: torch.Tensor, num_items: int, programs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """build_schedule's stream (``programs > 0``)."""
    device = pages.device
    batch = pages.shape[0]
    if batch == 0:   # nothing to run (and no kernel launched: its rows stay zero)
        return (torch.zeros(num_items, STREAM_WORK_COLUMNS, dtype=torch.int32, device=device),
                torch.zeros(0, 3, dtype=torch.int32, device=device))
    end = pages.cumsum(0)                                                                 # [B]
    start = end - pages
    total = end[-1]
    # Runs as even as possible: run r holds pages [cut(r), cut(r + 1)) with
    # cut(r) = floor(r * total / programs), so a uniform step's cuts fall on
    # its request boundaries; with fewer pages than programs, a page each.
    wide = total >= programs
    used = torch.where(wide, programs, total.clamp(min=1))                                 # runs with pages

    def cut(r):
        return torch.where(wide, r * total // programs, torch.minimum(r, total))

    def run_of(position):
        return torch.where(wide, ((position + 1) * programs - 1) // total.clamp(min=1), position)

    # The runs each request's pages fall in; an empty request: the run at its position.
    first_run = torch.where(pages > 0, run_of(start), torch.minimum(run_of(start), used - 1))
    last_run = torch.where(pages > 0, run_of(end - 1), first_run)
    count = last_run - first_run + 1
    first_piece = count.cumsum(0) - count
    # Pieces in request order are in run order too (a request's runs follow
    # the previous one's). No host sync: a request has at most ``programs``
    # pieces, and rows past a request's count write to a dropped extra row.
    k = torch.arange(programs, device=device)
    live = k[None, :] < count[:, None]                                                     # [B, programs]
    run = first_run[:, None] + k[None, :]
    nonempty = pages[:, None] > 0
    lo = torch.where(nonempty, torch.maximum(start[:, None], cut(run)) - start[:, None], 0)
    hi = torch.where(nonempty, torch.minimum(end[:, None], cut(run + 1)) - start[:, None], 0)
    piece = torch.where(live, first_piece[:, None] + k[None, :], num_items).flatten()
    work = torch.zeros(num_items + 1, STREAM_WORK_COLUMNS, dtype=torch.long, device=device)
    work[piece, 0] = torch.arange(batch, device=device)[:, None].expand(-1, programs).flatten()
    work[piece, 1] = lo.flatten()
    work[piece, 2] = hi.flatten()
    # Each run's pieces: [first, end) from the runs' piece counts in run order.
    in_run = torch.zeros(num_items + 1, dtype=torch.long, device=device)
    in_run.index_add_(0, torch.where(live, run, num_items).flatten(), torch.ones_like(piece))
    in_run = in_run[:num_items]
    work = work[:num_items]
    # The programs past the used runs have no piece: no program runs the rows
    # past the pieces (the merge never reads them), and a uniform step, whose
    # runs hold exactly its pieces, launches no program only to write an
    # empty partial.
    is_run = torch.arange(num_items, device=device) < used
    run_end = in_run.cumsum(0)
    work[:, 3] = torch.where(is_run, run_end - in_run, 0)
    work[:, 4] = torch.where(is_run, run_end, 0)
    segments = torch.stack([first_piece, count, torch.full_like(count, -1)], dim=1)
    return work.to(torch.int32), segments.to(torch.int32)


def _segment_schedule(pages: torch.Tensor, max_pages: int, num_items: int,
                      chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """build_schedule's segments of ``c`` pages (``programs == 0``): columns 0-2 of work."""
    device = pages.device
    batch = pages.shape[0]

    def items_for(chunk):
        return _cdiv(pages, chunk).clamp(min=1).sum()

    # Binary search for the smallest feasible chunk: lo is never feasible
    # unless it is the answer, hi always is (one segment per request fits).
    lo = torch.ones((), dtype=torch.long, device=device)
    hi = pages.max().clamp(min=1) if batch else lo
    for _ in range(SCHEDULE_SEARCH_STEPS):
        mid = (lo + hi) // 2
        feasible = items_for(mid) <= num_items
        hi = torch.where(feasible, mid, hi)
        lo = torch.where(feasible, lo, mid + 1)
    if chunk > 0:
        hi = torch.full((), chunk, dtype=torch.long, device=device)
    chunk = hi
    full = pages // chunk                                                                 # [B]
    rest = pages - full * chunk
    has_tail = (rest > 0) | (pages == 0)
    full_end = full.cumsum(0)
    full_first = full_end - full
    num_full = full_end[-1] if batch else torch.zeros((), dtype=torch.long, device=device)
    # Tails by decreasing length, ties in request order (a stable sort of a
    # key unique per request).
    key = torch.where(has_tail, (max_pages + 1 - rest) * (batch + 1) + torch.arange(batch, device=device),
                      (max_pages + 2) * (batch + 1))
    order = torch.argsort(key)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(batch, device=device)
    tail = torch.where(has_tail, num_full + rank, -1)

    position = torch.arange(num_items, device=device)
    request = torch.searchsorted(full_end, position, right=True).clamp(max=max(batch - 1, 0))   # [NI]
    is_full = position < num_full
    seg = position - (full_first[request] if batch else 0)
    tail_at = (position - num_full).clamp(0, max(batch - 1, 0))
    tail_req = order[tail_at] if batch else tail_at
    is_tail = ~is_full & (position - num_full < has_tail.sum())
    work = torch.zeros(num_items, 3, dtype=torch.long, device=device)
    work[:, 0] = torch.where(is_full, request, torch.where(is_tail, tail_req, 0))
    work[:, 1] = torch.where(is_full, seg * chunk, torch.where(is_tail, (full * chunk)[tail_req] if batch else 0, 0))
    work[:, 2] = torch.where(is_full, seg * chunk + chunk, torch.where(is_tail, pages[tail_req] if batch else 0, 0))
    return work.to(torch.int32), torch.stack([full_first, full, tail], dim=1).to(torch.int32)


def segment_slots(segments: torch.Tensor, most: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot, live) int64/bool [B, most]: request b's partial slots in page
    order (:func:`build_schedule`'s ``segments``), ``live`` where it has that
    many."""
    first, full, tail = (segments[:, i].long() for i in range(3))
    ordinal = torch.arange(most, device=segments.device)
    count = full + (tail >= 0).long()
    slot = torch.where(ordinal[None, :] < full[:, None], first[:, None] + ordinal[None, :], tail[:, None])
    live = ordinal[None, :] < count[:, None]
    return torch.where(live, slot, 0), live


def _gather_rows(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``cache[ids]`` in the cache's dtype (its pages, or its token rows by slot)."""
    # fp8 tensors have no index kernels on every backend; gather the bytes.
    if is_fp8(cache.dtype):
        return cache.view(torch.uint8)[ids].view(cache.dtype)
    return cache[ids]


_E4M3 = getattr(torch, "float8_e4m3fn", None)


def e4m3_row_factor(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (row, head) power of two that puts the largest |q| of a latent
    row in [128, 256) (e4m3's largest finite value is 448): exact to apply
    and undo, and the finest scale a kernel gets for free (each program
    holds whole rows of q). Rows with inf, NaN or all zeros keep a factor of
    1; the score factor is NaN where the row holds inf (e4m3 has no inf and a
    kernel's conversion saturates: the row must stay poisoned). Returns
    (factor, 1 / factor)."""
    finite = (amax > 0) & (amax < math.inf)
    # floor(log2(amax)) exactly, from the exponent: a float32 log2 may round
    # up just below a power of two, and its vector and scalar paths may differ.
    exponent = torch.frexp(torch.where(finite, amax, 1.0)).exponent.float() - 1.0
    shift = torch.where(finite, 7.0 - exponent, 0.0)
    shift = shift.clamp(-126.0, 126.0)
    unscale = torch.where(amax < math.inf, torch.exp2(-shift), math.nan)
    return torch.exp2(shift), unscale


def to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3fn (to nearest, ties to even) and back to float32;
    beyond 448 the kernels' conversion saturates, as here."""
    return x.clamp(-448.0, 448.0).to(_E4M3).float()


def fp8_product_weights(scores: torch.Tensor, top: torch.Tensor, exp2=torch.exp2) -> torch.Tensor:
    """The weights ``P`` the fp8-products kernels multiply ``V`` by, scaled
    to the segment's max ``top``: each KV tile of FP8_PRODUCTS_TILE tokens
    (counted from the segment's first) quantises ``exp2(s - m_t)`` against
    the running max ``m_t`` after that tile, times FP8_P_SCALE, to e4m3;
    the online softmax then rescales the tile's product by ``exp2(m_t - top)``.
    ``scores``: [..., N] base 2, -inf where masked. ``exp2``: the function
    used (:func:`segmented_attention` passes an order-exact one in the
    batch-invariant mode)."""
    n = scores.shape[-1]
    tiles = -(-n // FP8_PRODUCTS_TILE)
    padded = torch.nn.functional.pad(scores, (0, tiles * FP8_PRODUCTS_TILE - n), value=-math.inf)
    per_tile = padded.unflatten(-1, (tiles, FP8_PRODUCTS_TILE))
    running = torch.cummax(per_tile.amax(dim=-1), dim=-1).values                    # [..., T]
    shift = torch.where(running == -math.inf, 0.0, running)
    quantised = to_e4m3(exp2(per_tile - shift[..., None]) * FP8_P_SCALE) / FP8_P_SCALE
    last = torch.where(top == -math.inf, 0.0, top)
    weights = quantised * exp2(shift - last[..., None])[..., None]
    return weights.flatten(-2)[..., :n]


def segmented_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    row_lens: torch.Tensor,
    page_table: torch.Tensor,
    work: torch.Tensor,
    *,
    qlen: int,
    kv_lora_rank: int,
    softmax_scale: float,
    kv_scale: torch.Tensor | None = None,
    span: int | None = None,
    fp8_products: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unreduced MLA attention of every work item's rows over its pages.

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
    work : int32 [NI, 3] or [NI, 5]
        The schedule (:func:`build_schedule`): item (piece) ``i`` is the
        segment of pages ``[work[i, 1], work[i, 2])`` of request
        ``work[i, 0]``, for all its ``qlen`` rows and every head (which
        program runs it does not change its result). This function computes
        every row; the kernels only those some program runs, so a stream
        schedule's rows past its pieces (which no merge reads) stay as
        allocated there (:func:`mla_dcp.testing.ran_rows`).
    qlen, kv_lora_rank : int
    softmax_scale : float
    kv_scale : float32 [1] or None
        Per-tensor dequantization scale of the cache (None: 1).
    span : int or None
        Pages every item is padded to (at least its own); None: the step's
        longest item. A fixed span (batch-invariant mode) gives every item
        the same shapes, so a row's arithmetic does not depend on the step.
    fp8_products : bool
        The fp8-products mode's roundings (e4m3 cache only): q's latent part
        quantised to e4m3 per (row, head) with :func:`e4m3_row_factor`, P
        per KV tile with :func:`fp8_product_weights`; the rope part and the
        sums stay exact. What the kernels compute, up to their fp32
        accumulation order.

    Returns
    -------
    seg_out : float32 [NI, H, qlen, Dl]
        Item ``i``'s partial for head ``h`` and row ``t`` of its request:
        ``kv_scale * sum_k exp2(S2_k - seg_max) v_k``, unnormalized;
        unspecified (never to be read) where ``seg_sum == 0``.
    seg_max : float32 [NI, H, qlen]
        Base-2 running max ``max_k S2_k``; -inf for a segment with no key;
        NaN for a poisoned segment (DESIGN.md, "Poisoned rows"): NaN or inf
        in the query or in a key the row reads, scores that overflow, or a
        row longer than the page table covers (``max_pages * P``: a length
        beyond the static bound, which the host cannot check without a
        sync). Never +inf.
    seg_sum : float32 [NI, H, qlen]
        ``sum_k exp2(S2_k - seg_max)``; 0 for a segment with no key; NaN
        where ``seg_max`` is NaN.

    Here ``S2_k = softmax_scale * log2(e) * kv_scale * (q . k_k)`` (base 2).
    """
    _, heads, head_dim = q.shape
    batch, max_pages = page_table.shape
    items = work.shape[0]
    page = page_size_for(kv_cache.shape[1])
    paged_cache = kv_cache.reshape(kv_cache.shape[0] * (kv_cache.shape[1] // page), page, head_dim)
    device = q.device
    scale2 = softmax_scale * LOG2E
    value_scale = kv_scale.float() if kv_scale is not None else torch.ones(1, device=device)

    seg_out = torch.empty(items, heads, qlen, kv_lora_rank, dtype=torch.float32, device=device)
    seg_max = torch.empty(items, heads, qlen, dtype=torch.float32, device=device)
    seg_sum = torch.empty(items, heads, qlen, dtype=torch.float32, device=device)
    if items == 0:
        return seg_out, seg_max, seg_sum
    request, page_lo, page_hi = (work[:, i].long() for i in range(3))
    # The oracle's loop bound, read on the host (this is the readable path).
    longest = max(1, int((page_hi - page_lo).max()))
    if span is not None and span < longest:
        raise ValueError(f"span must cover every item's pages ({longest}), got {span}")
    # A fixed span (batch-invariant mode): every product and sum in an order
    # fixed by the item alone. A matmul's or a reduction's CPU kernel splits
    # its work by the operands' sizes and the threads (measured at 16 threads:
    # P @ V of one item differs in the last bit between a batch of one item
    # and of three, and between q = 1 and q = 4), and a float32 exp2 takes a
    # scalar path for a vector's tail.
    invariant = span is not None
    dot = _ordered_dot if invariant else _dot
    exp2 = (lambda x: _exact_fn(torch.exp2, x)) if invariant else torch.exp2  # noqa: E731
    span = span or longest
    in_span = torch.arange(span, device=device)
    in_page = torch.arange(page, device=device)
    # Items in blocks of about _PURE_SEGMENT_TOKENS * 8 keys: bounded gathers.
    block = max(1, _PURE_SEGMENT_TOKENS * 8 // (span * page))
    live = None        # the items computed, where not all of them (a slice of them all otherwise)
    if invariant:
        # Only the pages some row of an item sees (a row sees a prefix of its segment): the pages
        # past them add only zeros, to sums whose order is fixed by position (each score's over
        # its columns, the weights' pairwise from the segment's first token, the values' in runs
        # from it with zeros' signs made +), so every bit is the static span's, at the cost of
        # the actual lengths rather than the static bound, whose items are mostly empty.
        longest_row = row_lens.view(batch, qlen).long().amax(dim=1).clamp(max=max_pages * page)[request]
        seen_pages = torch.minimum(_cdiv(longest_row - page_lo * page, page), page_hi - page_lo)
        live = torch.nonzero(seen_pages > 0).flatten()
        seg_out.zero_()
        seg_max.fill_(-math.inf)
        seg_sum.zero_()
        # Its products are elementwise before their ordered sums: blocks of bounded elements.
        block = max(1, min(block, _ORDERED_ELEMENTS // (qlen * heads * _ORDERED_TOKENS * head_dim)))
    for first in range(0, items if live is None else live.shape[0], block):
        sel = slice(first, min(first + block, items)) if live is None else live[first:first + block]
        req = request[sel]
        n = req.shape[0]
        queries = q.float().view(batch, qlen, heads, head_dim)[req]                          # [I, q, H, D]
        lens = row_lens.view(batch, qlen).long()[req]                                        # [I, q]
        width = max(1, min(span, int(seen_pages[sel].amax()))) if invariant else span
        # Lengths past the static bound cannot be caught on the host without
        # a sync: only the pages the table has are read, and those rows are
        # poisoned with NaN below so the error is loud.
        overflow = lens > max_pages * page
        page_idx = page_lo[sel, None] + in_span[None, :width]                                     # [I, S]
        page_ok = page_idx < page_hi[sel, None]
        table_ids = page_table[req].gather(1, page_idx.clamp(max=max_pages - 1)).long()
        # A page id outside the cache (a bad block table) is never gathered:
        # its keys read as NaN, which poisons exactly the rows that see them.
        in_cache = (table_ids >= 0) & (table_ids < paged_cache.shape[0])
        keys = _gather_rows(paged_cache, torch.where(page_ok & in_cache, table_ids, 0))
        keys = keys.reshape(n, width * page, head_dim)
        token_pos = (page_idx[:, :, None] * page + in_page).reshape(n, width * page)          # [I, N]
        per_token = lambda pages: pages[:, :, None].expand(-1, -1, page).reshape(n, width * page)  # noqa: E731
        # A request's last row sees the most keys: nothing past it is read.
        key_ok = per_token(page_ok) & (token_pos < lens[:, -1:])
        # Masked on load: NaN or garbage in slots a row must not read never
        # reaches the arithmetic.
        keys = torch.where(key_ok[:, :, None], keys.float(), 0.0)
        keys = torch.where((key_ok & ~per_token(in_cache))[:, :, None], math.nan, keys)
        visible = key_ok[:, None, :] & (token_pos[:, None, :] < lens[:, :, None])            # [I, q, N]
        if fp8_products:
            latent = queries[..., :kv_lora_rank]
            factor, unscale = e4m3_row_factor(latent.abs().amax(dim=-1))                  # [I, q, H]
            latent = to_e4m3(latent * factor[..., None])
            scores = (dot(latent, keys[..., :kv_lora_rank]) * unscale[..., None]
                      + dot(queries[..., kv_lora_rank:], keys[..., kv_lora_rank:]))
            scores = scores * (scale2 * value_scale)
        else:
            scores = dot(queries, keys) * (scale2 * value_scale)
        seen = visible[:, :, None, :]
        # A visible score of -inf comes from inf in q or k (or an overflow):
        # it must poison the row, not vanish as a zero weight. NaN here makes
        # the max NaN; +inf makes the sum NaN (exp2(inf - inf)).
        scores = torch.where(seen, torch.where(scores == -math.inf, math.nan, scores), -math.inf)
        top = scores.amax(dim=-1)                                                            # [I, q, H]
        probs = torch.where(seen, exp2(scores - top[..., None]), 0.0)
        # The values serve every row of the request, and a row that masks a
        # token still multiplies its value by 0: 0 * NaN = NaN. A non-finite
        # value is zeroed; the rows that see it are poisoned by its key's score.
        values = keys[..., :kv_lora_rank]
        values = torch.where(torch.isfinite(values), values, 0.0)
        weights = fp8_product_weights(scores, top, exp2) if fp8_products else probs
        weights = torch.where(seen, weights, 0.0)
        if invariant:
            out = _ordered_weighted_sum(weights, values) * value_scale
            total = _pairwise_sum(probs)
        else:
            out = torch.einsum("ithn,ind->ithd", weights, values) * value_scale
            total = probs.sum(dim=-1)
        # Poisoned: NaN statistics, so that neither merge can take the row
        # for an empty one and drop it.
        poisoned = overflow[:, :, None] | torch.isnan(total)
        seg_out[sel] = torch.where(poisoned[..., None], math.nan, out).transpose(1, 2)
        seg_max[sel] = torch.where(poisoned, math.nan, top).transpose(1, 2)
        seg_sum[sel] = torch.where(poisoned, math.nan, total).transpose(1, 2)
    return seg_out, seg_max, seg_sum


def _dot(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """[I, q, H, D] . [I, N, D] -> [I, q, H, N]."""
    return torch.einsum("ithd,ind->ithn", queries, keys)


def _pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim in a fixed pairwise order (zero-padded to a power
    of two, then halves added elementwise): each element's bits depend only
    on its own vector, not on the tensor's other sizes or the threads."""
    n = x.shape[-1]
    width = 1 << max(0, (n - 1).bit_length())
    x = torch.nn.functional.pad(x, (0, width - n))
    while width > 1:
        width //= 2
        x = x[..., :width] + x[..., width:]
    return x[..., 0]


# Tokens a step of the ordered products takes at once, and the elements of a block's step (bound
# their memory).
_ORDERED_TOKENS = 128
_ORDERED_ELEMENTS = 1 << 23


def _ordered_dot(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """:func:`_dot` with every score summed by :func:`_pairwise_sum`."""
    parts = [_pairwise_sum(queries[:, :, :, None, :] * keys[:, None, None, lo:lo + _ORDERED_TOKENS, :])
             for lo in range(0, keys.shape[1], _ORDERED_TOKENS)]
    return torch.cat(parts, dim=-1)


def _ordered_weighted_sum(weights: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``einsum("ithn,ind->ithd")`` in a fixed order: pairwise within each
    run of _ORDERED_TOKENS tokens, the runs added in token order. Each run's
    sum is taken with its zeros' sign made + (``+ 0.0``): a masked token's
    product is a zero of either sign (0 times a negative value), so a span
    cut shorter (fewer masked tokens) would otherwise change the sign of an
    exactly-zero sum; so cut, every bit stays the one the whole span gives."""
    total = None
    for lo in range(0, values.shape[1], _ORDERED_TOKENS):
        w = weights[..., lo:lo + _ORDERED_TOKENS]                                  # [I, q, H, n]
        v = values[:, lo:lo + _ORDERED_TOKENS].transpose(1, 2)                     # [I, D, n]
        part = _pairwise_sum(w[:, :, :, None, :] * v[:, None, None]) + 0.0       # [I, q, H, D]
        total = part if total is None else total + part
    return total


def merge_segments(seg_out: torch.Tensor, seg_max: torch.Tensor, seg_sum: torch.Tensor, segments: torch.Tensor,
                   out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 4: each request's segments (its items of the schedule) into
    output and natural-log LSE of its rows.

    Parameters
    ----------
    seg_out : float32 [NI, H, qlen, Dl]
    seg_max, seg_sum : float32 [NI, H, qlen], base-2 statistics
    segments : int32 [B, 3], per request (first, full, tail): :func:`build_schedule`'s
    out_dtype : torch.dtype

    Returns
    -------
    out : out_dtype [B*qlen, H, Dl] and lse float32 [B*qlen, H] (natural
    log), by :func:`merge_stacked_segments`'s rules; slots of other
    requests and unused items are never read.
    """
    items, heads, qlen, width = seg_out.shape
    batch = segments.shape[0]
    if batch == 0:
        return (seg_out.new_empty(0, heads, width, dtype=out_dtype), seg_out.new_empty(0, heads))
    # The oracle's loop bound, read on the host.
    most = max(1, int((segments[:, 1] + (segments[:, 2] >= 0).to(segments.dtype)).max()))
    slot, live = segment_slots(segments, most)                                           # [B, S]
    slot = slot.clamp(max=max(items - 1, 0))
    rows = batch * qlen
    stacked_max = torch.where(live[..., None, None], seg_max[slot], -math.inf)          # [B, S, H, q]
    stacked_sum = torch.where(live[..., None, None], seg_sum[slot], 0.0)
    by_row = lambda x: x.permute(0, 3, 2, 1, *range(4, x.dim())).reshape(rows, heads, most, *x.shape[4:])  # noqa: E731
    return merge_stacked_segments(by_row(seg_out[slot]), by_row(stacked_max), by_row(stacked_sum), out_dtype)


def merge_stacked_segments(seg_out: torch.Tensor, seg_max: torch.Tensor, seg_sum: torch.Tensor,
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
    weight = torch.where(present, _exact_fn(torch.exp2, seg_max - top_finite[..., None]), 0.0)
    # Summed in segment order, one segment at a time: a reduction kernel's
    # order may depend on the tensor's size (and the threads), and a row's
    # bits must not depend on how many rows or segments the step has (a
    # missing segment adds an exact 0).
    total = _in_order_sum((weight * seg_sum).movedim(-1, 0))
    weighted = _in_order_sum(torch.where(present[..., None], weight[..., None] * seg_out, 0.0).movedim(-2, 0))
    nonempty = total > 0
    out = torch.where(nonempty[..., None], weighted / total[..., None], 0.0)
    lse = torch.where(nonempty, LN2 * (top_finite + _exact_fn(torch.log2, total)), -math.inf)
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
    factor = torch.where(present, _exact_fn(torch.exp, lses - top_finite), 0.0)
    total = _in_order_sum(factor)
    nonempty = total > 0
    merged_lse = torch.where(nonempty, top_finite + _exact_fn(torch.log, total), -math.inf)
    weight = torch.where(nonempty, factor / total, 0.0)
    return torch.where(poisoned, math.nan, weight), torch.where(poisoned, math.nan, merged_lse)


def weighted_sum(weight: torch.Tensor, outs: torch.Tensor) -> torch.Tensor:
    """``sum_r weight_r * out_r`` in float32; a rank of weight 0 adds exactly 0,
    whatever its output holds (NaN included); a NaN weight (a poisoned row)
    makes the sum NaN."""
    return _in_order_sum(torch.where((weight != 0)[..., None], weight[..., None] * outs.float(), 0.0))


def _exact_fn(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` in float32, the same bits for an element wherever it lies in
    the tensor: float32 exp/log kernels take a vector path for most elements
    and a scalar one for the tail, which may differ in the last bit, so a
    row's result would depend on the tensor's size. Computed in float64 and
    rounded, both paths agree."""
    return fn(x.double()).float()


def _in_order_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over dim 0 in index order (a reduction kernel's order may depend
    on the tensor's size and the threads)."""
    total = x[0].clone() if x.shape[0] else x.new_zeros(x.shape[1:])
    for k in range(1, x.shape[0]):
        total = total + x[k]
    return total


# Elements of a gathered-key product at once (rows in groups below that; a top-2048 row of 576
# columns is 1.2M).
_GATHER_ELEMENTS = 1 << 23


def gathered_attention(queries: torch.Tensor, keys_of, count: int, *, kv_lora_rank: int,
                       scale: float | torch.Tensor, value_scale: float | torch.Tensor,
                       invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's attention over keys gathered for it alone (a token tree's block keys, a sparse
    row's listed ones).

    ``queries`` [R, H, D]; ``keys_of(rows)`` -> (keys [r, count, D], seen bool [r, count]) for a
    slice of the rows: each row's keys (any float dtype; a broadcast view is fine) and the ones it
    reads. Scores are ``q . k * scale``, outputs ``* value_scale`` (an fp8 cache's). Rows are taken
    in groups that bound the products' memory.

    Returns (out float32 [R, H, Dl], normalised, 0 where the row reads nothing; lse float32 [R, H],
    natural log, -inf there; poisoned bool [R, H]: a key the row reads, or its query, gives a
    non-finite score). NaN in a key a row does not read changes nothing. ``invariant``: sums in an
    order fixed by the row alone (batch-invariant mode).
    """
    rows, heads, dim = queries.shape
    device = queries.device
    out = torch.empty(rows, heads, kv_lora_rank, dtype=torch.float32, device=device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
    poisoned = torch.empty(rows, heads, dtype=torch.bool, device=device)
    exp = (lambda x: _exact_fn(torch.exp, x)) if invariant else torch.exp                     # noqa: E731
    step = max(1, _GATHER_ELEMENTS // max(1, count * dim * (heads if invariant else 1)))
    for lo in range(0, rows, step):
        sel = slice(lo, min(lo + step, rows))
        keys, seen = keys_of(sel)
        keys = keys.float()
        q = queries[sel].float()
        if invariant:
            scores = _pairwise_sum(q[:, :, None, :] * keys[:, None, :, :])                     # [r, H, K]
        else:
            scores = torch.einsum("rhd,rkd->rhk", q, keys)
        scores = scores * scale
        visible = seen[:, None, :]
        poisoned[sel] = (visible & ~torch.isfinite(scores)).any(dim=-1)
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
        out[sel] = torch.where(total[..., None] > 0, summed / total.clamp(min=1e-30)[..., None], 0.0)
        lse[sel] = torch.where(total > 0, top + torch.log(total.clamp(min=1e-30)), -math.inf)
    return out, lse, poisoned


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
