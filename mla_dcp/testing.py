"""Build hostile DCP problems and judge results: shared by tests, demo and benchmarks.

A problem is a batch of requests with keys in *global* order, sharded over
the ranks of a DCP group by a token-by-token dealing simulation (it does not
use the placement formula of `mla_dcp.pure.placement`, so it can check it).
Every cache slot a rank must not read holds NaN, and every block-table entry
past a request's blocks holds an id far out of range: a kernel that reads
what it must not fails loudly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Sequence

import torch

from mla_dcp.config import VerifyConfig
from mla_dcp._dtypes import is_fp8
from mla_dcp._shapes import WORK_COLUMNS
from mla_dcp.pure.reference import reference_attention

__all__ = ["deal_positions", "ragged_map_cases", "RankShard", "Problem", "make_problem", "error_budget", "assert_close_special",
           "run_ranks", "merge_partials", "check_problem", "poison_key", "make_column_positive", "ran_rows",
           "exact_e4m3_interpreter"]

# Far beyond any cache: an unused table entry read as a block id faults or
# reads NaN-free garbage that the comparison catches.
OUT_OF_RANGE_BLOCK = 1 << 29


@functools.lru_cache(maxsize=64)
def deal_positions(length: int, world: int, interleave: int) -> tuple[tuple[int, ...], ...]:
    """Deal global positions ``0..length-1`` to ranks like a card dealer.

    Each rank in turn takes ``interleave`` consecutive tokens. Returns, per
    rank, its global positions in rank-local order.
    """
    hands: list[list[int]] = [[] for _ in range(world)]
    rank, taken = 0, 0
    for position in range(length):
        hands[rank].append(position)
        taken += 1
        if taken == interleave:
            rank, taken = (rank + 1) % world, 0
    return tuple(tuple(hand) for hand in hands)


def platform_fp8() -> torch.dtype:
    """The fp8 e4m3 flavour of this platform's GPUs: e4m3fnuz on ROCm, e4m3fn elsewhere."""
    return torch.float8_e4m3fnuz if torch.version.hip is not None else torch.float8_e4m3fn


def fp8_nan(dtype: torch.dtype) -> torch.Tensor:
    """The NaN bit pattern of an fp8 dtype, as a one-byte tensor."""
    return torch.tensor([math.nan]).to(dtype).view(torch.uint8)


@dataclasses.dataclass
class RankShard:
    cfg: VerifyConfig
    block_table: torch.Tensor   # int32 [B, max_blocks]
    kv_cache: torch.Tensor      # [num_blocks, block_size, Dqk]


