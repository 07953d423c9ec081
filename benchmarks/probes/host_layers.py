"""Host time of each layer of an eager verify step, outermost to innermost.

    python benchmarks/probes/host_layers.py OUT_DIR [C7 C4 R1 ...]

For each config: the whole step, build_view, verify, then each layer below
verify called directly with the same arguments (validation, the op-or-
launcher entry, the launcher, its allocations, its plan's replay, the
compiled kernel's C launch), and the same for build_view's metadata launch;
beside them, torch.empty and an empty kernel's C launch with and without
PDL. Each figure: wall time per call of 2,000 back-to-back calls, no
synchronisation between them (the GPU work of these configs is below the
host's, so the host is what is timed). A layer's time minus the one below it
is what that layer adds. Writes OUT_DIR/host_layers.json.
"""
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

import mla_dcp
from mla_dcp import api, bench
from mla_dcp.ops import fast_launch, launchers
from mla_dcp.ops import library as ops
from mla_dcp.ops.triton_kernels import helpers


def per_call_us(fn):
    return bench.host_time(fn, calls=2000) * 1e6


@triton.jit
def _empty_kernel(x_ptr, n, PDL: tl.constexpr):
    helpers.after_previous_kernel(PDL)
    if tl.program_id(0) < 0:
        tl.store(x_ptr, n)


def only_replay(plans):
    """The one replay a plan cache holds after one layout's call."""
    replays = [r for r in plans.values() if r is not None]
    return replays[-1] if replays else None


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    names = sys.argv[2:] or ["C7", "C4", "R1"]
    result = {"env": bench.environment(), "us_per_call": {}}
    x = torch.zeros(4, dtype=torch.int32, device="cuda")
    common = {
        "torch.empty [1024] int32": lambda: torch.empty(1024, dtype=torch.int32, device=x.device),
        "empty kernel, launch()": lambda: fast_launch.launch(_empty_kernel, (1,), x, 3, PDL=False),
        "empty kernel, launch() PDL": lambda: fast_launch.launch(_empty_kernel, (1,), x, 3, PDL=True,
                                                                  launch_pdl=True),
        "current stream": lambda: torch._C._cuda_getCurrentRawStream(0),
    }
    rows = {}
    for label, fn in common.items():
        rows[label] = round(per_call_us(fn), 2)
        print(f"{label:44s} {rows[label]:8.2f} us", flush=True)
    for pdl in (False, True):
        entry = next(e for k, e in fast_launch._ENTRIES.items()
                     if k[0] == id(_empty_kernel) and (("PDL", pdl) in k[3]))
        stream = torch._C._cuda_getCurrentRawStream(0)
        label = f"empty kernel, entry (C launcher){' PDL' if pdl else ''}"
        rows[label] = round(per_call_us(lambda: entry((1,), stream, (x, 3))), 2)
        print(f"{label:44s} {rows[label]:8.2f} us", flush=True)
    result["us_per_call"]["common"] = rows

    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        step = bench.step_fns(case)[0]
        fast_launch.clear()
        with torch.inference_mode():
            step()
            view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
            facts = api._facts(cfg)
            num_items, programs = api._schedule_shape_memo(cfg, seq_lens.shape[0], seq_lens.device, q.dtype,
                                                           kv.dtype)
            meta_args = (seq_lens, cfg.qlen, cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.causal,
                         facts.page_size, facts.max_pages, num_items, facts.schedule_chunk, programs)
            attn_args = (q, kv, scale, view.row_lens, view.page_table, view.work, view.segments, cfg.qlen,
                         cfg.kv_lora_rank, facts.scale, facts.schedule_chunk, cfg.fp8_products)
            single = view.work.shape[0] == view.page_table.shape[0]
            outputs = launchers.attention_outputs(q, cfg.kv_lora_rank, view.work.shape[0], cfg.qlen, single)
            attn_replay = only_replay(launchers._ATTENTION_PLANS)
            merge_replay = only_replay(launchers._MERGE_PLANS)
            meta_replay = only_replay(launchers._METADATA_PLANS)
            attn_sources = (q, kv, scale, view.row_lens, view.page_table, view.work, *outputs,
                            facts.scale * launchers._LOG2E)
            pieces = {
                "step (build_view + verify)": step,
                "build_view": lambda: mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype),
                "  _facts + _schedule_shape_memo": lambda: (api._facts(cfg), api._schedule_shape_memo(
                    cfg, seq_lens.shape[0], seq_lens.device, q.dtype, kv.dtype)),
                "  ops.stage.step_metadata": lambda: ops.stage.step_metadata(*meta_args),
                "  launchers.step_metadata": lambda: launchers.step_metadata(*meta_args),
                "verify": lambda: mla_dcp.verify(cfg, view, q, kv, scale),
                "  _validate_verify": lambda: api._validate_verify(cfg, view, q, kv, scale),
                "  ops.stage.merged_attention": lambda: ops.stage.merged_attention(*attn_args),
                "  launchers.merged_attention": lambda: launchers.merged_attention(*attn_args),
                "    attention_outputs": lambda: launchers.attention_outputs(
                    q, cfg.kv_lora_rank, view.work.shape[0], cfg.qlen, single),
                "    _launch_attention (plan hit)": lambda: launchers._launch_attention(
                    q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen, cfg.kv_lora_rank,
                    facts.scale, outputs, single, cfg.batch_invariant, cfg.fp8_products),
            }
            if attn_replay is not None:
                pieces["      attention Replay"] = lambda: attn_replay(attn_sources)
                args = attn_replay.arguments(attn_sources)
                bound = attn_replay.bound
                pieces["        Replay.arguments"] = lambda: attn_replay.arguments(attn_sources)
                pieces["        Bound call"] = lambda: bound(*args)
                if bound.entry is not None:
                    stream = torch._C._cuda_getCurrentRawStream(q.device.index)
                    pieces["          entry (C launcher)"] = lambda: bound.entry(bound.grid, stream, args)
            if not single:
                seg = outputs
                pieces["    merge_segments"] = lambda: launchers.merge_segments(*seg, view.segments, q.dtype)
                if merge_replay is not None:
                    out = torch.empty(q.shape[0], q.shape[1], cfg.kv_lora_rank, dtype=q.dtype, device=q.device)
                    lse = torch.empty(q.shape[0], q.shape[1], dtype=torch.float32, device=q.device)
                    msrc = (*seg, view.segments, out, lse)
                    pieces["      merge Replay"] = lambda: merge_replay(msrc)
            if meta_replay is not None:
                msrc2 = (seq_lens, view.row_lens, view.work, view.segments)
                pieces["  metadata Replay"] = lambda: meta_replay(msrc2)
            rows = {}
            for label, fn in pieces.items():
                rows[label] = round(per_call_us(fn), 2)
                print(f"{name} {label:44s} {rows[label]:8.2f} us", flush=True)
        result["us_per_call"][name] = rows
    (out_dir / "host_layers.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
