"""Helpers both Gluon kernels (seesaw.py, narrow.py) share: Triton-version
shims, the KV tile's TMA paging (one box per page below the 64-token tile),
q's staging into shared memory (copied, or converted to fp16 for an e4m3
cache), score masking and value guards, a program's base pointers and rows,
the epilogue, and on the host the cache's descriptors and the layout
conditions both kernels need.

Kernel code and its host-side descriptors only: no launcher, no
``mla_dcp.pure``. Built for sm_90 (wgmma); importable only where Triton ships
Gluon's Hopper module (3.6 and later).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from mla_dcp.ops import fast_launch, launch_args
from mla_dcp.ops.triton_kernels import helpers as triton_helpers

# Renamed after Triton 3.6 (the old name raises in later versions).
tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


# cp.async into shared memory (`async_copy_global_to_shared` until 3.6).
copy_to_shared = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


# A barrier of the calling partition's warps (`thread_barrier` until 3.6).
warps_barrier = getattr(gl, "barrier", None) or gl.thread_barrier


# Named objects that cross into partitions (``gl.aggregate`` after 3.6; 3.6's
# Gluon modules take it from triton.language.core under its private name).
aggregate = getattr(gl, "aggregate", None) or triton.language.core._aggregate


# A field of an aggregate that is a tensor in one launch and a constant in
# another (Triton passes an integer 1 as a constant).
scalar = triton.language.core.base_value


# Parts of a KV tile, each with its own "landed" mbarrier per buffer.
LO_PART = gl.constexpr(0)


HI_PART = gl.constexpr(1)


ROPE_PART = gl.constexpr(2)


NUM_PARTS = gl.constexpr(3)


@gluon.jit
def part_bar(bars, buf, part):
    """The "landed" mbarrier of one part of KV buffer ``buf``."""
    return bars.index(buf * NUM_PARTS + part)


# Probe hook: a program's row of int64 stamps (benchmarks/probes/seesaw_timeline.py).
STAMP_SLOTS = gl.constexpr(16)


@gluon.jit
def stamp(stamps_ptr, slot):
    """The global timer into ``slot`` of this program's stamps; without a
    stamps buffer (``None``: every launch but the timeline probe's) nothing
    is compiled."""
    if stamps_ptr is not None:
        now = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                        pack=1)
        stamp_value(stamps_ptr, slot, now)


@gluon.jit
def stamp_value(stamps_ptr, slot, value):
    """``value`` into ``slot`` of this program's stamps (as :func:`stamp`)."""
    if stamps_ptr is not None:
        pid = gl.program_id(0) + gl.num_programs(0) * (gl.program_id(1) + gl.num_programs(1) * gl.program_id(2))
        gl.store(stamps_ptr + pid * STAMP_SLOTS + slot, value.to(gl.int64))


@gluon.jit
def stamp_sm(stamps_ptr, slot):
    """The multiprocessor this program runs on into ``slot`` (as :func:`stamp`)."""
    if stamps_ptr is not None:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        stamp_value(stamps_ptr, slot, sm)


@gluon.jit
def slot(page_table_ptr, token, page):
    """The cache slot of a token of the request whose page-table row ``page_table_ptr`` points at."""
    page_id = gl.load(page_table_ptr + token // page)
    return page_id * page + token % page


@gluon.jit
def load_part(desc, page_table_ptr, tok_lo, tok_hi, tile, col, bar, dst, pred, page,
               BLOCK_N: gl.constexpr):
    """One part of a KV tile (a latent half or the rope columns) into ``dst``.

    A tile past the segment (the odd tile of the last pair) loads the
    segment's first tile again, fully masked. Pages smaller than the tile
    take one box per page; a box past the segment's end reloads the tile's
    first box (its slots are masked and zeroed like any past the end)."""
    BOX: gl.constexpr = desc.block_type.shape[0]
    slots = part_slots(page_table_ptr, tok_lo, tok_hi, tile, page, BOX, BLOCK_N)
    copy_part(desc, slots, col, bar, landing(dst, desc), pred, BLOCK_N)


@gluon.jit
def landing(buf, desc):
    """Where a part's copy lands: ``buf``, or where ``buf`` is the fp16 form
    of an e4m3 part, the upper half of its bytes (:func:`_convert_in_place`)."""
    dst = buf
    if converted_in_place(buf.dtype, desc.dtype):
        dst = upper_half(buf, desc)
    return dst


@gluon.constexpr_function
def converted_in_place(buf_dtype, copy_dtype):
    """Whether a part copied as ``copy_dtype`` becomes ``buf_dtype`` in place:
    e4m3 copies into the fp16 buffers of the seesaw (the narrow kernel keeps
    its e4m3 tiles as they land)."""
    return copy_dtype.primitive_bitwidth == 8 and buf_dtype.primitive_bitwidth == 16


@gluon.jit
def stacked_before_3_7(buf, like, count: gl.constexpr):
    return buf._reinterpret(like.dtype, [count, buf.shape[0], buf.shape[1]], like.layout)


@gluon.jit
def stacked_since_3_7(buf, like, count: gl.constexpr):
    return buf.reinterpret(like.dtype, [count, buf.shape[0], buf.shape[1]], like.layout)


# buf's bytes as ``count`` tiles of buf's shape in the dtype and layout of ``like`` (buf itself or a
# TMA descriptor; the builtin was renamed after 3.6, as the ones above).
stacked = stacked_since_3_7 if hasattr(gl.shared_memory_descriptor, "reinterpret") else stacked_before_3_7


@gluon.jit
def upper_half(buf, desc):
    """The bytes of buf's upper half as ``desc``'s e4m3 box."""
    return stacked(buf, desc, 2).index(1)


@gluon.jit
def load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, tok_lo, tok_hi, tile, bars, kv_lo, kv_hi,
               kv_rope, stage, pred, PAGE: gl.constexpr, BLOCK_N: gl.constexpr, LATENT: gl.constexpr,
               ROPE: gl.constexpr):
    """Tile ``tile`` of the segment into ``stage``: its latent halves, its rope part, or both."""
    HALF: gl.constexpr = kv_lo.shape[2]
    if LATENT:
        load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile, 0,
                   part_bar(bars, stage, LO_PART), kv_lo.index(stage), pred, PAGE, BLOCK_N)
        load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile, HALF,
                   part_bar(bars, stage, HI_PART), kv_hi.index(stage), pred, PAGE, BLOCK_N)
    if ROPE:
        load_part(kv_rope_desc, page_table_ptr, tok_lo, tok_hi, tile, 2 * HALF,
                   part_bar(bars, stage, ROPE_PART), kv_rope.index(stage), pred, PAGE, BLOCK_N)