@dataclasses.dataclass
class Problem:
    seq_lens: torch.Tensor      # int32 [B], global lengths
    q: torch.Tensor             # [B*qlen, H, Dqk]
    global_kv: torch.Tensor     # float32 [B, max_len, Dqk], dequantized, global order
    kv_scale: torch.Tensor | None
    shards: list[RankShard]
    block_mask: torch.Tensor | None = None   # bool [B, qlen, qlen] or [qlen, qlen]: a masked block (a tree)

    def reference(self, dtype: torch.dtype = torch.float64,
                  rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention in global coordinates: the merged answer, or with ``rank``
        the partial result of the keys that rank holds (by dealing)."""
        cfg = self.shards[0].cfg
        key_mask = None
        if rank is not None:
            max_len = self.global_kv.shape[1]
            hand = deal_positions(max_len, cfg.dcp_world_size, cfg.interleave)[rank]
            owned = torch.zeros(max_len, dtype=torch.bool)
            owned[list(hand)] = True
            key_mask = owned.to(self.q.device)[None, :].expand(self.global_kv.shape[0], -1)
        return reference_attention(
            self.q, self.global_kv, self.seq_lens, qlen=cfg.qlen, kv_lora_rank=cfg.kv_lora_rank,
            softmax_scale=cfg.scale, key_mask=key_mask, dtype=dtype, causal=cfg.causal, block_mask=self.block_mask)


def make_problem(
    seq_lens: Sequence[int],
    *,
    qlen: int,
    num_heads: int,
    kv_lora_rank: int,
    rope_dim: int,
    world: int = 1,
    interleave: int = 1,
    block_size: int = 16,
    max_model_len: int | None = None,
    dtype: torch.dtype = torch.float32,
    kv_dtype: torch.dtype | None = None,
    num_segments: int | None = None,
    softmax_scale: float | None = None,
    causal: bool = True,
    seed: int = 0,
    device: str | torch.device = "cpu",
    ranks: Sequence[int] | None = None,
    block_mask: torch.Tensor | None = None,
) -> Problem:
    """A random verify problem sharded over ``world`` ranks with NaN poisoning.

    Physical blocks are handed out in a random order, each rank's cache has
    spare NaN blocks, and unused block-table entries hold out-of-range ids.
    ``ranks`` builds only those ranks' shards (a DCP process holds only its
    own); a rank's shard is the same whichever others are built.
    ``softmax_scale`` defaults to ``(kv_lora_rank + rope_dim) ** -0.5``, a
    test problem's choice (a real model passes its own). ``block_mask``: a
    masked block (bool [qlen, qlen] or [B, qlen, qlen], :func:`mla_dcp.tree_mask`),
    which :func:`run_ranks` passes to ``build_view``.
    """
    kv_dtype = kv_dtype or dtype
    gen = torch.Generator().manual_seed(seed)
    lens = [int(n) for n in seq_lens]
    batch, head_dim = len(lens), kv_lora_rank + rope_dim
    max_len = max(lens + [1])
    max_model_len = max_model_len or max(max_len, qlen)
    softmax_scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    if max_model_len < max_len:
        raise ValueError(f"max_model_len={max_model_len} is below the longest length {max_len}")

    q = torch.randn(batch * qlen, num_heads, head_dim, generator=gen).to(dtype)
    kv = torch.randn(batch, max_len, head_dim, generator=gen)
    kv_scale = None
    if is_fp8(kv_dtype):
        # Spread the stored values over fp8's range so the scale matters.
        kv_scale = torch.tensor([(kv.abs().amax().item() if kv.numel() else 1.0) / 200.0], dtype=torch.float32)
        stored = (kv / kv_scale).to(kv_dtype)
        global_kv = stored.float() * kv_scale
    else:
        stored = kv.to(kv_dtype)
        global_kv = stored.float()

    hands = deal_positions(max_len, world, interleave)
    shards = []
    for rank in range(world) if ranks is None else ranks:
        rank_gen = torch.Generator().manual_seed(seed * 1009 + rank + 1)
        cfg = VerifyConfig(
            num_heads=num_heads, qlen=qlen, block_size=block_size, max_model_len=max_model_len,
            dcp_world_size=world, dcp_rank=rank, interleave=interleave,
            kv_lora_rank=kv_lora_rank, rope_dim=rope_dim, num_segments=num_segments, softmax_scale=softmax_scale,
            causal=causal)
        local_counts = [sum(1 for p in hands[rank] if p < n) for n in lens]
        blocks_needed = [-(-n // block_size) for n in local_counts]
        num_blocks = sum(blocks_needed) + 2
        order = torch.randperm(num_blocks, generator=rank_gen).to(torch.int32)
        block_table = torch.full((batch, max(cfg.min_table_blocks, 1)), OUT_OF_RANGE_BLOCK, dtype=torch.int32)
        cache = torch.full((num_blocks, block_size, head_dim), math.nan)
        cursor = 0
        for b, (count, needed) in enumerate(zip(local_counts, blocks_needed)):
            block_table[b, :needed] = order[cursor:cursor + needed]
            cursor += needed
            positions = torch.tensor(hands[rank][:count], dtype=torch.long)
            local = torch.arange(count)
            slots = block_table[b, local // block_size].long() * block_size + local % block_size
            cache.view(-1, head_dim)[slots] = kv[b, positions]
        if is_fp8(kv_dtype):
            cache_bytes = torch.where(cache.isnan(), 0, cache / kv_scale).to(kv_dtype).view(torch.uint8)
            cache_bytes = torch.where(cache.isnan(), fp8_nan(kv_dtype), cache_bytes)
            rank_cache = cache_bytes.view(kv_dtype)
        else:
            rank_cache = cache.to(kv_dtype)
        shards.append(RankShard(cfg, block_table.to(device), rank_cache.to(device)))

    return Problem(
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        q=q.to(device), global_kv=global_kv.to(device),
        kv_scale=None if kv_scale is None else kv_scale.to(device), shards=shards,
        block_mask=None if block_mask is None else block_mask.to(device))


def poison_key(problem: Problem, b: int, position: int, columns: slice, value: float) -> int:
    """Write ``value`` (NaN, +-inf) into columns of request ``b``'s key at
    global ``position``, in the global keys and in the cache of the rank that
    holds it (found by dealing; a problem built for some ranks only changes
    the cache of that rank if it has it). fp8 caches take NaN only (e4m3 has
    no inf). Returns that rank."""
    cfg = problem.shards[0].cfg
    hands = deal_positions(problem.global_kv.shape[1], cfg.dcp_world_size, cfg.interleave)
    rank = next(r for r, hand in enumerate(hands) if position in hand)
    local = hands[rank].index(position)
    problem.global_kv[b, position, columns] = value
    shard = next((s for s in problem.shards if s.cfg.dcp_rank == rank), None)
    if shard is None:
        return rank
    block = int(shard.block_table[b, local // cfg.block_size])
    cache = shard.kv_cache
    if is_fp8(cache.dtype):
        if not math.isnan(value):
            raise ValueError(f"an fp8 e4m3 cache holds NaN but not {value}")
        cache.view(torch.uint8)[block, local % cfg.block_size, columns] = fp8_nan(cache.dtype).to(cache.device)
    else:
        cache[block, local % cfg.block_size, columns] = value
    return rank


def make_column_positive(problem: Problem, column: int) -> None:
    """Key column ``column`` := |k| + 0.5 everywhere (16-bit caches), so a
    query of -inf there scores -inf against every key."""
    for shard in problem.shards:
        cache = shard.kv_cache
        if is_fp8(cache.dtype):
            raise ValueError("make_column_positive needs a 16- or 32-bit cache")
        cache[..., column] = (cache[..., column].float().abs() + 0.5).to(cache.dtype)
    dtype = problem.shards[0].kv_cache.dtype
    problem.global_kv[..., column] = (problem.global_kv[..., column].abs() + 0.5).to(dtype).float()


def ragged_map_cases(randoms: int, max_batch: int, seed: int = 8) -> list[tuple[list[int], int, int]]:
    """(query_start_loc, qlen, num_tokens) cases for a ragged map against its oracle: tokens before
    the first request and after the last, empty requests, a request of more tokens than qlen (its
    earliest: no row), one longer than a loop step of the kernel, no request at all, no token; then
    ``randoms`` random batches of 1 to ``max_batch - 1`` requests of 0-8 tokens, qlen 5."""
    cases = [([1, 2, 5, 5, 9, 10], 3, 12), ([0, 300, 302, 302], 4, 310), ([4], 3, 6), ([0], 2, 0), ([0, 0, 3], 3, 3),
             ([2, 5], 8, 5), ([0, 5000, 5001], 8, 5003)]
    g = torch.Generator().manual_seed(seed)
    for _ in range(randoms):
        counts = torch.randint(0, 9, (int(torch.randint(1, max_batch, (1,), generator=g)),), generator=g)
        front, back = (int(v) for v in torch.randint(0, 5, (2,), generator=g))
        starts = front + torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        cases.append((starts.tolist(), 5, int(starts[-1]) + back))
    return cases


@contextlib.contextmanager
def exact_e4m3_interpreter():
    """Triton's interpreter (``TRITON_INTERPRET=1``) with torch's fp32/fp16 -> e4m3 rounding (to
    nearest even, saturating at 448 as the GPU's conversion does) and its e4m3 -> fp16/fp32
    widening of dot operands, which keeps NaN (the interpreter reads e4m3's 0x7f as a number, so
    a NaN key would not poison its rows). The interpreter's own fp32 -> e4m3 conversion drops the
    carry into the exponent (1.94 -> 1.0). Its fp32 -> bf16 conversion rounds to nearest even here
    too, as the GPU's does (the interpreter's truncates). Restored on exit."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    e4m3 = torch.float8_e4m3fn
    original = interpreter._convert_float

    def convert(data, input_dtype, output_dtype, rounding_mode):
        wide = {tl.float32: (np.float32, torch.float32), tl.float16: (np.float16, torch.float16)}
        if output_dtype == tl.float8e4nv and input_dtype in wide:
            src = np.frombuffer(data.tobytes(), dtype=wide[input_dtype][0])
            x = torch.from_numpy(src.astype(np.float32)).clamp(-448.0, 448.0)
            return x.to(e4m3).view(torch.uint8).numpy().reshape(data.shape)
        if output_dtype == tl.bfloat16 and input_dtype == tl.float32:
            x = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np.float32).copy())
            return x.to(torch.bfloat16).view(torch.uint16).numpy().reshape(data.shape)
        if input_dtype == tl.float8e4nv and output_dtype in wide:
            x = torch.from_numpy(np.frombuffer(data.tobytes(), dtype=np.uint8).copy()).view(e4m3)
            out = x.to(wide[output_dtype][1]).numpy()
            return out.view(np.uint32 if output_dtype == tl.float32 else np.uint16).reshape(data.shape)
        return original(data, input_dtype, output_dtype, rounding_mode)

    interpreter._convert_float = convert
    try:
        yield
    finally:
        interpreter._convert_float = original


