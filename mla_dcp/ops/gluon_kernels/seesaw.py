"""Hopper attention in Gluon: two warpgroups in a "seesaw" over KV tile pairs.

The Triton kernels leave the schedule to the compiler, which splits each
64x64 score tile between the two warpgroups (each re-reads all of q from
shared memory for 32 columns) and runs softmax between the matrix multiplies
with no overlap (as its compiled code shows). Gluon states the schedule instead,
after FlashMLA's dense decode kernel:

* warpgroup L owns output columns [0, 256), warpgroup R columns [256, 512);
* of each pair of KV tiles, L scores the even tile and R the odd one, each a
  whole 64x64 score tile (q read once per tile, not twice);
* each multiplies its own probabilities with its half of V from registers,
  and the other's probabilities, passed through shared memory, with its half
  of the other tile's V. While one warpgroup runs softmax, the other's
  matrix multiplies keep the tensor cores busy.

The running max is shared: L publishes its tile's max, R folds in its own
and publishes the pair's, and both rescale to it, so the two halves of the
output and the two partial sums always refer to the same max. Each publishes
as soon as its row max is known, before its exponentials: the two softmaxes
then run side by side and L's own V product runs under R's (publishing after
the product, as the first version did, left the tensor cores idle through
both softmaxes in turn: 5-7% of the loop, measured on the H200).

Same contract as ``triton_kernels.kernels.segmented_attention_tma_kernel`` for 16-bit q over
a cache of q's dtype without scale or an e4m3 cache with or without one, pages
of 16 tokens or more (one TMA box per page below the 64-token tile), rope width
64; ``helpers.fits`` says which launches (the narrow kernel's conditions too). An e4m3 cache lands by TMA in the upper
half of the fp16 buffer each part becomes and is converted there in place,
so both warpgroups multiply fp16 from shared memory as on a 16-bit cache
(1.7x faster than the narrow kernel's conversions in registers on C2). Each
warpgroup converts its own latent half of its next tile while its last V
product of a pair runs, and the other parts before their products in the
scores, under the previous part's product (measured on C2:
a third, converting warpgroup and row-chunked conversion were slower). q
moves into fp16's range with the Triton kernels' per-row power of two (as in
ops/gluon_kernels/narrow.py).
``FP8_PRODUCTS`` (VerifyConfig.fp8_products) builds the e4m3 variant: the
latent halves stay e4m3 and multiply on fp8 wgmma, which reads a shared
B operand K-major only, so each warpgroup writes the V^T of the two halves
it multiplies (:class:`ProductsShared`, :func:`_warpgroup_e4m3`).
Built for sm_90 (wgmma); importable only where Triton ships Gluon's Hopper
module (3.6 and later: the renamed builtins are shimmed in ``helpers``).
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from mla_dcp.ops.gluon_kernels import helpers
from mla_dcp.ops.gluon_kernels.helpers import (
    BLOCK_M,
    HI_PART,
    LO_PART,
    NUM_PARTS,
    ROPE_PART,
    aggregate,
    part_bar,
    scalar,
    warps_barrier,
)
from mla_dcp.ops.triton_kernels import helpers as triton_helpers


# mbarriers that order the warpgroups (one completion per tile pair).
_MAX0_READY = gl.constexpr(0)      # L wrote its tile's max and its rescale factor
_SCALE1_READY = gl.constexpr(1)    # R wrote the pair's max and its rescale factor
_P0_READY = gl.constexpr(2)        # L's probabilities (rescaled to the pair's max) are in shared memory
_P1_READY = gl.constexpr(3)        # R's probabilities are in shared memory
_SUM0_READY = gl.constexpr(4)      # final partial sums
_SUM1_READY = gl.constexpr(5)
_NUM_SYNC = gl.constexpr(6)
_P0_FREE = gl.constexpr(6)         # R's product with L's probabilities is done (fp8-products builds only)
# Registers of R (setmaxnreg). No producer warps here, so the 64K-register
# file splits evenly: 256 each (L keeps the kernel's allotment).
RIGHT_REGS = gl.constexpr(256)



@aggregate
class Shared:
    """The shared memory both warpgroups use: q's three parts, two KV
    tiles (L's even, R's odd) per part, L's probabilities (R's go where q's
    rope part was), the row statistics they exchange, the tiles' "landed"
    mbarriers (:func:`helpers.part_bar`) and the ones that order the two
    warpgroups (``_MAX0_READY`` and the rest)."""
    q_lo: gl.shared_memory_descriptor
    q_hi: gl.shared_memory_descriptor
    q_rope: gl.shared_memory_descriptor
    kv_lo: gl.shared_memory_descriptor
    kv_hi: gl.shared_memory_descriptor
    kv_rope: gl.shared_memory_descriptor
    p0: gl.shared_memory_descriptor
    stat_max: gl.shared_memory_descriptor
    stat_scale0: gl.shared_memory_descriptor
    stat_scale1: gl.shared_memory_descriptor
    stat_sum0: gl.shared_memory_descriptor
    stat_sum1: gl.shared_memory_descriptor
    stat_unscale: gl.shared_memory_descriptor
    kv_bars: gl.shared_memory_descriptor
    sync_bars: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope, p0, stat_max, stat_scale0, stat_scale1,
                 stat_sum0, stat_sum1, stat_unscale, kv_bars, sync_bars):
        self.q_lo, self.q_hi, self.q_rope = q_lo, q_hi, q_rope
        self.kv_lo, self.kv_hi, self.kv_rope = kv_lo, kv_hi, kv_rope
        self.p0 = p0
        self.stat_max, self.stat_scale0, self.stat_scale1 = stat_max, stat_scale0, stat_scale1
        self.stat_sum0, self.stat_sum1, self.stat_unscale = stat_sum0, stat_sum1, stat_unscale
        self.kv_bars, self.sync_bars = kv_bars, sync_bars


@aggregate
class Program:
    """What a program's warpgroups need besides shared memory: the cache's
    descriptors, the program's own pointers (its request's rows and pages,
    its item's partial slot: neither the request nor the item stays live in a
    register through the loop, where the accumulators hold nearly all), and
    its scalars. Shape constants come from the buffers inside a partition."""
    kv_half_desc: scalar
    kv_rope_desc: scalar
    row_lens_ptr: gl.tensor
    page_table_ptr: gl.tensor
    seg_out_ptr: gl.tensor
    seg_max_ptr: gl.tensor
    seg_sum_ptr: gl.tensor
    out_ptr: gl.tensor
    lse_ptr: gl.tensor
    softmax_scale_log2: scalar
    max_pages: scalar
    tok_lo: scalar
    tok_hi: scalar
    n_pairs: scalar
    qlen: scalar
    heads: scalar
    page: scalar
    kv_scale: scalar
    stamps_ptr: scalar

    @gluon.constexpr_function
    def __init__(self, kv_half_desc, kv_rope_desc, row_lens_ptr, page_table_ptr, seg_out_ptr, seg_max_ptr,
                 seg_sum_ptr, out_ptr, lse_ptr, softmax_scale_log2, max_pages, tok_lo, tok_hi, n_pairs, qlen,
                 heads, page, kv_scale, stamps_ptr):
        self.kv_half_desc, self.kv_rope_desc = kv_half_desc, kv_rope_desc
        self.row_lens_ptr, self.page_table_ptr = row_lens_ptr, page_table_ptr
        self.seg_out_ptr, self.seg_max_ptr, self.seg_sum_ptr = seg_out_ptr, seg_max_ptr, seg_sum_ptr
        self.out_ptr, self.lse_ptr = out_ptr, lse_ptr
        # A constant (the shape constants, an integer 1) arrives here as a plain Python value.
        scalars = dict(softmax_scale_log2=softmax_scale_log2, max_pages=max_pages, tok_lo=tok_lo, tok_hi=tok_hi,
                       n_pairs=n_pairs, qlen=qlen, heads=heads, page=page, kv_scale=kv_scale,
                       stamps_ptr=stamps_ptr)
        for name, value in scalars.items():
            setattr(self, name, value if isinstance(value, scalar) else gl.constexpr(value))


@gluon.jit
def _rebuilt_each_pair(buf, k):
    """``buf`` itself, reached through an index that depends on the pair counter ``k`` (``k >> 30``
    is 0: a segment has fewer than 2**24 pairs). For a wgmma operand in shared memory. A
    loop-invariant buffer's descriptors (64 bits per k-step: 36 for q per tile) are hoisted out of
    the pair loop by the compilers and spill: R reloaded ~36 of q's from local memory every pair,
    and with 231 KiB of shared memory the L1 left for them missed 60% of the time (Nsight
    Compute, on the H200). Rebuilt every pair, each costs one uniform add, as the KV tiles' do."""
    return helpers.stacked(buf, buf, 1).index(k >> 30)


