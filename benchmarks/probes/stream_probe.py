"""How fast can C4's KV stream go on P programs with S tiles in flight each?

    python benchmarks/probes/stream_probe.py OUT_DIR [P:S,P:S,...]

C4's narrow kernel runs 128 programs (64 requests x 2 segments), one per
multiprocessor, 32 tiles each, with two 72 KiB tiles in flight. The open
levers for it are a work list that spreads
the batch's 4096 tiles over all 132 multiprocessors, and more bytes in flight
per program. Both only pay if the stream itself speeds up, so this times the
stream alone: a Gluon kernel whose program ``p`` of ``P`` copies global tiles
``[p * T // P, (p + 1) * T // P)`` of the batch (request ``g // 64``, page
``g % 64`` through the case's page table, exactly the narrow kernel's three
TMA boxes per tile) with ``S`` tiles in flight and no math, no q and no
output. ``P:S:D`` also holds each tile ``D`` ns (a busy wait on the global
timer) between its landing and its buffer's refill, as the narrow kernel's
math does (~1 us per tile: loads only it is 4% faster, the recorded notes), so
``128:2:1000`` stands for the committed kernel's stream and ``132:2:1000`` for
the same stream spread over every multiprocessor. The committed attention
kernel (partials, no merge) is timed beside it, and the copy ceiling with it;
so are the step's two other kernels alone (the row lengths, the segment
merge), the budget a merge fused into the attention kernel would work with.

Each variant is captured in a CUDA graph per rotating input and timed twice:
with the benchmark's ``do_bench`` (which zeroes 256 MiB before every replay,
so the stream also writes back L2's dirty lines) and after a flush that
reads 256 MiB instead (clean L2; benchmarks/probes/graph_overhead.py's ``flush_read``).
Writes OUT_DIR/stream_probe.json and prints one line per variant.
"""
import json
import pathlib
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

import graph_overhead
import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import library as ops
from mla_dcp.ops.gluon_kernels import helpers

DEFAULT_VARIANTS = "64:2,128:2,132:2,128:3,132:3,256:1,264:1,396:1,64:2:1000,128:2:1000,132:2:1000,128:3:1000"


