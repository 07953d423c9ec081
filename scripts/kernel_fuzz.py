"""Random steps through the kernels, against the CPU oracles.

    TRITON_INTERPRET=1 python scripts/kernel_fuzz.py [SECONDS] [SEED]      # the Triton kernels on the CPU
    python scripts/kernel_fuzz.py [SECONDS] [SEED] --device cuda           # the GPU's kernels (Gluon on sm_90)
    ... [--wide]: the models' latent widths (128, 512; rope 0, 64) on smaller steps

For a kernel change, beside the tests' fixed cases: until SECONDS (default 300) have passed, draws
a problem (1-4 requests of random lengths up to a random static bound, 0 and the bound included;
q, heads, widths, DCP world size and interleave, block sizes that are pages and that are not,
fp32 or fp16 queries (bf16 too on a GPU: the interpreter's bf16 dot is wrong), 16-bit or e4m3
caches, a NaN key some rows see) and one of three routes:

* ``causal``: build_view, then the merged-attention launcher (attention, segment merge) against
  verify's CPU path on the same inputs, causal or not, a drawn segment count or batch-invariant
  segments, e4m3 caches with or without fp8 products (on the CPU half of them on a GPU's tile
  plan: rows, KV tile, warps, stages, descriptor loads); every rank's partials merged against
  attention in global coordinates;
* ``tree``: the block kernel over random token trees (parents drawn per request, context-rooted
  nodes included) and context partials holding -inf, +inf, against its op's CPU kernel;
* ``sparse``: the sparse kernel over random index lists (-1 entries, positions past a row's
  window), batch-invariant or not, against its op's CPU kernel.

Prints each failing draw (its seed reproduces it: ``--only SEED``) and a count; exits 1 on any.

    TRITON_INTERPRET=1 python scripts/kernel_fuzz.py [SECONDS] [SEED] --builds

also builds every Triton kernel the draws launched, with the constants and argument types each
launch had, for sm_90 (ptxas ships with Triton; no GPU): a build the interpreter cannot fail (an
e4m3 tl.dot narrower than 32, say) fails here, with the first draw that launched it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import random
import sys
import time

import torch

import mla_dcp
from mla_dcp import pure
from mla_dcp.ops import fast_launch, launchers, library, tiles
from mla_dcp.testing import assert_close_special, exact_e4m3_interpreter, make_problem, merge_partials, poison_key

ROUTES = ("causal", "causal", "tree", "sparse")


def draw(seed: int, device: str = "cpu", wide: bool = False) -> dict:
    """One random case (``wide``: the models' latent widths, 128 or 512 with 0 or 64 rope columns;
    on the CPU on fewer heads, rows and keys, so that the interpreter keeps up; on a GPU up to 128
    heads and thousands of keys, the shapes its Gluon kernels take; 8 and 32 heads are what a rank
    holds of Kimi-K2's 64 and DeepSeek-V3's 128 under tensor parallelism)."""
    case = _draw(seed, device)
    if wide:
        r = random.Random(seed + 7)
        cpu = device == "cpu"
        qlen = min(case["qlen"], 4 if cpu else 6)
        bound = max(min(case["bound"], 120), qlen) if cpu else max(case["bound"] * 20, qlen)
        case.update(dl=r.choice([128, 512]), dr=r.choice([0, 64]), qlen=qlen, bound=bound,
                    heads=r.choice([1, 2, 3, 8] if cpu else [1, 3, 8, 16, 20, 32, 64, 128]),
                    lens=[min(n, bound) if cpu else min(n * 20, bound) for n in case["lens"]])
    if device == "cpu" and case["route"] == "causal":
        # Half the interpreter's causal draws take a GPU's tiles (the CPU's own plan is the smallest): the
        # kernels' numbers at those shapes, and with --builds their sm_90 builds as a GPU launches them.
        r = random.Random(seed + 13)
        if r.random() < 0.5:
            widest = 32 if case["dtype"] == torch.float32 else 64
            case["plan"] = (r.choice([m for m in (16, 32, 64) if m <= widest]), r.choice([16, 32, 64]),
                            r.choice([4, 8]), r.choice([1, 2, 3]), r.random() < 0.5)
    return case


def _draw(seed: int, device: str) -> dict:
    r = random.Random(seed)
    route = r.choice(ROUTES)
    qlen = {"causal": r.randint(1, 6), "tree": r.randint(1, 12), "sparse": r.randint(1, 6)}[route]
    bound = r.randint(qlen, 300 if route == "causal" else 200)
    dtype = r.choice([torch.float32, torch.float16] + ([torch.bfloat16] if device != "cpu" else []))
    return dict(seed=seed, device=device, route=route, qlen=qlen, heads=r.choice([1, 2, 3, 5, 8]), dl=r.choice([16, 24, 32]),
                dr=r.choice([0, 8, 16]), world=r.randint(1, 3), interleave=r.randint(1, 3),
                block=r.choice([1, 2, 3, 8, 16, 24, 64]), bound=bound,
                lens=[r.choice([0, r.randint(0, bound), bound, min(bound, r.randint(0, qlen + 3))])
                      for _ in range(r.randint(1, 4))],
                dtype=dtype, kv=r.choice([None, torch.float8_e4m3fn]) if dtype != torch.float32 else None,
                causal=r.random() < 0.75, invariant=r.random() < 0.3, segments=r.choice([None, 1, 2, 5]),
                nan=r.random() < 0.4, topk=r.choice([1, 7, 40, 70]), products=r.random() < 0.5)


def latent_magnitudes(shard, dl: int) -> torch.Tensor:
    """|the latent part| of every cached row of the shard, as stored (its scale not applied), on the
    CPU, [slots, dl]; the never-read NaN padding as 0."""
    return shard.kv_cache.float()[..., :dl].abs().nan_to_num(0, 0, 0).cpu().flatten(0, 1)


def fp8_accumulation(problem, magnitudes: torch.Tensor, dl: int, scale: float) -> float:
    """What a GPU's e4m3 products may move an LSE by against the oracle's float32 sums: Hopper's fp8
    tensor cores keep about 14 bits of a product sum as they accumulate (DeepSeek-V3's report), so a
    score may be off by 2^-14 of its terms' magnitudes (2^-12 here, for the rounding of q and K to
    e4m3 and the sums' length), and an LSE by the largest such score error. ``magnitudes``: the
    shard's :func:`latent_magnitudes`."""
    q = problem.q[..., :dl].float().abs().nan_to_num(0, 0, 0).cpu().flatten(0, 1)
    keys = magnitudes
    if problem.kv_scale is not None:
        keys = keys * problem.kv_scale.float().cpu()
    return 2.0 ** -12 * scale * (q @ keys.T).max().item() if q.numel() and keys.numel() else 0.0


def largest_value(problem, magnitudes: torch.Tensor) -> float:
    """max |v| over a shard's :func:`latent_magnitudes`, the cache's scale applied."""
    largest = magnitudes.max().item() if magnitudes.numel() else 0.0
    return largest * (problem.kv_scale.float().item() if problem.kv_scale is not None else 1.0)


def check(case: dict) -> None:
    r = random.Random(case["seed"] + 1)
    problem = make_problem(case["lens"], qlen=case["qlen"], num_heads=case["heads"], kv_lora_rank=case["dl"],
                           rope_dim=case["dr"], world=case["world"], interleave=case["interleave"],
                           block_size=case["block"], max_model_len=case["bound"], dtype=case["dtype"],
                           kv_dtype=case["kv"] if case["route"] == "causal" else None,
                           num_segments=None if case["invariant"] else case["segments"],
                           causal=case["causal"] or case["route"] != "causal", seed=case["seed"] % 997,
                           device=case["device"])
    lens, qlen, heads, dl = case["lens"], case["qlen"], case["heads"], case["dl"]
    if case["nan"] and max(lens) > 0:
        b = max(range(len(lens)), key=lambda i: lens[i])
        poison_key(problem, b, r.randrange(lens[b]), slice(0, 2), float("nan"))
    eps = {torch.float32: 1e-6, torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}[case["dtype"]]
    low = 4e-3 if case["dtype"] == torch.float16 else 3e-2 if case["dtype"] == torch.bfloat16 else 1e-4
    cpu = lambda args: tuple(a.cpu() if isinstance(a, torch.Tensor) else a for a in args)   # noqa: E731
    g = torch.Generator().manual_seed(case["seed"] % 991)

    def close(got, want, out_eps, lse_extra=0.0, out_extra=0.0):
        finite = want[0][torch.isfinite(want[0])].float()
        assert_close_special("out", got[0], want[0],
                             out_eps * max(1.0, finite.abs().max().item() if finite.numel() else 1) + out_extra)
        assert_close_special("lse", got[1], want[1],
                             1e-5 * max(1.0, want[1].nan_to_num(0, 0, 0).abs().max().item()) + lse_extra)

    if case["route"] == "causal":
        partials = []
        products = case["products"] and case["kv"] is not None
        for shard in problem.shards:
            cfg = shard.cfg
            if case["invariant"]:
                cfg = dataclasses.replace(cfg, batch_invariant=True, invariant_segment_tokens=128)
            if products:
                cfg = dataclasses.replace(cfg, fp8_products=True)
            view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
            plan = case.get("plan")
            with tiles.forced_plan(tiles.AttentionPlan(*plan[:4], tma=plan[4])) if plan else contextlib.nullcontext():
                got = launchers.merged_attention(problem.q, shard.kv_cache, problem.kv_scale, view.row_lens,
                                                 view.page_table, view.work, view.segments, qlen, dl, cfg.scale,
                                                 cfg.schedule_chunk, products)
            inputs = cpu((problem.seq_lens, shard.block_table, problem.q, shard.kv_cache, problem.kv_scale))
            oracle = mla_dcp.verify(cfg, mla_dcp.build_view(cfg, *inputs[:2]), *inputs[2:])
            # fp8 products: the same roundings as the oracle's, but a P an accumulation order puts on
            # the other side of an e4m3 rounding moves the output by up to an e4m3 step of its weight.
            # On a GPU its scores may be off by up to delta (fp8_accumulation), which moves each weight
            # by up to delta of itself, so out (a weighted mean of values) by up to 2 delta max|v|.
            delta = out_extra = 0.0
            if products and case["device"] != "cpu":
                magnitudes = latent_magnitudes(shard, dl)
                delta = fp8_accumulation(problem, magnitudes, dl, cfg.scale)
                out_extra = 2 * delta * largest_value(problem, magnitudes)
            close(cpu(got), oracle, 2e-2 if products else low, delta, out_extra)
            partials.append(got)
        out, lse = merge_partials(partials)
        want = problem.reference()
        tol = (1e-4 if case["dtype"] == torch.float32 else 2e-2 if case["dtype"] == torch.float16 else 6e-2
               ) if not products else 1.5e-1      # fp8 products: e4m3 q and P, against float64
        assert_close_special("merged out", out, want[0], tol * max(1.0, want[0].abs().nan_to_num(0).max().item()))
        assert_close_special("merged lse", lse, want[1], tol * 10)
    elif case["route"] == "tree":
        batch = len(lens)
        parents = torch.tensor([[r.choice([-1, -2]) if i == 0 else r.randint(-1, i - 1) for i in range(qlen)]
                                for _ in range(batch)])
        mask = mla_dcp.tree_mask(parents).to(case["device"])
        for shard in problem.shards:
            cfg = shard.cfg
            out = torch.randn(batch * qlen, heads, dl, generator=g).to(case["dtype"]).to(case["device"])
            lse = torch.randn(batch * qlen, heads, generator=g).to(case["device"])
            if batch * qlen > 2:
                lse[1, 0], lse[2, -1] = float("-inf"), float("inf")
            args = (problem.q, shard.kv_cache, problem.kv_scale, out, lse, shard.block_table, mask, problem.seq_lens,
                    qlen, case["world"], cfg.dcp_rank, case["interleave"], cfg.max_model_len, dl, cfg.scale)
            close(cpu(launchers.block_attention(*args)), library.block_attention(*cpu(args)), 4 * eps)
    else:
        topk = case["topk"]
        indices = torch.full((len(lens) * qlen, topk), -1, dtype=torch.int32, device=case["device"])
        for b, n in enumerate(lens):
            for t in range(qlen):
                pool = max(n - (qlen - 1 - t), 0) + r.randint(0, 3)      # a few past the row's window
                chosen = torch.randperm(max(pool, 1), generator=g)[:topk]
                indices[b * qlen + t, torch.randperm(topk, generator=g)[:chosen.numel()]] = chosen.to(indices)
        for shard in problem.shards:
            cfg = shard.cfg
            row_lens = pure.verify_row_lens(problem.seq_lens, qlen, case["world"], cfg.dcp_rank, case["interleave"])
            table = pure.expand_page_table(shard.block_table, case["block"], cfg.max_local_len)
            args = (problem.q, shard.kv_cache, None, row_lens, table, indices, qlen, case["world"], cfg.dcp_rank,
                    case["interleave"], dl, cfg.scale)
            close(cpu(launchers.sparse_attention(*args, invariant=case["invariant"])),
                  library.sparse_attention(*cpu(args)), 4 * eps)


_TORCH_TO_TRITON = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                    torch.float8_e4m3fn: "fp8e4nv", torch.float8_e4m3fnuz: "fp8e4b8", torch.int32: "i32",
                    torch.int64: "i64", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


def launch_spec(kernel, args: tuple, options: dict) -> dict:
    """A recorded launch (``fast_launch.recording``) as what its build depends on: the kernel, each
    argument's type (a tensor's dtype, a descriptor's box, an integer's width) or a constant's value,
    and the compile options."""
    names = list(inspect.signature(kernel.fn).parameters)
    values = {**dict(zip(names, args)), **{k: v for k, v in options.items() if k in names}}
    described = {}
    for name, value in values.items():
        if isinstance(value, torch.Tensor):
            described[name] = ["ptr", _TORCH_TO_TRITON[value.dtype]]
        elif hasattr(value, "block_shape") and hasattr(value, "base"):
            described[name] = ["desc", _TORCH_TO_TRITON[value.base.dtype], list(value.block_shape)]
        else:
            described[name] = ["value", value if not isinstance(value, torch.dtype) else str(value)]
    return {"module": kernel.fn.__module__, "name": kernel.fn.__name__, "args": described,
            "options": {k: v for k, v in options.items() if k in ("num_warps", "num_stages", "num_ctas", "maxnreg")}}


def build_specs(specs: list) -> list:
    """Build each launch_spec for sm_90 (in a process without TRITON_INTERPRET): [(index, error)]."""
    import importlib

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gluon_compile
    failures = []
    for index, spec in enumerate(specs):
        kernel = getattr(importlib.import_module(spec["module"]), spec["name"])
        sig, consts = {}, {}
        for param in kernel.params:
            kind = spec["args"].get(param.name)
            if param.is_constexpr:
                consts[param.name] = kind[1] if kind is not None else param.default
            elif kind is None or kind[0] == "value" and (kind[1] is None or type(kind[1]) is int and kind[1] == 1):
                # An argument left out, None, or an integer 1: Triton passes it as a constant.
                consts[param.name] = None if kind is None else kind[1]
            elif kind[0] == "ptr":
                sig[param.name] = "*" + kind[1]
            elif kind[0] == "desc":
                sig[param.name] = f"tensordesc<{kind[1]}{kind[2]}>"
            elif isinstance(kind[1], bool):
                sig[param.name] = "i1"
            elif isinstance(kind[1], int):
                sig[param.name] = "i32" if -2 ** 31 <= kind[1] < 2 ** 31 else "i64"
            else:
                sig[param.name] = "fp32"
        sig.update({name: "constexpr" for name in consts})
        try:
            gluon_compile.build_sm90(kernel, sig, consts, spec["options"])
        except Exception as error:       # every failing build is reported, then the next
            failures.append((index, f"{type(error).__name__}: {str(error)[-600:]}"))
    return failures


def _build_recorded(specs: dict) -> int:
    """Build the recorded launches' kernels in a fresh interpreter without TRITON_INTERPRET; print
    each failure with the first draw that launched it."""
    import subprocess
    import tempfile
    listed = list(specs.items())
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump([json.loads(key) for key, _ in listed], handle)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, os.path.abspath(__file__), "--build-specs", handle.name], env=env,
                         capture_output=True, text=True)
    os.unlink(handle.name)
    if run.returncode not in (0, 1):
        print(run.stderr[-3000:])
        return 1
    failures = json.loads(run.stdout.strip().splitlines()[-1])
    for index, error in failures:
        key, seed = listed[index]
        spec = json.loads(key)
        print(f"BUILD FAIL seed {seed}: {spec['name']} {spec['args']} {spec['options']}: {error}", flush=True)
    print(f"{len(listed)} distinct builds for sm_90, {len(failures)} failed")
    return 1 if failures else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["--build-specs"]:
        with open(argv[1]) as handle:
            failures = build_specs(json.load(handle))
        print(json.dumps(failures))
        return 1 if failures else 0
    device = "cpu"
    if "--device" in argv:
        at = argv.index("--device")
        device, argv = argv[at + 1], argv[:at] + argv[at + 2:]
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print("on the CPU, run under TRITON_INTERPRET=1 (or pass --device cuda on a GPU)", file=sys.stderr)
        return 2
    wide, builds = "--wide" in argv, "--builds" in argv
    argv = [a for a in argv if a not in ("--wide", "--builds")]
    if builds and device != "cpu":
        print("--builds records the launches under the interpreter (the CPU)", file=sys.stderr)
        return 2
    if argv[:1] == ["--only"]:
        seeds, seconds = [int(argv[1])], float("inf")
    else:
        seconds = float(argv[0]) if argv else 300.0
        rng = random.Random(int(argv[1]) if len(argv) > 1 else 0)
        seeds = iter(lambda: rng.randrange(1 << 30), None)
    started, count, failed, specs = time.time(), 0, 0, {}
    # The interpreter's own e4m3 reads NaN as a number; a GPU's conversions are its own.
    with exact_e4m3_interpreter() if device == "cpu" else contextlib.nullcontext():
        for seed in seeds:
            if time.time() - started > seconds:
                break
            case = draw(seed, device, wide)
            count += 1
            try:
                with fast_launch.recording() as records:
                    check(case)
            except Exception as error:          # every failure is reported with its draw, then the next
                failed += 1
                print(f"FAIL seed {seed}: {case}: {type(error).__name__}: {str(error)[:400]}", flush=True)
            if builds:
                for kernel, _grid, args, options in records:
                    specs.setdefault(json.dumps(launch_spec(kernel, args, options), sort_keys=True), seed)
    print(f"{count} draws, {failed} failed, {time.time() - started:.0f} s")
    if builds:
        failed += _build_recorded(specs)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