@gluon.jit
def _landed(buf, bar, phase, desc, converted):
    """Wait for a part's copy; an e4m3 part then becomes fp16 in place,
    unless ``converted`` says its warpgroup did so ahead (:func:`_convert_ahead`).
    Waiting again on a phase already waited for returns at once: no copy
    lands on that barrier before this warpgroup refills the part, after it
    has read it."""
    mbarrier.wait(bar, phase)
    if helpers.converted_in_place(buf.dtype, desc.dtype):
        if not converted:
            # probe: convert
            _convert_in_place(buf, helpers.landing(buf, desc))


@gluon.jit
def _convert_ahead(buf, bar, phase, desc, more):
    """Convert the next tile's own e4m3 half while this warpgroup's last V
    product of the pair runs. Done in the scores instead, both warpgroups
    convert at the start of each pair, and the tensor cores wait."""
    if helpers.converted_in_place(buf.dtype, desc.dtype):
        if more:
            # probe: convert-ahead
            _landed(buf, bar, phase, desc, False)


@gluon.jit
def _convert_in_place(dst, src):
    """dst (16-bit, 64 or 256 columns) = src (e4m3, the upper half of dst's
    bytes). Every thread reads all of its share of src before any thread
    writes: a latent half's fp16 columns 128-255 (and the rope part's rows)
    overwrite e4m3 bytes not yet read by others. 16-byte loads, two values per
    conversion instruction, 32-byte stores.

    Triton 3.6's barrier pass adds a bar.sync between each two of a latent
    half's four stores; the four stores stay anyway. The alternatives all ran
    C2 8-12 us slower on the H200: one store statement (no bar.sync,
    more spills in the loops), two statements, or columns 0-127 stored before
    128-255 are loaded (no loop spills, one round trip more)."""
    COLS: gl.constexpr = dst.shape[1]
    gl.static_assert(COLS == 64 or COLS == 256, "a latent half (256) or the rope part (64)")
    # Consecutive lanes take consecutive rows (order [0, 1]): a 16-byte access is served 8 lanes
    # at a time, and under the rows' swizzle (chunk c of row r at c ^ r % 8, 128-byte rows; the
    # rope's e4m3 rows are 64 bytes, swizzled by r // 2 % 4) 8 rows of one chunk are 8 different
    # bank groups, for the e4m3 loads and the fp16 stores alike. With 4 lanes per row (order
    # [1, 0]) two rows shared a quarter-warp, and each e4m3 load of a latent half took 8
    # wavefronts instead of 4.
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [0, 1])
    x0 = src.slice(0, 64, dim=1).load(layout)
    if COLS == 256:
        x1 = src.slice(64, 64, dim=1).load(layout)
        x2 = src.slice(128, 64, dim=1).load(layout)
        x3 = src.slice(192, 64, dim=1).load(layout)
    warps_barrier()
    dst.slice(0, 64, dim=1).store(x0.to(dst.dtype))
    if COLS == 256:
        dst.slice(64, 64, dim=1).store(x1.to(dst.dtype))
        dst.slice(128, 64, dim=1).store(x2.to(dst.dtype))
        dst.slice(192, 64, dim=1).store(x3.to(dst.dtype))
    # Generic-proxy writes, read next by wgmma (async proxy) of every warp.
    fence_async_shared()
    warps_barrier()