@gluon.jit
def stream_kernel(kv_half_desc, kv_rope_desc, page_table_ptr, stride_page_b, tiles_per_request, total_tiles,
                  hold_ns, STAGES: gl.constexpr, BLOCK_N: gl.constexpr):
    HALF: gl.constexpr = kv_half_desc.block_type.shape[1]
    DR: gl.constexpr = kv_rope_desc.block_type.shape[1]
    kv_lo = gl.allocate_shared_memory(kv_half_desc.dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_hi = gl.allocate_shared_memory(kv_half_desc.dtype, [STAGES, BLOCK_N, HALF], kv_half_desc.layout)
    kv_rope = gl.allocate_shared_memory(kv_rope_desc.dtype, [STAGES, BLOCK_N, DR], kv_rope_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    program = gl.program_id(0)
    programs = gl.num_programs(0)
    first = (program * total_tiles) // programs
    count = ((program + 1) * total_tiles) // programs - first
    for s in gl.static_range(STAGES):
        _copy_tile(kv_half_desc, kv_rope_desc, page_table_ptr, stride_page_b, tiles_per_request, first + s,
                   bars.index(s), kv_lo.index(s), kv_hi.index(s), kv_rope.index(s), s < count, BLOCK_N)
    for t in range(count):
        stage = t % STAGES
        mbarrier.wait(bars.index(stage), (t // STAGES) & 1)
        if hold_ns > 0:
            landed = _global_ns()
            while _global_ns() - landed < hold_ns:
                pass
        # Every warp has seen the tile land before the buffer is refilled.
        helpers.warps_barrier()
        _copy_tile(kv_half_desc, kv_rope_desc, page_table_ptr, stride_page_b, tiles_per_request, first + t + STAGES,
                   bars.index(stage), kv_lo.index(stage), kv_hi.index(stage), kv_rope.index(stage),
                   t + STAGES < count, BLOCK_N)


@gluon.jit
def _global_ns():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)


@gluon.jit
def _copy_tile(kv_half_desc, kv_rope_desc, page_table_ptr, stride_page_b, tiles_per_request, tile, bar, lo, hi, rope,
               pred, BLOCK_N: gl.constexpr):
    """Global tile ``tile`` (one 64-token page) into one stage: its two latent halves and its rope part."""
    HALF: gl.constexpr = kv_half_desc.block_type.shape[1]
    request = tile // tiles_per_request
    page_id = gl.load(page_table_ptr + request * stride_page_b + tile % tiles_per_request, mask=pred, other=0)
    slot = page_id * BLOCK_N
    mbarrier.expect(bar, 2 * kv_half_desc.block_type.nbytes + kv_rope_desc.block_type.nbytes, pred=pred)
    helpers.tma_load(kv_half_desc, [slot, 0], bar, lo, pred=pred)
    helpers.tma_load(kv_half_desc, [slot, HALF], bar, hi, pred=pred)
    helpers.tma_load(kv_rope_desc, [slot, 2 * HALF], bar, rope, pred=pred)


def stream_fn(kv, table, programs: int, stages: int, hold_ns: int):
    half_desc, rope_desc = helpers.descriptors(kv, bench.DL, kv.shape[1])
    tiles_per_request = table.shape[1]
    total = table.shape[0] * tiles_per_request

    def run():
        stream_kernel[(programs,)](half_desc, rope_desc, table, table.stride(0), tiles_per_request, total,
                                   hold_ns, STAGES=stages, BLOCK_N=helpers.BLOCK_N, num_warps=4)
    return run


def _variant(spec: str) -> tuple[int, int, int]:
    """``P:S`` or ``P:S:D`` -> (programs, stages, hold_ns)."""
    fields = spec.split(":")
    if len(fields) not in (2, 3) or not all(f.isdigit() for f in fields) or not 1 <= int(fields[1]) <= 3:
        raise SystemExit(f"variant must be P:S or P:S:D (programs, 1-3 stages, ns held per tile), got {spec!r}")
    programs, stages, hold_ns = (int(f) for f in fields + ["0"] * (3 - len(fields)))
    return programs, stages, hold_ns


def main(argv):
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    out = pathlib.Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    variants = [_variant(spec) for spec in (argv[1] if len(argv) > 1 else DEFAULT_VARIANTS).split(",")]
    read_flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    ceilings = bench.measure_ceilings()
    case = bench.make_case("C4", torch.bfloat16)
    assert case.cfg.block_size == helpers.BLOCK_N, "one page per tile"
    result = {"ceilings": ceilings, "kv_bytes": case.kv_bytes, "variants": {}}
    print(f"ceilings: {ceilings}", flush=True)

    def timed(label, fns, programs=None):
        replay = bench._rotating(bench._graphed(fns))
        row = {"do_bench_us": bench.time_fn(replay) * 1e6,
               "flush_read_us": graph_overhead._timed(replay, lambda: torch.amax(read_flush, dim=0), None) * 1e6}
        for key in ("do_bench", "flush_read"):
            row[f"{key}_tb_s"] = case.kv_bytes / row[f"{key}_us"] / 1e6
        if programs:
            tiles = case.inputs[0][1].numel() / programs
            row["us_per_tile_flush_read"] = row["flush_read_us"] / tiles
        result["variants"][label] = row
        print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items()), flush=True)
        (out / "stream_probe.json").write_text(json.dumps(result, indent=1))

    timed("committed attention (partials)", bench.attention_fns(case))
    timed("row lengths alone", [lambda seq_lens=seq_lens: ops.row_lens(seq_lens, case.cfg.qlen, case.cfg.dcp_world_size,
                                                                       case.cfg.dcp_rank, case.cfg.interleave)
                                for seq_lens, *_ in case.inputs])
    partials = [fn() for fn in bench.attention_fns(case)]
    segments = [mla_dcp.build_view(case.cfg, s, t).segments for s, t, *_ in case.inputs]
    timed("segment merge alone", [lambda p=p, g=g: ops.merge_segments(*p, g, torch.bfloat16)
                                  for p, g in zip(partials, segments)])
    for programs, stages, hold_ns in variants:
        timed(f"stream P={programs} S={stages} hold={hold_ns} ns",
              [stream_fn(kv, table, programs, stages, hold_ns) for _, table, _, kv, _ in case.inputs], programs)
    timed("committed attention (partials), again", bench.attention_fns(case))


if __name__ == "__main__":
    main(sys.argv[1:])
