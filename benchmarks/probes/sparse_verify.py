"""What token-sparse rows cost (mla_dcp.verify_sparse, DeepSeek Sparse Attention) beside the dense step.

    python benchmarks/probes/sparse_verify.py OUT_DIR [C1,C3,C4,C7] [--topk 2048]

Per config (the benchmark's inputs: one DCP rank's step, ``bench.make_case``), after the ceilings
(``bench.measure_ceilings``) in the same run, graphed (one step a graph, do_bench's median) and as
host time (1,000 back-to-back eager calls):

- ``dense``: build_view + verify, the benchmark's step;
- ``sparse``: build_view + verify_sparse, each row listing ``topk`` random positions of its window
  (all of it where shorter), the same indices on the rank (its share is what it holds);
- ``sparse_kernel``: verify_sparse alone over a built view; ``pieces_N``: the same with each row's
  slots split over N programs (``launchers.sparse_pieces``: 1, half its choice, its choice, twice);
  ``n16``: 16 positions a step; ``stages_1``: the loop not pipelined; ``h32``: 32 heads a program
  where the step has as many (``launchers.SPARSE_TILES``);
  ``variants_max_diff``: their outputs' largest difference from the chosen one's;
  ``ds_kernel``: the same over the cache re-encoded in DeepSeek's fp8 layout (``fp8_ds_mla``), and
  its output's largest difference from the bf16 cache's (e4m3's rounding); ``ds_stages_3`` and
  ``ds_n32``: its tile at 3 stages and at 32 positions a step.

The sparse floor counts the listed positions the rank holds: bytes (keys gathered once + q + out)
at the copy rate, flops (2 x rows x heads x listed x 1088) at the matmul rate. Checks the sparse
step against the CPU path on the first two requests, and a row listing its whole window against
the dense row. Writes OUT_DIR/sparse_verify.json. Predicted on the H200 (top-2048, W = 8: a rank
holds ~256 positions a row): C7 ~8 us (16 programs of one step each, the slots kernel and the merge
~2 us each; 209 with one program a row over the raw list), C4 ~20-25 us (3 pieces a row: three
waves of ~3 steps; 216 before), C1 ~70 us (768 programs of 8 steps, 7x its floor: 16-head tiles
gather each key 8 times).
"""
import sys

import _ab
import torch

import mla_dcp
from mla_dcp import bench


