"""Which kernel a shape class should take: the step timed with the attention plan overridden.

    python benchmarks/probes/plan_variants.py OUT_DIR VARIANT CASES

One process per variant (plans are memoised per process). ``VARIANT``:

* ``base``: the committed plans;
* ``narrow8``: e4m3 caches at 16- and 32-row tiles take the narrow Gluon
  kernel (its e4m3 path) instead of the Triton kernels;
* ``seesaw8``: e4m3 caches below 64 (row, head) pairs take the 64-row plan
  (the seesaw: its exact build, and its fp8-products build with
  ``+fp8p``), one tile per request's rows;
* ``inv64``, ``invH``: for batch-invariant cases, tiles planned for 64 pairs
  (committed) or for the step's own head count;
* ``narrow64``, ``narrow64x16``: 16-bit steps of exactly 64 pairs (R1: q 4,
  H 16) take the narrow kernel's 32-pair plan (two row tiles a request; with
  ``x16`` its 16-pair plan, four) and so the stream schedule, instead of the
  seesaw's one-piece-a-program chunks.

``CASES``: comma-separated ``NAME[+fp8p][+invN][+mmlK]`` (``+inv1024``: batch-invariant
mode with 1024-token segments; ``+mml4``: ``max_model_len`` 4x the longest request's, the block
table padded to it). Names are the benchmark's configs and, here,
``R1f8`` (R1 over an e4m3 cache). Per case: the graphed
step and the attention kernel alone (us), the kernel that ran, and out's
relative L2 error against float64 on the first input. Writes
OUT_DIR/plan_variants_VARIANT.json.
"""
import dataclasses
import pathlib
import sys

import torch

from mla_dcp import bench

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _ab import run_variants  # noqa: E402
from fp8_products_accuracy import errors, reference  # noqa: E402

bench.RAGGED.setdefault("R1f8", (4, 16, bench.RAGGED["R1"][2], 64, "fp8"))


def patch(variant: str) -> None:
    from mla_dcp.ops import launchers, tiles

    committed = tiles._attention_plan

    def planned(m_size, kv_lora_rank, q_dtype, kv_dtype, page, device, batch):
        if variant == "seesaw8" and kv_dtype.itemsize == 1 and m_size < 64:
            return committed(64, kv_lora_rank, q_dtype, kv_dtype, page, device, None)
        if variant.startswith("narrow64") and q_dtype.itemsize == 2 and kv_dtype.itemsize == 2 and m_size == 64:
            rows = 16 if variant.endswith("x16") else 32
            return committed(rows, kv_lora_rank, q_dtype, kv_dtype, page, device,
                             None if batch is None else batch * (64 // rows))
        plan = committed(m_size, kv_lora_rank, q_dtype, kv_dtype, page, device, batch)
        if variant == "narrow8" and kv_dtype.itemsize == 1 and plan.block_m in tiles.NARROW_WIDTHS:
            plan = dataclasses.replace(plan, narrow=True, tma=False)
        return plan
    tiles._attention_plan = planned
    if variant == "invH":
        launchers._INVARIANT_PLAN_ROWS = None


def run_case(spec: str) -> dict:
    import mla_dcp
    from mla_dcp.ops import launchers

    name, *flags = spec.split("+")
    invariant = [int(f[3:]) for f in flags if f.startswith("inv")]
    case = bench.make_case(name, torch.bfloat16, batch_invariant=bool(invariant),
                           invariant_segment_tokens=invariant[0] if invariant else None,
                           fp8_products="fp8p" in flags)
    longer = [int(f[3:]) for f in flags if f.startswith("mml")]
    if longer:   # a static bound past the step's lengths (engines size it for the longest context)
        cfg = dataclasses.replace(case.cfg, max_model_len=case.cfg.max_model_len * longer[0])
        case.inputs = [(s, torch.nn.functional.pad(t, (0, cfg.min_table_blocks - t.shape[1])), q, kv, sc)
                       for s, t, q, kv, sc in case.inputs]
        case.cfg = cfg
    if launchers._INVARIANT_PLAN_ROWS is None:     # invH: the case's own head count
        launchers._INVARIANT_PLAN_ROWS = case.cfg.num_heads
        planned_rows = None
    else:
        planned_rows = launchers._INVARIANT_PLAN_ROWS
    steps = bench.step_fns(case)
    row = {"case": spec, "graph_us": bench.time_fn(bench._rotating(bench._graphed(steps))) * 1e6}
    kernel = launchers.last_attention_kernel
    row["kernel"] = getattr(getattr(kernel, "fn", None), "__name__", None) or getattr(kernel, "name", str(kernel))
    row["attention_us"] = bench.time_fn(bench._rotating(bench._graphed(bench.attention_fns(case)))) * 1e6
    seq_lens, table, q, kv, scale = case.inputs[0]
    view = mla_dcp.build_view(case.cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)
    out, lse = mla_dcp.verify(case.cfg, view, q, kv, scale)
    ref_out, ref_lse = reference(case.cfg, view, q, kv, scale if scale is not None else torch.ones(1))
    row.update(errors(out, lse, ref_out, ref_lse))
    row["floor_us"] = 0.0
    if planned_rows is None:
        launchers._INVARIANT_PLAN_ROWS = None
    del case
    torch.cuda.empty_cache()
    return row


def floor(spec: str, row: dict, ceilings: dict) -> None:
    kv_bytes, io_bytes, flops = bench.work(spec.split("+")[0])
    row["floor_us"] = 1e6 * max((kv_bytes + io_bytes) / ceilings["copy_bytes_per_s"],
                                flops / ceilings["bf16_flops_per_s"])


def main():
    run_variants(sys.argv, "plan_variants", lambda spec, variant: run_case(spec), patch, floor)


if __name__ == "__main__":
    main()