def error_budget(exact: torch.Tensor, low_precision: torch.Tensor, dtype: torch.dtype) -> float:
    """Tolerance from data: twice the error of an independent low-precision
    reference plus one rounding of the output in ``dtype``."""
    finite = torch.isfinite(exact)
    if not finite.any():
        return 0.0
    ref_err = (low_precision.double() - exact.double())[finite].abs().max().item()
    rounding = torch.finfo(dtype).eps * exact.double()[finite].abs().max().item()
    return 2.0 * (ref_err + rounding)


def ran_rows(work: torch.Tensor) -> torch.Tensor:
    """bool [NI]: the rows of a schedule's ``work`` that some attention
    program runs: every row of one with three columns, the stream's runs'
    pieces ``[first, end)`` of one with five. The kernels write only these
    rows' partials, so a comparison of partial tensors takes only these."""
    rows = torch.arange(work.shape[0], device=work.device)
    if work.shape[1] == WORK_COLUMNS:
        return torch.ones_like(rows, dtype=torch.bool)
    first, end = work[:, 3].long(), work[:, 4].long()
    return ((rows[:, None] >= first[None, :]) & (rows[:, None] < end[None, :])).any(dim=1)


def assert_close_special(name: str, got: torch.Tensor, want: torch.Tensor, atol: float) -> float:
    """inf/NaN positions (and signs) must match exactly; finite values within ``atol``.

    Returns the max absolute error over finite positions.
    """
    got, want = got.double().cpu(), want.double().cpu()
    for label, fn in (("NaN", torch.isnan), ("+inf", torch.isposinf), ("-inf", torch.isneginf)):
        mismatch = fn(got) != fn(want)
        if mismatch.any():
            index = mismatch.nonzero()[0].tolist()
            raise AssertionError(
                f"{name}: {label} positions differ ({int(mismatch.sum())} places, first at {index}: "
                f"got {got[tuple(index)].item()}, want {want[tuple(index)].item()})")
    finite = torch.isfinite(want)
    err = (got - want)[finite].abs().max().item() if finite.any() else 0.0
    if not err <= atol:
        raise AssertionError(f"{name}: max abs error {err:.3e} exceeds the budget {atol:.3e}")
    return err


