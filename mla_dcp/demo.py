"""`python -m mla_dcp demo`: one whole DCP verification, checked against the truth.

Shards a random paged cache over the ranks of a DCP group (NaN in every slot
a rank must not read, out-of-range ids in unused block-table entries), runs
every rank's `verify`, merges the partials and compares the result with
attention computed in global coordinates. The group is simulated in one
process, or (`--ranks N`, or `torchrun --nproc-per-node N -m mla_dcp.demo`)
made of N real processes that each hold only their own shard and merge over
torch.distributed. Exits non-zero when the answer is wrong.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import mla_dcp
from mla_dcp.distributed import METHODS
from mla_dcp.testing import (assert_close_special, error_budget, make_problem, merge_partials, platform_fp8,
                             run_ranks)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mla_dcp demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16, help="query heads H (default 16: DeepSeek-V3's 128 scaled to a CPU)")
    parser.add_argument("--qlen", type=int, default=3, help="verify rows per request: drafts + 1 (default 3)")
    parser.add_argument("--world", type=int, default=4, help="simulated DCP ranks W, in one process (default 4)")
    parser.add_argument("--ranks", type=int, default=0,
                        help="run W=RANKS real processes (gloo on CPUs; NCCL when RANKS GPUs are present), "
                             "each holding only its own shard; torchrun -m mla_dcp.demo does the same")
    parser.add_argument("--method", choices=METHODS, default="reduce_scatter",
                        help="cross-rank merge of --ranks/torchrun runs (default reduce_scatter)")
    parser.add_argument("--interleave", type=int, nargs="+", default=[1, 2], help="interleave sizes to run (default 1 2)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[0, 2, 37, 190, 301],
                        help="global lengths of the requests, verify tokens included (0 = padding)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per cache block (default 16)")
    parser.add_argument("--max-model-len", type=int, default=512, help="static bound on a request's length (default 512)")
    parser.add_argument("--kv-lora-rank", type=int, default=512, help="latent width Dl (default 512)")
    parser.add_argument("--rope-dim", type=int, default=64, help="rope width Dr (default 64)")
    parser.add_argument("--softmax-scale", type=float, default=192 ** -0.5,
                        help="the model's softmax scale (default 192 ** -0.5: DeepSeek-V3's 128 + 64 wide "
                             "query-key heads, without YaRN)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="query dtype (default float32)")
    parser.add_argument("--kv", choices=("same", "fp8"), default="same",
                        help="cache dtype: the query's, or fp8 e4m3 with a per-tensor scale (default same)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="device to run on (default: cuda if present, else cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-rows", type=int, default=8, help="rows of the window table to print (default 8)")
    return parser


def _problem(args: argparse.Namespace, interleave: int, device, ranks=None):
    dtype = _DTYPES[args.dtype]
    kv_dtype = platform_fp8() if args.kv == "fp8" else dtype
    return make_problem(
        args.seq_lens, qlen=args.qlen, num_heads=args.heads, kv_lora_rank=args.kv_lora_rank,
        rope_dim=args.rope_dim, world=args.world, interleave=interleave, block_size=args.block_size,
        max_model_len=args.max_model_len, dtype=dtype, kv_dtype=kv_dtype, softmax_scale=args.softmax_scale,
        seed=args.seed,
        device=device, ranks=ranks)


def report(args: argparse.Namespace, interleave: int, problem, row_lens: torch.Tensor, out: torch.Tensor,
           lse: torch.Tensor, elapsed: float, how: str) -> bool:
    """Print the per-rank row lengths, the causal windows, the error against
    the global reference and the time. ``row_lens``: int [W, B*q]."""
    dtype = _DTYPES[args.dtype]
    kv_dtype = problem.shards[0].kv_cache.dtype
    print(f"\n== {how}: W={args.world} interleave={interleave} q={args.qlen} H={args.heads} "
          f"Dl={args.kv_lora_rank} Dr={args.rope_dim} block={args.block_size} "
          f"q dtype={args.dtype} kv dtype={kv_dtype} device={out.device}")
    row_lens = row_lens.cpu()
    for rank in range(row_lens.shape[0]):
        print(f"rank {rank} row_lens: {row_lens[rank].tolist()}")
    qlen = args.qlen
    print(f"{'row (b,t)':>10} {'global window':>14} | " + " ".join(f"r{r:<4}" for r in range(args.world)) + "| sum")
    windows = torch.tensor([max(0, args.seq_lens[r // qlen] - qlen + 1 + r % qlen) for r in range(row_lens.shape[1])])
    for row in range(min(args.show_rows, row_lens.shape[1])):
        b, t = divmod(row, qlen)
        cells = " ".join(f"{int(n):<5}" for n in row_lens[:, row])
        print(f"{f'({b},{t})':>10} {f'[0, {int(windows[row])})':>14} | {cells}| {int(row_lens[:, row].sum())}")

    exact_out, exact_lse = problem.reference(torch.float64)
    low_precision = dtype != torch.float32 or kv_dtype != dtype
    budget = error_budget(exact_out, problem.reference(dtype)[0], dtype) if low_precision else 1e-4
    try:
        out_err = assert_close_special("out", out, exact_out, budget)
        lse_err = assert_close_special("lse", lse, exact_lse, max(budget, 1e-4))
    except AssertionError as failure:
        print(f"WRONG: {failure}")
        return False
    window_sums_ok = bool((row_lens.sum(0) == windows).all())
    print(f"merged vs global reference: max |out err| {out_err:.2e}, max |lse err| {lse_err:.2e} "
          f"(budget {budget:.1e}); -inf/NaN positions match; rank lengths sum to the windows: {window_sums_ok}")
    print(f"time: {elapsed * 1e3:.1f} ms for verify + merge (first call, includes warm-up)")
    return window_sums_ok


def run_simulated(args: argparse.Namespace, interleave: int) -> bool:
    """All ranks in this process, merged with the stacked merge."""
    problem = _problem(args, interleave, args.device)
    start = time.perf_counter()
    partials, views = run_ranks(problem)
    out, lse = merge_partials(partials)
    if out.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    row_lens = torch.stack([v.row_lens for v in views])
    return report(args, interleave, problem, row_lens, out, lse, elapsed, "simulated DCP, one process")


def run_process(rank: int, world: int, args: argparse.Namespace, interleave: int) -> bool:
    """This process is DCP rank ``rank``: it builds and holds only its own
    shard, verifies, merges over the process group; rank 0 reports."""
    import torch.distributed as dist

    from mla_dcp import distributed

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    problem = _problem(args, interleave, device, ranks=[rank])
    shard = problem.shards[0]
    start = time.perf_counter()
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table, q_dtype=problem.q.dtype,
                              kv_dtype=shard.kv_cache.dtype)
    out, lse = distributed.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale,
                                  method=args.method)
    if out.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    # Only for the report: bring every rank's row lengths and head slice to all.
    row_lens = torch.empty(world, *view.row_lens.shape, dtype=torch.int32, device=device)
    distributed.all_gather_single(row_lens.view(-1), view.row_lens)
    if args.method != "all_reduce":
        out_parts = [torch.empty_like(out) for _ in range(world)]
        lse_parts = [torch.empty_like(lse) for _ in range(world)]
        dist.all_gather(out_parts, out.contiguous())
        dist.all_gather(lse_parts, lse.contiguous())
        out, lse = torch.cat(out_parts, dim=1), torch.cat(lse_parts, dim=1)
    ok = True
    if rank == 0:
        ok = report(args, interleave, problem, row_lens, out, lse, elapsed,
                    f"{world} processes ({dist.get_backend()}, method={args.method})")
    verdict = torch.tensor([int(ok)], device=device)
    dist.broadcast(verdict, src=0)
    return bool(verdict.item())


def _process_main(rank: int, world: int, args: argparse.Namespace) -> None:
    results = [run_process(rank, world, args, interleave) for interleave in args.interleave]
    if not all(results):
        raise RuntimeError("the merged answer is wrong (see rank 0's report)")


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse what cannot run with one line and exit status 2 (argparse's
    error), before any work: sizes below 1, an unusable device."""
    for name in ("heads", "qlen", "world", "block_size", "max_model_len", "kv_lora_rank"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.softmax_scale > 0 or args.softmax_scale == float("inf"):
        parser.error(f"--softmax-scale must be a finite number > 0, got {args.softmax_scale}")
    if args.rope_dim < 0 or args.ranks < 0:
        parser.error(f"--rope-dim and --ranks must be >= 0, got {args.rope_dim} and {args.ranks}")
    if any(i < 1 for i in args.interleave):
        parser.error(f"--interleave sizes must be >= 1, got {args.interleave}")
    if any(n < 0 for n in args.seq_lens) or max(args.seq_lens) > args.max_model_len:
        parser.error(f"--seq-lens must lie in [0, --max-model-len={args.max_model_len}], got {args.seq_lens}")
    try:
        device = torch.device(args.device)
    except RuntimeError as failure:
        parser.error(f"--device {args.device!r} is not a device: {failure}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device} needs a CUDA (or ROCm) GPU and a torch built for it; "
                     f"this torch ({torch.__version__}) sees none")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda, got {args.device!r}")


def _launched_by_torchrun() -> bool:
    import os

    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    if _launched_by_torchrun():
        import os

        import torch.distributed as dist

        world = int(os.environ["WORLD_SIZE"])
        use_nccl = torch.cuda.is_available() and torch.cuda.device_count() >= world
        if use_nccl:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group("nccl" if use_nccl else "gloo")
        args.world = world
        try:
            ok = all([run_process(dist.get_rank(), world, args, i) for i in args.interleave])
        finally:
            dist.destroy_process_group()
        print("\nOK" if ok else "\nFAILED")
        from mla_dcp.testing import exit_process_now
        exit_process_now(0 if ok else 1)
    elif args.ranks:
        args.world = args.ranks
        from mla_dcp.testing import group_succeeds
        ok = group_succeeds(_process_main, args.ranks, args)
    else:
        ok = all([run_simulated(args, interleave) for interleave in args.interleave])
    print("\nOK" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
