"""`torch.library` registrations: one custom op per stage of DESIGN.md.

Each op has a fake (meta) implementation that checks dtypes and derives
output shapes from input shapes alone, so `torch.compile(fullgraph=True)`
keeps the whole verify step in one graph, one node per stage. The default
kernel of every op is the pure oracle (it runs on any device); the Triton
launchers in this package are registered on top of it for CUDA/ROCm.

Only torch is imported here: the schemas never depend on Triton.
"""

from __future__ import annotations

import types
from typing import Callable

import torch

from mla_dcp import pure
from mla_dcp._shapes import (STREAM_WORK_COLUMNS, WORK_COLUMN_COUNTS, WORK_COLUMNS, page_table_shape,
                             schedule_shape_for, work_columns)
from mla_dcp.ops import tiles

__all__ = ["row_lens", "expand_pages", "schedule", "step_metadata", "step_metadata_auto", "segmented_attention",
           "merge_segments", "single_segment_attention", "merged_attention", "merge_ranks", "ragged_map",
           "ragged_rows", "ragged_tokens", "write_cache", "block_attention", "sparse_attention",
           "stage"]

_NAMESPACE = "mla_dcp"


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise RuntimeError(message)


@torch.library.custom_op(f"{_NAMESPACE}::row_lens", mutates_args=())
def row_lens(seq_lens: torch.Tensor, qlen: int, world: int, rank: int, interleave: int,
             causal: bool = True) -> torch.Tensor:
    """Stage 1: int32 [B*qlen] rank-local lengths of every verify row (causal, or a non-causal block)."""
    return pure.verify_row_lens(seq_lens, qlen, world, rank, interleave, causal=causal)


@row_lens.register_fake
def _(seq_lens, qlen, world, rank, interleave, causal=True):
    _expect(seq_lens.dtype == torch.int32 and seq_lens.dim() == 1,
            f"mla_dcp::row_lens: seq_lens must be int32 [B], got {seq_lens.dtype} {list(seq_lens.shape)}")
    return seq_lens.new_empty(seq_lens.shape[0] * qlen, dtype=torch.int32)


@torch.library.custom_op(f"{_NAMESPACE}::expand_pages", mutates_args=())
def expand_pages(block_table: torch.Tensor, block_size: int, max_local_len: int) -> torch.Tensor:
    """Stage 2: int32 [B, max_pages] page table from the block table."""
    return pure.expand_page_table(block_table, block_size, max_local_len)


@expand_pages.register_fake
def _(block_table, block_size, max_local_len):
    _expect(block_table.dtype == torch.int32 and block_table.dim() == 2,
            f"mla_dcp::expand_pages: block_table must be int32 [B, max_blocks], "
            f"got {block_table.dtype} {list(block_table.shape)}")
    return block_table.new_empty(page_table_shape(block_table.shape, block_size, max_local_len), dtype=torch.int32)


@torch.library.custom_op(f"{_NAMESPACE}::schedule", mutates_args=())
def schedule(row_lens: torch.Tensor, qlen: int, page: int, max_pages: int,
             num_items: int, chunk: int = 0, programs: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's work schedule: (work int32 [num_items, 3], or [num_items, 5]
    for the stream (``programs > 0``), segments int32 [B, 3])."""
    return pure.build_schedule(row_lens, qlen, page, max_pages, num_items, chunk, programs)


@schedule.register_fake
def _(row_lens, qlen, page, max_pages, num_items, chunk=0, programs=0):
    _expect(row_lens.dtype == torch.int32 and row_lens.dim() == 1 and row_lens.shape[0] % qlen == 0,
            f"mla_dcp::schedule: row_lens must be int32 [B*{qlen}], got {row_lens.dtype} {list(row_lens.shape)}")
    batch = row_lens.shape[0] // qlen
    return (row_lens.new_empty(num_items, work_columns(programs), dtype=torch.int32),
            row_lens.new_empty(batch, 3, dtype=torch.int32))


@torch.library.custom_op(f"{_NAMESPACE}::step_metadata", mutates_args=())
def step_metadata(seq_lens: torch.Tensor, qlen: int, world: int, rank: int, interleave: int, causal: bool,
                  page: int, max_pages: int, num_items: int, chunk: int = 0, programs: int = 0,
                  context: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``row_lens`` then ``schedule``: (row_lens int32 [B*qlen], work, segments), one launch on a GPU.
    ``context``: of each request's keys before its block of ``qlen`` (``max(L - qlen, 0)``, a masked
    block's context), as if those were its length."""
    if context:
        seq_lens = (seq_lens - qlen).clamp_min(0)
    lens = pure.verify_row_lens(seq_lens, qlen, world, rank, interleave, causal=causal)
    return (lens, *pure.build_schedule(lens, qlen, page, max_pages, num_items, chunk, programs))


