"""The plain-torch oracle: every stage of DESIGN.md, readable and device-agnostic.

Used by the tests as ground truth and as the CPU implementation of the
`mla_dcp::` custom ops. Nothing here imports Triton.
"""

from mla_dcp._fp8_ds_mla import decode as decode_fp8_ds_mla
from mla_dcp._fp8_ds_mla import encode as encode_fp8_ds_mla
from mla_dcp.pure.attention import (
    LN2,
    LOG2E,
    build_schedule,
    default_num_segments,
    e4m3_row_factor,
    fp8_product_weights,
    merge_ranks,
    merge_segments,
    merge_stacked_segments,
    segmented_attention,
    to_e4m3,
)
from mla_dcp.pure.cache import cache_slots, to_cache_dtype, write_cache
from mla_dcp.pure.paging import expand_page_table, page_size_for
from mla_dcp.pure.pipeline import verify
from mla_dcp.pure.placement import local_len, local_lens, local_position, owner_rank, verify_row_lens
from mla_dcp.pure.ragged import RAGGED_NO_REQUEST, RAGGED_NO_ROW, ragged_map, ragged_rows, ragged_tokens
from mla_dcp.pure.reference import reference_attention
from mla_dcp.pure.sparse import sparse_attention
from mla_dcp.pure.tree import TREE_CONTEXT, TREE_ROOT, block_attention, tree_mask

__all__ = [
    "LN2",
    "LOG2E",
    "RAGGED_NO_REQUEST",
    "RAGGED_NO_ROW",
    "TREE_CONTEXT",
    "TREE_ROOT",
    "block_attention",
    "build_schedule",
    "cache_slots",
    "decode_fp8_ds_mla",
    "default_num_segments",
    "e4m3_row_factor",
    "encode_fp8_ds_mla",
    "expand_page_table",
    "fp8_product_weights",
    "local_len",
    "local_lens",
    "local_position",
    "merge_ranks",
    "merge_segments",
    "merge_stacked_segments",
    "owner_rank",
    "page_size_for",
    "ragged_map",
    "ragged_rows",
    "ragged_tokens",
    "reference_attention",
    "segmented_attention",
    "sparse_attention",
    "to_cache_dtype",
    "to_e4m3",
    "tree_mask",
    "verify",
    "verify_row_lens",
    "write_cache",
]