@gluon.jit
def part_slots(page_table_ptr, tok_lo, tok_hi, tile, page, BOX: gl.constexpr,
                BLOCK_N: gl.constexpr):
    """The cache slots (token rows) of a tile's boxes, by :func:`load_part`'s
    rules; unused entries repeat the first. Every box's page id is read
    before the first copy goes out: the barrier pass puts a bar.sync before
    each copy into the buffer, and no load moves across one, so reading them
    in turn would expose each load's latency."""
    BOXES: gl.constexpr = BLOCK_N // BOX
    gl.static_assert(BOXES == 1 or BOXES == 2 or BOXES == 4, "pages of 16, 32 or whole 64-token tiles (layout_fits)")
    start = tok_lo + tile * BLOCK_N
    start = gl.where(start < tok_hi, start, tok_lo)
    slot0 = slot(page_table_ptr, start, page)
    slot1 = slot0
    slot2 = slot0
    slot3 = slot0
    if BOXES >= 2:
        slot1 = slot(page_table_ptr, box_start(start, 1 * BOX, tok_hi), page)
    if BOXES >= 4:
        slot2 = slot(page_table_ptr, box_start(start, 2 * BOX, tok_hi), page)
        slot3 = slot(page_table_ptr, box_start(start, 3 * BOX, tok_hi), page)
    return slot0, slot1, slot2, slot3