@step_metadata.register_fake
def _(seq_lens, qlen, world, rank, interleave, causal, page, max_pages, num_items, chunk=0, programs=0,
      context=False):
    _expect(seq_lens.dtype == torch.int32 and seq_lens.dim() == 1,
            f"mla_dcp::step_metadata: seq_lens must be int32 [B], got {seq_lens.dtype} {list(seq_lens.shape)}")
    batch = seq_lens.shape[0]
    return (seq_lens.new_empty(batch * qlen), seq_lens.new_empty(num_items, work_columns(programs)),
            seq_lens.new_empty(batch, 3))


def schedule_shape_of(batch: int, device: torch.device, q_dtype: torch.dtype, kv_dtype: torch.dtype,
                      max_pages: int, page: int, m_size: int, kv_lora_rank: int, stream: bool | None,
                      fixed_segments: int | None = None) -> tuple[int, int]:
    """(num_items, programs) of a step's schedule from static facts (``mla_dcp.schedule_shape``):
    ``fixed_segments`` a request (``VerifyConfig.num_segments``, batch-invariant mode's count) one
    piece a program; otherwise the device's choice, the stream where its kernel runs several pieces
    a program (``stream``: ``VerifyConfig.stream``)."""
    if fixed_segments is not None:
        return batch * fixed_segments, 0
    if device.type == "cuda":
        return tiles.gpu_schedule_shape(stream, max_pages, page, m_size, kv_lora_rank, batch, device, q_dtype,
                                        kv_dtype)
    return schedule_shape_for(batch, pure.default_num_segments(max_pages, page), stream is not False)


def stream_code(stream: bool | None) -> int:
    """``VerifyConfig.stream`` as :func:`step_metadata_auto` takes it: -1 for None, 0 or 1."""
    return -1 if stream is None else int(bool(stream))


