"""Launchers of the Triton kernels: output allocation, grids, tile choice.

Each launcher has the signature of its `mla_dcp::` op, so it is registered
as that op's CUDA kernel as is; under `TRITON_INTERPRET=1` the same launchers
run the kernels on CPU tensors (used by the tests). No launcher reads a
tensor value on the host.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings

import torch
import triton

try:  # Triton >= 3.4; older versions take the pointer kernel only
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover
    TensorDescriptor = None

from mla_dcp.ops.triton_kernels import kernels
from mla_dcp.ops import fast_launch
from mla_dcp.ops.fast_launch import launch
from mla_dcp.ops.launch_args import _capability, kernel_outputs, pdl_options
from mla_dcp import _fp8_ds_mla
from mla_dcp._dtypes import layout_facts, require_kernel_layout
from mla_dcp._shapes import (FP8_PRODUCTS_TILE, RAGGED_NO_REQUEST, RAGGED_NO_ROW, STREAM_MAX_PROGRAMS, WORK_COLUMNS,
                             check_schedule_shape, page_size_for, page_table_shape)
from mla_dcp.ops import tiles
from mla_dcp.ops.tiles import NARROW_WIDTHS, attention_plan

_METADATA_BLOCK = 256
# Below this many (row, head) pairs the segment merge splits columns over programs.
_MERGE_SPLIT_BELOW_PAIRS = 1024
# Measured on the H200 (C7, 64 segments, whole step): 32 columns and one
# warp per program 19.4 us, 64 columns and 4 warps 20.2, 128 and 8 21.7.
_MERGE_SPLIT_BLOCK_D = 32
_MERGE_SPLIT_WARPS = 1
# A whole row's program reads a request's items at most this many a step: built for sm_90 at
# 4 warps, a [64, 512] float32 tile spills (3944 bytes a thread under Triton 3.9, 472 under 3.6),
# [32, 512] takes 194 registers under 3.9, [16, 512] 96 (scripts/gluon_compile.py compile_merge).
_MERGE_ROW_MOST_ITEMS = 16
# Batch-invariant mode's merge tile, from static facts only (never the row count, which decides
# the default mode's split): (most columns a program, warps, most items a step). Whole rows, 16
# items a step. Measured on the H100 (benchmarks/probes/merge_variants.py, the merge alone over
# the step's partials): R1 (45 items for its long request) 28.2 -> 12.5 us against 64 a step; C4,
# R3, C7 within 0.2 us, C5 19.6 -> 20.5; 128 or 32 columns a program: C4 14 -> 30-44 us.
_INVARIANT_MERGE_TILE = (512, 4, _MERGE_ROW_MOST_ITEMS)

# The compiled attention kernel of the latest launch, for the benchmark's
# compiler report (registers, spills, shared memory, wgmma in the PTX).
last_attention_kernel = None

# Per launcher, its plans: a key of every fact the launcher's choices read
# (shapes, strides, dtypes, device, the op's static arguments) -> its launch
# as a fast_launch.Replay, so that a repeated call allocates its outputs and
# launches without choosing a kernel, building its options or keying Triton's
# specialisation again (most of an eager step's host time). Filled by the
# first call of each key, which takes the full path; a launch that does not
# fit a replay (a launcher-made copy of an input, say) takes it every time.
_METADATA_PLANS = fast_launch.plan_cache()
_PAGES_PLANS = fast_launch.plan_cache()
_MOVE_PLANS = fast_launch.plan_cache()
_ATTENTION_PLANS = fast_launch.plan_cache()
_MERGE_PLANS = fast_launch.plan_cache()
_MERGED_PLANS = fast_launch.plan_cache()
_SPARSE_PLANS = fast_launch.plan_cache()
_RANKS_PLANS = fast_launch.plan_cache()
# The merged-attention plans that went native, by the call's shapes and static arguments alone
# (the native plan checks every layout itself; another layout takes the keyed path).
_MERGED_NATIVE = fast_launch.plan_cache()


def _remember(plans: dict, key, records, sources: tuple) -> None:
    """Keep the replay of the launch recorded for ``key`` (None: take the full path again); none with
    the fast path off (MLA_DCP_FAST_LAUNCH=0: every call takes the full path)."""
    if not fast_launch.enabled:
        return
    fast_launch.keep(plans, key, fast_launch.Replay.of(records, sources), _MAX_PLANS)


_MAX_PLANS = 1024
_UNSEEN = object()    # a plan cache's answer for a key not seen yet (None: seen, and no plan fits)


def _dot_width(width: int, least: int = 16) -> int:
    """Padded width of a tl.dot reduction dimension: a power of two, and at
    least 16 (compiled Triton rejects K < 16; the interpreter does not), or
    ``least`` (e4m3 operands: 32, the K of an fp8 MMA instruction on sm_89+)."""
    return max(least, triton.next_power_of_2(width))


# The least reduction width of a tl.dot over e4m3 operands that Triton builds for sm_90
# (a 16-wide one fails to compile; the interpreter takes any width).
_FP8_DOT_LEAST = 32


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _tma_fits(q: torch.Tensor, kv_cache: torch.Tensor, kv_lora_rank: int, rope_dim: int, page: int,
              block_n: int, fp8_products: bool = False) -> bool:
    """Whether the descriptor kernel can serve this launch: KV tiles inside
    one page, box widths a power of two in [16, 256] (the 512 latent columns
    as two halves; with ``fp8_products`` halves of 32 and more, the latent
    products' e4m3 dots), 16-byte aligned rows, 16-bit queries (the descriptor
    kernel has no float32 path) and a GPU with a tensor memory accelerator
    (or the interpreter, which emulates one)."""
    half = kv_lora_rank // 2
    if fp8_products and half < _FP8_DOT_LEAST:
        return False
    # NVIDIA Hopper or later: ROCm reports its own capability numbers (MI300: 9.4), and its
    # descriptor path was never run here.
    on_device = kv_cache.is_cuda and torch.version.hip is None and _capability(kv_cache.device)[0] >= 9
    return (TensorDescriptor is not None and (on_device or os.environ.get("TRITON_INTERPRET") == "1")
            and q.dtype in (torch.float16, torch.bfloat16) and kv_lora_rank == 2 * half
            and all(_is_pow2(w) and 16 <= w <= 256 for w in (half, rope_dim))
            and page % block_n == 0 and kv_cache.data_ptr() % 16 == 0
            and kv_cache.stride(1) * kv_cache.element_size() % 16 == 0)


def _gluon_modules():
    """(seesaw, narrow, helpers) of ops/gluon_kernels, or None where this Triton has no Gluon Hopper module."""
    global _GLUON
    if _GLUON is None:
        try:
            from mla_dcp.ops.gluon_kernels import helpers, narrow, seesaw
            _GLUON = (seesaw, narrow, helpers)
        except ImportError:  # pragma: no cover - Triton without Gluon
            _GLUON = False
    return _GLUON or None


_GLUON = None


def _gluon_fits(q, kv_cache, kv_scale, kv_lora_rank: int, page: int) -> bool:
    """Whether the Gluon kernels can serve this launch: compiled Triton (no
    interpreter), an NVIDIA sm_90 GPU (wgmma; Blackwell has none), and their
    conditions (``gluon_kernels.helpers.fits``, the same for both)."""
    if not kv_cache.is_cuda or torch.version.hip is not None or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if _capability(kv_cache.device) != (9, 0):
        return False
    modules = _gluon_modules()
    return modules is not None and modules[2].fits(q, kv_cache, kv_scale, kv_lora_rank, page)


def _unit_inner_stride(table: torch.Tensor) -> torch.Tensor:
    return table if table.stride(-1) == 1 else table.contiguous()


def row_lens(seq_lens: torch.Tensor, qlen: int, world: int, rank: int, interleave: int,
             causal: bool = True) -> torch.Tensor:
    num_rows = seq_lens.shape[0] * qlen
    out = torch.empty(num_rows, dtype=torch.int32, device=seq_lens.device)
    if num_rows:
        grid = (triton.cdiv(num_rows, _METADATA_BLOCK),)
        launch(kernels.row_lens_kernel, grid, seq_lens, out, num_rows, QLEN=qlen, WORLD=world, RANK=rank,
            INTERLEAVE=interleave, BLOCK=_METADATA_BLOCK, CAUSAL=causal,
            **pdl_options(seq_lens.device))
    return out


def expand_pages(block_table: torch.Tensor, block_size: int, max_local_len: int) -> torch.Tensor:
    key = (layout_facts(block_table), block_size, max_local_len)
    replay = _PAGES_PLANS.get(key)
    batch, max_pages = page_table_shape(block_table.shape, block_size, max_local_len)
    out = torch.empty(batch, max_pages, dtype=torch.int32, device=block_table.device)
    if replay is not None:
        replay((block_table, out))
        return out
    pages_per_block = block_size // page_size_for(block_size)
    if batch and max_pages:
        grid = (triton.cdiv(max_pages, _METADATA_BLOCK), batch)
        with fast_launch.recording() as records:
            launch(kernels.expand_pages_kernel, grid, block_table, out, block_table.stride(0), out.stride(0),
                max_pages, PAGES_PER_BLOCK=pages_per_block, BLOCK=_METADATA_BLOCK,
                **pdl_options(block_table.device))
        _remember(_PAGES_PLANS, key, records, (block_table, out))
    return out


# The schedule kernel writes each request's items at most this many at a time.
_SCHEDULE_ITEMS_STEP = 16
# Elements per thread of its [BLOCK_B, ITEMS_STEP] tiles (the chunked
# schedule's, the stream's: its cuts' divisions take more registers), and
# requests per warp: past these its builds spill (sm_90, from the cubins:
# the stream's at 256 requests and 16 items a step, 8 KB of stack per thread;
# the chunked one at 128 and 16, 104 bytes; one warp over 1024 requests,
# 0.3-1.2 KB, over 256 in the stream, 24 bytes under Triton 3.6; the
# chunked one's two and four warps at 256 and 512 requests, 8 bytes under
# Triton 3.6, so past one warp a thread holds half the tile; none within
# the bounds, up to 1024 requests, under Triton 3.6 and 3.9).
_SCHEDULE_TILE_PER_THREAD = 32
_STREAM_TILE_PER_THREAD = 8
# The stream's pieces a step at most: one request's over 256 programs.
_STREAM_ITEMS_STEP = 256
_SCHEDULE_REQUESTS_PER_WARP = 128
_SCHEDULE_FOUR_WARPS_UP_TO = 1024
# The segment merge reads at most this many of a request's items per step:
# a uniform step's request has about NI / B, read in one step; a long
# request among short ones takes a few.
_MERGE_MAX_CHUNK = 64


def _schedule_constants(batch: int, max_pages: int, programs: int) -> dict:
    if programs > STREAM_MAX_PROGRAMS:
        raise ValueError(f"the stream schedule supports up to {STREAM_MAX_PROGRAMS} programs, got {programs}")
    # The tiles are [requests, pieces]: a few requests (each over many
    # programs) take a row each, not 32 rows of which one is live (C7, one
    # request over 128 programs, took 16 steps of a [32, 8] tile, 31 of its
    # rows dead); the tails' sort then has as many keys as the batch.
    block_b = triton.next_power_of_2(batch)
    # The tails' sort key packs (length, request, full count) in 64 bits.
    if (max_pages + 2) ** 2 * block_b >= 1 << 62:
        raise ValueError(f"the schedule supports max_pages * sqrt(batch) up to about 2^29, "
                         f"got max_pages={max_pages}, batch={batch}")
    # One warp up to 128 requests: the bisection's reductions stay in shuffles
    # (no shared memory and barrier per step), on the step's critical path.
    # Four up to 1024 requests; past that the [BLOCK_B] vectors of one thread
    # spill at four (sm_90, built as launched: 8-24 bytes a thread at 2048
    # requests, 264-824 at 4096, 1872-6544 at 8192), so a warp per 128
    # requests, 32 at most (2048: 84-90 registers, no spill; 4096: 8 bytes;
    # 8192: 112-296; scripts/gluon_compile.py). Not timed on a GPU.
    warps = (min(4, max(1, block_b // _SCHEDULE_REQUESTS_PER_WARP)) if block_b <= _SCHEDULE_FOUR_WARPS_UP_TO
             else min(32, block_b // _SCHEDULE_REQUESTS_PER_WARP))
    per_thread, most = ((_STREAM_TILE_PER_THREAD, _STREAM_ITEMS_STEP) if programs > 0
                        else (_SCHEDULE_TILE_PER_THREAD // (1 if warps == 1 else 2), _SCHEDULE_ITEMS_STEP))
    # Past four warps the steps stay those of four: the extra warps are for the
    # [BLOCK_B] vectors, and a thread of 8-32 warps holds fewer registers.
    step = min(most, max(1, per_thread * 32 * min(warps, 4) // block_b))
    # STREAM only where set: the chunked build's options stay as they were.
    return dict(BLOCK_B=block_b, ITEMS_STEP=step, num_warps=warps, **({"STREAM": True} if programs > 0 else {}))


def _schedule_outputs(batch: int, num_items: int, device: torch.device, max_pages: int, chunk: int, programs: int):
    columns = check_schedule_shape(batch, num_items, max_pages, chunk, programs)
    # With no request there is no kernel to write the (all unused) items.
    work = torch.empty(num_items, columns, dtype=torch.int32, device=device) if batch else \
        torch.zeros(num_items, columns, dtype=torch.int32, device=device)
    return work, torch.empty(batch, 3, dtype=torch.int32, device=device)


def schedule(row_lens: torch.Tensor, qlen: int, page: int, max_pages: int, num_items: int, chunk: int = 0,
             programs: int = 0):
    """The step's (work int32 [num_items, 3] or the stream's [num_items, 5],
    segments int32 [B, 3]): one program of :func:`kernels.schedule_kernel`,
    no host sync."""
    batch = row_lens.shape[0] // qlen
    work, segments = _schedule_outputs(batch, num_items, row_lens.device, max_pages, chunk, programs)
    if batch:
        launch(kernels.schedule_kernel, (1,),
            row_lens, work, segments, batch, num_items, max_pages, chunk, programs, QLEN=qlen, PAGE=page,
            **_schedule_constants(batch, max_pages, programs), **pdl_options(row_lens.device))
    return work, segments


def step_metadata(seq_lens: torch.Tensor, qlen: int, world: int, rank: int, interleave: int, causal: bool,
                  page: int, max_pages: int, num_items: int, chunk: int = 0, programs: int = 0,
                  context: bool = False):
    """(row_lens, work, segments) of :func:`row_lens` and :func:`schedule` in
    one launch of :func:`kernels.step_metadata_kernel` (``context``: over each
    request's keys before its block, ``max(L - qlen, 0)``)."""
    batch = seq_lens.shape[0]
    key = (layout_facts(seq_lens), qlen, world, rank, interleave, causal, page, max_pages, num_items, chunk,
           programs, context)
    plan = _METADATA_PLANS.get(key)
    # A plan exists only where the full path launched: batch > 0, shapes checked.
    if plan is not None and plan.usable():
        return plan.run((seq_lens,))
    device = seq_lens.device
    out = torch.empty(batch * qlen, dtype=torch.int32, device=device)
    work, segments = _schedule_outputs(batch, num_items, device, max_pages, chunk, programs)
    if batch:
        with fast_launch.recording() as records:
            launch(kernels.step_metadata_kernel, (1 + triton.cdiv(batch * qlen, _METADATA_BLOCK),),
                seq_lens, out, work, segments, batch, num_items, max_pages, chunk, programs,
                QLEN=qlen, WORLD=world, RANK=rank,
                INTERLEAVE=interleave, CAUSAL=causal, PAGE=page, BLOCK=_METADATA_BLOCK, CONTEXT=context,
                **_schedule_constants(batch, max_pages, programs), **pdl_options(device))
        if fast_launch.enabled:
            fast_launch.keep(_METADATA_PLANS, key, fast_launch.Sequence.of(
                records, (seq_lens, out, work, segments), (), (out, work, segments)), _MAX_PLANS)
    return out, work, segments


def attention_outputs(q, kv_lora_rank: int, num_items: int, qlen: int, finalize: bool) -> tuple:
    """What an attention kernel writes: the float32 partials of every work
    item (seg_out [NI, H, qlen, Dl], seg_max, seg_sum [NI, H, qlen]), or with
    ``finalize`` (one item per request) the normalised output in q's dtype
    and the float32 LSE."""
    rows, heads, _ = q.shape
    device = q.device
    if finalize:
        return (torch.empty(rows, heads, kv_lora_rank, dtype=q.dtype, device=device),
                torch.empty(rows, heads, dtype=torch.float32, device=device))
    return (torch.empty(num_items, heads, qlen, kv_lora_rank, dtype=torch.float32, device=device),
            torch.empty(num_items, heads, qlen, dtype=torch.float32, device=device),
            torch.empty(num_items, heads, qlen, dtype=torch.float32, device=device))


def segmented_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale,
                        invariant_pages=0, fp8_products=False):
    outputs = attention_outputs(q, kv_lora_rank, work.shape[0], qlen, finalize=False)
    _launch_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale,
                      outputs, finalize=False, batch_invariant=invariant_pages > 0, fp8_products=fp8_products)
    return outputs


