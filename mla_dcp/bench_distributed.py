"""`python -m mla_dcp.bench --distributed --ranks N`: a DCP layer over real ranks.

Per configuration and per merge method: this rank's `verify` and the cross-rank
merge (`mla_dcp.distributed.merge`), timed over one process per rank (NCCL on
GPUs, gloo on CPUs), with the merge's payload at the latent width (Dl = 512)
and at 128 (the width after a value up-projection; stage 5 takes any width),
next to each collective's bandwidth measured in the same run on a large
buffer, and the floor that bandwidth implies for each payload. Under
`torchrun --nproc-per-node N -m mla_dcp.bench --distributed` the launcher's
processes are used instead of spawning.

Each rank holds the configuration's local length per request (the same work
as one rank of the single-GPU benchmark). Times are the slowest rank's median.
Writes results.json and results.md (and merge.png where matplotlib is
installed) under `--out`.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import torch

METHODS = ("reduce_scatter", "all_reduce", "all_to_all")
WIDTHS = (512, 128)
# (B, q, H, local L, block): the single-GPU benchmark's shapes, and a small one for CPUs and tests.
SHAPES = {"C1": (32, 3, 128, 8192, 64), "C3": (8, 4, 64, 32768, 64), "C4": (64, 2, 16, 4096, 64),
          "tiny": (2, 3, 8, 96, 16)}
DL, DR, SCALE = 512, 64, 192 ** -0.5
# Large enough that a collective runs at its bandwidth, not its latency.
_BANDWIDTH_BYTES = {"cuda": 256 << 20, "cpu": 8 << 20}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_us(fn, device: torch.device, iters: int) -> float:
    """Median per-call wall time (us) of ``fn`` on this rank, then the slowest
    rank's (a collective ends when its slowest participant does)."""
    import torch.distributed as dist

    fn()
    _sync(device)
    samples = []
    for _ in range(iters):
        dist.barrier()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        samples.append((time.perf_counter() - start) * 1e6)
    slowest = torch.tensor([statistics.median(samples)], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())


def collective_bandwidths(world: int, device: torch.device, iters: int) -> dict:
    """Algorithm bandwidth (bytes of the per-rank input / time) of each
    collective the merge methods use, on a large float32 buffer, and NCCL's
    bus bandwidth convention beside it."""
    import torch.distributed as dist

    from mla_dcp.distributed import reduce_scatter_single

    size = _BANDWIDTH_BYTES[device.type] // 4 // world * world
    src = torch.ones(size, dtype=torch.float32, device=device)
    out_rs = torch.empty(size // world, dtype=torch.float32, device=device)
    out_a2a = torch.empty_like(src)
    times = {
        "all_reduce": _timed_us(lambda: dist.all_reduce(src), device, iters),
        "reduce_scatter": _timed_us(lambda: reduce_scatter_single(out_rs, src), device, iters),
        "all_to_all": _timed_us(lambda: dist.all_to_all_single(out_a2a, src), device, iters),
    }
    nbytes = src.numel() * 4
    bus = {"all_reduce": 2 * (world - 1) / world, "reduce_scatter": (world - 1) / world,
           "all_to_all": (world - 1) / world}
    return {name: {"bytes": nbytes, "us": t, "alg_bytes_per_s": nbytes / (t * 1e-6),
                   "bus_bytes_per_s": bus[name] * nbytes / (t * 1e-6)} for name, t in times.items()}


def merge_payload_bytes(method: str, rows: int, heads: int, width: int, world: int) -> int:
    """Bytes of the per-rank input of the merge's main collective (float32 on
    the wire): the rescaled partial for reduce_scatter / all_reduce, the
    partial with its LSE packed alongside for all_to_all."""
    return rows * heads * (width + (1 if method == "all_to_all" else 0)) * 4


def _case(name: str, world: int, rank: int, device: torch.device):
    import mla_dcp

    batch, qlen, heads, local, block = SHAPES[name]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=block, max_model_len=world * local,
                               dcp_world_size=world, dcp_rank=rank, kv_lora_rank=DL, rope_dim=DR,
                               softmax_scale=SCALE)
    g = torch.Generator().manual_seed(rank)
    blocks = batch * cfg.min_table_blocks
    kv = torch.randn(blocks, block, DL + DR, generator=g).to(device, dtype)
    table = torch.arange(blocks, dtype=torch.int32).view(batch, -1).to(device)
    torch.manual_seed(0)      # the same queries on every rank (the heads are all-gathered before attention)
    q = torch.randn(batch * qlen, heads, DL + DR).to(device, dtype)
    seq_lens = torch.full((batch,), world * local, dtype=torch.int32, device=device)
    return cfg, seq_lens, table, q, kv


