"""Launch configuration: tile shapes and the static segment count.

Pure Python on static facts (shapes, the device's multiprocessor count):
importable without Triton, and never reads a tensor value.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib

import torch

from mla_dcp._shapes import cdiv, schedule_shape_for

# Program ids of the attention grid past this many segments buy nothing:
# each segment already has a whole wave of work at the batch sizes that need it.
MAX_GPU_SEGMENTS = 64
# Bytes per second at which the merge moves partials: only the ratio to a
# program's time per token matters, so one H200-like constant serves.
_PARTIAL_BYTES_PER_S = 4.0e12

# The stream schedule (pure.build_schedule, programs > 0) on GPUs too, unless
# MLA_DCP_STREAM=0 (for configs whose VerifyConfig.stream is None): measured
# on the H200 it takes ragged steps 10-27% faster (R3, R6) and exactly uniform
# ones 5-7% slower (C4, R3u: the pieces' loop makes each KV tile 7% slower,
# docs/performance.md). Serving batches are ragged. The CPU path takes it
# unless the config says otherwise. Read once: a compiled graph must not
# guard on it.
STREAM_ON_GPU = os.environ.get("MLA_DCP_STREAM", "1") != "0"

# Tile widths (rows) of the narrow Gluon kernel (ops/gluon_kernels/narrow.py): its wgmma N.
NARROW_WIDTHS = (16, 32)

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
    # KV tiles in flight: the Triton kernels' pipeline depth, the narrow Gluon
    # kernel's stages (1 or 2); the seesaw always holds one pair of tiles.
    num_stages: int
    ctas_per_sm: int = 1      # programs resident per multiprocessor (shared memory bound)
    token_ns: float = 60.0    # one program's time per KV token, measured (see segment_choice)
    min_fill: int = 0         # at least this many programs per multiprocessor (memory-bound tiles)
    tma: bool = False         # descriptor (TMA) loads where the layout allows (Hopper and later)
    warp_specialize: bool = False   # Triton's producer/consumer warp groups (needs tma)
    # The Gluon kernel of ops/gluon_kernels/seesaw.py where it fits (Hopper, 16-bit cache):
    # KV tiles in pairs, so a segment's tokens round up to 2 * block_n.
    seesaw: bool = False
    # The Gluon kernel of ops/gluon_kernels/narrow.py for 16- and 32-row tiles (Hopper,
    # 16-bit or e4m3 cache): scores as K q^T, so the rows are wgmma's N.
    narrow: bool = False
    program_us: float = 0.0   # one program's fixed cost (q staging, pipeline fill, epilogue), measured


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


# Plans and segment choices of eager calls, by their arguments and the
# device's facts: the planning Python costs 10-20 us per call on the H200's
# host. Traced calls recompute instead, so no compiled graph guards on it.
_EAGER_MEMO: dict[tuple, object] = {}
# Entries kept per call's static facts (schedule shapes by batch, among them) are cleared past
# this many: configs or batches made afresh per call must not pile up.
EAGER_MEMO_LIMIT = 4096


def _memoised_in_eager(compute, device: torch.device, *args):
    if _FORCED or torch.compiler.is_compiling():
        return compute(*args)
    key = (compute, args, _device_facts(device) if device.type == "cuda" else None)
    if key not in _EAGER_MEMO:
        _EAGER_MEMO[key] = compute(*args)
    return _EAGER_MEMO[key]


def attention_plan(m_size: int, kv_lora_rank: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, page: int,
                   device: torch.device, batch: int | None = None) -> AttentionPlan:
    """Tile and segment fill of the segmented-attention kernel (see :func:`_attention_plan`)."""
    return _memoised_in_eager(_attention_plan, device, m_size, kv_lora_rank, q_dtype, kv_dtype, page, device, batch)


def _attention_plan(m_size: int, kv_lora_rank: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, page: int,
                    device: torch.device, batch: int | None) -> AttentionPlan:
    """Tile and segment fill of the segmented-attention kernel.

    The tuned table first. Otherwise 64-row tiles with 64-token KV tiles and
    8 warps for 16-bit queries: a 128-row tile with a 512-wide float32
    accumulator overflows the H200's 227 KiB of shared memory. Float32
    queries double every operand, so they take half the tile. Small problems
    (and the CPU interpreter) take the smallest tile ``tl.dot`` accepts.

    With ``batch`` given, a latency-bound step (fewer programs than
    multiprocessors even at the most segments) takes tiles of half the rows
    of a memory-bound (32-row) plan: twice the programs in flight. Measured
    on the H200, C7 (B=1, 32 rows, 64 segments): 20.2 -> 19.1 us per step.
    e4m3 caches at 32 rows take the device's tuned 64-row seesaw plan where
    there is one and the step fills the GPU.
    """
    if _FORCED:
        return _FORCED[-1]
    block_m = _block_m(m_size, q_dtype)
    if device.type != "cuda":
        return AttentionPlan(block_m=block_m, block_n=16, num_warps=4, num_stages=1)
    tuned = _tuned(m_size, kv_lora_rank, q_dtype, kv_dtype, page, device)
    if tuned is not None:
        plan = AttentionPlan(**tuned)
        if plan.block_m == 32 and _too_few_programs(plan, batch, m_size, device):
            # The narrow Gluon kernel's shared memory is mostly its KV stages:
            # half the rows do not fit a second program per multiprocessor.
            # With one program per multiprocessor (fewer programs than
            # multiprocessors), it keeps two tiles in flight even where the
            # plan's single stage counts on a second resident program.
            plan = dataclasses.replace(plan, block_m=16, num_stages=2 if plan.narrow else min(plan.num_stages, 2),
                                       tma=False,
                                       ctas_per_sm=plan.ctas_per_sm if plan.narrow else 2 * plan.ctas_per_sm)
        return plan
    if kv_dtype == torch.float8_e4m3fn and q_dtype.itemsize == 2 and block_m == 32:
        seesaw = _tuned(64, kv_lora_rank, q_dtype, kv_dtype, page, device)
        # e4m3 caches at 32 pairs: where the device's tuned 64-row plan is the
        # seesaw, it serves them too, half its rows idle, unless too few
        # programs would fill the GPU (one a request and segment). Measured on
        # the H200, graphed step: C4f8 270 us on the Triton kernel, 153 on the
        # narrow one, 110 on the seesaw (C4 in bf16: 104); R6 554, 316, 256;
        # with fp8 products (the seesaw's e4m3 build against the Triton
        # kernel's) C4f8 217 -> 112, R6 451 -> 246. C7f8 (one request): narrow
        # 22.3, seesaw 31.0.
        if seesaw is not None and seesaw.get("seesaw"):
            plan = AttentionPlan(**seesaw)
            if not _too_few_programs(plan, batch, m_size, device):
                return plan
    wide = kv_lora_rank > 256
    # Descriptor loads for 64-row tiles: on the H200 they beat pointer loads
    # for bf16 (5%) and fp8 (15% at 2 stages) caches, and lost with 32-row
    # tiles (spills). The launcher falls back to pointers where TMA is absent,
    # and serves the Gluon kernel where it fits (1.5x the descriptor kernel on
    # the H200, the same chip as the H100). Narrower tiles take the
    # transposed Gluon kernel there, over 16-bit caches (C4 on the H200: 1.56x
    # the m32 Triton kernel) and e4m3 ones (C4f8 1.77x, C7f8 1.08x, R6 1.75x;
    # at C2's 64-row shape the seesaw's in-place conversion beat it 1.7x).
    return AttentionPlan(block_m=block_m, block_n=32 if q_dtype == torch.float32 else 64,
                         num_warps=8 if wide else 4, num_stages=2, token_ns=60.0 if block_m == 64 else 150.0,
                         tma=block_m == 64, seesaw=block_m == 64,
                         narrow=block_m in NARROW_WIDTHS and q_dtype.itemsize == 2)


def _tuned(m_size: int, kv_lora_rank: int, q_dtype: torch.dtype, kv_dtype: torch.dtype, page: int,
           device: torch.device) -> dict | None:
    """The device's tuned plan of the shape class, if its table has one."""
    return _TUNED.get(_device_name(device), {}).get(shape_class(m_size, kv_lora_rank, q_dtype, kv_dtype, page))