@torch.library.custom_op(f"{_NAMESPACE}::step_metadata_auto", mutates_args=())
def step_metadata_auto(seq_lens: torch.Tensor, qlen: int, world: int, rank: int, interleave: int, causal: bool,
                       page: int, max_pages: int, chunk: int, num_heads: int, kv_lora_rank: int,
                       q_dtype: torch.dtype, kv_dtype: torch.dtype,
                       stream: int = -1, context: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``step_metadata`` with the schedule's shape chosen when it runs, from the batch it gets and
    the static facts (:func:`schedule_shape_of`; ``stream`` -1, 0, 1 for ``VerifyConfig.stream``
    None, False, True): what a traced step calls, so that its graph holds no choice that follows
    the batch (the device's segment count does, at nearly every size: a graph that computed it
    would guard on it and be traced again for each batch size). Its fake fixes the work table's
    shape for a static batch and leaves it to the run for a dynamic one."""
    num_items, programs = _auto_shape(seq_lens, qlen, max_pages, page, num_heads, kv_lora_rank, q_dtype, kv_dtype,
                                      stream)
    return torch.ops.mla_dcp.step_metadata.default(seq_lens, qlen, world, rank, interleave, causal, page, max_pages,
                                                   num_items, chunk, programs, context)


def _auto_facts_checked(qlen, max_pages, page, num_heads, kv_lora_rank, stream) -> bool | None:
    """RuntimeError naming the first of :func:`step_metadata_auto`'s static facts out of range;
    else ``stream`` as ``VerifyConfig.stream``."""
    for name, value in (("qlen", qlen), ("max_pages", max_pages), ("page", page), ("num_heads", num_heads),
                        ("kv_lora_rank", kv_lora_rank)):
        _expect(value >= 1, f"mla_dcp::step_metadata_auto: {name} must be >= 1, got {value}")
    _expect(stream in (-1, 0, 1), f"mla_dcp::step_metadata_auto: stream must be -1 (None), 0 or 1, got {stream}")
    return None if stream < 0 else bool(stream)


def _auto_shape(seq_lens, qlen, max_pages, page, num_heads, kv_lora_rank, q_dtype, kv_dtype, stream):
    """:func:`schedule_shape_of` for :func:`step_metadata_auto`; a GPU's kept by its arguments (with
    the tile plans' memo, which forgetting device facts empties): the cost model's Python is most
    of the op's host time otherwise."""
    batch, device = seq_lens.shape[0], seq_lens.device
    if device.type != "cuda" or tiles._FORCED:
        stream_flag = _auto_facts_checked(qlen, max_pages, page, num_heads, kv_lora_rank, stream)
        return schedule_shape_of(batch, device, q_dtype, kv_dtype, max_pages, page, qlen * num_heads, kv_lora_rank,
                                 stream_flag)
    key = (_auto_shape, batch, device.index, qlen, max_pages, page, num_heads, kv_lora_rank, q_dtype, kv_dtype,
           stream, tiles.STREAM_ON_GPU)
    shape = tiles._EAGER_MEMO.get(key)
    if shape is None:
        stream_flag = _auto_facts_checked(qlen, max_pages, page, num_heads, kv_lora_rank, stream)
        if len(tiles._EAGER_MEMO) >= tiles.EAGER_MEMO_LIMIT:
            tiles._EAGER_MEMO.clear()
        shape = tiles._EAGER_MEMO[key] = schedule_shape_of(batch, device, q_dtype, kv_dtype, max_pages, page,
                                                           qlen * num_heads, kv_lora_rank, stream_flag)
    return shape


def _step_metadata_auto_cuda(seq_lens, qlen, world, rank, interleave, causal, page, max_pages, chunk, num_heads,
                             kv_lora_rank, q_dtype, kv_dtype, stream=-1, context=False):
    """The op's CUDA kernel: the shape, then step_metadata's launcher (what its own CUDA kernel calls)."""
    num_items, programs = _auto_shape(seq_lens, qlen, max_pages, page, num_heads, kv_lora_rank, q_dtype, kv_dtype,
                                      stream)
    return _LAUNCHERS["step_metadata"](seq_lens, qlen, world, rank, interleave, causal, page, max_pages, num_items,
                                       chunk, programs, context)


@step_metadata_auto.register_fake
def _(seq_lens, qlen, world, rank, interleave, causal, page, max_pages, chunk, num_heads, kv_lora_rank, q_dtype,
      kv_dtype, stream=-1, context=False):
    _expect(seq_lens.dtype == torch.int32 and seq_lens.dim() == 1,
            f"mla_dcp::step_metadata_auto: seq_lens must be int32 [B], got {seq_lens.dtype} "
            f"{list(seq_lens.shape)}")
    stream_flag = _auto_facts_checked(qlen, max_pages, page, num_heads, kv_lora_rank, stream)
    batch = seq_lens.shape[0]
    if isinstance(batch, int):
        # A static batch: the shape it will run with, fixed in the graph (CUDA graph trees refuse a
        # graph holding a size it does not fix).
        num_items, programs = schedule_shape_of(batch, seq_lens.device, q_dtype, kv_dtype, max_pages, page,
                                                qlen * num_heads, kv_lora_rank, stream_flag)
        work = seq_lens.new_empty(num_items, work_columns(programs))
    else:
        # A dynamic batch: the schedule's rows and columns are chosen when the op runs, sizes the
        # graph does not fix (so no guard follows the cost model's choice).
        ctx = torch.library.get_ctx()
        work = seq_lens.new_empty(ctx.new_dynamic_size(), ctx.new_dynamic_size())
    return seq_lens.new_empty(batch * qlen), work, seq_lens.new_empty(batch, 3)


def _work_columns_fit(columns) -> bool:
    """Whether a schedule's column count is one of its layouts', or not fixed by the graph being
    traced: :func:`step_metadata_auto` chooses it when it runs, always one of them."""
    return not isinstance(columns, int) or columns in WORK_COLUMN_COUNTS


@torch.library.custom_op(f"{_NAMESPACE}::segmented_attention", mutates_args=())
def segmented_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_scale: torch.Tensor | None,
    row_lens: torch.Tensor,
    page_table: torch.Tensor,
    work: torch.Tensor,
    qlen: int,
    kv_lora_rank: int,
    softmax_scale: float,
    invariant_pages: int = 0,
    fp8_products: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stage 3: (seg_out f32 [NI, H, qlen, Dl], seg_max, seg_sum f32 [NI, H, qlen]), base 2.

    Rows that no program runs (a stream schedule's past its pieces, which no
    merge reads) are unspecified, and so is ``seg_out`` where ``seg_sum == 0``
    (a row with no key in its segment: the kernels store only its statistics).

    ``invariant_pages > 0``: batch-invariant mode, whose schedule cuts
    segments of that many pages (VerifyConfig.invariant_chunk_pages): the
    kernel's tiles and each item's arithmetic do not depend on ``qlen * H``,
    the batch or the other items. 0: the default mode. ``fp8_products``:
    e4m3 products over an e4m3 cache (VerifyConfig.fp8_products)."""
    return pure.segmented_attention(
        q, kv_cache, row_lens, page_table, work, qlen=qlen, kv_lora_rank=kv_lora_rank,
        softmax_scale=softmax_scale, kv_scale=kv_scale, span=invariant_pages or None, fp8_products=fp8_products)


@segmented_attention.register_fake
def _segmented_attention_fake(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank,
                              softmax_scale, invariant_pages=0, fp8_products=False):
    rows, heads, head_dim = q.shape
    _expect(kv_cache.dim() == 3 and kv_cache.shape[2] == head_dim,
            f"mla_dcp::segmented_attention: kv_cache must be [num_blocks, block_size, {head_dim}], "
            f"got {list(kv_cache.shape)}")
    _expect(row_lens.dtype == torch.int32 and list(row_lens.shape) == [rows],
            f"mla_dcp::segmented_attention: row_lens must be int32 [{rows}], "
            f"got {row_lens.dtype} {list(row_lens.shape)}")
    _expect(page_table.dtype == torch.int32 and page_table.dim() == 2
            and page_table.shape[0] * qlen == rows,
            f"mla_dcp::segmented_attention: page_table must be int32 [{rows // qlen}, max_pages], "
            f"got {page_table.dtype} {list(page_table.shape)}")
    _expect(kv_scale is None or (kv_scale.dtype == torch.float32 and kv_scale.numel() == 1),
            "mla_dcp::segmented_attention: kv_scale must be float32 [1] or None")
    _expect(work.dtype == torch.int32 and work.dim() == 2 and _work_columns_fit(work.shape[1]),
            f"mla_dcp::segmented_attention: work must be int32 [NI, {WORK_COLUMNS}] or [NI, {STREAM_WORK_COLUMNS}], "
            f"got {work.dtype} {list(work.shape)}")
    items = work.shape[0]
    seg_out = q.new_empty(items, heads, qlen, kv_lora_rank, dtype=torch.float32)
    seg_max = q.new_empty(items, heads, qlen, dtype=torch.float32)
    seg_sum = q.new_empty(items, heads, qlen, dtype=torch.float32)
    return seg_out, seg_max, seg_sum


@torch.library.custom_op(f"{_NAMESPACE}::merge_segments", mutates_args=())
def merge_segments(seg_out: torch.Tensor, seg_max: torch.Tensor, seg_sum: torch.Tensor, segments: torch.Tensor,
                   out_dtype: torch.dtype, batch_invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 4: (out [B*qlen, H, Dl] in out_dtype, lse f32 [B*qlen, H] natural log).

    ``batch_invariant``: the GPU kernel's tile does not follow the number of
    rows (the CPU path never does)."""
    return pure.merge_segments(seg_out, seg_max, seg_sum, segments, out_dtype)


@merge_segments.register_fake
def _(seg_out, seg_max, seg_sum, segments, out_dtype, batch_invariant=False):
    _expect(seg_out.dim() == 4 and seg_max.shape == seg_out.shape[:3] and seg_sum.shape == seg_max.shape,
            f"mla_dcp::merge_segments: expected seg_out [NI, H, qlen, Dl] and stats [NI, H, qlen], got "
            f"{list(seg_out.shape)}, {list(seg_max.shape)}, {list(seg_sum.shape)}")
    _expect(segments.dtype == torch.int32 and segments.dim() == 2 and segments.shape[1] == 3,
            f"mla_dcp::merge_segments: segments must be int32 [B, 3], got {segments.dtype} {list(segments.shape)}")
    _, heads, qlen, width = seg_out.shape
    rows = segments.shape[0] * qlen
    return (seg_out.new_empty(rows, heads, width, dtype=out_dtype),
            seg_out.new_empty(rows, heads, dtype=torch.float32))


def _attention_and_merge(q, kv_cache, kv_scale, row_lens, page_table, work, segments, qlen, kv_lora_rank,
                         softmax_scale, invariant_pages, fp8_products):
    """The pure stages 3 and 4 of the fused ops."""
    return pure.merge_segments(*pure.segmented_attention(
        q, kv_cache, row_lens, page_table, work, qlen=qlen, kv_lora_rank=kv_lora_rank,
        softmax_scale=softmax_scale, kv_scale=kv_scale, span=invariant_pages or None,
        fp8_products=fp8_products), segments, q.dtype)


def _merged_outputs(q, kv_lora_rank):
    """The fused ops' (out, lse) for q's rows."""
    rows, heads = q.shape[:2]
    return q.new_empty(rows, heads, kv_lora_rank), q.new_empty(rows, heads, dtype=torch.float32)


@torch.library.custom_op(f"{_NAMESPACE}::single_segment_attention", mutates_args=())
def single_segment_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_scale: torch.Tensor | None,
    row_lens: torch.Tensor,
    page_table: torch.Tensor,
    work: torch.Tensor,
    qlen: int,
    kv_lora_rank: int,
    softmax_scale: float,
    invariant_pages: int = 0,
    fp8_products: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stages 3 and 4 with one segment per request: (out [T, H, Dl] in q's dtype, lse f32 [T, H] natural log).

    ``work`` is a schedule of one item per request (as
    :func:`mla_dcp.pure.build_schedule` gives for ``num_items == B``, in any
    order). Equal to ``merge_segments`` of ``segmented_attention``; the
    Triton kernel normalises in its epilogue, so no partials are written or
    read and the merge launch goes away.
    """
    batch = page_table.shape[0]
    slot = torch.empty(batch, dtype=torch.int32, device=work.device)
    slot[work[:, 0].long()] = torch.arange(batch, dtype=torch.int32, device=work.device)
    segments = torch.stack([slot, torch.ones_like(slot), torch.full_like(slot, -1)], dim=1)
    return _attention_and_merge(q, kv_cache, kv_scale, row_lens, page_table, work, segments, qlen, kv_lora_rank,
                                softmax_scale, invariant_pages, fp8_products)


@single_segment_attention.register_fake
def _(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale, invariant_pages=0,
      fp8_products=False):
    # The same input checks as the two-stage op.
    _segmented_attention_fake(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale)
    return _merged_outputs(q, kv_lora_rank)


@torch.library.custom_op(f"{_NAMESPACE}::merged_attention", mutates_args=())
def merged_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    kv_scale: torch.Tensor | None,
    row_lens: torch.Tensor,
    page_table: torch.Tensor,
    work: torch.Tensor,
    segments: torch.Tensor,
    qlen: int,
    kv_lora_rank: int,
    softmax_scale: float,
    invariant_pages: int = 0,
    fp8_products: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stages 3 and 4 of any schedule in one op: (out [T, H, Dl] in q's dtype, lse f32 [T, H] natural log).

    What ``verify`` runs: ``merge_segments`` of ``segmented_attention``, or
    ``single_segment_attention`` where the schedule has one item per
    request (a static fact: ``work.shape == (B, 3)``), with the same bits.
    One node in a compiled graph instead of two: each custom op costs a
    dispatch and its outputs' checks per call there (docs/performance.md).
    """
    return _attention_and_merge(q, kv_cache, kv_scale, row_lens, page_table, work, segments, qlen, kv_lora_rank,
                                softmax_scale, invariant_pages, fp8_products)


@merged_attention.register_fake
def _(q, kv_cache, kv_scale, row_lens, page_table, work, segments, qlen, kv_lora_rank, softmax_scale,
      invariant_pages=0, fp8_products=False):
    _segmented_attention_fake(q, kv_cache, kv_scale, row_lens, page_table, work, qlen, kv_lora_rank, softmax_scale)
    _expect(segments.dtype == torch.int32 and list(segments.shape) == [page_table.shape[0], 3],
            f"mla_dcp::merged_attention: segments must be int32 [{page_table.shape[0]}, 3], "
            f"got {segments.dtype} {list(segments.shape)}")
    return _merged_outputs(q, kv_lora_rank)


@torch.library.custom_op(f"{_NAMESPACE}::merge_ranks", mutates_args=())
def merge_ranks(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 5: stacked per-rank partials -> (out [T, H, Dl], lse f32 [T, H] natural log)."""
    return pure.merge_ranks(outs, lses)


@merge_ranks.register_fake
def _(outs, lses):
    _expect(outs.dim() == 4 and lses.shape == outs.shape[:3],
            f"mla_dcp::merge_ranks: expected outs [W, T, H, Dl] and lses [W, T, H], "
            f"got {list(outs.shape)}, {list(lses.shape)}")
    return outs.new_empty(outs.shape[1:]), lses.new_empty(lses.shape[1:], dtype=torch.float32)


@torch.library.custom_op(f"{_NAMESPACE}::ragged_map", mutates_args=())
def ragged_map(query_start_loc: torch.Tensor, qlen: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged blocks' maps, once a step: (token_of_row int32 [B*qlen], row_of_token int32 [T])
    (``pure.ragged_map``)."""
    return pure.ragged_map(query_start_loc, qlen, num_tokens)


@ragged_map.register_fake
def _(query_start_loc, qlen, num_tokens):
    _expect(query_start_loc.dim() == 1 and query_start_loc.shape[0] >= 1
            and query_start_loc.dtype in (torch.int32, torch.int64),
            f"mla_dcp::ragged_map: expected query_start_loc int32 or int64 [B + 1], got "
            f"{query_start_loc.dtype} {list(query_start_loc.shape)}")
    batch = query_start_loc.shape[0] - 1
    return (query_start_loc.new_empty(batch * qlen, dtype=torch.int32),
            query_start_loc.new_empty(num_tokens, dtype=torch.int32))


@torch.library.custom_op(f"{_NAMESPACE}::ragged_rows", mutates_args=())
def ragged_rows(q: torch.Tensor, token_of_row: torch.Tensor) -> torch.Tensor:
    """Ragged blocks: packed tokens [T, ...] as verify rows [B*qlen, ...] (``pure.ragged_rows``)."""
    return pure.ragged_rows(q, token_of_row)


@ragged_rows.register_fake
def _(q, token_of_row):
    _expect(token_of_row.dtype == torch.int32 and token_of_row.dim() == 1 and q.dim() >= 1,
            f"mla_dcp::ragged_rows: expected q [T, ...] and token_of_row int32 [B*qlen], got "
            f"{list(q.shape)}, {token_of_row.dtype} {list(token_of_row.shape)}")
    return q.new_empty(token_of_row.shape[0], *q.shape[1:])


@torch.library.custom_op(f"{_NAMESPACE}::ragged_tokens", mutates_args=())
def ragged_tokens(out: torch.Tensor, lse: torch.Tensor,
                  row_of_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged blocks: verify rows (out, lse [B*qlen, ...]) as the packed tokens (``pure.ragged_tokens``)."""
    return pure.ragged_tokens(out, lse, row_of_token)


@ragged_tokens.register_fake
def _(out, lse, row_of_token):
    _expect(row_of_token.dtype == torch.int32 and row_of_token.dim() == 1 and out.dim() >= 1
            and lse.dim() >= 1 and lse.shape[0] == out.shape[0],
            f"mla_dcp::ragged_tokens: expected out [R, ...], lse [R, ...] and row_of_token int32 [T], got "
            f"{list(out.shape)}, {list(lse.shape)}, {row_of_token.dtype} {list(row_of_token.shape)}")
    tokens = row_of_token.shape[0]
    return out.new_empty(tokens, *out.shape[1:]), lse.new_empty(tokens, *lse.shape[1:])


@torch.library.custom_op(f"{_NAMESPACE}::write_cache", mutates_args=("kv_cache",))
def write_cache(kv_cache: torch.Tensor, slots: torch.Tensor, latent: torch.Tensor,
                kv_scale: torch.Tensor | None) -> None:
    """New tokens into a rank's paged cache, in place (``pure.write_cache``; slot -1: skipped)."""
    pure.write_cache(kv_cache, slots, latent, kv_scale)


@write_cache.register_fake
def _(kv_cache, slots, latent, kv_scale):
    _expect(kv_cache.dim() == 3 and slots.dtype == torch.int64 and slots.dim() == 1 and latent.dim() == 2
            and latent.shape == (slots.shape[0], kv_cache.shape[2]),
            f"mla_dcp::write_cache: expected kv_cache [blocks, block_size, D], slots int64 [N] and latent [N, D], "
            f"got {list(kv_cache.shape)}, {slots.dtype} {list(slots.shape)}, {list(latent.shape)}")
    return None


@torch.library.custom_op(f"{_NAMESPACE}::block_attention", mutates_args=())
def block_attention(q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, out: torch.Tensor,
                    lse: torch.Tensor, block_table: torch.Tensor, mask: torch.Tensor, seq_lens: torch.Tensor,
                    qlen: int, world: int, rank: int, interleave: int, max_model_len: int, kv_lora_rank: int,
                    softmax_scale: float, invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked blocks: each row over its block keys on this rank, merged into its context partial
    ``(out, lse)`` (``pure.block_attention``, the keys' slots by ``pure.cache_slots``)."""
    slots = pure.cache_slots(seq_lens, block_table, qlen, world, rank, interleave, kv_cache.shape[1], max_model_len)
    return pure.block_attention(q, kv_cache, out, lse, slots, mask, seq_lens, qlen=qlen, kv_lora_rank=kv_lora_rank,
                                softmax_scale=softmax_scale, max_model_len=max_model_len, kv_scale=kv_scale,
                                invariant=invariant)


@block_attention.register_fake
def _(q, kv_cache, kv_scale, out, lse, block_table, mask, seq_lens, qlen, world, rank, interleave, max_model_len,
      kv_lora_rank, softmax_scale, invariant=False):
    batch = seq_lens.shape[0]
    _expect(q.dim() == 3 and out.shape == (q.shape[0], q.shape[1], kv_lora_rank) and lse.shape == q.shape[:2]
            and mask.shape == (batch, qlen, qlen) and q.shape[0] == batch * qlen,
            f"mla_dcp::block_attention: expected q [B*qlen, H, D], out [B*qlen, H, {kv_lora_rank}], lse [B*qlen, H] "
            f"and mask [B, qlen, qlen] with B={batch}, qlen={qlen}, got {list(q.shape)}, {list(out.shape)}, "
            f"{list(lse.shape)}, {list(mask.shape)}")
    return out.new_empty(out.shape), lse.new_empty(lse.shape, dtype=torch.float32)


@torch.library.custom_op(f"{_NAMESPACE}::sparse_attention", mutates_args=())
def sparse_attention(q: torch.Tensor, kv_cache: torch.Tensor, kv_scale: torch.Tensor | None, row_lens: torch.Tensor,
                     page_table: torch.Tensor, indices: torch.Tensor, qlen: int, world: int, rank: int,
                     interleave: int, kv_lora_rank: int, softmax_scale: float,
                     invariant: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-sparse rows: each row over the positions its indices list that this rank holds
    (``pure.sparse_attention``) -> (out [B*qlen, H, Dl], lse f32 [B*qlen, H] natural log)."""
    return pure.sparse_attention(q, kv_cache, row_lens, page_table, indices, qlen=qlen, world=world, rank=rank,
                                 interleave=interleave, kv_lora_rank=kv_lora_rank, softmax_scale=softmax_scale,
                                 kv_scale=kv_scale, invariant=invariant)


@sparse_attention.register_fake
def _(q, kv_cache, kv_scale, row_lens, page_table, indices, qlen, world, rank, interleave, kv_lora_rank,
      softmax_scale, invariant=False):
    _expect(q.dim() == 3 and indices.dim() == 2 and indices.shape[0] == q.shape[0] and row_lens.shape == q.shape[:1],
            f"mla_dcp::sparse_attention: expected q [R, H, D], indices [R, topk] and row_lens [R], got "
            f"{list(q.shape)}, {list(indices.shape)}, {list(row_lens.shape)}")
    return q.new_empty(q.shape[0], q.shape[1], kv_lora_rank), q.new_empty(q.shape[:2], dtype=torch.float32)


def _inference_only(ctx, *grads):
    raise RuntimeError(
        "mla_dcp is inference-only: its ops have no backward (verification needs no gradient). "
        "Run it under torch.inference_mode() or torch.no_grad(), or detach the inputs.")


# Without a formula torch's own error would say "no autograd formula"; this
# one says why there is none.
for _op in (segmented_attention, merge_segments, single_segment_attention, merged_attention, merge_ranks, ragged_map,
            ragged_rows, ragged_tokens, block_attention, sparse_attention):
    _op.register_autograd(_inference_only, setup_context=lambda ctx, inputs, output: None)


# Launchers by op name, filled where Triton is installed (see below).
_LAUNCHERS: dict[str, Callable] = {}
_CUDA_LIBRARY = torch.library.Library(_NAMESPACE, "FRAGMENT")


def plain_eager_cuda(tensor: torch.Tensor) -> bool:
    """Whether a call may go straight to its launcher: an eager call on a
    plain CUDA tensor, with no dispatch or function mode, profiler or
    autograd that would expect to see the op (they still do otherwise)."""
    return (type(tensor) is torch.Tensor and tensor.is_cuda
            and not torch._C._len_torch_dispatch_stack()
            and not torch._C._is_torch_function_mode_enabled()
            and not torch.autograd._profiler_enabled()
            and not (tensor.requires_grad and torch.is_grad_enabled()))


def launchers_may_serve() -> bool:
    """Whether eager calls may go to the Triton launchers at all (not compiling, Triton present):
    with :func:`plain_eager_cuda` of a call's tensor, what the API's Python plans need; alone, what
    a native plan's call needs checked before it, as it checks the rest itself (each tensor's
    exact type, device and requires_grad; dispatch and function modes, the profiler)."""
    return not torch.compiler.is_compiling() and bool(_LAUNCHERS)


def _op_or_launcher(op, name: str):
    def call(*args):
        # The dispatcher costs 40-75 us of host time per op on the H200's
        # host (benchmarks/probes/host_overhead.py): most of a small eager step.
        # Traced calls always take the op, so compiled graphs keep one node
        # per stage.
        if not torch.compiler.is_compiling():
            launcher = _LAUNCHERS.get(name)
            if launcher is not None and plain_eager_cuda(args[0]):
                return launcher(*args)
        return op(*args)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``mla_dcp::{name}``; in plain eager CUDA calls, its Triton launcher without the dispatcher."
    return call


def _register_triton_kernels() -> None:
    """Register the Triton launchers as the CUDA (and ROCm) kernels.

    The launchers import Triton on first use, so importing mla_dcp stays
    cheap and works where Triton is absent (the pure kernels then serve
    every device).
    """
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        return

    def launchers():
        from mla_dcp.ops import launchers as module
        return module

    def first_call(name):
        # Bound to the launcher itself on first use (Triton is imported then).
        def call(*args):
            launcher = _LAUNCHERS[name] = getattr(launchers(), name)
            return launcher(*args)
        return call

    # Registered with the low-level API on the CUDA key (ROCm's too), not with
    # CustomOpDef.register_kernel: its wrapper checks outputs for aliasing on
    # every call, ~6 us of host time per op in a compiled graph (H200 host), and
    # every launcher returns fresh tensors. The schema, fake and autograd
    # kernels stay custom_op's.
    for name in __all__[:-1]:
        if name == "step_metadata_auto":
            continue     # no launcher of its own: it chooses the schedule's shape, then calls step_metadata's
        _LAUNCHERS[name] = first_call(name)
        _CUDA_LIBRARY.impl(name, (lambda name: lambda *args: _LAUNCHERS[name](*args))(name), "CUDA")
    _CUDA_LIBRARY.impl("step_metadata_auto", _step_metadata_auto_cuda, "CUDA")


_register_triton_kernels()

# What the public API calls: the ops above, minus the dispatcher in eager CUDA calls.
stage = types.SimpleNamespace(**{name: _op_or_launcher(globals()[name], name) for name in __all__[:-1]})
