"""Where a Gluon program's time goes: %globaltimer stamps at its phases.

    python benchmarks/probes/seesaw_timeline.py OUT_DIR [C1,C6,C3,C5,C6:2,C4@narrow,C4:3@narrow16]

``NAME[:N][@KERNEL]``: a benchmark config, at N segments (one piece per
program; one segment stores the final output, more store partials) or,
without N, with the schedule a step of it takes (the stream where the kernel
runs several pieces a program, unless ``MLA_DCP_STREAM=0``), on the seesaw
kernel (default), its fp8-products build (``products``: an e4m3 config,
VerifyConfig.fp8_products) or the narrow one (``narrow``/``narrow32``: 32
pairs per tile, ``narrow16``). A stream program's stamps are its last piece's; the
programs that ran no piece are left out.

Launches the kernel with a stamps buffer (its ``stamps_ptr`` hook, compiled
only then: ``helpers.stamp``), so that each program writes the global timer at: entry, after the dependent-launch
wait, after the first KV copies are issued (q's go out before them), after
q has landed (over an e4m3 cache: has been staged as fp16), when the first
score tile is ready (each seesaw warpgroup), at the loop's end, after the
seesaw's partial sums are exchanged and after the epilogue; plus the SM it ran on and its number of pairs (seesaw) or
tiles (narrow). Runs each config's first input and prints
per-phase medians, the per-program cost outside the loop, the gap between
consecutive programs on one SM, and the idle SMs at the end. Also times the
stamped and the committed kernel under a CUDA graph, so the stamps' own
cost is on record. Writes OUT_DIR/seesaw_timeline.json.
"""
import json
import math
import dataclasses
import pathlib
import statistics
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp._shapes import page_size_for
from mla_dcp.ops import launchers
from mla_dcp.ops.gluon_kernels import helpers, narrow, seesaw

SLOTS = helpers.STAMP_SLOTS.value
PHASES = ["entry", "after_wait", "kv_copies_issued", "q_landed", "L_first_scores", "R_first_scores", "L_loop_end",
          "R_loop_end", "L_sums", "R_sums", "L_epilogue_end", "R_epilogue_end"]
SMID, PAIRS = 12, 13   # for the narrow kernel, slot 13 holds its tiles

def quantiles(values):
    values = sorted(values)
    pick = lambda f: values[min(len(values) - 1, int(f * len(values)))]
    return {"p10": pick(0.1), "median": statistics.median(values), "p90": pick(0.9)}


def analyse(stamps, grid_programs, kind="seesaw"):
    s = stamps[:grid_programs].double()
    t0 = s[:, 0].min()
    us = (s - t0) / 1000.0
    us[:, SMID] = s[:, SMID]
    us[:, PAIRS] = s[:, PAIRS]
    two_sides = kind in SEESAW_KINDS
    # Each program's end: the later of its two warpgroups' epilogues.
    last = (torch.maximum(us[:, 10], us[:, 11]) if two_sides else us[:, 10]).tolist()
    rows = us.tolist()
    phases = {
        "wait": [r[1] - r[0] for r in rows],
        "issue_copies": [r[2] - r[1] for r in rows],
        "q_landed_after_kv_issue": [r[3] - r[2] for r in rows],
        "first_scores_after_q": [r[4] - r[3] for r in rows],
        # per pair of tiles (seesaw, L) or per tile (narrow)
        "loop_per_pair_L": [(r[6] - r[4]) / max(r[PAIRS] - 1, 1) for r in rows if r[PAIRS] > 1],
        "program": [e - r[0] for r, e in zip(rows, last)],
    }
    if two_sides:
        phases["sum_exchange_L"] = [r[8] - r[6] for r in rows]
        phases["epilogue_L"] = [r[10] - r[8] for r in rows]
        phases["epilogue_R"] = [r[11] - r[9] for r in rows]
    else:
        phases["epilogue"] = [r[10] - r[6] for r in rows]
    # Outside the loop: the program minus its pairs at the loop's per-pair rate.
    per_pair = statistics.median(phases["loop_per_pair_L"]) if phases["loop_per_pair_L"] else 0.0
    phases["outside_loop"] = [e - r[0] - (r[PAIRS] - 1) * per_pair for r, e in zip(rows, last)]
    by_sm = {}
    for r, e in zip(rows, last):
        by_sm.setdefault(int(r[SMID]), []).append((r[0], e))
    gaps = []
    for runs in by_sm.values():
        runs.sort()
        gaps += [b[0] - a[1] for a, b in zip(runs, runs[1:])]
    span = max(last)
    sm_ends = [max(e for _, e in runs) for runs in by_sm.values()]
    sm_busy = [sum(e - b for b, e in runs) for runs in by_sm.values()]
    return {
        "programs": grid_programs, "sms_used": len(by_sm), "span_us": span,
        "programs_per_sm": quantiles([len(v) for v in by_sm.values()]),
        "first_start_spread_us": quantiles([min(b for b, _ in runs) for runs in by_sm.values()]),
        "sm_end_us": quantiles(sm_ends), "sm_idle_at_end_us": quantiles([span - e for e in sm_ends]),
        "sm_busy_fraction": sum(sm_busy) / (len(by_sm) * span),
        "gap_between_programs_us": quantiles(gaps) if gaps else None,
        "phases_us": {k: quantiles(v) for k, v in phases.items() if v},
    }