@gluon.jit
def _scores(q_own, q_other, q_rope_regs, k_own, k_other, k_rope, bar_own, bar_other, bar_rope, phase, half_desc,
            rope_desc, own_converted, s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """q K^T of one tile; each part's multiply is issued as soon as that part
    has landed (an e4m3 part: converted, under the previous part's multiply),
    so the tail of the tile's load overlaps the first ones. The warpgroup's
    own latent half (the one its V products read) goes first: it copied that
    half itself, a product before the other warpgroup copied the other, and
    from the second pair on (``own_converted``) converted it ahead. The rope
    part (refilled by this warpgroup right after its previous scores) comes
    next, the other half last: copied after the other warpgroup's last V
    product of the pair, it is the part most likely still in flight."""
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    # probe: wait-own
    _landed(k_own, bar_own, phase, half_desc, own_converted)
    # probe: qk-own
    s = warpgroup_mma(q_own, k_own.permute((1, 0)), s, use_acc=False, is_async=True)
    # probe: convert-rope
    _landed(k_rope, bar_rope, phase, rope_desc, False)
    # probe: qk-rope
    s = warpgroup_mma(q_rope_regs, k_rope.permute((1, 0)), s, is_async=True)
    # probe: convert-other
    _landed(k_other, bar_other, phase, half_desc, False)
    # probe: qk-other
    s = warpgroup_mma(q_other, k_other.permute((1, 0)), s, is_async=True)
    return warpgroup_mma_wait(0, deps=(s,))


@gluon.jit
def _publish_tile_max(s, m_run, stat_max, stat_scale0, sync_bars):
    """L: its tile's running max and rescale factor out to R (before its
    exponentials, see the module's note). Returns (m_new, m_shift, alpha)."""
    m_new = gl.maximum(m_run, gl.max(s, axis=1))
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2(m_run - m_shift)
    stat_max.store(m_new)
    stat_scale0.store(alpha)
    warps_barrier()
    mbarrier.arrive(sync_bars.index(_MAX0_READY), count=1)
    return m_new, m_shift, alpha


@gluon.jit
def _fold_pair_max(s, stat_max, stat_scale0, stat_scale1, sync_bars, phase, rows_s: gl.constexpr):
    """R: L's max folded with its own tile's into the pair's, published with
    R's factor. Returns (m_new, m_shift, alpha0, alpha1): L's and R's factors."""
    mbarrier.wait(sync_bars.index(_MAX0_READY), phase)
    m0 = stat_max.load(rows_s)
    alpha0 = stat_scale0.load(rows_s)
    m_new = gl.maximum(m0, gl.max(s, axis=1))
    m_shift = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha1 = gl.exp2(m0 - m_shift)
    warps_barrier()
    stat_max.store(m_new)
    stat_scale1.store(alpha1)
    warps_barrier()
    mbarrier.arrive(sync_bars.index(_SCALE1_READY), count=1)
    return m_new, m_shift, alpha0, alpha1


@gluon.jit
def _summed(IS_LEFT: gl.constexpr, l_run, stat_sum0, stat_sum1, sync_bars, rows_s: gl.constexpr):
    """Both warpgroups' partial sums, added in the same order by both: bitwise equal."""
    if IS_LEFT:
        stat_sum0.store(l_run)
        warps_barrier()
        mbarrier.arrive(sync_bars.index(_SUM0_READY), count=1)
        mbarrier.wait(sync_bars.index(_SUM1_READY), 0)
        l_all = l_run + stat_sum1.load(rows_s)
    else:
        stat_sum1.store(l_run)
        warps_barrier()
        mbarrier.arrive(sync_bars.index(_SUM1_READY), count=1)
        mbarrier.wait(sync_bars.index(_SUM0_READY), 0)
        l_all = stat_sum0.load(rows_s) + l_run
    return l_all


@gluon.jit
def _finish(IS_LEFT: gl.constexpr, FINALIZE: gl.constexpr, SCALED: gl.constexpr, FACTOR: gl.constexpr, acc,
            m_run, l_run, smem, prog: Program, o_layout: gl.constexpr, rows_s: gl.constexpr):
    """A warpgroup's end, either build: both partial sums, the output times
    the cache's scale and ``FACTOR`` where ``SCALED``, the epilogue
    (``smem``: :class:`Shared` or :class:`ProductsShared`)."""
    my = 0 if IS_LEFT else 1
    BLOCK_M: gl.constexpr = acc.shape[0]
    HALF: gl.constexpr = acc.shape[1]
    # The epilogue's row lengths: loaded before the exchange, which hides the load.
    rows = helpers.row_info(prog.row_lens_ptr, gl.program_id(0), 0, gl.SliceLayout(1, o_layout), prog.qlen,
                            prog.heads, BLOCK_M)
    helpers.stamp(prog.stamps_ptr, 6 + my)
    l_all = _summed(IS_LEFT, l_run, smem.stat_sum0, smem.stat_sum1, smem.sync_bars, rows_s)
    if SCALED:
        acc = acc * (prog.kv_scale * FACTOR)
    helpers.stamp(prog.stamps_ptr, 8 + my)
    helpers.epilogue(acc, m_run, l_all, my * HALF, IS_LEFT, rows, prog.qlen, prog.max_pages, prog.seg_out_ptr,
                     prog.seg_max_ptr, prog.seg_sum_ptr, prog.out_ptr, prog.lse_ptr, o_layout, prog.heads, prog.page,
                     FINALIZE, 2 * HALF)
    helpers.stamp(prog.stamps_ptr, 10 + my)


@gluon.jit
def _warpgroup(IS_LEFT: gl.constexpr, FINALIZE: gl.constexpr, smem: Shared, prog: Program):
    """One warpgroup's side of the seesaw (L: even tiles, columns [0, 256);
    R: odd tiles, columns [256, 512))."""
    q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope = smem.q_lo, smem.q_hi, smem.q_rope, smem.kv_lo, smem.kv_hi, smem.kv_rope
    p0_smem, stat_max, stat_unscale = smem.p0, smem.stat_max, smem.stat_unscale
    stat_scale0, stat_scale1 = smem.stat_scale0, smem.stat_scale1
    kv_bars, sync_bars = smem.kv_bars, smem.sync_bars
    kv_half_desc, kv_rope_desc = prog.kv_half_desc, prog.kv_rope_desc
    row_lens_ptr, page_table_ptr = prog.row_lens_ptr, prog.page_table_ptr
    softmax_scale_log2 = prog.softmax_scale_log2
    tok_lo, tok_hi, n_pairs = prog.tok_lo, prog.tok_hi, prog.n_pairs
    qlen, heads, page, stamps_ptr = prog.qlen, prog.heads, prog.page, prog.stamps_ptr
    BLOCK_M: gl.constexpr = q_lo.shape[0]
    BLOCK_N: gl.constexpr = kv_rope.shape[1]
    HALF: gl.constexpr = q_lo.shape[1]
    DL: gl.constexpr = 2 * HALF
    FP8: gl.constexpr = kv_half_desc.dtype.primitive_bitwidth == 8
    dtype: gl.constexpr = kv_lo.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 16])
    qa_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2)
    pa_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_tile = gl.program_id(0)
    m_live, _, _, row_len = helpers.row_info(row_lens_ptr, m_tile, 0, rows_s, qlen, heads, BLOCK_M)
    # Tiles wholly below this are visible to every row and inside the segment
    # (the masked odd tile of a last pair starts at or past tok_hi).
    shortest = gl.minimum(gl.min(gl.where(m_live, row_len, tok_hi), axis=0), tok_hi)
    # e4m3: q was scaled per row into fp16's range, and the cache's scale
    # (folded into softmax_scale_log2 by the kernel) multiplies every score.
    score_scale = softmax_scale_log2
    if FP8:
        score_scale = (stat_unscale.load(rows_s) * softmax_scale_log2)[:, None]

    # The rope part of q lives in registers: its shared memory then carries
    # R's probabilities (q, two KV tiles and both probability tiles would not
    # fit in 227 KiB otherwise). Each warpgroup reads it before the first
    # pair; R overwrites it only after L's first _MAX0_READY, which L signals
    # after its read.
    q_rope_regs = q_rope.load(qa_layout)
    p1_smem = q_rope
    if IS_LEFT:
        my = 0
        v_half, other_half, q_own, q_other = kv_lo, kv_hi, q_lo, q_hi
        own_bar, other_bar = part_bar(kv_bars, 0, LO_PART), part_bar(kv_bars, 0, HI_PART)
    else:
        my = 1
        v_half, other_half, q_own, q_other = kv_hi, kv_lo, q_hi, q_lo
        own_bar, other_bar = part_bar(kv_bars, 1, HI_PART), part_bar(kv_bars, 1, LO_PART)

    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_run = gl.zeros([BLOCK_M], gl.float32, rows_s)
    for k in range(n_pairs):
        phase = k & 1
        tile = 2 * k + my
        more = k + 1 < n_pairs
        s = _scores(_rebuilt_each_pair(q_own, k), _rebuilt_each_pair(q_other, k), q_rope_regs, v_half.index(my),
                    other_half.index(my), kv_rope.index(my), own_bar, other_bar, part_bar(kv_bars, my, ROPE_PART),
                    phase, kv_half_desc, kv_rope_desc, k > 0, s_layout, BLOCK_M, BLOCK_N)
        if k == 0:
            helpers.stamp(stamps_ptr, 4 + my)
        # Only this warpgroup scores this tile's rope part: refill it now.
        helpers.load_part(kv_rope_desc, page_table_ptr, tok_lo, tok_hi, tile + 2, DL,
                   part_bar(kv_bars, my, ROPE_PART), kv_rope.index(my), more, page, BLOCK_N)
        s = helpers.masked(s, row_len, shortest, tok_lo, tok_hi, tile, score_scale, s_layout, BLOCK_N, 1, FP8)
        own_start = tok_lo + tile * BLOCK_N
        other_start = own_start + BLOCK_N - 2 * my * BLOCK_N
        if IS_LEFT:
            m_new, m_shift, alpha = _publish_tile_max(s, m_run, stat_max, stat_scale0, sync_bars)
            # probe: softmax
            p = gl.exp2(s - m_shift[:, None])
            l_run = l_run * alpha + gl.sum(p, axis=1)
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
        else:
            m_run, m_shift, alpha0, alpha1 = _fold_pair_max(s, stat_max, stat_scale0, stat_scale1, sync_bars, phase,
                                                            rows_s)
            # probe: softmax
            p = gl.exp2(s - m_shift[:, None])
            l_run = l_run * (alpha0 * alpha1) + gl.sum(p, axis=1)
            acc = acc * gl.convert_layout(alpha0 * alpha1, rows_o)[:, None]
        p16 = p.to(dtype)
        if own_start + BLOCK_N > shortest:
            helpers.guard_values(v_half.index(my), tok_hi - own_start, BLOCK_N, HALF)
        # probe: pv-own
        acc = warpgroup_mma(gl.convert_layout(p16, pa_layout), _rebuilt_each_pair(v_half.index(my), k), acc,
                            is_async=True)
        if IS_LEFT:
            acc = warpgroup_mma_wait(0, deps=(acc,))
            # L is this tile's last reader of its low half.
            helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 2, 0,
                       part_bar(kv_bars, 0, LO_PART), kv_lo.index(0), more, page, BLOCK_N)
            mbarrier.wait(sync_bars.index(_SCALE1_READY), phase)
            alpha1 = stat_scale1.load(rows_s)
            m_run = stat_max.load(rows_s)
            p0_smem.store((p * alpha1[:, None]).to(dtype))
            fence_async_shared()
            warps_barrier()
            mbarrier.arrive(sync_bars.index(_P0_READY), count=1)
            acc = acc * gl.convert_layout(alpha1, rows_o)[:, None]
            l_run = l_run * alpha1
            mbarrier.wait(sync_bars.index(_P1_READY), phase)
            if other_start + BLOCK_N > shortest:
                helpers.guard_values(kv_lo.index(1), tok_hi - other_start, BLOCK_N, HALF)
            # probe: pv-other
            acc = warpgroup_mma(_rebuilt_each_pair(p1_smem, k), _rebuilt_each_pair(kv_lo.index(1), k), acc,
                                is_async=True)
            _convert_ahead(v_half.index(my), own_bar, phase ^ 1, kv_half_desc, more)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 3, 0,
                       part_bar(kv_bars, 1, LO_PART), kv_lo.index(1), more, page, BLOCK_N)
        else:
            p1_smem.store(p16)
            fence_async_shared()
            warps_barrier()
            mbarrier.arrive(sync_bars.index(_P1_READY), count=1)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 2, HALF,
                       part_bar(kv_bars, 1, HI_PART), kv_hi.index(1), more, page, BLOCK_N)
            mbarrier.wait(sync_bars.index(_P0_READY), phase)
            if other_start + BLOCK_N > shortest:
                helpers.guard_values(kv_hi.index(0), tok_hi - other_start, BLOCK_N, HALF)
            # probe: pv-other
            acc = warpgroup_mma(_rebuilt_each_pair(p0_smem, k), _rebuilt_each_pair(kv_hi.index(0), k), acc,
                                is_async=True)
            _convert_ahead(v_half.index(my), own_bar, phase ^ 1, kv_half_desc, more)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 1, HALF,
                       part_bar(kv_bars, 0, HI_PART), kv_hi.index(0), more, page, BLOCK_N)

    # An e4m3 cache's scale multiplies the output (the scores' is in softmax_scale_log2).
    _finish(IS_LEFT, FINALIZE, FP8, 1.0, acc, m_run, l_run, smem, prog, o_layout, rows_s)


