"""Launch configuration: tile shapes and the static segment count.

Pure Python on static facts (shapes, the device's multiprocessor count):
importable without Triton, and never reads a tensor value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib

import torch

from mla_dcp._shapes import cdiv

# Program ids of the attention grid past this many segments buy nothing:
# each segment already has a whole wave of work at the batch sizes that need it.
MAX_GPU_SEGMENTS = 64
# A segment shorter than this (in static tokens) writes partials about as
# large as the keys it read: latency-bound steps (one short request) lose more
# in the merge than they gain in parallelism.
MIN_SEGMENT_TOKENS = 256

# Offline-tuned plans (`python -m mla_dcp.bench --sweep`), keyed by GPU name
# and shape class. Read once at import; nothing tunes at run time, so a CUDA
# graph capture never triggers a benchmark.
_TUNED_PATH = pathlib.Path(__file__).with_name("tuned_plans.json")
_TUNED: dict[str, dict[str, dict[str, int]]] = (
    json.loads(_TUNED_PATH.read_text()) if _TUNED_PATH.exists() else {})
_FORCED: list[AttentionPlan] = []


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    block_m: int     # (head, verify row) pairs per program
    block_n: int     # tokens per KV tile
    num_warps: int
    num_stages: int
    waves: int = 2   # segments fill the GPU with about this many programs per multiprocessor


def shape_class(m_size: int, kv_lora_rank: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, page: int) -> str:
    """Key of the tuned table: what changes the best tile."""
    block_m = _block_m(m_size, q_dtype)
    return f"q{q_dtype.itemsize}-kv{kv_dtype.itemsize}-m{block_m}-dl{kv_lora_rank}-p{min(page, 64)}"


def _block_m(m_size: int, q_dtype: torch.dtype) -> int:
    widest = 32 if q_dtype == torch.float32 else 64
    block_m = 16
    while block_m < widest and block_m < m_size:
        block_m *= 2
    return block_m


def attention_plan(m_size: int, kv_lora_rank: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, page: int,
                   device: torch.device) -> AttentionPlan:
    """Tile and segment fill of the segmented-attention kernel.

    The tuned table first. Otherwise 64-row tiles with 64-token KV tiles and
    8 warps for 16-bit queries: a 128-row tile with a 512-wide float32
    accumulator overflows the H200's 227 KiB of shared memory. Float32
    queries double every operand, so they take half the tile. Small problems
    (and the CPU interpreter) take the smallest tile ``tl.dot`` accepts.
    """
    if _FORCED:
        return _FORCED[-1]
    block_m = _block_m(m_size, q_dtype)
    if device.type != "cuda":
        return AttentionPlan(block_m=block_m, block_n=16, num_warps=4, num_stages=1)
    tuned = _TUNED.get(_device_name(device), {}).get(shape_class(m_size, kv_lora_rank, q_dtype, kv_dtype, page))
    if tuned is not None:
        return AttentionPlan(**tuned)
    wide = kv_lora_rank > 256
    return AttentionPlan(block_m=block_m, block_n=32 if q_dtype == torch.float32 else 64,
                         num_warps=8 if wide else 4, num_stages=2)


@contextlib.contextmanager
def forced_plan(plan: AttentionPlan):
    """Use ``plan`` for every launch inside the block (the benchmark's sweep)."""
    _FORCED.append(plan)
    try:
        yield
    finally:
        _FORCED.pop()


_DEVICE_FACTS: dict[int, tuple[str, int]] = {}


def _device_facts(device: torch.device) -> tuple[str, int]:
    # A plain dict, not lru_cache: Dynamo traces through it without a warning.
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _DEVICE_FACTS:
        props = torch.cuda.get_device_properties(index)
        _DEVICE_FACTS[index] = (props.name, props.multi_processor_count)
    return _DEVICE_FACTS[index]


def _device_name(device: torch.device) -> str:
    return _device_facts(device)[0]


def gpu_num_segments(max_pages: int, batch: int, m_size: int, kv_lora_rank: int, q_dtype: torch.dtype,
                     kv_dtype: torch.dtype, page: int, device: torch.device) -> int:
    """Enough segments that the grid fills every multiprocessor ``waves``
    times, and no more: each extra segment costs a partial write and read in
    the merge."""
    plan = attention_plan(m_size, kv_lora_rank, q_dtype, kv_dtype, page, device)
    programs_per_segment = max(1, batch * cdiv(m_size, plan.block_m))
    wanted = cdiv(plan.waves * _device_facts(device)[1], programs_per_segment)
    longest_useful = max(1, max_pages * page // MIN_SEGMENT_TOKENS)
    return max(1, min(wanted, longest_useful, MAX_GPU_SEGMENTS))
