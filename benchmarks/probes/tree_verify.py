"""What a token tree costs (build_view(block_mask=...)): a masked block against the causal step.

    python benchmarks/probes/tree_verify.py OUT_DIR [C4,C7,C1,C3,R1,R4]

Per config (the benchmark's inputs: one DCP rank's step, ``bench.make_case``), after the ceilings
(``bench.measure_ceilings``: copy bandwidth, bf16 matmul) in the same run, graphed (one step a
graph, do_bench's median) and as host time (1,000 back-to-back eager calls):

- ``step``: build_view + verify, causal: the benchmark's step;
- ``tree``: the same with a tree mask (each node's parent the node two before it, the first two
  roots: a binary-ish tree of the config's qlen), build_view with ``block_mask`` then verify;
- ``chain``: a chain mask (the causal answer through the masked path);
- ``block``: the block kernel alone (``mla_dcp::block_attention`` over a context partial); and
  ``block_h8_w4``, ``block_h16_w8``: its program of 8 heads at 4 warps and of 16 at 8.

Checks: the chain's output against the causal step's within the bf16 budget (two roundings of
``out``), NaN-free; the tree's against the pure path on the CPU for the first four requests.
Writes OUT_DIR/tree_verify.json, and a profile by function of 300 eager tree steps a config
(OUT_DIR/tree_profile_NAME.txt; its head also printed). Predicted on the H200: ``block`` ~ (q + 2 out) bytes at the copy
rate (C1 ~10 us, C4 ~2.5 us, C7 < 2 us: a launch), ``tree`` ~ ``step`` + ``block`` + 1-2 us.
"""
import pathlib
import sys

import _ab
import torch

import mla_dcp
from mla_dcp import bench
from mla_dcp.ops import library as ops


def main(out_dir: str, names: list[str]) -> None:
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    results = {"ceilings": bench.measure_ceilings()}
    print("ceilings", results["ceilings"], flush=True)
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        batch, qlen = seq_lens.shape[0], cfg.qlen
        tree = mla_dcp.tree_mask(bench.tree_parents(qlen)).cuda()
        chain = mla_dcp.tree_mask([i - 1 for i in range(qlen)]).cuda()

        def step():
            return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype),
                                  q, kv, scale)

        def masked(mask):
            def run():
                view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype, block_mask=mask)
                return mla_dcp.verify(cfg, view, q, kv, scale)
            return run

        view = mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype, block_mask=tree)
        context = mla_dcp.verify(cfg, view.context, q, kv, scale)

        def block():
            return ops.stage.block_attention(q, kv, scale, *context, table, view.mask, seq_lens, qlen,
                                             cfg.dcp_world_size, cfg.dcp_rank, cfg.interleave, cfg.max_model_len,
                                             cfg.kv_lora_rank, cfg.scale, False)

        want_out, _ = step()
        chain_out, _ = masked(chain)()
        finite = want_out.float().abs().max().item()
        chain_err = (chain_out.float() - want_out.float()).abs().max().item()
        tree_out, tree_lse = masked(tree)()
        rows = slice(0, min(batch, 4) * qlen)
        cpu_view = mla_dcp.build_view(cfg, seq_lens[:4].cpu(), table[:4].cpu(), block_mask=tree.cpu())
        cpu_scale = None if scale is None else scale.cpu()
        cpu_out, cpu_lse = mla_dcp.verify(cfg, cpu_view, q[rows].cpu(), kv.cpu(), cpu_scale)
        row = {"chain_max_err": chain_err, "chain_budget": 2 * 2 ** -8 * finite,
               "chain_nan": bool(chain_out.isnan().any()),
               "tree_vs_cpu_max_err": (tree_out[rows].float().cpu() - cpu_out.float()).abs().max().item(),
               "tree_lse_vs_cpu_max_err": (tree_lse[rows].cpu() - cpu_lse).abs().max().item()}
        row["floor_us"] = max((case.kv_bytes + case.io_bytes) / results["ceilings"]["copy_bytes_per_s"],
                              case.flops / results["ceilings"]["bf16_flops_per_s"]) * 1e6
        row["block_bytes"] = q.numel() * q.element_size() + 2 * context[0].numel() * context[0].element_size()
        for label, fn in (("step", step), ("tree", masked(tree)), ("chain", masked(chain)), ("block", block)):
            _ab.time_step(row, label, fn)
        row["block_at_copy_rate_us"] = row["block_bytes"] / results["ceilings"]["copy_bytes_per_s"] * 1e6
        # The block kernel's (heads, warps) a program: the launcher's (8, 8), chosen by registers
        # (89 a thread built as launched: two programs an SM), against (8, 4) and (16, 8), untimed so far.
        from mla_dcp.ops import fast_launch, launchers
        chosen = (launchers._BLOCK_HEADS, launchers._BLOCK_WARPS)
        want_block = block()[0].float()
        try:
            for heads, warps in ((8, 4), (16, 8)):
                launchers._BLOCK_HEADS, launchers._BLOCK_WARPS = heads, warps
                fast_launch.clear()
                row[f"block_h{heads}_w{warps}_max_diff"] = (block()[0].float() - want_block).abs().max().item()
                _ab.time_step(row, f"block_h{heads}_w{warps}", block, host=False)
        finally:
            launchers._BLOCK_HEADS, launchers._BLOCK_WARPS = chosen
            fast_launch.clear()
        # Where an eager tree step's host time goes, by function.
        pathlib.Path(out_dir).mkdir(parents=True, exist_ok=True)
        profile = _ab.profile_text(masked(tree))
        (pathlib.Path(out_dir) / f"tree_profile_{name}.txt").write_text(profile)
        print("\n".join(profile.splitlines()[:45]), flush=True)     # its head in the log too
        results[name] = row
        _ab.print_row(name, row)
    _ab.save(out_dir, "tree_verify.json", results)


if __name__ == "__main__":
    main(sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "C4,C7,C1,C3,R1,R4").split(","))