def _too_few_programs(plan: AttentionPlan, batch: int | None, m_size: int, device: torch.device) -> bool:
    """Whether a step of ``batch`` requests (None: unknown) has fewer programs
    under ``plan`` than the device has multiprocessors, even at the most
    segments: a latency-bound step."""
    return batch is not None and batch * cdiv(m_size, plan.block_m) * MAX_GPU_SEGMENTS < _device_facts(device)[1]


def for_stream(plan: AttentionPlan, m_size: int, q_dtype: torch.dtype) -> AttentionPlan:
    """``plan`` for a stream schedule (a view built for other dtypes than the
    launch's), which the seesaw cannot run: a step of 32 pairs or fewer,
    whose 64 seesaw rows would be half idle, takes the narrow kernel at its
    own width (it runs a program's pieces); wider steps keep the plan's tile
    for the Triton kernels."""
    block_m = _block_m(m_size, q_dtype)
    if plan.seesaw and block_m in NARROW_WIDTHS:
        return dataclasses.replace(plan, block_m=block_m, seesaw=False, narrow=True, tma=False, num_stages=2)
    return plan


@contextlib.contextmanager
def forced_plan(plan: AttentionPlan):
    """Use ``plan`` for every launch inside the block (the benchmark's sweep)."""
    _FORCED.append(plan)
    try:
        yield
    finally:
        _FORCED.pop()