@aggregate
class ProductsShared:
    """Shared memory of the fp8-products build: q's latent halves in e4m3 and
    its rope part in q's dtype; the KV tiles' latent halves e4m3 as they land
    (the scores read them directly: K-major, as fp8 wgmma needs), the rope
    parts converted in place to q's dtype; each warpgroup's two V^T tiles
    (``vt``: L's of the even and odd tile, then R's), e4m3 P·V needing
    its B operand K-major, i.e. V transposed; both probability tiles in
    e4m3; the row statistics and barriers as in :class:`Shared`."""
    q_lo: gl.shared_memory_descriptor
    q_hi: gl.shared_memory_descriptor
    q_rope: gl.shared_memory_descriptor
    kv_lo: gl.shared_memory_descriptor
    kv_hi: gl.shared_memory_descriptor
    kv_rope: gl.shared_memory_descriptor
    vt: gl.shared_memory_descriptor
    p0: gl.shared_memory_descriptor
    p1: gl.shared_memory_descriptor
    stat_max: gl.shared_memory_descriptor
    stat_scale0: gl.shared_memory_descriptor
    stat_scale1: gl.shared_memory_descriptor
    stat_sum0: gl.shared_memory_descriptor
    stat_sum1: gl.shared_memory_descriptor
    stat_unscale: gl.shared_memory_descriptor
    kv_bars: gl.shared_memory_descriptor
    sync_bars: gl.shared_memory_descriptor

    @gluon.constexpr_function
    def __init__(self, q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope, vt, p0, p1, stat_max, stat_scale0, stat_scale1,
                 stat_sum0, stat_sum1, stat_unscale, kv_bars, sync_bars):
        self.q_lo, self.q_hi, self.q_rope = q_lo, q_hi, q_rope
        self.kv_lo, self.kv_hi, self.kv_rope = kv_lo, kv_hi, kv_rope
        self.vt, self.p0, self.p1 = vt, p0, p1
        self.stat_max, self.stat_scale0, self.stat_scale1 = stat_max, stat_scale0, stat_scale1
        self.stat_sum0, self.stat_sum1, self.stat_unscale = stat_sum0, stat_sum1, stat_unscale
        self.kv_bars, self.sync_bars = kv_bars, sync_bars


