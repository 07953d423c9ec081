"""Launch configuration: tile shapes and the static segment count.

Pure Python on static facts (shapes, the device's multiprocessor count):
importable without Triton, and never reads a tensor value.
"""

from __future__ import annotations

import dataclasses

import torch

from mla_dcp._shapes import cdiv

# Program ids of the attention grid past this many segments buy nothing:
# each segment already has a whole wave of work at the batch sizes that need it.
MAX_GPU_SEGMENTS = 64


@dataclasses.dataclass(frozen=True)
class AttentionTile:
    block_m: int     # (head, verify row) pairs per program
    block_n: int     # tokens per KV tile
    num_warps: int
    num_stages: int


def attention_tile(m_size: int, kv_lora_rank: int, q_dtype: torch.dtype, device: torch.device) -> AttentionTile:
    """Tile of the segmented-attention kernel.

    64-row tiles with 64-token KV tiles and 8 warps for 16-bit queries: a
    128-row tile with a 512-wide float32 accumulator overflows the H200's
    227 KiB of shared memory. Float32 queries double every operand, so they
    take half the tile. Small problems (and the CPU interpreter) take the
    smallest tile that ``tl.dot`` accepts.
    """
    widest = 32 if q_dtype == torch.float32 else 64
    block_m = 16
    while block_m < widest and block_m < m_size:
        block_m *= 2
    if device.type != "cuda":
        return AttentionTile(block_m=block_m, block_n=16, num_warps=4, num_stages=1)
    wide = kv_lora_rank > 256
    return AttentionTile(block_m=block_m, block_n=widest, num_warps=8 if wide else 4, num_stages=2)


_MULTIPROCESSORS: dict[int, int] = {}


def _multiprocessors(device_index: int) -> int:
    # A plain dict, not lru_cache: Dynamo traces through it without a warning.
    if device_index not in _MULTIPROCESSORS:
        _MULTIPROCESSORS[device_index] = torch.cuda.get_device_properties(device_index).multi_processor_count
    return _MULTIPROCESSORS[device_index]


def gpu_num_segments(max_pages: int, batch: int, m_size: int, kv_lora_rank: int, q_dtype: torch.dtype,
                     device: torch.device) -> int:
    """Enough segments that the grid fills every multiprocessor about twice,
    and no more: each extra segment costs a partial write and read in the merge."""
    tile = attention_tile(m_size, kv_lora_rank, q_dtype, device)
    programs_per_segment = max(1, batch * cdiv(m_size, tile.block_m))
    index = device.index if device.index is not None else torch.cuda.current_device()
    wanted = cdiv(2 * _multiprocessors(index), programs_per_segment)
    return max(1, min(wanted, max_pages, MAX_GPU_SEGMENTS))