_DEVICE_FACTS: dict[int, tuple[str, int]] = {}


def _query_device(index: int) -> tuple[str, int]:
    props = torch.cuda.get_device_properties(index)
    return props.name, props.multi_processor_count


@torch.compiler.assume_constant_result
def _device_facts_of(index: int) -> tuple[str, int]:
    # Dynamo must not trace this: it would guard on the cache's contents,
    # and the first compiled call, which fills the cache, would recompile at
    # the second.
    if index not in _DEVICE_FACTS:
        _DEVICE_FACTS[index] = _query_device(index)
    return _DEVICE_FACTS[index]


def _device_facts(device: torch.device) -> tuple[str, int]:
    """(name, multiprocessor count) of a CUDA device."""
    return _device_facts_of(device.index if device.index is not None else torch.cuda.current_device())


def _device_name(device: torch.device) -> str:
    return _device_facts(device)[0]


def segment_choice(max_pages: int, batch: int, m_size: int, kv_lora_rank: int, q_dtype: torch.dtype,
                   kv_dtype: torch.dtype, page: int, device: torch.device) -> tuple[int, float]:
    """See :func:`_segment_choice`."""
    return _memoised_in_eager(_segment_choice, device, max_pages, batch, m_size, kv_lora_rank, q_dtype, kv_dtype, page,
                              device)


def programs_per_segment(plan: AttentionPlan, batch: int, m_size: int) -> int:
    """The attention kernel's programs per segment: one per request and tile of ``plan.block_m`` of its
    ``m_size`` rows x heads."""
    return max(1, batch * cdiv(m_size, plan.block_m))