@gluon.jit
def _transpose_values(src, dst, n_valid, GUARD: gl.constexpr):
    """dst [HALF, BLOCK_N] = src [BLOCK_N, HALF]^T, e4m3, 64 columns a pass;
    with ``GUARD`` (a tile past the shortest row) tokens at and past
    ``n_valid`` and non-finite values are zeroed, as guard_values does for
    the 16-bit V. Each thread moves 4 x 8 bytes: 8-byte loads along a
    token's row, 4-byte stores along a column of V^T."""
    layout: gl.constexpr = gl.BlockedLayout([4, 8], [4, 8], [4, 1], [1, 0])
    stores: gl.constexpr = gl.BlockedLayout([4, 1], [4, 8], [4, 1], [0, 1])
    ROWS: gl.constexpr = src.shape[0]
    for c in gl.static_range(src.shape[1] // 64):
        x = src.slice(c * 64, 64, dim=1).load(layout)
        if GUARD:
            toks = gl.arange(0, ROWS, gl.SliceLayout(1, layout))
            keep = (toks[:, None] < n_valid) & (gl.abs(x.to(gl.float32)) < float("inf"))
            x = gl.where(keep, x, gl.zeros_like(x))
        # probe: vt-store
        dst.slice(c * 64, 64, dim=0).store(gl.permute(gl.convert_layout(x, stores), [1, 0]))
    # Generic-proxy writes, read next by wgmma (async proxy) of every warp.
    fence_async_shared()
    warps_barrier()


@gluon.jit
def _values_transposed(src, dst, n_valid, guard):
    if guard:
        _transpose_values(src, dst, n_valid, True)
    else:
        _transpose_values(src, dst, n_valid, False)


@gluon.jit
def _scores_e4m3(q_own, q_other, q_rope, k_own, k_other, k_rope, bar_own, bar_other, bar_rope, phase, rope_desc,
                 vt_own, n_valid, guard, v_next, vt_next, bar_next, n_next, guard_next, NEXT: gl.constexpr,
                 lat_unscale, s_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """q K^T of one tile with e4m3 latent products: both latent halves on
    fp8 wgmma, scaled by q's latent row factor, then the 16-bit rope part
    into the same accumulator (pure.segmented_attention's order: latent
    scores times the factor, plus the rope scores). Under the latent
    products this warpgroup transposes its own half of the tile into
    ``vt_own`` (its V for the tile) and converts the rope part; with
    ``NEXT`` (R) also the other tile's half it multiplies (``v_next``: L's
    tile, refilled by R half a pair ago), which R would otherwise transpose
    with no product of its own in flight."""
    # The same registers as s_layout; an e4m3 wgmma takes K = 32 a step.
    s8_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_N, 32])
    s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s8_layout)
    mbarrier.wait(bar_own, phase)
    s = warpgroup_mma(q_own, k_own.permute((1, 0)), s, use_acc=False, is_async=True)
    mbarrier.wait(bar_other, phase)
    s = warpgroup_mma(q_other, k_other.permute((1, 0)), s, is_async=True)
    _values_transposed(k_own, vt_own, n_valid, guard)
    if NEXT:
        mbarrier.wait(bar_next, phase)
        _values_transposed(v_next, vt_next, n_next, guard_next)
    # probe: e4m3-convert-rope
    _landed(k_rope, bar_rope, phase, rope_desc, converted=False)
    s = warpgroup_mma_wait(0, deps=(s,))
    s = gl.convert_layout(s * gl.convert_layout(lat_unscale, gl.SliceLayout(1, s8_layout))[:, None], s_layout)
    # probe: e4m3-qk-rope
    s = warpgroup_mma(q_rope, k_rope.permute((1, 0)), s, is_async=True)
    # probe: e4m3-scores-wait
    return warpgroup_mma_wait(0, deps=(s,))


