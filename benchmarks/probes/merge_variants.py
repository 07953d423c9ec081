"""The batch-invariant mode's segment merge: tile variants, alone and in the whole step.

    python benchmarks/probes/merge_variants.py OUT_DIR VARIANT CASES

``VARIANT``: ``rows`` (the committed tile, ``launchers._INVARIANT_MERGE_TILE``),
``dD_wW_cC`` (that tile set to ``(D, W, C)``: D columns a program, W warps, at
most C items a step; ``d512_w4_c64`` was the tile before), or ``default`` (the
default mode, for reference). One process per variant (launch plans are kept per process).
Per case (the benchmark's configs, the segment length by heads): the graphed
step, the merge alone over the step's own partials (graphed), whether the
step's output equals that merge's bit for bit, and out's relative L2 error
against float64. Writes OUT_DIR/merge_VARIANT.json.
"""
import pathlib
import sys

import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import launchers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _ab import run_variants  # noqa: E402
from fp8_products_accuracy import errors, reference  # noqa: E402


def run_case(name: str, invariant: bool) -> dict:
    case = bench.make_case(name, torch.bfloat16, batch_invariant=invariant)
    cfg = case.cfg
    row = {"case": name, "graph_us": bench.time_fn(bench._rotating(bench._graphed(bench.step_fns(case)))) * 1e6}
    seq_lens, table, q, kv, scale = case.inputs[0]
    view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    step_out, step_lse = mla_dcp.verify(cfg, view, q, kv, scale)
    row["items"], row["batch"] = int(view.work.shape[0]), int(view.page_table.shape[0])
    row.update(errors(step_out, step_lse, *reference(cfg, view, q, kv, scale if scale is not None else torch.ones(1))))
    if view.work.shape[0] > view.page_table.shape[0]:
        partials = launchers.segmented_attention(q, kv, scale, view.row_lens, view.page_table, view.work, cfg.qlen,
                                                 cfg.kv_lora_rank, cfg.scale, cfg.schedule_chunk)
        out, lse = torch.empty_like(step_out), torch.empty_like(step_lse)

        def merge():
            launchers._merge_segments_anew(*partials, view.segments, out, lse, invariant)

        row["merge_us"] = bench.time_fn(bench._graphed([merge])[0]) * 1e6
        merge()
        row["step_equals_merge"] = bool(torch.equal(out, step_out) and torch.equal(lse, step_lse))
    del case
    torch.cuda.empty_cache()
    return row


def setup(variant: str) -> None:
    if variant not in ("rows", "default"):
        launchers._INVARIANT_MERGE_TILE = tuple(int(part[1:]) for part in variant.split("_"))


def main():
    run_variants(sys.argv, "merge", lambda name, variant: run_case(name, variant != "default"), setup)


if __name__ == "__main__":
    main()