def parse_spec(spec: str):
    """``NAME[:N][@KERNEL]`` -> (config name, forced segments or None, kernel kind, pairs per tile)."""
    left, _, kernel = spec.partition("@")
    name, _, forced = left.partition(":")
    kernel = kernel or "seesaw"
    if kernel in SEESAW_KINDS:
        return name, int(forced) if forced else None, kernel, helpers.BLOCK_M
    if kernel in ("narrow", "narrow32", "narrow16"):
        return name, int(forced) if forced else None, "narrow", 16 if kernel == "narrow16" else 32
    raise SystemExit(f"kernel must be seesaw, products, narrow, narrow32 or narrow16, got {kernel!r} in {spec!r}")


# Kernel kinds of a spec: the seesaw's two builds, the narrow kernel; and the module each launches from.
SEESAW_KINDS = ("seesaw", "products")
MODULES = {"seesaw": seesaw, "products": seesaw, "narrow": narrow}


def launcher(module, kind, cfg, ns, outputs, finalize, page, block_m, stamps=None):
    """A launch of ``module``'s kernel with one view's inputs (``stamps``: the buffer its timeline stamps go to)."""
    if kind in SEESAW_KINDS:
        products = kind == "products"
        return lambda v, q, kv, kv_scale: module.launch(q, kv, kv_scale, v.row_lens, v.page_table, v.work, cfg.qlen,
                                                        512, cfg.scale, outputs, finalize, page, stamps=stamps,
                                                        fp8_products=products)
    return lambda v, q, kv, kv_scale: module.launch(q, kv, kv_scale, v.row_lens, v.page_table, v.work, cfg.qlen, 512,
                                                    cfg.scale, outputs, finalize, page, block_m, stamps=stamps)


def attention_case(name: str, forced):
    """A benchmark config's inputs as (view, q, kv, kv scale or None), its segment count (its
    tuned one unless ``forced``), whether the kernel finalizes, the output
    buffers the attention kernel writes, and the cache's page size. Unforced,
    the view is the one a step builds (the stream schedule where it applies)."""
    case = bench.make_case(name, torch.bfloat16)
    q = case.inputs[0][2]
    ns = forced or mla_dcp.num_segments_for(case.cfg, q.shape[0] // case.cfg.qlen, q.device)
    cfg = dataclasses.replace(case.cfg, num_segments=ns) if forced else case.cfg
    views = [(mla_dcp.build_view(cfg, s, t), q, kv, kv_scale) for s, t, q, kv, kv_scale in case.inputs]
    view, q, kv, _ = views[0]
    finalize = view.work.shape[0] == view.page_table.shape[0]   # one item per request, as verify
    outputs = launchers.attention_outputs(q, cfg.kv_lora_rank, view.work.shape[0], cfg.qlen, finalize)
    return cfg, views, ns, finalize, outputs, page_size_for(kv.shape[1])


def main():
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = {spec: parse_spec(spec) for spec in (sys.argv[2] if len(sys.argv) > 2 else "C1,C6,C3,C5").split(",")}
    result = {"env": bench.environment(), "ceilings": bench.measure_ceilings(), "configs": {}}
    for spec, (name, forced, kind, block_m) in specs.items():
        cfg, views, ns, finalize, outputs, page = attention_case(name, forced)
        view, q, kv, kv_scale = views[0]
        if kind in SEESAW_KINDS and view.work.shape[1] != 3:
            raise SystemExit(f"{spec}: the seesaw runs one piece per program; a step of {name} takes the stream "
                             f"schedule (give a segment count, {name}:N, for one piece per program)")
        heads = q.shape[1]
        programs = math.ceil(cfg.qlen * heads / block_m) * view.work.shape[0]
        stamps = torch.zeros(programs, SLOTS, dtype=torch.int64, device=q.device)
        run_stamped = launcher(MODULES[kind], kind, cfg, ns, outputs, finalize, page, block_m, stamps)
        for _ in range(3):   # compile, then warm caches; the last launch's stamps are kept
            run_stamped(view, q, kv, kv_scale)
        torch.cuda.synchronize()
        stamps = stamps.cpu()
        torch.save(stamps, out_dir / f"stamps_{spec.replace(':', '_').replace('@', '_')}.pt")
        ran = stamps[stamps[:, 10] > 0]   # a stream's programs past its runs run no piece
        report = analyse(ran, ran.shape[0], kind)
        report.update(segments=ns, kernel=kind, pairs_per_tile=block_m, work_columns=view.work.shape[1])
        timings = {}
        for turn in range(2):
            for label, buffer in (("committed", None), ("stamped", torch.zeros_like(stamps, device=q.device))):
                run = launcher(MODULES[kind], kind, cfg, ns, outputs, finalize, page, block_m, buffer)
                fns = [lambda args=args, run=run: run(*args) for args in views]
                timings.setdefault(label, []).append(bench.time_fn(bench._rotating(bench._graphed(fns))) * 1e6)
        report["graph_us"] = timings
        result["configs"][spec] = report
        print(spec, json.dumps(report, indent=1), flush=True)
        (out_dir / "seesaw_timeline.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