def single_segment_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale,
                             invariant_pages=0, fp8_products=False):
    outputs = attention_outputs(q, kv_lora_rank, work.shape[0], qlen, finalize=True)
    _launch_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale, outputs,
                      finalize=True, batch_invariant=invariant_pages > 0, fp8_products=fp8_products)
    return outputs


def merged_attention(q, kv_cache, kv_scale, row_lens, page_table, work, segments, qlen, kv_lora_rank, softmax_scale,
                     invariant_pages=0, fp8_products=False):
    """Stages 3 and 4: the normalising kernel where the schedule has one item
    per request, else the attention kernel and the segment merge (the same
    launches, and bits, as the two ops).

    A repeated layout launches from one plan (fast_launch.Sequence: the
    partials in one scratch buffer, every launch's arguments by position),
    whoever calls: the API's eager step, the op in a compiled graph."""
    sources = (q, kv_cache, kv_scale, row_lens, page_table, work, segments)
    coarse = (q.shape, kv_cache.shape, qlen, kv_lora_rank, softmax_scale, invariant_pages, fp8_products)
    fast = _MERGED_NATIVE.get(coarse)
    if fast is not None and not tiles._FORCED:
        made = fast.run_native(sources)
        if made is not None:
            return made
    # A forced plan (tiles.forced_plan, the tests' and tuner's) is not the key's to remember.
    key = None if tiles._FORCED or not fast_launch.enabled else (
        layout_facts(q), layout_facts(kv_cache), None if kv_scale is None else layout_facts(kv_scale),
        layout_facts(row_lens), layout_facts(page_table), layout_facts(work), layout_facts(segments), qlen,
        kv_lora_rank, softmax_scale, invariant_pages, fp8_products)
    return _sequence_call(_MERGED_PLANS, key, sources, lambda: _merged_attention(
        *sources, qlen, kv_lora_rank, softmax_scale, invariant_pages, fp8_products), _MERGED_NATIVE, coarse)