@gluon.jit
def _warpgroup_e4m3(IS_LEFT: gl.constexpr, FINALIZE: gl.constexpr, smem: ProductsShared, prog: Program):
    """:func:`_warpgroup` with fp8 products (VerifyConfig.fp8_products).

    Each tile's probabilities are quantised against the running max after
    that tile, as in pure.fp8_product_weights: L's tile against L's max, R's
    against the pair's. So both go out as soon as computed, and each
    warpgroup first multiplies L's tile (in L's max), rescales by R's
    factor, then R's tile: R's first product now waits for L's
    probabilities, and L cannot overwrite them before R's product is done
    (``_P0_FREE``). The V of a product is the transposed copy in ``vt``,
    so each KV half is refilled as soon as its scorer and its transposer
    are done with it."""
    q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope = smem.q_lo, smem.q_hi, smem.q_rope, smem.kv_lo, smem.kv_hi, smem.kv_rope
    vt, p0_smem, p1_smem, stat_max, stat_unscale = smem.vt, smem.p0, smem.p1, smem.stat_max, smem.stat_unscale
    stat_scale0, stat_scale1 = smem.stat_scale0, smem.stat_scale1
    kv_bars, sync_bars = smem.kv_bars, smem.sync_bars
    kv_half_desc, kv_rope_desc = prog.kv_half_desc, prog.kv_rope_desc
    row_lens_ptr, page_table_ptr = prog.row_lens_ptr, prog.page_table_ptr
    softmax_scale_log2 = prog.softmax_scale_log2
    tok_lo, tok_hi, n_pairs = prog.tok_lo, prog.tok_hi, prog.n_pairs
    qlen, heads, page, stamps_ptr = prog.qlen, prog.heads, prog.page, prog.stamps_ptr
    BLOCK_M: gl.constexpr = q_lo.shape[0]
    BLOCK_N: gl.constexpr = kv_rope.shape[1]
    HALF: gl.constexpr = q_lo.shape[1]
    DL: gl.constexpr = 2 * HALF
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    # e4m3 products: K = 32 a wgmma step.
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HALF, 32])
    rows_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    m_tile = gl.program_id(0)
    m_live, _, _, row_len = helpers.row_info(row_lens_ptr, m_tile, 0, rows_s, qlen, heads, BLOCK_M)
    shortest = gl.minimum(gl.min(gl.where(m_live, row_len, tok_hi), axis=0), tok_hi)
    lat_unscale = stat_unscale.load(rows_s)
    if IS_LEFT:
        my = 0
        own_half, other_half, q_own, q_other = kv_lo, kv_hi, q_lo, q_hi
        own_bar, other_bar = part_bar(kv_bars, 0, LO_PART), part_bar(kv_bars, 0, HI_PART)
        # The other tile's half this warpgroup multiplies (its V): kv_lo of tile 1.
        v_other_bar = part_bar(kv_bars, 1, LO_PART)
    else:
        my = 1
        own_half, other_half, q_own, q_other = kv_hi, kv_lo, q_hi, q_lo
        own_bar, other_bar = part_bar(kv_bars, 1, HI_PART), part_bar(kv_bars, 1, LO_PART)
        v_other_bar = part_bar(kv_bars, 0, HI_PART)
    vt_own = vt.index(3 * my)
    vt_other = vt.index(1 + my)
    v_other_src = own_half.index(1 - my)

    acc = gl.zeros([BLOCK_M, HALF], gl.float32, o_layout)
    m_run = gl.full([BLOCK_M], float("-inf"), gl.float32, rows_s)
    l_run = gl.zeros([BLOCK_M], gl.float32, rows_s)
    for k in range(n_pairs):
        phase = k & 1
        tile = 2 * k + my
        more = k + 1 < n_pairs
        own_start = tok_lo + tile * BLOCK_N
        other_start = own_start + BLOCK_N - 2 * my * BLOCK_N
        s = _scores_e4m3(_rebuilt_each_pair(q_own, k), _rebuilt_each_pair(q_other, k), _rebuilt_each_pair(q_rope, k),
                         own_half.index(my), other_half.index(my), kv_rope.index(my), own_bar, other_bar,
                         part_bar(kv_bars, my, ROPE_PART), phase, kv_rope_desc, vt_own, tok_hi - own_start,
                         own_start + BLOCK_N > shortest, v_other_src, vt_other, v_other_bar, tok_hi - other_start,
                         other_start + BLOCK_N > shortest, not IS_LEFT, lat_unscale, s_layout, BLOCK_M, BLOCK_N)
        if k == 0:
            helpers.stamp(stamps_ptr, 4 + my)
        # This warpgroup alone scores the tile's rope part and reads (scores,
        # transposes) its own latent half: refill both.
        helpers.load_part(kv_rope_desc, page_table_ptr, tok_lo, tok_hi, tile + 2, DL,
                          part_bar(kv_bars, my, ROPE_PART), kv_rope.index(my), more, page, BLOCK_N)
        helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 2, my * HALF, own_bar,
                          own_half.index(my), more, page, BLOCK_N)
        # The 16-bit rope part of q is not rescaled here: a huge one can overflow a score to -inf, which
        # must poison its row (FP8=False keeps that check; the latent part holds no inf).
        s = helpers.masked(s, row_len, shortest, tok_lo, tok_hi, tile, softmax_scale_log2, s_layout, BLOCK_N, 1,
                           False)
        if IS_LEFT:
            m_new, m_shift, alpha = _publish_tile_max(s, m_run, stat_max, stat_scale0, sync_bars)
            probs = gl.exp2(s - m_shift[:, None])
            l_run = l_run * alpha + gl.sum(probs, axis=1)
            p8 = (probs * triton_helpers.P_SCALE).to(gl.float8e4nv)
            if k > 0:
                mbarrier.wait(sync_bars.index(_P0_FREE), phase ^ 1)
            p0_smem.store(p8)
            fence_async_shared()
            warps_barrier()
            mbarrier.arrive(sync_bars.index(_P0_READY), count=1)
            acc = acc * gl.convert_layout(alpha, rows_o)[:, None]
            acc = warpgroup_mma(_rebuilt_each_pair(p0_smem, k), _rebuilt_each_pair(vt_own, k).permute((1, 0)), acc,
                                is_async=True)
            mbarrier.wait(v_other_bar, phase)
            _values_transposed(v_other_src, vt_other, tok_hi - other_start, other_start + BLOCK_N > shortest)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            mbarrier.wait(sync_bars.index(_SCALE1_READY), phase)
            alpha1 = stat_scale1.load(rows_s)
            m_run = stat_max.load(rows_s)
            acc = acc * gl.convert_layout(alpha1, rows_o)[:, None]
            l_run = l_run * alpha1
            # R has scored tile 1 (it signalled its scale after), and its low half is transposed.
            helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 3, 0, v_other_bar,
                              v_other_src, more, page, BLOCK_N)
            mbarrier.wait(sync_bars.index(_P1_READY), phase)
            acc = warpgroup_mma(_rebuilt_each_pair(p1_smem, k), _rebuilt_each_pair(vt_other, k).permute((1, 0)),
                                acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
        else:
            m_run, m_shift, alpha0, alpha1 = _fold_pair_max(s, stat_max, stat_scale0, stat_scale1, sync_bars, phase,
                                                            rows_s)
            probs = gl.exp2(s - m_shift[:, None])
            l_run = l_run * (alpha0 * alpha1) + gl.sum(probs, axis=1)
            p1_smem.store((probs * triton_helpers.P_SCALE).to(gl.float8e4nv))
            fence_async_shared()
            warps_barrier()
            mbarrier.arrive(sync_bars.index(_P1_READY), count=1)
            acc = acc * gl.convert_layout(alpha0, rows_o)[:, None]
            mbarrier.wait(sync_bars.index(_P0_READY), phase)
            acc = warpgroup_mma(_rebuilt_each_pair(p0_smem, k), _rebuilt_each_pair(vt_other, k).permute((1, 0)),
                                acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            warps_barrier()
            mbarrier.arrive(sync_bars.index(_P0_FREE), count=1)
            # L has scored tile 0 (its probabilities came after), and its high half is transposed.
            helpers.load_part(kv_half_desc, page_table_ptr, tok_lo, tok_hi, tile + 1, HALF, v_other_bar,
                              v_other_src, more, page, BLOCK_N)
            acc = acc * gl.convert_layout(alpha1, rows_o)[:, None]
            acc = warpgroup_mma(_rebuilt_each_pair(p1_smem, k), _rebuilt_each_pair(vt_own, k).permute((1, 0)), acc,
                                is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))

    # The cache's scale, and P's into e4m3's range, multiply the output.
    _finish(IS_LEFT, FINALIZE, True, 1.0 / triton_helpers.P_SCALE, acc, m_run, l_run, smem, prog, o_layout,
            rows_s)


# A partition's function takes no constexpr argument (Triton 3.6): one function per role.
@gluon.jit
def _left_partial(smem, prog):
    _warpgroup(True, False, smem, prog)


@gluon.jit
def _right_partial(smem, prog):
    _warpgroup(False, False, smem, prog)


@gluon.jit
def _left_final(smem, prog):
    _warpgroup(True, True, smem, prog)


@gluon.jit
def _right_final(smem, prog):
    _warpgroup(False, True, smem, prog)


@gluon.jit
def _left_e4m3_partial(smem, prog):
    _warpgroup_e4m3(True, False, smem, prog)


@gluon.jit
def _right_e4m3_partial(smem, prog):
    _warpgroup_e4m3(False, False, smem, prog)


@gluon.jit
def _left_e4m3_final(smem, prog):
    _warpgroup_e4m3(True, True, smem, prog)


@gluon.jit
def _right_e4m3_final(smem, prog):
    _warpgroup_e4m3(False, True, smem, prog)


@gluon.jit
def seesaw_attention_kernel(
    q_ptr,           # [B*QLEN, H, DL+DR], 16-bit
    kv_half_desc,    # Gluon descriptor of the cache as [num_slots, DL+DR], box [BLOCK_N, DL // 2]
    kv_rope_desc,    # the same cache, box [BLOCK_N, DR]
    kv_scale_ptr,    # float32 [1] (read only when HAS_KV_SCALE; e4m3 caches)
    row_lens_ptr,
    page_table_ptr,
    work_ptr,        # int32 [NI, 3]: one piece per program (pure.build_schedule)
    seg_out_ptr,
    seg_max_ptr,
    seg_sum_ptr,
    out_ptr,
    lse_ptr,
    stride_q_row, stride_q_head,
    stride_page_b,
    softmax_scale_log2,
    max_pages,
    QLEN: gl.constexpr,
    H: gl.constexpr,
    DL: gl.constexpr,
    DR: gl.constexpr,
    PAGE: gl.constexpr,
    FINALIZE: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    HAS_KV_SCALE: gl.constexpr,
    PDL: gl.constexpr,
    WORK_COLS: gl.constexpr = 3,
    FP8_PRODUCTS: gl.constexpr = False,
    stamps_ptr=None,  # int64 [programs, helpers.STAMP_SLOTS]: the timeline probe's only
):
    helpers.stamp(stamps_ptr, 0)
    HALF: gl.constexpr = DL // 2
    gl.static_assert(DR == BLOCK_N, "the rope buffer of q doubles as a probability tile")
    gl.static_assert(WORK_COLS == 3, "one piece per program (the launcher sends the stream elsewhere)")
    # An e4m3 cache multiplies in fp16 (one instruction converts two values):
    # the buffers are fp16 and each part's copy lands in the upper half of its
    # buffer's bytes (helpers.landing), converted in place by its scorer.
    # With FP8_PRODUCTS the latent halves stay e4m3 and only the rope part is
    # converted, to q's dtype (ProductsShared).
    FP8: gl.constexpr = kv_half_desc.dtype.primitive_bitwidth == 8
    gl.static_assert(FP8 or not FP8_PRODUCTS, "fp8 products need an e4m3 cache")
    dtype: gl.constexpr = (q_ptr.dtype.element_ty if FP8_PRODUCTS else gl.float16 if FP8
                           else kv_half_desc.dtype)
    e4m3: gl.constexpr = gl.float8e4nv
    half_layout: gl.constexpr = (gl.NVMMASharedLayout.get_default_for([BLOCK_N, HALF], dtype)
                                 if FP8 and not FP8_PRODUCTS else kv_half_desc.layout)
    rope_layout: gl.constexpr = (gl.NVMMASharedLayout.get_default_for([BLOCK_N, DR], dtype) if FP8
                                 else kv_rope_desc.layout)
    stat_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])

    if FP8_PRODUCTS:
        q_half_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, HALF], e4m3)
        q_lo = gl.allocate_shared_memory(e4m3, [BLOCK_M, HALF], q_half_layout)
        q_hi = gl.allocate_shared_memory(e4m3, [BLOCK_M, HALF], q_half_layout)
        q_rope = gl.allocate_shared_memory(dtype, [BLOCK_M, DR], rope_layout)
        kv_lo = gl.allocate_shared_memory(e4m3, [2, BLOCK_N, HALF], half_layout)
        kv_hi = gl.allocate_shared_memory(e4m3, [2, BLOCK_N, HALF], half_layout)
        kv_rope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DR], rope_layout)
        vt = gl.allocate_shared_memory(e4m3, [4, HALF, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([HALF, BLOCK_N], e4m3))
        p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], e4m3)
        p0_smem = gl.allocate_shared_memory(e4m3, [BLOCK_M, BLOCK_N], p_layout)
        p1_smem = gl.allocate_shared_memory(e4m3, [BLOCK_M, BLOCK_N], p_layout)
    else:
        q_lo = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], half_layout)
        q_hi = gl.allocate_shared_memory(dtype, [BLOCK_M, HALF], half_layout)
        q_rope = gl.allocate_shared_memory(dtype, [BLOCK_M, DR], rope_layout)
        kv_lo = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HALF], half_layout)
        kv_hi = gl.allocate_shared_memory(dtype, [2, BLOCK_N, HALF], half_layout)
        kv_rope = gl.allocate_shared_memory(dtype, [2, BLOCK_N, DR], rope_layout)
        p0_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], rope_layout)
    stat_max = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    stat_scale0 = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    stat_scale1 = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    stat_sum0 = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    stat_sum1 = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    stat_unscale = gl.allocate_shared_memory(gl.float32, [BLOCK_M], stat_layout)
    kv_bars = gl.allocate_shared_memory(gl.int64, [2 * NUM_PARTS, 1], mbarrier.MBarrierLayout())
    SYNCS: gl.constexpr = _NUM_SYNC + 1 if FP8_PRODUCTS else _NUM_SYNC
    sync_bars = gl.allocate_shared_memory(gl.int64, [SYNCS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2 * NUM_PARTS):
        mbarrier.init(kv_bars.index(i), count=1)
    for i in gl.static_range(SYNCS):
        mbarrier.init(sync_bars.index(i), count=1)
    helpers.after_previous_kernel(PDL)
    helpers.stamp(stamps_ptr, 1)

    item = gl.program_id(1)
    b = gl.load(work_ptr + item * WORK_COLS)
    m_tile = gl.program_id(0)
    ld_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    if not FINALIZE:
        # An empty piece (an unused item, or the one piece of a request with
        # no page) has only its statistics to store: no q staging, no loop.
        # Batch-invariant steps hold mostly such items (a static bound 8x the
        # longest request gave C1 2560 of them).
        if gl.load(work_ptr + item * WORK_COLS + 2) <= gl.load(work_ptr + item * WORK_COLS + 1):
            helpers.store_empty_stats(seg_max_ptr, seg_sum_ptr, item, m_tile, QLEN, H, BLOCK_M,
                                      gl.SliceLayout(1, ld_layout))
            return
    m_live, head, row, row_len = helpers.row_info(row_lens_ptr, m_tile, b, gl.SliceLayout(1, ld_layout), QLEN, H,
                                           BLOCK_M)
    # q's copies go out first: their transfer overlaps the dependent loads
    # (row lengths, then page ids) that the KV copies wait for.
    if not FP8:
        helpers.copy_q(q_ptr, q_lo, q_hi, q_rope, row, head, m_live, stride_q_row, stride_q_head, ld_layout)
    tok_lo, tok_hi = triton_helpers.item_tokens(work_ptr, item, row_len, PAGE, WORK_COLS)
    n_tiles = gl.cdiv(gl.maximum(tok_hi - tok_lo, 0), BLOCK_N)
    n_pairs = (n_tiles + 1) // 2

    # The program's own pointers (see _warpgroup).
    page_table_ptr, row_lens_ptr, out_ptr, lse_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr = helpers.program_pointers(
        b, item, page_table_ptr, stride_page_b, row_lens_ptr, out_ptr, lse_ptr, seg_out_ptr, seg_max_ptr,
        seg_sum_ptr, QLEN, H, DL)
    for buf in gl.static_range(2):
        helpers.load_tile(kv_half_desc, kv_rope_desc, page_table_ptr, tok_lo, tok_hi, buf, kv_bars, kv_lo,
                   kv_hi, kv_rope, buf, n_pairs > 0, PAGE, BLOCK_N, True, True)

    helpers.stamp(stamps_ptr, 2)
    # A tensor even where it is 1: no constexpr passes into a partition.
    kv_scale = gl.to_tensor(triton_helpers.kv_scale_of(kv_scale_ptr, HAS_KV_SCALE)).to(gl.float32)
    if FP8_PRODUCTS:
        unscale = helpers.stage_q_e4m3(q_ptr, q_lo, q_hi, q_rope, row, head, m_live, stride_q_row, stride_q_head,
                                       ld_layout)
        stat_unscale.store(unscale)
        warps_barrier()
        softmax_scale_log2 = softmax_scale_log2 * kv_scale
    elif FP8:
        unscale = helpers.stage_q_fp16(q_ptr, q_lo, q_hi, q_rope, row, head, m_live, stride_q_row, stride_q_head,
                                ld_layout)
        stat_unscale.store(unscale)
        warps_barrier()
        softmax_scale_log2 = softmax_scale_log2 * kv_scale
    else:
        helpers.q_landed()

    helpers.stamp(stamps_ptr, 3)
    helpers.stamp_sm(stamps_ptr, 12)
    helpers.stamp_value(stamps_ptr, 13, n_pairs)
    prog = Program(kv_half_desc, kv_rope_desc, row_lens_ptr, page_table_ptr, seg_out_ptr, seg_max_ptr, seg_sum_ptr,
                   out_ptr, lse_ptr, softmax_scale_log2, max_pages, tok_lo, tok_hi, n_pairs, QLEN, H, PAGE, kv_scale,
                   stamps_ptr)
    if FP8_PRODUCTS:
        products = ProductsShared(q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope, vt, p0_smem, p1_smem, stat_max,
                                  stat_scale0, stat_scale1, stat_sum0, stat_sum1, stat_unscale, kv_bars, sync_bars)
        args = (products, prog)
        if FINALIZE:
            gl.warp_specialize([(_left_e4m3_final, args), (_right_e4m3_final, args)], [4], [RIGHT_REGS])
        else:
            gl.warp_specialize([(_left_e4m3_partial, args), (_right_e4m3_partial, args)], [4], [RIGHT_REGS])
    else:
        smem = Shared(q_lo, q_hi, q_rope, kv_lo, kv_hi, kv_rope, p0_smem, stat_max, stat_scale0, stat_scale1,
                      stat_sum0, stat_sum1, stat_unscale, kv_bars, sync_bars)
        args = (smem, prog)
        if FINALIZE:
            gl.warp_specialize([(_left_final, args), (_right_final, args)], [4], [RIGHT_REGS])
        else:
            gl.warp_specialize([(_left_partial, args), (_right_partial, args)], [4], [RIGHT_REGS])


def launch(q, kv_cache, kv_scale, row_lens, page_table, work, qlen: int, kv_lora_rank: int, softmax_scale: float,
           outputs, finalize: bool, page: int, stamps=None, fp8_products: bool = False):
    """:func:`helpers.launch` of this kernel (64 pairs per tile); the caller
    checks :func:`helpers.fits` (and, for ``fp8_products``, an e4m3 cache)."""
    return helpers.launch(seesaw_attention_kernel, q, kv_cache, kv_scale, row_lens, page_table, work, qlen,
                          kv_lora_rank, softmax_scale, outputs, finalize, page, BLOCK_M, stamps,
                          **({"FP8_PRODUCTS": True} if fp8_products else {}))