def main(out_dir: str, names: list[str], topk: int) -> None:
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    ceilings = bench.measure_ceilings()
    results = {"ceilings": ceilings, "topk": topk}
    print("ceilings", ceilings, flush=True)
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        indices, held = bench.listed_positions(seq_lens, cfg.qlen, topk, cfg.dcp_world_size, cfg.interleave,
                                               cfg.dcp_rank)
        indices = indices.cuda()

        def view():
            return mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)

        def dense():
            return mla_dcp.verify(cfg, view(), q, kv, scale)

        def sparse():
            return mla_dcp.verify_sparse(cfg, view(), q, kv, indices, scale)

        built = view()

        def sparse_kernel():
            return mla_dcp.verify_sparse(cfg, built, q, kv, indices, scale)

        got_out, got_lse = sparse()
        rows = slice(0, 2 * cfg.qlen)
        cpu_view = mla_dcp.build_view(cfg, seq_lens[:2].cpu(), table[:2].cpu())
        cpu_out, cpu_lse = mla_dcp.verify_sparse(cfg, cpu_view, q[rows].cpu(), kv.cpu(), indices[rows].cpu(),
                                                 None if scale is None else scale.cpu())
        width = q.shape[-1]
        key_bytes = held * width * kv.element_size()
        io_bytes = q.numel() * q.element_size() + q.shape[0] * q.shape[1] * cfg.kv_lora_rank * q.element_size()
        flops = 2 * held * q.shape[1] * (width + cfg.kv_lora_rank)
        row = {"listed_held": held, "floor_us": max((key_bytes + io_bytes) / ceilings["copy_bytes_per_s"],
                                                    flops / ceilings["bf16_flops_per_s"]) * 1e6,
               "vs_cpu_out_max_err": (got_out[rows].float().cpu() - cpu_out.float()).abs().max().item(),
               "vs_cpu_lse_max_err": (got_lse[rows].cpu() - cpu_lse).abs().max().item(),
               "nan_rows": int(got_lse.isnan().any(-1).sum())}
        for label, fn in (("dense", dense), ("sparse", sparse), ("sparse_kernel", sparse_kernel)):
            _ab.time_step(row, label, fn)
        row["sparse_over_floor"] = row["sparse_kernel_graph_us"] / row["floor_us"]
        from mla_dcp.ops import fast_launch, launchers
        tiles, choose = dict(launchers.SPARSE_TILES), launchers.sparse_pieces
        auto = choose(q.shape[0], q.shape[1], indices.shape[1], cfg.dcp_world_size, False, q.device)
        row["pieces_auto"] = auto
        outputs = {}
        try:
            for pieces in sorted({1, max(1, auto // 2), auto, 2 * auto}):
                launchers.sparse_pieces = lambda *a, n=pieces, **k: n                     # noqa: E731
                fast_launch.clear()
                outputs[pieces] = sparse_kernel()
                _ab.time_step(row, f"pieces_{pieces}", sparse_kernel, host=False)
            launchers.sparse_pieces = choose
            variants = [("n16", (16, 16, 8, 3)), ("stages_1", (16, 32, 8, 1))]
            if q.shape[1] >= 32:
                variants.append(("h32", (32, 16, 8, 3)))
            for label, tile in variants:
                launchers.SPARSE_TILES = {**tiles, 16: tile, 32: tile}
                fast_launch.clear()
                outputs[label] = sparse_kernel()
                _ab.time_step(row, label, sparse_kernel, host=False)
        finally:
            launchers.SPARSE_TILES, launchers.sparse_pieces = tiles, choose
            fast_launch.clear()
        row["variants_max_diff"] = max((o[0].float() - outputs[auto][0].float()).nan_to_num().abs().max().item()
                                       for o in outputs.values())
        if kv.dtype == torch.bfloat16:
            from mla_dcp import _fp8_ds_mla
            ds = _fp8_ds_mla.encode(kv.view(-1, kv.shape[-1]), cfg.kv_lora_rank).view(*kv.shape[:2], -1)

            def ds_kernel():
                return mla_dcp.verify_sparse(cfg, built, q, ds, indices)

            chosen = ds_kernel()[0].float()
            row["ds_vs_bf16_max_err"] = (chosen - outputs[auto][0].float()).abs().max().item()
            _ab.time_step(row, "ds_kernel", ds_kernel, host=False)
            # The ds tile pipelined (builds without spills at 2-3 stages as a launch specialises it) and
            # 32 positions a step in one stage, against the chosen one.
            try:
                for label, tile in (("ds_stages_3", (16, 16, 8, 3)), ("ds_n32", (16, 32, 8, 1))):
                    launchers.SPARSE_TILES = {**tiles, "ds": tile}
                    fast_launch.clear()
                    row[label + "_max_diff"] = (ds_kernel()[0].float() - chosen).abs().max().item()
                    _ab.time_step(row, label, ds_kernel, host=False)
            finally:
                launchers.SPARSE_TILES = tiles
                fast_launch.clear()
        results[name] = row
        _ab.print_row(name, row)
    _ab.save(out_dir, "sparse_verify.json", results)


if __name__ == "__main__":
    argv = sys.argv[1:]
    topk = 2048
    if "--topk" in argv:
        at = argv.index("--topk")
        topk = int(argv[at + 1])
        del argv[at:at + 2]
    main(argv[0], (argv[1] if len(argv) > 1 else "C1,C3,C4,C7").split(","), topk)