def run_ranks(problem: Problem, verify_fn=None) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], list]:
    """Every rank's ``build_view`` + ``verify`` on its own shard.

    Returns the per-rank ``(out, lse)`` partials and the per-rank views.
    ``verify_fn`` defaults to :func:`mla_dcp.verify` (pass a compiled one to
    test it).
    """
    import mla_dcp

    verify_fn = verify_fn or mla_dcp.verify
    partials, views = [], []
    for shard in problem.shards:
        view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table, q_dtype=problem.q.dtype,
                                  kv_dtype=shard.kv_cache.dtype, block_mask=problem.block_mask)
        partials.append(verify_fn(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale))
        views.append(view)
    return partials, views


def merge_partials(partials: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    import mla_dcp

    return mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))


def check_problem(problem: Problem, dtype: torch.dtype, kv_dtype: torch.dtype | None,
                  per_rank: bool = True) -> float:
    """Check every rank's ``verify`` and the merge against global coordinates.

    Per rank: the partial equals attention over the keys that rank holds (by
    dealing), empty rows give exactly 0 and -inf. Merged: equals attention
    over the whole sequence. fp32 within 1e-4; lower precision within
    :func:`error_budget`. Returns the merged output's max error.
    """
    partials, views = run_ranks(problem)
    exact_out, exact_lse = problem.reference(torch.float64)
    if dtype == torch.float32 and kv_dtype in (None, torch.float32):
        budget = 1e-4
    else:
        budget = error_budget(exact_out, problem.reference(dtype)[0], dtype)
    if per_rank:
        for rank, (out, lse) in enumerate(partials):
            want_out, want_lse = problem.reference(torch.float64, rank=rank)
            assert out.dtype == problem.q.dtype and lse.dtype == torch.float32
            assert_close_special(f"rank {rank} lse", lse, want_lse, max(budget, 1e-4))
            assert_close_special(f"rank {rank} out", out, want_out, max(budget, error_budget(
                want_out, problem.reference(dtype, rank=rank)[0], dtype)))
            if problem.block_mask is None:
                empty = views[rank].row_lens == 0
                assert bool((out[empty] == 0).all()) and bool(lse[empty].isneginf().all())
    out, lse = merge_partials(partials)
    assert_close_special("merged lse", lse, exact_lse, max(budget, 1e-4))
    # DCP's invariant on the metadata: ranks' lengths add up to each row's window (a masked
    # block's context view: the keys before the block).
    qlen, causal = problem.shards[0].cfg.qlen, problem.shards[0].cfg.causal
    masked = problem.block_mask is not None
    windows = torch.tensor([max(0, int(n) - (qlen if masked else qlen - 1 - t if causal else 0))
                            for n in problem.seq_lens.tolist() for t in range(qlen)])
    row_lens = [(v.context if masked else v).row_lens.cpu() for v in views]
    assert torch.equal(sum(row_lens), windows.to(torch.int32))
    return assert_close_special("merged out", out, exact_out, budget)