@gluon.jit
def copy_part(desc, slots, col, bar, dst, pred, BLOCK_N: gl.constexpr):
    """A tile part's TMA copies, one box per entry of ``slots``."""
    BOX: gl.constexpr = desc.block_type.shape[0]
    BOXES: gl.constexpr = BLOCK_N // BOX
    mbarrier.expect(bar, BOXES * desc.block_type.nbytes, pred=pred)
    tma_load(desc, [slots[0], col], bar, dst.slice(0, BOX, dim=0), pred=pred)
    if BOXES >= 2:
        tma_load(desc, [slots[1], col], bar, dst.slice(BOX, BOX, dim=0), pred=pred)
    if BOXES >= 4:
        tma_load(desc, [slots[2], col], bar, dst.slice(2 * BOX, BOX, dim=0), pred=pred)
        tma_load(desc, [slots[3], col], bar, dst.slice(3 * BOX, BOX, dim=0), pred=pred)


@gluon.jit
def box_start(start, offset, tok_hi):
    """A box past the segment's end reloads the tile's first box."""
    box = start + offset
    return gl.where(box < tok_hi, box, start)


@gluon.jit
def guard_values(buf, n_valid, ROWS: gl.constexpr, COLS: gl.constexpr):
    """Zero a V buffer's rows at and past ``n_valid``, and its non-finite
    values: slots past the segment's end hold unspecified values, and a row
    that masks a token another row sees still multiplies its value by a
    probability of 0; 0 * NaN would reach those outputs. Rows that see a
    non-finite value are poisoned by its key's score (triton_helpers.finite_or_zero).
    Only tiles past the tile's shortest row pay."""
    # 32 columns a pass (16 values a thread): it runs inside the pair loop,
    # where the accumulator holds most registers, so its temporaries stay few.
    CHUNK: gl.constexpr = 32
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, layout))
    for c in gl.static_range(COLS // CHUNK):
        part = buf.slice(c * CHUNK, CHUNK, dim=1)
        x = part.load(layout)
        keep = (rows[:, None] < n_valid) & (gl.abs(x.to(gl.float32)) < float("inf"))
        part.store(gl.where(keep, x, gl.zeros_like(x)))
    # Generic-proxy writes, read next by wgmma (async proxy) of every warp.
    fence_async_shared()
    warps_barrier()


@gluon.jit
def masked(s, row_len, shortest, tok_lo, tok_hi, tile, score_scale, s_layout: gl.constexpr, BLOCK_N: gl.constexpr,
            TOKEN_AXIS: gl.constexpr, FP8: gl.constexpr):
    """Scaled scores, -inf where a row must not see the token. Only tiles
    reaching past the shortest row (a segment's last ones) pay for the mask.
    Tokens run along ``TOKEN_AXIS`` of ``s`` (0 in ops/gluon_kernels/narrow.py's K q^T).
    A visible -inf (inf in q or a 16-bit key) becomes NaN, the poisoned row;
    over an e4m3 cache (``FP8``) keys hold no inf and q's inf already made
    the score scale NaN (stage_q_fp16), so the select is left out there."""
    start = tok_lo + tile * BLOCK_N
    if start + BLOCK_N > shortest:
        if TOKEN_AXIS == 1:
            offs_n = start + gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
            visible = (offs_n[None, :] < row_len[:, None]) & (offs_n[None, :] < tok_hi)
        else:
            offs_n = start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, s_layout))
            visible = (offs_n[:, None] < row_len[None, :]) & (offs_n[:, None] < tok_hi)
        if FP8:
            s = gl.where(visible, s * score_scale, float("-inf"))
        else:
            s = gl.where(visible, triton_helpers.poison_neg_inf(s * score_scale), float("-inf"))
    elif FP8:
        s = s * score_scale
    else:
        s = triton_helpers.poison_neg_inf(s * score_scale)
    return s


