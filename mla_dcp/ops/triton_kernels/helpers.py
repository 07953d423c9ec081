"""Helpers the Triton kernels share, and the Gluon kernels call too (a Gluon
kernel may call a Triton function): dependent launch, a program's rows and
work item, the poisoned-row rules of DESIGN.md, the fp16 rescale of bf16
queries over an fp8 cache, segment statistics.

Kernel code only (``@triton.jit`` functions and constexprs): no launcher, no
``mla_dcp.pure``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from mla_dcp._shapes import FP8_P_SCALE, STREAM_WORK_COLUMNS

try:  # Triton >= 3.3; older versions launch in plain stream order (launch_args.pdl_options)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    HAS_GRID_DEPENDENCY_CONTROL = True
except ImportError:  # pragma: no cover
    gdc_launch_dependents = gdc_wait = None
    HAS_GRID_DEPENDENCY_CONTROL = False


LOG2E = tl.constexpr(1.4426950408889634)
# Columns of the stream schedule's work table (pure.build_schedule; the other has 3).
STREAM_WORK = tl.constexpr(STREAM_WORK_COLUMNS)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def after_previous_kernel(PDL: tl.constexpr):
    """Launched with programmatic dependent launch (PDL), a program may start
    while the stream's previous kernel still runs: its launch latency and
    prologue hide under that kernel's tail. So every kernel here waits for
    the previous one (and its memory) before it touches global memory, and
    then lets the next one launch; its programs wait in turn. Every program
    waits, so a kernel never completes before its predecessor, and a chain
    of them keeps stream order."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def rows_of(row_lens_ptr, offs_m, b, qlen, heads):
    """(live, head, verify row, row length) of tile rows ``offs_m``. Takes
    the indices (the Gluon kernel makes them in its own layouts) and run-time
    or constant ``qlen``/``heads`` (Gluon partitions receive no constexpr)."""
    m_live = offs_m < qlen * heads
    head = offs_m // qlen
    row = b * qlen + offs_m % qlen
    row_len = tl.load(row_lens_ptr + row, mask=m_live, other=0)
    return m_live, head, row, row_len


@triton.jit
def program_pieces(work_ptr, program):
    """(first, end): the run of pieces ``[first, end)`` attention program ``program`` of a stream
    schedule works through, one after another (its columns 3-4)."""
    return tl.load(work_ptr + program * STREAM_WORK + 3), tl.load(work_ptr + program * STREAM_WORK + 4)


@triton.jit
def item_tokens(work_ptr, item, row_len, PAGE: tl.constexpr, WORK_COLS: tl.constexpr):
    """[tok_lo, tok_hi): the tokens of the item's pages that some row of the tile sees.

    The schedule (build_view's, DESIGN.md stage 3) never gives an item pages
    past the page table, so rows longer than it covers (lengths beyond the
    static bound) read nothing of other requests; they are poisoned at the
    store. An unused item has an empty range."""
    page_lo = tl.load(work_ptr + item * WORK_COLS + 1)
    page_hi = tl.load(work_ptr + item * WORK_COLS + 2)
    # No row of this tile reads past its own length: stop at the tile's longest.
    return page_lo * PAGE, tl.minimum(page_hi * PAGE, tl.max(row_len, axis=0))


@triton.jit
def row_absmax(x):
    return tl.max(tl.abs(x.to(tl.float32)), axis=1)


# P's scale into e4m3's range in the fp8-products mode (see mla_dcp._shapes).
P_SCALE = tl.constexpr(FP8_P_SCALE)


@triton.jit
def pow2_row_shift(amax, TOP: tl.constexpr):
    """Per-row power of two that puts a row's largest |q| (``amax``) in
    [2^TOP, 2^(TOP+1)): exact to apply and undo. Rows with inf, NaN or all
    zeros keep a factor of 1; the exponent is capped at +-126, so a row below
    2^(TOP-126) gets a finite factor (float32's largest power of two is
    2^127) rather than an infinite one that would turn its zeros NaN. Returns
    (factor, 1 / factor), the latter through :func:`poison_unscale`."""
    finite = (amax > 0) & (amax < float("inf"))
    shift = tl.where(finite, TOP - tl.floor(tl.log2(tl.where(finite, amax, 1.0))), 0.0)
    shift = tl.minimum(tl.maximum(shift, -126.0), 126.0)
    return tl.exp2(shift), poison_unscale(tl.exp2(-shift), amax)


@triton.jit
def e4m3_row_shift(amax):
    """:func:`pow2_row_shift` into [128, 256) for e4m3, whose largest finite
    value is 448 (pure.e4m3_row_factor, the oracle); the 1 / factor is NaN
    where the row holds inf (the conversion saturates, e4m3 has no inf: the
    row must stay poisoned)."""
    return pow2_row_shift(amax, 7.0)