class EngineStep(torch.nn.Module):
    """One DCP rank's engine step as a module ``torch.export`` takes: the step's latent rows written
    to the cache (``cache_slots``, ``write_cache``), then its rows verified. ``route``: ``"ragged"``
    (``select`` the step's ``query_start_loc``, ``q`` and ``latents`` its packed tokens), ``"tree"``
    (``select`` a block mask) or ``"sparse"`` (``select`` each row's listed positions)."""

    def __init__(self, cfg: VerifyConfig, route: str):
        super().__init__()
        if route not in ("ragged", "tree", "sparse"):
            raise ValueError(f"route must be 'ragged', 'tree' or 'sparse', got {route!r}")
        self.cfg, self.route = cfg, route

    def forward(self, seq_lens, block_table, select, q, latents, kv_cache):
        import mla_dcp

        cfg = self.cfg
        blocks = mla_dcp.ragged_blocks(select, cfg.qlen, q.shape[0]) if self.route == "ragged" else None
        mla_dcp.write_cache(kv_cache, mla_dcp.cache_slots(cfg, seq_lens, block_table, blocks=blocks), latents)
        if self.route == "sparse":
            return mla_dcp.verify_sparse(cfg, mla_dcp.build_view(cfg, seq_lens, block_table), q, kv_cache, select)
        if self.route == "tree":
            return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, block_table, block_mask=select), q, kv_cache)
        out, lse = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, block_table), blocks.rows(q), kv_cache)
        return blocks.tokens(out, lse)