def _sequence_call(plans: dict, key, sources: tuple, full, natives: dict | None = None, coarse=None) -> tuple:
    """A whole launcher call from its plan (``plans[key]``, a fast_launch.Sequence of the call's launches
    over ``sources`` and the outputs it returns), or ``full()`` (the launches themselves), recorded as
    ``key``'s plan the first time (``key`` None: never). A plan that went native is also kept in
    ``natives`` by ``coarse`` (the native plan checks every layout itself)."""
    plan = plans.get(key, _UNSEEN) if key is not None else None
    if plan is not _UNSEEN:
        if plan is not None and plan.usable():
            if natives is not None and plan.native is not None:
                fast_launch.keep(natives, coarse, plan, _MAX_PLANS)
            return plan.run(sources)
        # No plan for this key, none may be made, or this call may not take
        # it (a recording, a launch hook): the launchers' own replays.
        return full()
    with fast_launch.recording_step() as (records, scratch):
        made = full()
    fast_launch.keep(plans, key, fast_launch.Sequence.of(records, (*sources, *made), scratch, made), _MAX_PLANS)
    return made


def _merged_attention(q, kv_cache, kv_scale, row_lens, page_table, work, segments, qlen, kv_lora_rank, softmax_scale,
                      invariant_pages, fp8_products):
    if work.shape == (page_table.shape[0], WORK_COLUMNS):
        return single_segment_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank,
                                        softmax_scale, invariant_pages, fp8_products)
    partials = segmented_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank,
                                   softmax_scale, invariant_pages, fp8_products)
    fast_launch.note_scratch(*partials)     # consumed here: a replayed step may allocate them as one buffer
    return merge_segments(*partials, segments, q.dtype, invariant_pages > 0)