def _rank_main(rank: int, world: int, options: dict) -> None:
    import mla_dcp
    from mla_dcp import distributed

    device = torch.device("cuda", torch.cuda.current_device()) if options["device"] == "cuda" else \
        torch.device("cpu")
    iters = options["iters"]
    result = {"world": world, "device": options["device"], "backend": options["backend"],
              "collectives": collective_bandwidths(world, device, iters), "rows": []}
    for name in options["configs"]:
        cfg, seq_lens, table, q, kv = _case(name, world, rank, device)
        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
        verify_us = _timed_us(lambda: mla_dcp.verify(cfg, view, q, kv), device, iters)
        out, lse = mla_dcp.verify(cfg, view, q, kv)
        for width in WIDTHS:
            part = out[..., :width].contiguous()
            for method in METHODS:
                merge_us = _timed_us(lambda: distributed.merge(part, lse, method=method), device, iters)
                payload = merge_payload_bytes(method, out.shape[0], out.shape[1], width, world)
                floor_us = payload / result["collectives"][method]["alg_bytes_per_s"] * 1e6
                result["rows"].append({"config": name, "method": method, "width": width, "verify_us": verify_us,
                                       "merge_us": merge_us, "payload_bytes": payload, "floor_us": floor_us,
                                       "merge_over_floor": merge_us / floor_us})
    if rank == 0:
        out_dir = pathlib.Path(options["out"])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "results.json").write_text(json.dumps(result, indent=1))
        (out_dir / "results.md").write_text(markdown(result))
        plot(result, out_dir / "merge.png")
        print(markdown(result))


def markdown(result: dict) -> str:
    lines = [f"# DCP layer over {result['world']} ranks ({result['device']}, {result['backend']})", "",
             "Collective bandwidth measured in the same run (per-rank input bytes / time; bus bandwidth in "
             "NCCL's convention):", "", "| collective | MiB | us | GB/s (alg) | GB/s (bus) |", "| --- | ---: | ---: | ---: | ---: |"]
    for name, c in result["collectives"].items():
        lines.append(f"| {name} | {c['bytes'] / 2 ** 20:.0f} | {c['us']:.1f} | {c['alg_bytes_per_s'] / 1e9:.1f} | "
                     f"{c['bus_bytes_per_s'] / 1e9:.1f} |")
    lines += ["", "Per layer, the slowest rank's median (us): this rank's verify, the merge, the floor its payload "
              "implies at the bandwidth above.", "",
              "| config | method | width | verify | merge | payload KiB | floor | merge / floor |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in result["rows"]:
        lines.append(f"| {r['config']} | {r['method']} | {r['width']} | {r['verify_us']:.1f} | {r['merge_us']:.1f} | "
                     f"{r['payload_bytes'] / 1024:.0f} | {r['floor_us']:.1f} | {r['merge_over_floor']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: pathlib.Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = result["rows"]
    labels = [f"{r['config']}\n{r['method']}\n{r['width']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6), 3.5))
    ax.bar(range(len(rows)), [r["merge_us"] for r in rows], label="merge")
    ax.plot(range(len(rows)), [r["floor_us"] for r in rows], "k_", markersize=14, label="bandwidth floor")
    ax.set_xticks(range(len(rows)), labels, fontsize=6)
    ax.set_ylabel("us per layer"); ax.set_yscale("log")
    ax.set_title(f"DCP merge over {result['world']} ranks ({result['backend']})", fontsize=9)
    ax.legend(fontsize=7); fig.tight_layout(); fig.savefig(path, dpi=120); plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mla_dcp.bench --distributed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=2, help="processes to spawn (ignored under torchrun)")
    parser.add_argument("--configs", default="C1,C3,C4", help="comma-separated subset of " + ",".join(SHAPES))
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--iters", type=int, default=20, help="timed calls per measurement")
    parser.add_argument("--out", default="benchmarks/latest/distributed")
    args = parser.parse_args(argv)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in SHAPES]
    if unknown:
        parser.error(f"unknown configs {unknown}; choose from {list(SHAPES)}")
    if args.ranks < 1 or args.iters < 1:
        parser.error(f"--ranks and --iters must be >= 1, got {args.ranks} and {args.iters}")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    for name in configs:
        heads = SHAPES[name][2]
        world = int(os.environ.get("WORLD_SIZE", args.ranks))
        if heads % world:
            parser.error(f"{name} has {heads} heads, not divisible by {world} ranks (the head-slicing merges)")
    options = {"configs": configs, "device": device, "iters": args.iters, "out": args.out,
               "backend": "nccl" if device == "cuda" else "gloo"}
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:       # under torchrun
        import torch.distributed as dist

        if device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(options["backend"])
        try:
            _rank_main(dist.get_rank(), dist.get_world_size(), options)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        return 0
    if device == "cuda" and torch.cuda.device_count() < args.ranks:
        parser.error(f"--ranks {args.ranks} needs as many GPUs, found {torch.cuda.device_count()}")
    from mla_dcp.testing import launch_group

    launch_group(_rank_main, args.ranks, options, backend=options["backend"])
    print(f"wrote {pathlib.Path(args.out) / 'results.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