def check_exported_package(module, inputs, dynamic_shapes: dict, package_path: str, sizes=(2, 5, 9)):
    """``torch.export`` ``module`` (its last input a cache it writes in place) at ``inputs(3)`` with
    ``dynamic_shapes``, build an AOTInductor package at ``package_path``, and check that at each of
    ``sizes`` its results and its cache equal eager's bit for bit. Returns the exported program and,
    per size, how many cache rows the step changed."""
    exported = torch.export.export(module, inputs(3), dynamic_shapes=dynamic_shapes)
    runner = torch._inductor.aoti_load_package(
        torch._inductor.aoti_compile_and_package(exported, package_path=package_path))
    written = []
    for size in sizes:
        args = inputs(size)
        cache, eager_cache = args[-1].clone(), args[-1].clone()
        got, want = runner(*args[:-1], cache), module(*args[:-1], eager_cache)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"batch {size}"
        assert torch.equal(cache, eager_cache), f"batch {size}"
        written.append(int((cache != args[-1]).flatten(1).any(-1).sum()))
    return exported, written


def check_compiled_follows(step, cases) -> None:
    """``torch.compile(step, fullgraph=True, dynamic=False)`` over ``cases`` (argument tuples with the
    same shapes and other values): each result bit for bit the eager step's, NaN where it is NaN, and
    only the first case compiles (the others run under ``fail_on_recompile``)."""
    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    for index, args in enumerate(cases):
        with torch.compiler.set_stance("fail_on_recompile" if index else "default"):
            got = compiled(*args)
        torch.testing.assert_close(got, step(*args), rtol=0, atol=0, equal_nan=True)


def check_graph_follows(step, updates) -> None:
    """On a GPU: the eager ``step()`` makes no host sync (``sync_debug_mode("error")``), and one CUDA
    graph of it, replayed after each of ``updates`` (functions that change its inputs in place),
    equals the eager step bit for bit, NaN where it is NaN."""
    step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    for update in updates:
        update()
        graph.replay()
        torch.testing.assert_close(captured, step(), rtol=0, atol=0, equal_nan=True)


def _process_entry(rank: int, world: int, store_path: str, backend: str, fn, args) -> None:
    import torch.distributed as dist

    if backend == "nccl":
        torch.cuda.set_device(rank)
    # A file store: no TCP server living in rank 0 that peers still talk to
    # while rank 0 exits, and no race for a free port.
    dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        # Nobody tears the group down while a peer still talks to it.
        dist.barrier()
    except BaseException as failure:
        # The spawn machinery reports only Exceptions; a test's failed
        # assertion helper (e.g. pytest's) may be a BaseException.
        if isinstance(failure, Exception):
            raise
        raise RuntimeError(f"rank {rank}: {type(failure).__name__}: {failure}") from failure
    finally:
        dist.destroy_process_group()
    exit_process_now(0)


def exit_process_now(code: int) -> None:
    """End a process of a torch.distributed group after its work is done.

    Skips C++ static destructors: gloo's background threads can still be
    joinable then, and std::terminate aborts the process (SIGABRT in about 1
    of 8 runs of a 2-process gloo group here) after everything succeeded.
    """
    import os
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def group_succeeds(fn, world: int, *args) -> bool:
    """:func:`launch_group` for a command line: True when every process
    finished, else False with the failing process's last line printed."""
    try:
        launch_group(fn, world, *args)
        return True
    except Exception as failure:  # a rank's failure arrives as the spawn machinery's exception
        print(f"FAILED in a DCP process: {str(failure).strip().splitlines()[-1]}")
        return False


def launch_group(fn, world: int, *args, backend: str | None = None) -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` fresh processes forming one
    process group (gloo on CPUs; NCCL when ``world`` GPUs are present).

    ``fn`` must be importable (a module-level function). An exception in any
    process is raised here with its traceback.
    """
    import os
    import tempfile

    import torch.multiprocessing as mp

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    with tempfile.TemporaryDirectory(prefix="mla_dcp_group_") as folder:
        mp.start_processes(_process_entry, args=(world, os.path.join(folder, "store"), backend, fn, args),
                           nprocs=world, start_method="spawn")
