"""`python -m mla_dcp demo`: one whole DCP verification, checked against the truth.

Simulates a DCP group in one process: shards a random paged cache over the
ranks (NaN in every slot a rank must not read, out-of-range ids in unused
block-table entries), runs every rank's `verify`, merges the partials and
compares the result with attention computed in global coordinates.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from mla_dcp.testing import assert_close_special, error_budget, make_problem, merge_partials, run_ranks

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_KV_DTYPES = {"same": None, "fp8": "fp8"}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="python -m mla_dcp demo", description=__doc__,
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16, help="query heads H (default 16: DeepSeek-V3's 128 scaled to a CPU)")
    parser.add_argument("--qlen", type=int, default=3, help="verify rows per request: drafts + 1 (default 3)")
    parser.add_argument("--world", type=int, default=4, help="simulated DCP ranks W (default 4)")
    parser.add_argument("--interleave", type=int, nargs="+", default=[1, 2], help="interleave sizes to run (default 1 2)")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[0, 2, 37, 190, 301],
                        help="global lengths of the requests, verify tokens included (0 = padding)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per cache block (default 16)")
    parser.add_argument("--max-model-len", type=int, default=512, help="static bound on a request's length (default 512)")
    parser.add_argument("--kv-lora-rank", type=int, default=512, help="latent width Dl (default 512)")
    parser.add_argument("--rope-dim", type=int, default=64, help="rope width Dr (default 64)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="query dtype (default float32)")
    parser.add_argument("--kv", choices=sorted(_KV_DTYPES), default="same",
                        help="cache dtype: the query's, or fp8 e4m3 with a per-tensor scale (default same)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="device to run on (default: cuda if present, else cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show-rows", type=int, default=8, help="rows of the window table to print (default 8)")
    return parser


def _fp8_dtype(device: str) -> torch.dtype:
    if torch.version.hip is not None and str(device).startswith("cuda"):
        return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def run_case(args: argparse.Namespace, interleave: int) -> bool:
    dtype = _DTYPES[args.dtype]
    kv_dtype = _fp8_dtype(args.device) if args.kv == "fp8" else dtype
    problem = make_problem(
        args.seq_lens, qlen=args.qlen, num_heads=args.heads, kv_lora_rank=args.kv_lora_rank,
        rope_dim=args.rope_dim, world=args.world, interleave=interleave, block_size=args.block_size,
        max_model_len=args.max_model_len, dtype=dtype, kv_dtype=kv_dtype, seed=args.seed,
        device=args.device)
    print(f"\n== W={args.world} interleave={interleave} q={args.qlen} H={args.heads} "
          f"Dl={args.kv_lora_rank} Dr={args.rope_dim} block={args.block_size} "
          f"q dtype={args.dtype} kv dtype={kv_dtype} device={args.device}")

    start = time.perf_counter()
    partials, views = run_ranks(problem)
    out, lse = merge_partials(partials)
    if out.is_cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start

    for rank, view in enumerate(views):
        print(f"rank {rank} row_lens: {view.row_lens.tolist()}")
    qlen = args.qlen
    print(f"{'row (b,t)':>10} {'global window':>14} | " + " ".join(f"r{r:<4}" for r in range(args.world)) + "| sum")
    row_lens = torch.stack([v.row_lens.cpu() for v in views])
    for row in range(min(args.show_rows, row_lens.shape[1])):
        b, t = divmod(row, qlen)
        visible = max(0, args.seq_lens[b] - qlen + 1 + t)
        cells = " ".join(f"{int(n):<5}" for n in row_lens[:, row])
        print(f"{f'({b},{t})':>10} {f'[0, {visible})':>14} | {cells}| {int(row_lens[:, row].sum())}")

    exact_out, exact_lse = problem.reference(torch.float64)
    low_out, _ = problem.reference(dtype)
    budget = 1e-4 if dtype == torch.float32 and kv_dtype == dtype else error_budget(exact_out, low_out, dtype)
    try:
        out_err = assert_close_special("out", out, exact_out, budget)
        lse_err = assert_close_special("lse", lse, exact_lse, max(budget, 1e-4))
    except AssertionError as failure:
        print(f"WRONG: {failure}")
        return False
    window_sums_ok = bool((row_lens.sum(0) == torch.tensor(
        [max(0, args.seq_lens[r // qlen] - qlen + 1 + r % qlen) for r in range(row_lens.shape[1])])).all())
    print(f"merged vs global reference: max |out err| {out_err:.2e}, max |lse err| {lse_err:.2e} "
          f"(budget {budget:.1e}); -inf/NaN positions match; rank lengths sum to the windows: {window_sums_ok}")
    print(f"time: {elapsed * 1e3:.1f} ms for {args.world} ranks' verify + merge (first call, includes warm-up)")
    return window_sums_ok


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ok = all([run_case(args, interleave) for interleave in args.interleave])
    print("\nOK" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