@triton.jit
def fp16_row_shift(amax):
    """:func:`pow2_row_shift` that brings a bf16 query into fp16's range.

    An fp8 cache converts to fp16 in one instruction (to bf16 it takes
    several, on every KV tile), so bf16 queries over an fp8 cache multiply in
    fp16: scaled so the row's largest |q| lies in [2^13, 2^14), far below
    fp16's 65504; bf16's 8-bit mantissa fits in fp16's 11. Only parts below
    2^-38 of the row's largest element would flush, far under bf16's own
    rounding of the scores.
    """
    return pow2_row_shift(amax, 13.0)


@triton.jit
def poison_unscale(unscale, amax):
    """A row's score factor, NaN where its query holds inf (``amax``: the
    row's largest |q|; a NaN in q needs nothing, its scores are NaN anyway).
    Every score of such a row turns NaN, DESIGN's poisoned row, so a kernel
    that stages q through registers needs no per-score check for inf in q."""
    return tl.where(amax < float("inf"), unscale, float("nan"))


@triton.jit
def scaled_rows(x, factor, dtype: tl.constexpr):
    """x's rows times their :func:`pow2_row_shift` factor, in ``dtype``
    (fp16, or e4m3: saturating)."""
    return (x.to(tl.float32) * factor[:, None]).to(dtype)


@triton.jit
def poison_neg_inf(scores):
    """A score a row may see is -inf only when inf reached it (in q or a key)
    or the product overflowed: DESIGN's poisoned row. As NaN it poisons the
    statistics (the sum turns NaN, stats_of restores the max); as -inf it
    would vanish as a zero weight, and a row of them would look empty.
    Elementwise: the Gluon kernels call it too."""
    return tl.where(scores == float("-inf"), float("nan"), scores)


@triton.jit
def finite_or_zero(x):
    """``x`` where finite, 0 elsewhere: a value operand's guard.

    A tile's values serve all of its rows, and a row that must not see a
    token still multiplies its value by a probability of 0: 0 * NaN = NaN
    would poison it. Zeroing a non-finite value changes nothing for the rows
    that do see the token: its key, of which the value is a part, already
    makes their score NaN or inf, which poisons them. Applied only to tiles
    that reach past the tile's shortest row (where some row masks a token).
    Elementwise: the Gluon kernels call it too."""
    return tl.where(tl.abs(x.to(tl.float32)) < float("inf"), x, 0.0)


@triton.jit
def kv_scale_of(kv_scale_ptr, HAS_KV_SCALE: tl.constexpr):
    if HAS_KV_SCALE:
        kv_scale = tl.load(kv_scale_ptr)
    else:
        kv_scale = 1.0
    return kv_scale


@triton.jit
def stats_of(m_i, l_i, poisoned):
    """(max, sum) a segment stores from its running statistics (elementwise:
    the Gluon kernel calls it too)."""
    # Triton's max drops NaN (fmax), so a NaN score leaves the running max
    # finite while the sum turns NaN; a +inf score makes the max +inf and the
    # sum NaN (inf - inf). DESIGN's merges treat only -inf as "no key" and
    # stage 3 never writes +inf: a NaN sum makes the max NaN, as the oracle's.
    bad = (l_i != l_i) | poisoned
    return tl.where(bad, float("nan"), m_i), tl.where(bad, float("nan"), l_i)


@triton.jit
def final_of(acc, seg_max, seg_sum):
    """A one-segment row's normalised output and natural-log LSE: its merge
    is its own statistics (weight exp2(m - m) = 1 where it saw a key). A
    poisoned row (NaN statistics, from stats_of) gives NaN in both. One
    select per element: the row rules (NaN, empty, a key seen) fold into
    per-row values first, since selects per element lengthen the
    epilogue measurably.
    Elementwise: the Gluon kernels call it too."""
    corrupt = seg_max != seg_max
    present = seg_max > float("-inf")
    nonempty, inv_sum, lse = normalise(tl.where(present, seg_sum, 0.0), tl.where(present, seg_max, 0.0), corrupt)
    kept = nonempty & ~corrupt
    other = tl.where(corrupt, float("nan"), 0.0)
    return tl.where(kept[:, None], acc * inv_sum[:, None], other[:, None]), lse


@triton.jit
def normalise(total, top, corrupt):
    """Stage 4's last step from the merged statistics (base 2): whether the
    row saw a key, the factor its output columns are multiplied by (1 / sum:
    one division per row, not one `div.full.f32` per column), and the
    natural-log LSE. Only -inf means "no key": a NaN statistic (``corrupt``)
    makes the LSE NaN. A row that saw a key has a sum >= 1 (its largest
    score contributes exp2(0)), so the reciprocal neither overflows nor
    loses precision."""
    nonempty = total > 0
    divisor = tl.where(nonempty, total, 1.0)
    lse = tl.where(nonempty, LN2 * (top + tl.log2(divisor)), float("-inf"))
    return nonempty, 1.0 / divisor, tl.where(corrupt, float("nan"), lse)