@gluon.jit
def stage_q_fp16(q_ptr, q_lo, q_hi, q_rope, row, head, m_live, stride_q_row, stride_q_head,
                  ld_layout: gl.constexpr):
    """q of the tile's (head, verify row) pairs into shared memory as fp16,
    zeros for rows past the tile's end (ops/gluon_kernels/narrow.py over an e4m3 cache): a
    bf16 pair is first scaled by the power of two of triton_helpers.fp16_row_shift.
    Returns the pairs' 1 / factor. 16-bit q that needs no conversion is
    copied instead (:func:`copy_q`).

    The rows' maxima take one pass over q; then each part (a latent half, the
    rope columns) is loaded again whole and stored in one statement. With no
    barrier between them, the second pass's loads go out with the first's
    (in the seesaw's SASS, 46 of the 72 in one run): about two memory round trips.
    Stored 64 columns at a time, as before, every chunk waited for its own
    loads: the barrier pass puts a bar.sync between two stores into one
    buffer, and no load moves across one. Holding all of q in registers
    instead (one pass) spills (stack 72 -> 176 B) and adds reloads to the
    pair loop."""
    HALF: gl.constexpr = q_lo.shape[1]
    DR: gl.constexpr = q_rope.shape[1]
    q_base = q_ptr + row.to(gl.int64) * stride_q_row + head * stride_q_head
    factor = gl.full(row.shape, 1.0, gl.float32, row.type.layout)
    # The rows' largest |q| also finds inf in q: the returned factor is then
    # NaN (triton_helpers.poison_unscale), which poisons the row's scores, so the
    # e4m3 loops need no per-score check (e4m3 keys hold no inf).
    amax = gl.zeros_like(factor)
    for c in gl.static_range((2 * HALF + DR) // 64):
        amax = gl.maximum(amax, triton_helpers.row_absmax(q_part(q_base, c * 64, 64, m_live, ld_layout)))
    unscale = triton_helpers.poison_unscale(factor, amax)
    if q_ptr.dtype.element_ty == gl.bfloat16:
        factor, unscale = triton_helpers.fp16_row_shift(amax)
    q_lo.store(triton_helpers.scaled_rows(q_part(q_base, 0, HALF, m_live, ld_layout), factor, gl.float16))
    q_hi.store(triton_helpers.scaled_rows(q_part(q_base, HALF, HALF, m_live, ld_layout), factor, gl.float16))
    q_rope.store(triton_helpers.scaled_rows(q_part(q_base, 2 * HALF, DR, m_live, ld_layout), factor, gl.float16))
    fence_async_shared()
    warps_barrier()
    return unscale


@gluon.jit
def stage_q_e4m3(q_ptr, q_lo, q_hi, q_rope, row, head, m_live, stride_q_row, stride_q_head,
                  ld_layout: gl.constexpr):
    """q of the tile's pairs for the fp8-products mode: the latent halves in
    e4m3, scaled per pair by triton_helpers.e4m3_row_shift of the latent
    part's largest |q| (pure.e4m3_row_factor), the rope part as it is.
    Returns the latent scores' 1 / factor, NaN where any of q's row is
    inf (the rope part's too)."""
    HALF: gl.constexpr = q_lo.shape[1]
    DR: gl.constexpr = q_rope.shape[1]
    q_base = q_ptr + row.to(gl.int64) * stride_q_row + head * stride_q_head
    amax = gl.full(row.shape, 0.0, gl.float32, row.type.layout)
    for c in gl.static_range(2 * HALF // 64):
        amax = gl.maximum(amax, triton_helpers.row_absmax(q_part(q_base, c * 64, 64, m_live, ld_layout)))
    rope = q_part(q_base, 2 * HALF, DR, m_live, ld_layout)
    factor, unscale = triton_helpers.e4m3_row_shift(amax)
    unscale = triton_helpers.poison_unscale(unscale, gl.maximum(amax, triton_helpers.row_absmax(rope)))
    q_lo.store(triton_helpers.scaled_rows(q_part(q_base, 0, HALF, m_live, ld_layout), factor, gl.float8e4nv))
    q_hi.store(triton_helpers.scaled_rows(q_part(q_base, HALF, HALF, m_live, ld_layout), factor, gl.float8e4nv))
    q_rope.store(rope)
    fence_async_shared()
    warps_barrier()
    return unscale


@gluon.jit
def q_part(q_base, first_col, COLS: gl.constexpr, m_live, ld_layout: gl.constexpr):
    cols = first_col + gl.arange(0, COLS, gl.SliceLayout(0, ld_layout))
    return gl.load(q_base[:, None] + cols[None, :], mask=m_live[:, None], other=0.0)


@gluon.jit
def copy_q(q_ptr, q_lo, q_hi, q_rope, row, head, m_live, stride_q_row, stride_q_head, ld_layout: gl.constexpr):
    """Issue the copies of 16-bit q into shared memory (:func:`q_landed`
    waits for them). Issued before the KV copies' dependent loads (row
    lengths, page ids), q's transfer overlaps their latency.

    Copies straight into shared memory, all in flight at once: loads and
    stores per chunk cost a memory latency each (the barrier pass puts a
    bar.sync between two stores to one buffer, so no chunk's loads start
    before the previous chunk is stored). Rows past the tile's end are
    zero-filled."""
    HALF: gl.constexpr = q_lo.shape[1]
    q_base = q_ptr + row.to(gl.int64) * stride_q_row + head * stride_q_head
    cols = gl.arange(0, 64, gl.SliceLayout(0, ld_layout))
    for c in gl.static_range(HALF // 64):
        copy_to_shared(q_lo.slice(c * 64, 64, dim=1), q_base[:, None] + c * 64 + cols[None, :],
                        mask=m_live[:, None])
        copy_to_shared(q_hi.slice(c * 64, 64, dim=1), q_base[:, None] + HALF + c * 64 + cols[None, :],
                        mask=m_live[:, None])
    copy_to_shared(q_rope, q_base[:, None] + 2 * HALF + cols[None, :], mask=m_live[:, None])
    async_copy.commit_group()


@gluon.jit
def q_landed():
    async_copy.wait_group(0)
    # Written through the generic proxy, read by wgmma (async proxy) of every warp.
    fence_async_shared()
    warps_barrier()


@gluon.jit
def after_previous_kernel(PDL: gl.constexpr):
    """triton_helpers.after_previous_kernel for the Gluon kernels (Gluon has no
    gdc_* builtins): wait for the stream's previous kernel, then let the next
    launch. Called after the barriers' set-up, before any global read."""
    if PDL:
        gl.inline_asm_elementwise("griddepcontrol.wait; // $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)
        gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0", "=r", [], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def program_pointers(b, item, page_table_ptr, stride_page_b, row_lens_ptr, out_ptr, lse_ptr, seg_out_ptr,
                      seg_max_ptr, seg_sum_ptr, QLEN: gl.constexpr, H: gl.constexpr, DL: gl.constexpr):
    """A program's own pointers, offset once in the prologue: its request's
    page-table row, row lengths and outputs, and its item's partial slot.
    Then neither the request nor the item stays live in a register through
    the loop, and the helpers index from 0."""
    return (page_table_ptr + b * stride_page_b, row_lens_ptr + b * QLEN,
            out_ptr + b.to(gl.int64) * (QLEN * H * DL), lse_ptr + b.to(gl.int64) * (QLEN * H),
            seg_out_ptr + item.to(gl.int64) * (H * QLEN * DL), seg_max_ptr + item.to(gl.int64) * (H * QLEN),
            seg_sum_ptr + item.to(gl.int64) * (H * QLEN))


@gluon.jit
def store_empty_stats(seg_max_ptr, seg_sum_ptr, item, m_tile, QLEN: gl.constexpr, H: gl.constexpr,
                      BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """An empty piece's partial: seg_max -inf and seg_sum 0 for the tile's
    live (head, row) pairs of item ``item`` (its seg_out is unspecified)."""
    offs_m = m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout)   # head * QLEN + row: the slot's own order
    m_live = offs_m < QLEN * H
    offs = item.to(gl.int64) * (H * QLEN) + offs_m
    gl.store(seg_max_ptr + offs, gl.full([BLOCK_M], float("-inf"), gl.float32, layout), mask=m_live)
    gl.store(seg_sum_ptr + offs, gl.zeros([BLOCK_M], gl.float32, layout), mask=m_live)


@gluon.jit
def row_info(row_lens_ptr, m_tile, b, layout: gl.constexpr, qlen, heads, BLOCK_M: gl.constexpr):
    return triton_helpers.rows_of(row_lens_ptr, m_tile * BLOCK_M + gl.arange(0, BLOCK_M, layout), b, qlen, heads)


@gluon.jit
def epilogue(acc, m_i, l_i, first_col, STORE_STATS: gl.constexpr, rows, qlen, max_pages, seg_out_ptr,
              seg_max_ptr, seg_sum_ptr, out_ptr, lse_ptr, o_layout: gl.constexpr, heads, page,
              FINALIZE: gl.constexpr, DL: gl.constexpr):
    """Store one warpgroup's half of the output (and, from one of them, the
    statistics) with the same rules as the Triton kernels' epilogue.
    ``rows``: :func:`row_info` in ``o_layout``'s rows, loaded by the caller
    ahead of the partial sums' exchange, so that its latency is hidden; its
    rows are the request's (the pointers are offset to the request's rows
    and the item's partial slot)."""
    HALF: gl.constexpr = DL // 2
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_live, head, row, row_len = rows
    m_i = gl.convert_layout(m_i, rows_o)
    l_i = gl.convert_layout(l_i, rows_o)
    poisoned = row_len > max_pages * page
    seg_max, seg_sum = triton_helpers.stats_of(m_i, l_i, poisoned)
    pair = row.to(gl.int64) * heads + head
    offs_d = gl.arange(0, HALF, gl.SliceLayout(0, o_layout))
    if FINALIZE:
        out, lse = triton_helpers.final_of(acc, seg_max, seg_sum)
        if STORE_STATS:
            gl.store(lse_ptr + pair, lse, mask=m_live)
        gl.store(out_ptr + pair[:, None] * DL + first_col + offs_d[None, :], out.to(out_ptr.dtype.element_ty),
                 mask=m_live[:, None])
    else:
        offs = head.to(gl.int64) * qlen + row
        if STORE_STATS:
            gl.store(seg_max_ptr + offs, seg_max, mask=m_live)
            gl.store(seg_sum_ptr + offs, seg_sum, mask=m_live)
        acc = gl.where(poisoned[:, None], float("nan"), acc)
        # A row with no key here (an unused item, a row whose window ends
        # before the segment) has no output to store: the merge never reads
        # it. Batch-invariant steps hold mostly such items (the static bound's
        # segments), whose 128 KiB stores cost C1 +28% at an 8x bound.
        gl.store(seg_out_ptr + offs[:, None] * DL + first_col + offs_d[None, :], acc,
                 mask=(m_live & (seg_sum != 0))[:, None])


def descriptors(kv_cache, kv_lora_rank: int, page: int):
    """TMA descriptors of the cache as one row per token slot: boxes of a
    latent half and of the rope columns, one page tall below the 64-token
    tile (see load_part)."""
    key = (tuple(kv_cache.shape), kv_cache.stride(1), kv_cache.dtype, kv_cache.data_ptr() & 15, kv_lora_rank, page)
    fields = DESCRIPTOR_FIELDS.get(key)
    if fields is None:
        head_dim = kv_cache.shape[-1]
        slots = [kv_cache.shape[0] * kv_cache.shape[1], head_dim]
        strides = [kv_cache.stride(1), 1]
        box_rows = min(page, BLOCK_N)
        built = [TensorDescriptor(kv_cache, slots, strides, box, box_layout(tuple(box), kv_cache.dtype))
                 for box in ([box_rows, kv_lora_rank // 2], [box_rows, head_dim - kv_lora_rank])]
        # Everything but the tensor: the cache's own descriptors must not keep it alive.
        fields = DESCRIPTOR_FIELDS[key] = [{k: v for k, v in vars(d).items() if k != "base"} for d in built]
        return tuple(built)
    return tuple(with_base(kv_cache, f) for f in fields)


# Per cache shape, stride, dtype and alignment: the fields of its two validated
# descriptors. Building and validating a descriptor costs ~4 us of host time per
# launch; one of the same facts over another tensor is the same fields.
DESCRIPTOR_FIELDS: dict[tuple, list[dict]] = {}


def with_base(base, fields: dict):
    return fast_launch.rebased(TensorDescriptor, fields, base)


@functools.lru_cache(maxsize=None)
def box_layout(box: tuple[int, int], dtype: torch.dtype):
    # Asked per launch: the layout computation costs ~6 us of host time.
    return gl.NVMMASharedLayout.get_default_for(list(box), GL_DTYPES[dtype])


def fits(q, kv_cache, kv_scale, kv_lora_rank: int, page: int) -> bool:
    """Whether this kernel serves the launch: 16-bit q and cache of one
    dtype without a cache scale, or an e4m3fn cache (with or without one)
    under 16-bit q; and :func:`layout_fits`."""
    same = q.dtype == kv_cache.dtype and q.element_size() == 2 and kv_scale is None
    e4m3 = kv_cache.dtype == torch.float8_e4m3fn and q.dtype in (torch.bfloat16, torch.float16)
    return (same or e4m3) and layout_fits(q, kv_cache, kv_lora_rank, page)


def layout_fits(q, kv_cache, kv_lora_rank: int, page: int) -> bool:
    """The Gluon kernels' layout conditions: 512 latent + 64 rope columns,
    pages of whole 64-token tiles or of 16 or 32 tokens (a box per page;
    smaller pages would take too many copies per tile), 16-byte aligned
    cache rows, and q's rows in 16-byte pieces (its copies into shared memory
    move 16 bytes each: strides of whole 16 elements, which is what Triton's
    launch specialises)."""
    whole_tiles = page % BLOCK_N == 0 or (BLOCK_N % page == 0 and page >= 16)
    q_aligned = (q.data_ptr() % 16 == 0 and q.stride(-1) == 1 and q.stride(0) % 16 == 0
                 and q.stride(1) % 16 == 0)
    return (kv_lora_rank == 512 and q.shape[-1] - kv_lora_rank == BLOCK_N and whole_tiles and q_aligned
            and kv_cache.data_ptr() % 16 == 0 and kv_cache.stride(1) * kv_cache.element_size() % 16 == 0
            and kv_cache.stride(-1) == 1)


BLOCK_M = 64


BLOCK_N = 64


GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16, torch.float8_e4m3fn: gl.float8e4nv}


def launch(kernel, q, kv_cache, kv_scale, row_lens, page_table, work, qlen: int, kv_lora_rank: int,
           softmax_scale: float, outputs, finalize: bool, page: int, block_m: int, stamps=None, **constexprs):
    """Launch Gluon attention ``kernel`` (either: they take the same
    arguments) with the Triton kernels' arguments and outputs (see
    ``launchers._launch_attention``), ``block_m`` pairs per tile and the
    kernel's own ``constexprs``; the caller checks :func:`fits`. ``stamps``:
    an int64 [programs, STAMP_SLOTS] buffer for the timeline probe's stamps
    (:func:`stamp`); never passed otherwise, so no launch carries it."""
    _, heads, head_dim = q.shape
    half_desc, rope_desc = descriptors(kv_cache, kv_lora_rank, page)
    partials, unused = launch_args.kernel_outputs(outputs, finalize)
    grid = (triton.cdiv(qlen * heads, block_m), work.shape[0], 1)
    return fast_launch.launch(
        kernel, grid, q, half_desc, rope_desc, kv_scale if kv_scale is not None else unused, row_lens, page_table,
        work, *partials, q.stride(0), q.stride(1), page_table.stride(0), softmax_scale * math.log2(math.e),
        page_table.shape[1], QLEN=qlen, H=heads, DL=kv_lora_rank, DR=head_dim - kv_lora_rank, PAGE=page,
        FINALIZE=finalize, BLOCK_M=block_m, BLOCK_N=BLOCK_N, HAS_KV_SCALE=kv_scale is not None,
        WORK_COLS=work.shape[1], **constexprs,
        **({} if stamps is None else {"stamps_ptr": stamps}),
        **launch_args.pdl_options(q.device), num_warps=4)