# Batch-invariant mode plans its tiles as for this many (head, row) pairs,
# whatever qlen * H is: one kernel and one tile shape for every q and batch
# (a 64-row tile: the seesaw kernel on Hopper).
_INVARIANT_PLAN_ROWS = 64


def _launch_attention(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale,
                      outputs, finalize: bool, batch_invariant: bool = False, fp8_products: bool = False) -> None:
    """Launch an attention kernel writing ``outputs``: the segment partials
    (seg_out, seg_max, seg_sum), or with ``finalize`` (one segment) the
    merged (out, lse). ``fp8_products`` (an e4m3 cache): e4m3 products (the
    seesaw's fp8 build where it serves, else the Triton kernels'), over KV
    tiles of ``FP8_PRODUCTS_TILE`` tokens, the tile the pure path quantises P over."""
    rows, heads, head_dim = q.shape
    num_items = work.shape[0]
    if rows == 0 or num_items == 0:
        return
    global last_attention_kernel
    # A forced plan (tiles.forced_plan, the tests' and tuner's) is not the key's to remember.
    key = None if tiles._FORCED else (
        layout_facts(q), layout_facts(kv_cache), None if kv_scale is None else layout_facts(kv_scale),
        layout_facts(row_lens), layout_facts(page_table), layout_facts(work), qlen, kv_lora_rank, finalize,
        batch_invariant, fp8_products)
    replay = _ATTENTION_PLANS.get(key) if key is not None else None
    sources = (q, kv_cache, kv_scale, row_lens, page_table, work, *outputs, softmax_scale * _LOG2E)
    if replay is not None:
        last_attention_kernel = replay(sources)
        return
    with fast_launch.recording() as records:
        last_attention_kernel = _launch_attention_anew(q, kv_cache, kv_scale, row_lens, page_table, work, qlen,
                                                       kv_lora_rank, softmax_scale, outputs, finalize,
                                                       batch_invariant, fp8_products)
    if key is not None:
        _remember(_ATTENTION_PLANS, key, records, sources)


_LOG2E = math.log2(math.e)


