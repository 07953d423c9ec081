"""`python -m mla_dcp.bench`: one DCP rank's whole verify step against the roofline.

For each configuration: the step as users call it (`build_view` + `verify`,
eager) and under a CUDA graph, the attention kernel alone, and two baselines
measured in the same run: the pure PyTorch path on the GPU, and the same
Triton kernel fed one row per verify token (how engines run verify on a
decode-only kernel: the block table repeated per row). The ceilings (a 2 GiB
device copy counting read + write bytes, an 8192^3 bf16 matmul) are measured
first; each time is reported against the floor
``max(bytes / copy_bw, flops / matmul_rate)``.

`--sweep` times tile variants of the attention kernel and writes the best
per shape class, with its measured time per token (the segment-count model's
input), as a tuned-plan table (`mla_dcp/ops/tuned_plans.json` format). `--plot-only RESULTS.json` redraws the roofline plot of a run.
`--repeat N` measures the ceilings and every configuration N times in turn
and reports the medians over the repeats (each repeat's values stay in the
JSON): single measurements drift by several percent on a shared host.
`--route tree` times token-tree steps (`build_view(..., block_mask=...)`: the
benchmark's tree, node ``i`` hanging from node ``i - 2``, the first two from
the context) and `--route sparse` token-sparse ones (`verify_sparse`, each row
listing ``--topk`` random positions of its window; the floor counts the
positions the rank holds), each with the same configurations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import statistics
import sys
import time

import torch

CONFIGS = {
    # name: (B, q, H, rank-local L, block, KV)
    "C1": (32, 3, 128, 8192, 64, "bf16"),
    "C2": (32, 3, 128, 8192, 64, "fp8"),
    "C3": (8, 4, 64, 32768, 64, "bf16"),
    "C4": (64, 2, 16, 4096, 64, "bf16"),
    "C5": (1, 3, 128, 131072, 64, "bf16"),
    "C6": (128, 3, 128, 2048, 16, "bf16"),
    "C7": (1, 2, 16, 4096, 64, "bf16"),
    # e4m3 variants of C3 and C5 (VerifyConfig.fp8_products is timed on every e4m3 config).
    "C3f8": (8, 4, 64, 32768, 64, "fp8"),
    "C5f8": (1, 3, 128, 131072, 64, "fp8"),
    # C4 and C7 over an e4m3 cache: 32 pairs a request (the seesaw's 64-row e4m3 plan where tuned, and
    # the narrow kernel for a step too small to fill the GPU with it).
    "C4f8": (64, 2, 16, 4096, 64, "fp8"),
    "C7f8": (1, 2, 16, 4096, 64, "fp8"),
}
# Ragged steps: name: (q, H, rank-local lengths, block, KV). Each has a
# uniform twin, name + "u": the same batch and total tokens, equal lengths.
_R2 = [9114, 4894, 17001, 13706, 3546, 16774, 2140, 4019, 2737, 2033, 18321, 6700, 1873, 18504, 18137, 27651, 2191,
       5075, 1729, 11863, 1432, 14475, 3384, 5299, 5267, 4875, 3984, 6151, 13604, 11104, 8161, 6354]
_R3 = [3998, 9809, 9016, 2236, 6161, 15106, 9994, 7866, 10351, 9616, 1173, 10022, 315, 14990, 13821, 7787, 4349, 9124,
       3939, 3241, 11849, 7804, 8963, 13804, 9105, 7904, 6606, 10570, 14206, 2567, 3899, 10501, 2584, 14322, 15268,
       8671, 6488, 12244, 348, 11100, 12834, 1149, 2711, 12522, 15787, 9784, 801, 5035, 12880, 608, 13593, 14280, 4514,
       7845, 9844, 11877, 15175, 14498, 6450, 11800, 13012, 15191, 7094, 6571]
RAGGED = {
    "R1": (4, 16, [4641, 45118, 1730, 1696], 64, "bf16"),    # ThunderMLA's spec-decode workload
    "R2": (3, 128, _R2, 64, "bf16"),                           # long-tailed
    "R3": (2, 16, _R3, 64, "bf16"),                            # uniform-random in [100, 16000]
    "R4": (4, 64, [131072] + [2000] * 7, 64, "bf16"),          # one long request among short ones
    "R5": (3, 128, _R2, 64, "fp8"),                            # R2 over an e4m3 cache
    "R6": (2, 16, _R3, 64, "fp8"),                             # R3 over an e4m3 cache
}
TARGETS = {"C1": 1.5, "C3": 1.5, "C5": 1.5, "C6": 1.5, "C4": 1.3}


def lengths_of(name: str) -> list[int]:
    """Rank-local lengths of a config's requests (a twin: R's total spread evenly)."""
    if name in CONFIGS:
        batch, _, _, local_len, _, _ = CONFIGS[name]
        return [local_len] * batch
    lengths = RAGGED[name.removesuffix("u")][2]
    if name.endswith("u"):
        total, batch = sum(lengths), len(lengths)
        return [total // batch + (1 if b < total % batch else 0) for b in range(batch)]
    return list(lengths)


def shape_of(name: str) -> tuple:
    """(B, q, H, mean rank-local length, block, KV) of any config."""
    if name in CONFIGS:
        return CONFIGS[name]
    qlen, heads, lengths, block, kv_kind = RAGGED[name.removesuffix("u")]
    return (len(lengths), qlen, heads, sum(lengths) // len(lengths), block, kv_kind)


ALL_CONFIGS = [*CONFIGS, *(n for r in RAGGED for n in (r, r + "u"))]
DL, DR, WORLD = 512, 64, 8
SCALE = 192 ** -0.5


ROUTES = ("causal", "tree", "sparse")
TOPK = 2048


@dataclasses.dataclass
class Case:
    name: str
    cfg: object
    inputs: list   # rotating copies of (seq_lens, block_table, q, kv_cache, kv_scale)
    kv_bytes: int
    io_bytes: int
    flops: int
    route: str = "causal"
    # Per input copy: the tree's mask (route "tree") or the rows' listed positions (route "sparse").
    extras: list = dataclasses.field(default_factory=list)


def tree_parents(qlen: int) -> list[int]:
    """The benchmark's token tree: node ``i`` hangs from node ``i - 2``, the first two from the
    context (two branches of a tree drafter's block)."""
    return [-1 if i < 2 else i - 2 for i in range(qlen)]


def listed_positions(seq_lens: torch.Tensor, qlen: int, topk: int, world: int, interleave: int, rank: int,
                     seed: int = 0) -> tuple[torch.Tensor, int]:
    """int32 [B*qlen, topk] random distinct positions of each row's causal window (all of it when
    shorter, -1 after: an indexer's top-k), and how many of them rank ``rank`` holds."""
    from mla_dcp import pure

    g = torch.Generator().manual_seed(seed)
    lens = seq_lens.cpu().tolist()
    indices = torch.full((len(lens) * qlen, topk), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        for t in range(qlen):
            window = max(0, n - (qlen - 1 - t))
            chosen = torch.randperm(window, generator=g)[:topk] if window > topk else torch.arange(window)
            indices[b * qlen + t, :chosen.numel()] = chosen.to(torch.int32)
    held = (indices >= 0) & (pure.owner_rank(indices.clamp(min=0).long(), world, interleave) == rank)
    return indices, int(held.sum())


def sparse_work(name: str, held: int, q_itemsize: int = 2) -> tuple[int, int, int]:
    """(KV bytes, q + out bytes, flops) of one rank's sparse step: the ``held`` listed positions of
    its rows, each gathered once and multiplied by each row's heads."""
    _, _, heads, _, _, kv_kind = shape_of(name)
    _, io_bytes, _ = work(name, q_itemsize)
    kv_bytes = held * (DL + DR) * (1 if kv_kind == "fp8" else q_itemsize)
    return kv_bytes, io_bytes, 2 * heads * held * ((DL + DR) + DL)


def _progress(done: int, total: int, label: str) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<40}")
    sys.stderr.flush()
    if done == total:
        sys.stderr.write("\n")


def measure_ceilings() -> dict:
    import triton.testing

    n = 1 << 30  # 2 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return {"copy_bytes_per_s": 2 * n * 2 / (copy_ms * 1e-3), "bf16_flops_per_s": 2 * 8192 ** 3 / (mm_ms * 1e-3)}


def work(name: str, q_itemsize: int = 2) -> tuple[int, int, int]:
    """(KV bytes, q + out bytes, flops) of one rank's step: the performance issue's counts,
    from the real token count (a ragged step's floor is its own)."""
    batch, qlen, heads, _, _, kv_kind = shape_of(name)
    tokens = sum(lengths_of(name))
    kv_bytes = tokens * (DL + DR) * (1 if kv_kind == "fp8" else q_itemsize)
    io_bytes = batch * qlen * heads * ((DL + DR) + DL) * q_itemsize
    flops = 2 * qlen * heads * tokens * ((DL + DR) + DL)
    return kv_bytes, io_bytes, flops


def make_case(name: str, q_dtype: torch.dtype, batch_invariant: bool = False,
              invariant_segment_tokens: int | None = None, fp8_products: bool = False, route: str = "causal",
              topk: int = TOPK) -> Case:
    """One config's inputs; ``fp8_products`` applies to its e4m3 configs only (the mode needs one);
    ``route`` one of :data:`ROUTES` (``topk`` the sparse rows' listed positions)."""
    import mla_dcp

    batch, qlen, heads, _, block, kv_kind = shape_of(name)
    lengths = lengths_of(name)
    from mla_dcp.testing import platform_fp8

    kv_dtype = platform_fp8() if kv_kind == "fp8" else q_dtype
    # Rank 0 of W=8 with global length 8L holds exactly L tokens: one DCP rank's step.
    cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=block, max_model_len=WORLD * max(lengths),
                               dcp_world_size=WORLD, dcp_rank=0, kv_lora_rank=DL, rope_dim=DR, softmax_scale=SCALE,
                               batch_invariant=batch_invariant, invariant_segment_tokens=invariant_segment_tokens,
                               fp8_products=fp8_products and kv_kind == "fp8")
    kv_bytes, io_bytes, flops = work(name, q_dtype.itemsize)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 60 << 20)
    copies = max(1, min(32, math.ceil(4 * l2 / kv_bytes)))   # rotate through > L2 of inputs
    inputs = []
    needed = [-(-n // block) for n in lengths]
    blocks = sum(needed)
    for _ in range(copies):
        order = torch.randperm(blocks, device="cuda").to(torch.int32)
        table = torch.zeros(batch, cfg.min_table_blocks, dtype=torch.int32, device="cuda")
        start = 0
        for b, count in enumerate(needed):
            table[b, :count] = order[start:start + count]
            start += count
        seq_lens = torch.tensor([WORLD * n for n in lengths], dtype=torch.int32, device="cuda")
        q = torch.randn(batch * qlen, heads, DL + DR, device="cuda", dtype=q_dtype)
        kv = torch.randn(blocks, block, DL + DR, device="cuda", dtype=torch.float32)
        scale = None
        if kv_dtype != q_dtype:
            scale = torch.full((1,), 1 / 64, device="cuda")
            kv = (kv / scale).to(kv_dtype)
        else:
            kv = kv.to(kv_dtype)
        inputs.append((seq_lens, table, q, kv, scale))
    extras = []
    if route == "tree":
        mask = mla_dcp.tree_mask(tree_parents(qlen)).cuda()
        extras = [mask] * copies
    elif route == "sparse":
        for seed, (seq_lens, *_rest) in enumerate(inputs):
            listed, held = listed_positions(seq_lens, qlen, topk, WORLD, cfg.interleave, cfg.dcp_rank, seed)
            extras.append(listed.cuda())
            if seed == 0:     # the floor from the first copy's held keys (the copies differ by a few)
                kv_bytes, io_bytes, flops = sparse_work(name, held, q_dtype.itemsize)
    return Case(name, cfg, inputs, kv_bytes, io_bytes, flops, route, extras)


def _rotating(fns: list):
    state = {"i": 0}

    def call():
        fn = fns[state["i"] % len(fns)]
        state["i"] += 1
        return fn()
    return call


def _captured(run, warm_ups: list):
    """``run`` captured in a CUDA graph, after each of ``warm_ups`` ran twice
    (compilation, autotuning, allocator growth stay outside the capture);
    returns the graph's replayer."""
    for fn in warm_ups:
        fn()
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()

    # The replayer holds ``run`` (and through it the view and inputs the graph
    # reads, the warm-ups' too: a sequence's run closes over them): a graph
    # keeps no tensor alive, so a dropped closure would free its inputs for the
    # next allocation to overwrite before a replay reads them.
    def replay(graph=graph, inputs=run):
        graph.replay()
    return replay


def _graphed(fns: list) -> list:
    """Capture each closure once in its own CUDA graph; return replayers."""
    return [_captured(fn, [fn]) for fn in fns]


# Steps captured in one graph for the "graph x8" timing: an engine captures a
# whole forward (one verify step per layer), so it pays the graph's launch
# once, and dependent launch can overlap one step's tail with the next. Timed
# by do_bench, eight steps also share one L2 flush: do_bench zeroes 256 MiB,
# and a memory-bound step writes those dirty lines back inside its own timing
# (C4 on the H200: ~9 us of a one-step graph's 95), which an engine's step,
# after kernels that leave little dirty data, does not.
STEPS_PER_GRAPH = 8


def _sequence(fns: list, count: int):
    """One call runs ``count`` closures, cycling through ``fns`` in order."""
    def call():
        for i in range(count):
            fns[i % len(fns)]()
    return call


def _graphed_sequence(fns: list, count: int):
    """:func:`_sequence` captured in one CUDA graph; returns its replayer."""
    return _captured(_sequence(fns, count), fns)


def time_fn(fn, rep_ms: int = 100) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e-3


HOST_CALLS = 1000


def host_time(fn, calls: int = HOST_CALLS) -> float:
    """Host seconds per call: the wall time of ``calls`` back-to-back calls
    with no synchronisation between them, after a warm-up (the GPU's queue
    absorbs the work, so a step whose GPU time is below its host time is
    timed by its host)."""
    import time

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return elapsed / calls


def _route_view(case: Case, index: int):
    """Input copy ``index``'s build_view of the case's route (a MaskedView for a tree)."""
    import mla_dcp

    seq_lens, table, q, kv, _ = case.inputs[index]
    mask = case.extras[index] if case.route == "tree" else None
    return lambda: mla_dcp.build_view(case.cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype,
                                      block_mask=mask)


def _route_verify(case: Case, index: int, view):
    """Input copy ``index``'s verify of the case's route over ``view()``."""
    import mla_dcp

    _, _, q, kv, scale = case.inputs[index]
    if case.route == "sparse":
        listed = case.extras[index]
        return lambda: mla_dcp.verify_sparse(case.cfg, view(), q, kv, listed, scale)
    return lambda: mla_dcp.verify(case.cfg, view(), q, kv, scale)


def step_fns(case: Case) -> list:
    """The step as users call it: build_view + verify (verify_sparse for sparse rows)."""
    return [_route_verify(case, i, _route_view(case, i)) for i in range(len(case.inputs))]


def view_fns(case: Case) -> list:
    """The step's metadata alone: build_view (row lengths and schedule in one
    launch, and the page expansion where blocks are not pages)."""
    return [_route_view(case, i) for i in range(len(case.inputs))]


def attention_fns(case: Case) -> list:
    """The attention kernel verify launches: the segment partials, or with one
    segment the kernel that also normalises (verify then has no merge). For a
    tree or sparse rows: verify (verify_sparse) over a view built beforehand,
    every launch it makes."""
    import mla_dcp
    from mla_dcp.ops import library as ops

    if case.route != "causal":
        built = [_route_view(case, i)() for i in range(len(case.inputs))]
        return [_route_verify(case, i, lambda view=view: view) for i, view in enumerate(built)]
    cfg, fns = case.cfg, []
    for seq_lens, table, q, kv, scale in case.inputs:
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        if view.work.shape[0] == table.shape[0]:
            fns.append(lambda view=view, q=q, kv=kv, scale=scale: ops.single_segment_attention(
                q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, cfg.kv_lora_rank, cfg.scale,
                cfg.schedule_chunk, cfg.fp8_products))
        else:
            fns.append(lambda view=view, q=q, kv=kv, scale=scale: ops.segmented_attention(
                q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, cfg.kv_lora_rank, cfg.scale,
                cfg.schedule_chunk, cfg.fp8_products))
    return fns


def decode_style_fns(case: Case) -> list:
    """The same kernel, one row per verify token: qlen 1, block table repeated per row."""
    import mla_dcp
    from mla_dcp.ops import library as ops

    cfg, fns = case.cfg, []
    row_cfg = dataclasses.replace(cfg, qlen=1)
    for seq_lens, table, q, kv, scale in case.inputs:
        view = mla_dcp.build_view(cfg, seq_lens, table)
        pages = view.page_table.repeat_interleave(cfg.qlen, dim=0)
        ns = mla_dcp.num_segments_for(row_cfg, pages.shape[0], q.device, q.dtype, kv.dtype)
        work, segments = ops.schedule(view.row_lens, 1, cfg.page_size, cfg.max_pages, pages.shape[0] * ns)

        def run(view=view, pages=pages, q=q, kv=kv, scale=scale, work=work, segments=segments):
            seg = ops.segmented_attention(q, kv, scale, view.row_lens, pages, work, 1, DL, cfg.scale)
            return ops.merge_segments(*seg, segments, q.dtype)
        fns.append(run)
    return fns


def pure_fns(case: Case) -> list:
    from mla_dcp import pure

    cfg, fns = case.cfg, []
    for seq_lens, table, q, kv, scale in case.inputs[:1]:
        def run(seq_lens=seq_lens, table=table, q=q, kv=kv, scale=scale):
            return pure.verify(q, kv, seq_lens, table, qlen=cfg.qlen, world=WORLD, rank=0, interleave=1,
                               max_local_len=cfg.max_local_len, kv_lora_rank=DL, softmax_scale=cfg.scale,
                               kv_scale=scale)
        fns.append(run)
    return fns


def compiler_report() -> dict:
    from mla_dcp.ops import launchers

    kernel = launchers.last_attention_kernel
    if kernel is None:
        return {}
    ptx = kernel.asm.get("ptx", "")
    return {"registers": getattr(kernel, "n_regs", None), "spills": getattr(kernel, "n_spills", None),
            "shared_bytes": getattr(kernel.metadata, "shared", None), "wgmma_in_ptx": "wgmma" in ptx,
            "mma_sync_in_ptx": "mma.sync" in ptx}


# The timings of a row, each a median of do_bench; over repeats, their median.
TIMED = ("step_us", "host_us", "step_graph_us", "step_graph_seq_us", "attention_graph_us", "view_graph_us",
         "decode_style_graph_us", "pure_torch_us")


def _set_ratios(row: dict, ceilings: dict) -> dict:
    """The floor (the issue's max(bytes / copy rate, flops / matmul rate))
    and the ratios derived from the row's timings."""
    floor_s = max(row["bytes"] / ceilings["copy_bytes_per_s"], row["flops"] / ceilings["bf16_flops_per_s"])
    row["floor_us"] = floor_s * 1e6
    row["ratio"] = row["step_us"] / row["floor_us"]
    row["ratio_graph"] = row["step_graph_us"] / row["floor_us"]
    if "step_graph_seq_us" in row:
        row["ratio_graph_seq"] = row["step_graph_seq_us"] / row["floor_us"]
    row["non_attention_share"] = max(0.0, 1 - row["attention_graph_us"] / row["step_graph_us"])
    return row


def median_ceilings(ceilings: list[dict]) -> dict:
    """Each ceiling's median over the repeats."""
    return {key: statistics.median(c[key] for c in ceilings) for key in ceilings[0]}


def median_over_repeats(rows: list[dict], ceilings: dict) -> dict:
    """One config's row from its repeats: each timing the median over the
    repeats, every repeat's value kept under ``repeats``, the floor and
    ratios from the medians and ``ceilings`` (:func:`median_ceilings`).
    Timings drift by several percent within one process on a shared GPU host
    (measured on the H200), so one median is not enough for a
    target at its edge."""
    row = dict(rows[0])
    row["repeats"] = {key: [r[key] for r in rows] for key in TIMED if key in rows[0]}
    for key, values in row["repeats"].items():
        row[key] = statistics.median(values)
    return _set_ratios(row, ceilings)


def run_config(case: Case, ceilings: dict, baselines: bool) -> dict:
    steps = step_fns(case)
    row = {"config": case.name, "shape": dict(zip(("B", "q", "H", "L", "block", "kv"), shape_of(case.name))),
           "bytes": case.kv_bytes + case.io_bytes, "flops": case.flops}
    row["step_us"] = time_fn(_rotating(steps)) * 1e6
    row["host_us"] = host_time(_rotating(steps)) * 1e6
    row["step_graph_us"] = time_fn(_rotating(_graphed(steps))) * 1e6
    # Inputs larger than L2 (one copy for the large configs, rotated for small ones) keep every step's KV
    # stream from DRAM, as across layers.
    row["step_graph_seq_us"] = time_fn(_graphed_sequence(steps, STEPS_PER_GRAPH)) / STEPS_PER_GRAPH * 1e6
    attention = attention_fns(case)
    row["attention_graph_us"] = time_fn(_rotating(_graphed(attention))) * 1e6
    row["view_graph_us"] = time_fn(_rotating(_graphed(view_fns(case)))) * 1e6
    row["compiler"] = compiler_report()
    _set_ratios(row, ceilings)
    from mla_dcp.ops import tiles
    _, table, q, kv, _ = case.inputs[0]
    cfg = case.cfg
    row["segments"], predicted = tiles.segment_choice(cfg.max_pages, table.shape[0], cfg.qlen * cfg.num_heads, DL,
                                                      q.dtype, kv.dtype, cfg.page_size, q.device)
    row["predicted_attention_us"] = predicted * 1e6
    if baselines and case.route == "causal":
        row["decode_style_graph_us"] = time_fn(_rotating(_graphed(decode_style_fns(case)))) * 1e6
        row["pure_torch_us"] = time_fn(_rotating(pure_fns(case)), rep_ms=200) * 1e6
    target = TARGETS.get(case.name)
    row["target"] = target
    if cfg.batch_invariant:
        row["invariant_tokens"] = cfg.invariant_tokens     # the length in force (by heads where unset)
    return row


# (block_n, warps, stages, descriptor loads): the pointer grid, 128-token tiles
# (one stage fits beside q), and the descriptor kernel where pages allow it.
SWEEP_TILES = ([(bn, w, s, False) for bn in (32, 64) for w in (4, 8) for s in (1, 2, 3)]
               + [(128, 8, 1, False), (128, 8, 2, False)]
               + [(bn, 8, s, True) for bn, s in ((64, 2), (64, 3), (128, 1), (32, 3))])
SHARED_BYTES_PER_SM = 232448   # Hopper: 227 KiB usable per multiprocessor


def sweep(names: list[str], q_dtype: torch.dtype) -> dict:
    """Time tile variants of the attention kernel per shape class.

    For each tile: compile, read its shared memory (hence programs per
    multiprocessor), time it at the segment count the cost model picks, and
    derive the plan's ``token_ns`` (time per token per program) from the
    measurement. The best tile of a class's first config becomes its entry.
    """
    from mla_dcp._shapes import cdiv
    from mla_dcp.ops import tiles

    results, best = [], {}
    device_name = torch.cuda.get_device_name()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for index, name in enumerate(names):
        _progress(index, len(names), f"sweep {name}")
        case = make_case(name, q_dtype)
        seq_lens, table, q, kv, scale = case.inputs[0]
        cfg = case.cfg
        m_size = cfg.qlen * cfg.num_heads
        key = tiles.shape_class(m_size, DL, q.dtype, kv.dtype, cfg.page_size)
        block_m = tiles._block_m(m_size, q.dtype)
        timed = []
        for block_n, warps, stages, tma in (SWEEP_TILES if key not in best else []):
            if tma and cfg.page_size % block_n:
                continue   # tiles would straddle pages: the descriptor kernel does not apply
            plan = tiles.AttentionPlan(block_m, block_n, warps, stages, tma=tma)
            try:
                with tiles.forced_plan(plan):
                    attention_fns(case)[0]()          # compile, to read its shared memory
                    report = compiler_report()
                    ctas = max(1, SHARED_BYTES_PER_SM // max(1, report["shared_bytes"] or 1))
                plan = dataclasses.replace(plan, ctas_per_sm=ctas)
                with tiles.forced_plan(plan):
                    segments, _ = tiles.segment_choice(cfg.max_pages, table.shape[0], m_size, DL, q.dtype,
                                                       kv.dtype, cfg.page_size, q.device)
                    seconds = time_fn(_rotating(_graphed(attention_fns(case))), rep_ms=50)
                rounds = cdiv(table.shape[0] * cdiv(m_size, block_m) * segments, sms * ctas)
                tokens = cdiv(cfg.max_pages, segments) * cfg.page_size
                plan = dataclasses.replace(plan, token_ns=round(seconds * 1e9 / (rounds * tokens), 1))
            except Exception as failure:  # a tile that does not fit (shared memory) is skipped
                seconds, report = math.inf, {"error": str(failure).splitlines()[0][:200]}
            timed.append((seconds, plan))
            results.append({"config": name, "class": key, "plan": dataclasses.asdict(plan),
                            "us": seconds * 1e6, "compiler": report})
        if timed:
            best[key] = dataclasses.asdict(min(timed, key=lambda item: item[0])[1])
        del case
        torch.cuda.empty_cache()
    _progress(len(names), len(names), "sweep done")
    return {"device": device_name, "variants": results, "best": {device_name: best}}


def environment() -> dict:
    import triton

    from mla_dcp.ops import native

    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(),
            "torch": torch.__version__, "triton": triton.__version__,
            "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count,
            "native_plans": "built" if native.module(start=False) is not None
            else native.error() or ("off" if not native.enabled else "not built")}


def wait_for_native_plans() -> None:
    """Build (or load) the native plans before anything is timed: eager rows then time the path
    users get once it has built, never the build's thread beside them."""
    from mla_dcp.ops import native

    started = time.perf_counter()
    if native.enabled and native.wait() is None:
        print(f"native plans unavailable ({native.error()}): eager rows time the Python plans", file=sys.stderr)
    elif native.enabled:
        print(f"native plans ready in {time.perf_counter() - started:.1f} s")


def markdown(result: dict) -> str:
    env, ceil = result["environment"], result["ceilings"]
    lines = [f"# mla_dcp verify benchmark: {env['gpu']}", "",
             f"{env['date']}; torch {env['torch']}, Triton {env['triton']}; ceilings measured in the same run: "
             f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ceil['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s"
             + (f" (medians over {result['repeats']} repeats of the whole run)." if result.get("repeats", 1) > 1
                else ".")
             + (f" Batch-invariant mode (`VerifyConfig(batch_invariant=True, invariant_segment_tokens="
                f"{result.get('invariant_segment_tokens')})`"
                + ("; None: 64 tokens a head in [1024, 4096])." if result.get("invariant_segment_tokens") is None
                   else ").") if result.get("batch_invariant") else "")
             + (" e4m3 configs with `VerifyConfig(fp8_products=True)`." if result.get("fp8_products") else "")
             + (" One piece per program on the GPU, not the stream schedule (`MLA_DCP_STREAM=0`)."
                if result.get("stream") is False else "")
             + (f" Native plans (eager launches from C++): {env['native_plans']}." if "native_plans" in env else "")
             + {"tree": " Token trees: `build_view(..., block_mask=tree_mask(parents))`, node i hanging from node "
                        "i - 2, the first two from the context; `attn` is verify over a built view (the context's "
                        "stages and the block launch).",
                "sparse": f" Token-sparse rows: `verify_sparse`, each row listing {result.get('topk', TOPK)} random "
                          "positions of its window; the floor counts the positions the rank holds (keys gathered "
                          "once); `attn` is verify_sparse over a built view (slots, attention, merge)."}.get(
                 result.get("route", "causal"), ""),
             "", "Times in us (medians). `step`: build_view + verify, eager, as users call it; `graph`: the same "
             "under a CUDA graph; `graph x8`: eight steps in one graph, per step (the graph's launch and "
             "do_bench's L2 flush paid once, as in an engine's whole-forward graph), and its ratio to the floor; "
             "`host`: host time per eager step (wall time of 1,000 back-to-back steps, no sync between them); "
             "`attn`: the attention kernel alone (graph); `view`: build_view alone (graph: the step's metadata "
             "launches); `decode-style`: the same kernel, one row per verify "
             "token (graph); `pure`: the PyTorch path on the GPU (eager).", "",
             "| config | B | q | H | L | block | KV | floor | step | step/floor | host | graph | graph/floor | graph x8 | attn | view | "
             "segments (predicted attn) | non-attn share | decode-style | pure | target |",
             "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | --- |"]
    for row in result["rows"]:
        s = row["shape"]
        lines.append(
            f"| {row['config']} | {s['B']} | {s['q']} | {s['H']} | {s['L']} | {s['block']} | {s['kv']} | "
            f"{row['floor_us']:.0f} | {row['step_us']:.0f} | {row['ratio']:.2f} | {_host(row)} | "
            f"{row['step_graph_us']:.0f} | "
            f"{row['ratio_graph']:.2f} | {_with_ratio(row, 'step_graph_seq_us', 'ratio_graph_seq')} | "
            f"{row['attention_graph_us']:.0f} | {_view(row)} | "
            f"{row.get('segments', '')} ({row.get('predicted_attention_us', float('nan')):.0f}) | "
            f"{100 * row['non_attention_share']:.0f}% | "
            f"{row.get('decode_style_graph_us', float('nan')):.0f} | {row.get('pure_torch_us', float('nan')):.0f} | "
            f"{'<= %.1fx' % row['target'] if row['target'] else ''} |")
    return "\n".join(lines) + "\n"


def _view(row: dict) -> str:
    """build_view's graphed us, or "-" for a row from a run that did not time it."""
    return f"{row['view_graph_us']:.1f}" if "view_graph_us" in row else "-"


def _host(row: dict) -> str:
    """Host us per eager step, or "-" for a row from a run that did not time it."""
    return f"{row['host_us']:.0f}" if "host_us" in row else "-"


def _with_ratio(row: dict, key: str, ratio_key: str) -> str:
    """"us (ratio)", or "-" for a row from a run that did not time it."""
    return f"{row[key]:.0f} ({row[ratio_key]:.2f})" if key in row else "-"


def plot(result: dict, path: pathlib.Path) -> bool:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return False
    ceil = result["ceilings"]
    bw, peak = ceil["copy_bytes_per_s"], ceil["bf16_flops_per_s"]
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(13, 5), gridspec_kw={"width_ratios": [3, 2]})
    xs = [10 ** (k / 20) for k in range(0, 81)]
    ax.plot(xs, [min(peak, x * bw) / 1e12 for x in xs], "k-", label="roofline (measured copy bw, bf16 matmul)")
    rows = result["rows"]
    for row in rows:
        intensity = row["flops"] / row["bytes"]
        achieved = row["flops"] / (row["step_graph_us"] * 1e-6) / 1e12
        ax.plot([intensity], [achieved], "o")
        # Ragged configs sit on their twins' points: they are named in the bars instead.
        if row["config"].startswith("C"):
            ax.annotate(f"{row['config']} {row['ratio_graph']:.1f}x", (intensity, achieved), fontsize=8,
                        textcoords="offset points", xytext=(4, 4))
        if row.get("decode_style_graph_us"):
            ax.plot([intensity], [row["flops"] / (row["decode_style_graph_us"] * 1e-6) / 1e12], "x", color="gray")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("TFLOP/s (verify step, CUDA graph)")
    ax.set_title(f"mla_dcp verify on {result['environment']['gpu']} (x: decode-style baseline)")
    ax.legend(loc="lower right", fontsize=8)
    # Each config's graphed step against its floor; a ragged config beside its uniform twin.
    colours = {"C": "tab:blue", "R": "tab:orange", "u": "tab:gray"}
    names = [row["config"] for row in rows]
    kinds = ["u" if n.startswith("R") and n.endswith("u") else n[0] for n in names]
    ratios = [row["ratio_graph"] for row in rows]
    bars.barh(range(len(rows)), [min(r, 5.0) for r in ratios], color=[colours.get(k, "tab:green") for k in kinds])
    for i, r in enumerate(ratios):
        bars.text(min(r, 5.0) + 0.05, i, f"{r:.2f}", va="center", fontsize=7)
    bars.axvline(1.0, color="k", linewidth=0.8)
    bars.set_yticks(range(len(rows)), names, fontsize=7)
    bars.invert_yaxis()
    bars.set_xlim(0, 5.6)
    bars.set_xlabel("graphed step / floor (bars cut at 5)")
    bars.set_title("blue: uniform, orange: ragged, gray: its uniform twin", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--distributed" in argv:
        from mla_dcp import bench_distributed

        return bench_distributed.main([a for a in argv if a != "--distributed"])
    parser = argparse.ArgumentParser(prog="python -m mla_dcp.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", default=",".join(ALL_CONFIGS),
                        help="comma-separated subset of " + ",".join(ALL_CONFIGS) + " (R*: ragged, R*u: their uniform "
                             "twins; default all)")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16", help="query dtype")
    parser.add_argument("--out", default="benchmarks/latest", help="folder for results.json, results.md, roofline.png")
    parser.add_argument("--no-baselines", action="store_true", help="skip the pure and decode-style baselines")
    parser.add_argument("--sweep", action="store_true", help="time tile/segment variants; write sweep.json")
    parser.add_argument("--plot-only", metavar="RESULTS_JSON", help="redraw the plot and table of a recorded run")
    parser.add_argument("--distributed", action="store_true",
                        help="a DCP layer over real ranks: verify + each merge method, beside the collectives' "
                             "bandwidth (python -m mla_dcp.bench --distributed --help)")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="time VerifyConfig(batch_invariant=True) steps (its cost against the default mode)")
    parser.add_argument("--invariant-segment-tokens", type=int, default=None, metavar="N",
                        help="the batch-invariant mode's segment length (VerifyConfig.invariant_segment_tokens; "
                             "by default the config's own: 64 tokens a head in [1024, 4096])")
    parser.add_argument("--fp8-products", action="store_true",
                        help="time the e4m3 configs with VerifyConfig(fp8_products=True) (e4m3 tensor-core products)")
    parser.add_argument("--chunked", action="store_true",
                        help="one piece per program on the GPU, not the stream schedule (as MLA_DCP_STREAM=0; "
                             "mla_dcp.schedule_shape)")
    parser.add_argument("--route", choices=ROUTES, default="causal",
                        help="causal steps (default), token trees (build_view with a block mask) or token-sparse "
                             "rows (verify_sparse)")
    parser.add_argument("--topk", type=int, default=TOPK, metavar="N",
                        help="with --route sparse: positions each row lists (an indexer's top-k over all ranks)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the ceilings and all configs N times in turn; report medians over the repeats")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.topk < 1:
        parser.error(f"--topk must be at least 1, got {args.topk}")
    out = pathlib.Path(args.out)
    if args.plot_only:
        result = json.loads(pathlib.Path(args.plot_only).read_text())
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text(markdown(result))
        plot(result, out / "roofline.png")
        return 0
    # Everything that can refuse the run does so before a folder is made.
    if not torch.cuda.is_available():
        print("python -m mla_dcp.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {ALL_CONFIGS}")
    out.mkdir(parents=True, exist_ok=True)
    q_dtype = getattr(torch, args.dtype)
    from mla_dcp.ops import tiles
    if args.chunked:
        tiles.STREAM_ON_GPU = False
    if args.sweep:
        result = sweep(names, q_dtype)
        (out / "sweep.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result["best"], indent=1))
        return 0
    wait_for_native_plans()
    result = {"environment": environment(), "repeats": args.repeat, "batch_invariant": args.batch_invariant,
              "invariant_segment_tokens": args.invariant_segment_tokens, "fp8_products": args.fp8_products,
              "stream": tiles.STREAM_ON_GPU, "route": args.route, "topk": args.topk, "rows": []}
    ceilings, rows = [], {name: [] for name in names}
    steps = args.repeat * len(names)
    for turn in range(args.repeat):
        ceilings.append(measure_ceilings())
        print(f"ceilings: copy {ceilings[-1]['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
              f"bf16 matmul {ceilings[-1]['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s")
        for index, name in enumerate(names):
            _progress(turn * len(names) + index, steps, name)
            case = make_case(name, q_dtype, args.batch_invariant, args.invariant_segment_tokens, args.fp8_products,
                             args.route, args.topk)
            rows[name].append(run_config(case, ceilings[-1], not args.no_baselines))
            del case
            torch.cuda.empty_cache()
            # Saved after every config, so a run cut short keeps what it measured.
            result["ceilings"] = median_ceilings(ceilings)
            result["ceilings_repeats"] = ceilings
            result["rows"] = [median_over_repeats(rows[n], result["ceilings"]) for n in names if rows[n]]
            (out / "results.json").write_text(json.dumps(result, indent=1))
    _progress(steps, steps, "done")
    text = markdown(result)
    (out / "results.md").write_text(text)
    print(text)
    plot(result, out / "roofline.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