def kernel_seconds(plan: AttentionPlan, programs_per_segment: int, slots: int, max_pages: int, page: int,
                   segments: int) -> float:
    """The attention kernel's predicted time (s) at ``segments``, without the
    merge: its programs in rounds of ``slots``, each round one segment's
    tokens at the plan's ``token_ns`` plus its ``program_us``."""
    # The Gluon kernels' programs work on whole tiles (the seesaw on pairs).
    token_step = 2 * plan.block_n if plan.seesaw else plan.block_n if plan.narrow else 1
    rounds = cdiv(programs_per_segment * segments, slots)
    tokens = cdiv(cdiv(max_pages, segments) * page, token_step) * token_step
    return rounds * (tokens * plan.token_ns * 1e-9 + plan.program_us * 1e-6)


def _segment_choice(max_pages: int, batch: int, m_size: int, kv_lora_rank: int, q_dtype: torch.dtype,
                    kv_dtype: torch.dtype, page: int, device: torch.device) -> tuple[int, float]:
    """The segment count with the least predicted time for the static bound,
    and that predicted time of the attention kernel plus its partials (s).

    Programs run in rounds of ``multiprocessors * ctas_per_sm``; a round
    lasts one segment's tokens times the plan's measured ``token_ns``, plus
    a program's fixed cost ``program_us``. More
    segments shorten each program but add rounds when they overflow the last
    one, and every segment adds a partial output the merge writes and reads
    (``rows * heads * Dl`` floats, twice), except a single segment, which the
    kernel normalises itself (no partials, no merge). Fewest segments on ties.

    Memory-bound tiles (small ``block_m``) are not modelled well by rounds:
    there, more programs in flight hide memory latency (measured on C4: 9
    segments 134 us, 6 segments 161 us, 3 segments 165 us), so their plans
    set ``min_fill``, a floor of programs per multiprocessor.
    """
    plan = attention_plan(m_size, kv_lora_rank, q_dtype, kv_dtype, page, device, batch)
    programs = programs_per_segment(plan, batch, m_size)
    slots = _device_facts(device)[1] * plan.ctas_per_sm
    partial_s = batch * m_size * kv_lora_rank * 4 * 2 / _PARTIAL_BYTES_PER_S

    def predicted_s(segments: int) -> float:
        merged = segments * partial_s if segments > 1 else 0.0
        return kernel_seconds(plan, programs, slots, max_pages, page, segments) + merged

    # A plain loop: Dynamo traces this inside compiled steps, and torch 2.11's
    # Dynamo cannot trace min(..., key=...).
    most = max(1, min(max_pages, MAX_GPU_SEGMENTS))
    fewest = min(most, max(1, cdiv(plan.min_fill * _device_facts(device)[1], programs)))
    best, best_s = fewest, predicted_s(fewest)
    for segments in range(fewest + 1, most + 1):
        seconds = predicted_s(segments)
        if seconds < best_s:
            best, best_s = segments, seconds
    return best, best_s


def gpu_num_segments(max_pages: int, batch: int, m_size: int, kv_lora_rank: int, q_dtype: torch.dtype,
                     kv_dtype: torch.dtype, page: int, device: torch.device) -> int:
    """Static segment count of the GPU path: :func:`segment_choice`'s."""
    return segment_choice(max_pages, batch, m_size, kv_lora_rank, q_dtype, kv_dtype, page, device)[0]


def gpu_schedule_shape(stream: bool | None, max_pages: int, page: int, m_size: int, kv_lora_rank: int, batch: int,
                       device: torch.device, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> tuple[int, int]:
    """(num_items, programs) of a default-mode step on a GPU (``mla_dcp.schedule_shape``): the
    stream's ``B * segments`` programs over ``B * segments + B`` rows where the kernel runs several
    pieces a program (not the seesaw), else one piece a program (``programs == 0``). ``stream``:
    ``VerifyConfig.stream``."""
    segments = gpu_num_segments(max_pages, batch, m_size, kv_lora_rank, q_dtype, kv_dtype, page, device)
    streams = (stream is True or (stream is None and STREAM_ON_GPU)) and not attention_plan(
        m_size, kv_lora_rank, q_dtype, kv_dtype, page, device, batch).seesaw
    return schedule_shape_for(batch, segments, streams)