def _launch_attention_anew(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale,
                           outputs, finalize: bool, batch_invariant: bool, fp8_products: bool):
    """:func:`_launch_attention`'s choice of kernel, tile and arguments; returns the compiled kernel."""
    rows, heads, head_dim = q.shape
    num_items = work.shape[0]
    batch = page_table.shape[0]
    rope_dim = head_dim - kv_lora_rank
    page = page_size_for(kv_cache.shape[1])
    require_kernel_layout(q, kv_cache)
    # The kernel indexes both with unit inner stride; a view from build_view
    # already has it, so this copies only hand-made, strided metadata.
    row_lens, page_table = row_lens.contiguous(), _unit_inner_stride(page_table)
    if batch_invariant:
        tile = attention_plan(_INVARIANT_PLAN_ROWS, kv_lora_rank, q.dtype, kv_cache.dtype, page, q.device)
    else:
        tile = attention_plan(qlen * heads, kv_lora_rank, q.dtype, kv_cache.dtype, page, q.device, batch)
    if work.shape[1] != WORK_COLUMNS:
        if tile.seesaw and not tiles._FORCED and _gluon_fits(q, kv_cache, kv_scale, kv_lora_rank, page):
            # The view's schedule was built for other dtypes, and the seesaw
            # cannot run it. Once per layout: its later launches replay the plan.
            warnings.warn(
                f"mla_dcp: this view's schedule is a stream (built for other dtypes than q {q.dtype} and the "
                f"cache {kv_cache.dtype}), which the faster Hopper seesaw kernel cannot run; pass "
                f"build_view(..., q_dtype=q.dtype, kv_dtype=kv_cache.dtype)", stacklevel=2)
        tile = tiles.for_stream(tile, qlen * heads, q.dtype)
    if fp8_products:
        # The seesaw has an e4m3 build (fp8 wgmma, V transposed on chip) over
        # KV tiles of FP8_PRODUCTS_TILE tokens; other tiles take the Triton kernels'.
        tile = dataclasses.replace(tile, block_n=FP8_PRODUCTS_TILE, narrow=False, tma=tile.block_m == 64)
    grid = (triton.cdiv(qlen * heads, tile.block_m), num_items, 1)
    work = work.contiguous()
    partials, unused = kernel_outputs(outputs, finalize)
    scale_arg = kv_scale if kv_scale is not None else unused
    # bf16 queries over an fp8 cache multiply in fp16 (see triton_kernels.helpers.fp16_row_shift).
    q_to_fp16 = q.dtype == torch.bfloat16 and kv_cache.element_size() == 1 and not fp8_products
    common = dict(QLEN=qlen, H=heads, DL=kv_lora_rank, DR=rope_dim, PAGE=page, HAS_KV_SCALE=kv_scale is not None,
                  Q_TO_FP16=q_to_fp16, FINALIZE=finalize, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
                  num_warps=tile.num_warps, WORK_COLS=work.shape[1], **pdl_options(q.device),
                  **({"FP8_PRODUCTS": True} if fp8_products else {}))
    # The seesaw runs one piece per program; a stream schedule (a view built
    # for other dtypes than these) goes to the kernels that run a program's pieces.
    if (tile.seesaw and work.shape[1] == WORK_COLUMNS
            and _gluon_fits(q, kv_cache, kv_scale, kv_lora_rank, page)):
        return _gluon_modules()[0].launch(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank,
                                          softmax_scale, outputs, finalize, page, fp8_products=fp8_products)
    elif (tile.narrow and tile.block_m in NARROW_WIDTHS
          and _gluon_fits(q, kv_cache, kv_scale, kv_lora_rank, page)):
        return _gluon_modules()[1].launch(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank,
                                          softmax_scale, outputs, finalize, page, tile.block_m, tile.num_stages)
    elif tile.tma and _tma_fits(q, kv_cache, kv_lora_rank, rope_dim, page, tile.block_n, fp8_products):
        slots = [kv_cache.shape[0] * kv_cache.shape[1], head_dim]
        strides = [kv_cache.stride(1), 1]
        lo_desc = TensorDescriptor(kv_cache, slots, strides, [tile.block_n, kv_lora_rank // 2])
        rope_desc = TensorDescriptor(kv_cache, slots, strides, [tile.block_n, rope_dim])
        return launch(kernels.segmented_attention_tma_kernel, grid,
            q, lo_desc, rope_desc, scale_arg, row_lens, page_table, work, *partials,
            q.stride(0), q.stride(1), page_table.stride(0), softmax_scale * _LOG2E,
            page_table.shape[1], NUM_STAGES=tile.num_stages, WARP_SPECIALIZE=tile.warp_specialize, **common)
    else:
        return launch(kernels.segmented_attention_kernel, grid,
            q, kv_cache, scale_arg, row_lens, page_table, work, *partials,
            q.stride(0), q.stride(1), kv_cache.stride(1), page_table.stride(0),
            softmax_scale * _LOG2E, page_table.shape[1],
            DL_PAD=_dot_width(kv_lora_rank, _FP8_DOT_LEAST if fp8_products else 16), DR_PAD=_dot_width(rope_dim),
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_stages=tile.num_stages, **common)


def merge_segments(seg_out, seg_max, seg_sum, segments, out_dtype, batch_invariant=False):
    items, heads, qlen, width = seg_out.shape
    batch = segments.shape[0]
    rows = batch * qlen
    device = seg_out.device
    out = torch.empty(rows, heads, width, dtype=out_dtype, device=device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
    key = (layout_facts(seg_out), layout_facts(seg_max), layout_facts(seg_sum), layout_facts(segments),
           out_dtype, batch_invariant)
    replay = _MERGE_PLANS.get(key)
    if replay is not None:
        replay((seg_out, seg_max, seg_sum, segments, out, lse))
    elif rows * heads:
        with fast_launch.recording() as records:
            _merge_segments_anew(seg_out, seg_max, seg_sum, segments, out, lse, batch_invariant)
        _remember(_MERGE_PLANS, key, records, (seg_out, seg_max, seg_sum, segments, out, lse))
    return out, lse


def _merge_segments_anew(seg_out, seg_max, seg_sum, segments, out, lse, batch_invariant: bool, pieces: int = 0) -> None:
    """:func:`merge_segments`'s tile choice and launch into ``out`` and ``lse`` (``pieces`` > 0: every
    request has that many items in order, ``segments`` is not read)."""
    items, heads, qlen, width = seg_out.shape
    batch = items // pieces if pieces else segments.shape[0]
    rows = batch * qlen
    # Few rows (a latency-bound step): split each row's columns over
    # programs. Many rows: one program per row; splitting then only
    # multiplies tiny programs (measured on the H200: C6's merge 45 -> 124 us).
    # Several pairs of a request per program, to share its one read of
    # the schedule, measured slower (C1's merge 21 -> 32 us).
    block_d, warps = triton.next_power_of_2(width), 4
    # Batch-invariant mode keeps one tile whatever the step (_INVARIANT_MERGE_TILE): the
    # split's other layout reduces a row's segments in another order, and whether a step
    # splits depends on its row count.
    if rows * heads < _MERGE_SPLIT_BELOW_PAIRS and not batch_invariant:
        block_d, warps = min(_MERGE_SPLIT_BLOCK_D, block_d), _MERGE_SPLIT_WARPS
    # A uniform step's request has about NI / B items, read in one step (a whole row's program
    # at most _MERGE_ROW_MOST_ITEMS of them).
    chunk = min(_MERGE_MAX_CHUNK, triton.next_power_of_2(max(1, items // batch)))
    if batch_invariant:
        tile_d, warps, most = _INVARIANT_MERGE_TILE
        block_d, chunk = min(tile_d, block_d), min(most, chunk)
    elif block_d > _MERGE_SPLIT_BLOCK_D:
        chunk = min(_MERGE_ROW_MOST_ITEMS, chunk)
    launch(kernels.merge_segments_kernel, (rows * heads, triton.cdiv(width, block_d)),
        seg_out.contiguous(), seg_max.contiguous(), seg_sum.contiguous(),
        seg_max if pieces else segments.contiguous(), out, lse,
        QLEN=qlen, H=heads, DL=width, BLOCK_D=block_d, num_warps=warps, CHUNK=chunk, PIECES=pieces,
        **pdl_options(seg_out.device))


def merge_ranks(outs, lses):
    world, rows, heads, width = outs.shape
    device = outs.device
    out = torch.empty(rows, heads, width, dtype=outs.dtype, device=device)
    lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
    key = (layout_facts(outs), layout_facts(lses))
    replay = _RANKS_PLANS.get(key)
    pairs = rows * heads
    if replay is not None:
        replay((outs, lses, out, lse))
    elif pairs:
        with fast_launch.recording() as records:
            launch(kernels.merge_ranks_kernel, (pairs,),
                outs.contiguous(), lses.float().contiguous(), out, lse, pairs,
                WORLD=world, W_PAD=triton.next_power_of_2(world), DL=width,
                DL_PAD=triton.next_power_of_2(width), num_warps=4, **pdl_options(device))
        _remember(_RANKS_PLANS, key, records, (outs, lses, out, lse))
    return out, lse


# Columns one program of a row-moving kernel (ragged blocks, the cache write) copies: a row of 16 heads
# x 576 is nine of them.
_MOVE_BLOCK = 1024


def _flat_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as [N, columns] with a unit inner stride (a view where its layout allows one)."""
    return _unit_inner_stride(tensor.reshape(tensor.shape[0], -1))


# Tokens a step of the ragged map kernel's loops takes.
_MAP_BLOCK = 128


def ragged_map(query_start_loc: torch.Tensor, qlen: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``pure.ragged_map`` in one launch of :func:`kernels.ragged_map_kernel` (a program a request,
    one for the tokens of none) in place of its ~25 torch launches."""
    batch = query_start_loc.shape[0] - 1
    device = query_start_loc.device
    token_of_row = torch.empty(batch * qlen, dtype=torch.int32, device=device)
    row_of_token = torch.empty(num_tokens, dtype=torch.int32, device=device)
    if batch == 0 and num_tokens == 0:
        return token_of_row, row_of_token
    starts = query_start_loc.contiguous()
    key = ("map", layout_facts(starts), qlen, num_tokens)
    replay = _MOVE_PLANS.get(key)
    sources = (starts, token_of_row, row_of_token)
    if replay is not None:
        replay(sources)
        return token_of_row, row_of_token
    with fast_launch.recording() as records:
        launch(kernels.ragged_map_kernel, (batch + 1,), *sources, batch, num_tokens, QLEN=qlen,
               QLEN_PAD=triton.next_power_of_2(qlen), NO_ROW=RAGGED_NO_ROW, NO_REQUEST=RAGGED_NO_REQUEST,
               BLOCK=_MAP_BLOCK, num_warps=4, **pdl_options(device))
    _remember(_MOVE_PLANS, key, records, sources)
    return token_of_row, row_of_token


def ragged_rows(q: torch.Tensor, token_of_row: torch.Tensor) -> torch.Tensor:
    """``pure.ragged_rows`` in one launch of :func:`kernels.ragged_rows_kernel`."""
    rows = torch.empty(token_of_row.shape[0], *q.shape[1:], dtype=q.dtype, device=q.device)
    width = rows[0].numel() if rows.shape[0] else 0
    if rows.shape[0] == 0 or width == 0:
        return rows
    if q.shape[0] == 0:
        return rows.zero_()
    flat = _flat_rows(q)
    key = ("rows", layout_facts(flat), layout_facts(token_of_row))
    replay = _MOVE_PLANS.get(key)
    sources = (flat, token_of_row.contiguous(), rows)
    if replay is not None:
        replay(sources)
        return rows
    with fast_launch.recording() as records:
        launch(kernels.ragged_rows_kernel, (rows.shape[0], triton.cdiv(width, _MOVE_BLOCK)), *sources,
               flat.stride(0), width, BLOCK=_MOVE_BLOCK, **pdl_options(q.device))
    _remember(_MOVE_PLANS, key, records, sources)
    return rows


def ragged_tokens(out: torch.Tensor, lse: torch.Tensor, row_of_token: torch.Tensor):
    """``pure.ragged_tokens`` in one launch of :func:`kernels.ragged_tokens_kernel`."""
    tokens = row_of_token.shape[0]
    token_out = torch.empty(tokens, *out.shape[1:], dtype=out.dtype, device=out.device)
    token_lse = torch.empty(tokens, *lse.shape[1:], dtype=lse.dtype, device=lse.device)
    width, lse_width = out[0].numel() if out.shape[0] else 0, lse[0].numel() if lse.shape[0] else 0
    if tokens == 0:
        return token_out, token_lse
    if out.shape[0] == 0 or width == 0 or lse_width == 0:
        # No row to read (B = 0) or nothing in one: the rules alone (rare; no plan).
        nan = (row_of_token == RAGGED_NO_ROW).view(-1, *[1] * (out.dim() - 1))
        token_out.zero_().masked_fill_(nan, float("nan"))
        token_lse.fill_(float("-inf")).masked_fill_(nan.view(-1, *[1] * (lse.dim() - 1)), float("nan"))
        return token_out, token_lse
    flat_out, flat_lse = _flat_rows(out), _flat_rows(lse)
    key = ("tokens", layout_facts(flat_out), layout_facts(flat_lse), layout_facts(row_of_token))
    replay = _MOVE_PLANS.get(key)
    sources = (flat_out, flat_lse, row_of_token.contiguous(), token_out, token_lse)
    if replay is not None:
        replay(sources)
        return token_out, token_lse
    with fast_launch.recording() as records:
        launch(kernels.ragged_tokens_kernel, (tokens, triton.cdiv(width, _MOVE_BLOCK)), *sources,
               flat_out.stride(0), flat_lse.stride(0), width, lse_width, NO_ROW=RAGGED_NO_ROW,
               BLOCK=_MOVE_BLOCK, LSE_BLOCK=triton.next_power_of_2(lse_width), **pdl_options(out.device))
    _remember(_MOVE_PLANS, key, records, sources)
    return token_out, token_lse


def write_cache(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor, kv_scale):
    """``pure.write_cache`` in one launch of :func:`kernels.write_cache_kernel` (in place)."""
    rows, width = latent.shape
    if rows == 0 or width == 0:
        return None
    flat = _unit_inner_stride(latent)
    if kv_cache.dtype == torch.uint8:
        return _write_cache_ds(kv_cache, slots, flat)
    limit = torch.finfo(kv_cache.dtype).max if kv_scale is not None else 0.0
    key = ("cache", layout_facts(kv_cache), layout_facts(slots), layout_facts(flat),
           None if kv_scale is None else layout_facts(kv_scale))
    replay = _MOVE_PLANS.get(key)
    sources = (kv_cache, slots, flat, kv_scale if kv_scale is not None else slots)
    if replay is not None:
        replay(sources)
        return None
    with fast_launch.recording() as records:
        launch(kernels.write_cache_kernel, (rows, triton.cdiv(width, _MOVE_BLOCK)), *sources,
               kv_cache.stride(1), flat.stride(0), width, LIMIT=float(limit), HAS_SCALE=kv_scale is not None,
               BLOCK=_MOVE_BLOCK, **pdl_options(kv_cache.device))
    _remember(_MOVE_PLANS, key, records, sources)
    return None


def _write_cache_ds(kv_cache: torch.Tensor, slots: torch.Tensor, flat: torch.Tensor) -> None:
    """``write_cache`` into a cache of DeepSeek's fp8 layout: one program a row (its 128-value tiles'
    scales need the whole row)."""
    latent_rank, rope = _fp8_ds_mla.split(kv_cache.shape[2], flat.shape[1])
    key = ("cache_ds", layout_facts(kv_cache), layout_facts(slots), layout_facts(flat))
    replay = _MOVE_PLANS.get(key)
    sources = (kv_cache, slots, flat)
    if replay is not None:
        replay(sources)
        return None
    with fast_launch.recording() as records:
        launch(kernels.write_cache_ds_kernel, (flat.shape[0],), *sources, kv_cache.stride(1), flat.stride(0),
               DL=latent_rank, DR=rope, DR_PAD=triton.next_power_of_2(max(rope, 1)), num_warps=4,
               **pdl_options(kv_cache.device))
    _remember(_MOVE_PLANS, key, records, sources)
    return None


def _row_outputs(q: torch.Tensor, width: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [rows, H, width] in ``dtype``, lse float32 [rows, H]) for the rows of ``q``, unwritten."""
    rows, heads = q.shape[0], q.shape[1]
    return (torch.empty(rows, heads, width, dtype=dtype, device=q.device),
            torch.empty(rows, heads, dtype=torch.float32, device=q.device))


# Heads one program of the masked-block kernel holds, and its warps: its query rows and accumulator
# are [BLOCK_H, 512] float32 each in registers. Built for sm_90 as a launch specialises it
# (scripts/gluon_compile.py), 16 heads take 255 registers a thread at 4 warps (153 at 8); 8 heads at
# 8 warps 89, no spills: two programs an SM where 16 at 4 warps fit two of half the threads.
_BLOCK_HEADS = 8
_BLOCK_WARPS = 8


def block_attention(q, kv_cache, kv_scale, out, lse, block_table, mask, seq_lens, qlen, world, rank, interleave,
                    max_model_len, kv_lora_rank, softmax_scale, invariant=False):
    """``mla_dcp::block_attention`` in one launch of :func:`kernels.block_attention_kernel` (a row's
    keys in a fixed order whatever the step: batch-invariant as is)."""
    rows, heads, dim = q.shape
    device = q.device
    merged, merged_lse = _row_outputs(q, kv_lora_rank, out.dtype)
    if rows == 0 or heads == 0 or kv_lora_rank == 0:
        return merged, merged_lse
    q, out, lse, table = (_unit_inner_stride(t) for t in (q, out, lse, block_table))
    block_h = min(_BLOCK_HEADS, triton.next_power_of_2(heads))
    key = ("block", layout_facts(q), layout_facts(kv_cache), None if kv_scale is None else layout_facts(kv_scale),
           layout_facts(out), layout_facts(lse), layout_facts(table), layout_facts(mask), layout_facts(seq_lens),
           qlen, world, rank, interleave, max_model_len, kv_lora_rank, softmax_scale)
    replay = _MOVE_PLANS.get(key)
    sources = (q, kv_cache, kv_scale if kv_scale is not None else lse, out, lse, table, mask, seq_lens, merged,
               merged_lse)
    if replay is not None:
        replay(sources)
        return merged, merged_lse
    rope = dim - kv_lora_rank
    with fast_launch.recording() as records:
        launch(kernels.block_attention_kernel, (rows, triton.cdiv(heads, block_h)), *sources,
               q.stride(0), q.stride(1), kv_cache.stride(1), out.stride(0), out.stride(1), lse.stride(0),
               table.stride(0), mask.stride(0), mask.stride(1), mask.stride(2), heads, table.shape[1], qlen,
               max_model_len, softmax_scale * math.log2(math.e), WORLD=world, RANK=rank, INTERLEAVE=interleave,
               BLOCK_SIZE=kv_cache.shape[1], DL=kv_lora_rank, DL_PAD=triton.next_power_of_2(kv_lora_rank),
               DR=rope, DR_PAD=triton.next_power_of_2(max(rope, 1)), BLOCK_H=block_h, HAS_SCALE=kv_scale is not None,
               num_warps=_BLOCK_WARPS, **pdl_options(device))
    _remember(_MOVE_PLANS, key, records, sources)
    return merged, merged_lse


# (heads, listed positions, warps) of one program of the sparse kernel, by the step's heads (tl.dot
# needs 16 rows or more: fewer heads are padded). Built for sm_90 as a launch specialises it
# (scripts/gluon_compile.py: pointers and row strides divisible by 16; DL 512 + DR 64), registers a
# thread and no spills: 16 x 32 at 8 warps and 3 stages 128 (two programs an SM; 144 over e4m3, one),
# 32 x 16 at 8 warps 168; 16 x 32 at 4 warps 252 and 32 x 32 at 4 warps spilled 16 bytes (e4m3 8 and
# 184), every 64-head tile 400-650. 32 heads a program halve the re-gathering of a row's keys but
# halve the programs too: measured on the H200 (benchmarks/probes/sparse_verify.py, top-2048), C4
# 216.6 us with 16 heads against 444.6 with 32, C7 209.6 against 435.0, so 16 serve every step.
# Over DeepSeek's fp8 layout the dequantization takes more: 16 x 16 at 8 warps 184 registers in one
# stage, 249-252 in two or three (no spills: one program an SM either way; pipelined not yet timed),
# 16 x 32 200 in one stage and spilling at two. (A build without the launch's divisibility, which
# this table once went by, counted 168-180 for the 16-bit tile and spilled the pipelined ds ones.)
# (BLOCK_H, BLOCK_N, warps, stages).
SPARSE_TILES = {16: (16, 32, 8, 3), 32: (16, 32, 8, 3), "ds": (16, 16, 8, 1)}
# Listed positions a program of the slots kernel takes a step.
_SLOTS_BLOCK = 256
# At most this many pieces a row (the merge reads them in one step where it splits a row's columns,
# as it does for the few-row steps that have this many: up to _MERGE_MAX_CHUNK a step).
SPARSE_MAX_PIECES = 32
# Pieces a row in batch-invariant mode, at most: a count the static configuration alone fixes.
SPARSE_INVARIANT_PIECES = 8
# Multiprocessors the piece count plans for where the device has none to ask (the interpreter):
# the H200's, so a CPU test runs the split a GPU step of its shape would.
_PLANNED_SMS = 132


def sparse_tile(heads: int, ds_layout: bool = False) -> tuple[int, int, int, int]:
    """(BLOCK_H, BLOCK_N, warps, stages) of the sparse kernel for ``heads`` (over DeepSeek's fp8 layout)."""
    return SPARSE_TILES["ds" if ds_layout else 32 if heads >= 32 else 16]


def sparse_pieces(rows: int, heads: int, topk: int, world: int, ds_layout: bool, device: torch.device,
                  invariant: bool = False) -> int:
    """Programs each sparse row's slots split over. Only a step too small to fill the GPU splits:
    every piece beyond one is a partial written and merged, which a step of half a wave of programs
    or more pays for without gaining (one sparse program fits an SM at a time). Such a step then
    splits up to a program an SM, at most twice the steps a rank holds of a row on average
    (``topk / world`` positions: the slack covers a rank holding more than its share), 32 at most.
    Measured on the H200 at top-2048 over 8 ranks (benchmarks/probes/sparse_verify.py): C7's 2
    programs 39.4 us in one piece, 23.5 in 8, 20.7 in 16; C4's 128 programs 46.4 in one, 56.2 in 3,
    67.3 in 6; C1's 768 169.3 in one, 205.3 in 2. Batch-invariant mode takes the bound alone
    (``min(ceil(topk / (world * BLOCK_N)), 8)``): the split, and so a row's bits, may not depend
    on the batch."""
    block_h, block_n, _, _ = sparse_tile(heads, ds_layout)
    steps = max(1, triton.cdiv(topk, world * block_n))
    if invariant:
        return min(steps, SPARSE_INVARIANT_PIECES)
    sms = tiles._device_facts(device)[1] if device.type == "cuda" else _PLANNED_SMS
    programs = rows * triton.cdiv(heads, block_h)
    if 2 * programs >= sms:
        return 1
    return max(1, min(2 * steps, SPARSE_MAX_PIECES, triton.cdiv(sms, programs)))


def sparse_attention(q, kv_cache, kv_scale, row_lens, page_table, indices, qlen, world, rank, interleave,
                     kv_lora_rank, softmax_scale, invariant=False):
    """``mla_dcp::sparse_attention``: :func:`kernels.sparse_slots_kernel` packs each row's slots,
    :func:`kernels.sparse_attention_kernel` attends over them in :func:`sparse_pieces` pieces a row,
    and where there are several :func:`kernels.merge_segments_kernel` merges them. A repeated layout
    launches all of it from one plan."""
    rows, heads, dim = q.shape
    if rows == 0 or heads == 0 or kv_lora_rank == 0:
        return _row_outputs(q, kv_lora_rank, q.dtype)
    if indices.shape[1] == 0:
        out, lse = _row_outputs(q, kv_lora_rank, q.dtype)
        return out.zero_(), lse.fill_(float("-inf"))
    table, listed = _unit_inner_stride(page_table), _unit_inner_stride(indices)
    q = _unit_inner_stride(q)
    sources = (q, kv_cache, kv_scale if kv_scale is not None else row_lens, row_lens, table, listed)
    key = None if not fast_launch.enabled else (
        "sparse", layout_facts(q), layout_facts(kv_cache), None if kv_scale is None else layout_facts(kv_scale),
        layout_facts(row_lens), layout_facts(table), layout_facts(listed), qlen, world, rank, interleave,
        kv_lora_rank, softmax_scale, invariant, sparse_tile(heads, kv_cache.dtype == torch.uint8))
    return _sequence_call(_SPARSE_PLANS, key, sources, lambda: _sparse_attention(
        *sources, kv_scale is not None, qlen, world, rank, interleave, kv_lora_rank, softmax_scale, invariant))


def _sparse_attention(q, kv_cache, kv_scale, row_lens, table, listed, has_scale, qlen, world, rank, interleave,
                      kv_lora_rank, softmax_scale, invariant):
    """:func:`sparse_attention`'s launches (``kv_scale`` is a placeholder where not ``has_scale``)."""
    rows, heads, dim = q.shape
    device = q.device
    topk = listed.shape[1]
    ds_layout = kv_cache.dtype == torch.uint8
    slots = torch.empty(rows, topk, dtype=torch.int32, device=device)
    counts = torch.empty(rows, dtype=torch.int32, device=device)
    fast_launch.note_scratch(slots, counts)
    page = page_size_for(kv_cache.shape[1])
    launch(kernels.sparse_slots_kernel, (rows,), listed, row_lens, table, slots, counts, listed.stride(0),
           table.stride(0), topk, qlen, table.shape[1], WORLD=world, RANK=rank, INTERLEAVE=interleave, PAGE=page,
           BLOCK=min(_SLOTS_BLOCK, triton.next_power_of_2(topk)), num_warps=4, **pdl_options(device))
    block_h, block_n, warps, stages = sparse_tile(heads, ds_layout)
    pieces = sparse_pieces(rows, heads, topk, world, ds_layout, device, invariant)
    if pieces == 1:
        outputs = _row_outputs(q, kv_lora_rank, q.dtype) + (row_lens,)
    else:
        outputs = attention_outputs(q, kv_lora_rank, rows // qlen * pieces, qlen, finalize=False)
        fast_launch.note_scratch(*outputs)
    rope = dim - kv_lora_rank
    launch(kernels.sparse_attention_kernel, (rows, triton.cdiv(heads, block_h), pieces), q, kv_cache, kv_scale,
           row_lens, slots, counts, *outputs, q.stride(0), q.stride(1), kv_cache.stride(1), heads, topk, qlen,
           table.shape[1], softmax_scale * math.log2(math.e), PAGE=page, DL=kv_lora_rank, DR=rope,
           DL_PAD=_dot_width(kv_lora_rank), DR_PAD=_dot_width(rope), BLOCK_H=block_h, BLOCK_N=block_n,
           HAS_KV_SCALE=has_scale, DS_LAYOUT=ds_layout, PIECES=pieces, FINALIZE=pieces == 1,
           DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
           **pdl_options(device))
    if pieces == 1:
        return outputs[:2]
    out, lse = _row_outputs(q, kv_lora_rank, q.dtype)
    _merge_segments_anew(*outputs, None, out, lse, invariant, pieces)
    return out, lse
