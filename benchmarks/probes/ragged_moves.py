"""What a ragged step's moves cost (mla_dcp.ragged_blocks): requests with different numbers of
query tokens around the same verify step.

    python benchmarks/probes/ragged_moves.py OUT_DIR [C4,C7,R1,C1]

Per config (the benchmark's inputs: one DCP rank's step, ``bench.make_case``), graphed (one step a
graph, do_bench's median) and as host time (1,000 back-to-back eager calls):

- ``step``: build_view + verify, the benchmark's step;
- ``ragged``: the same with its q packed as tokens, each request's count drawn from
  ``1..qlen`` (``ragged_blocks`` once, then ``rows`` before verify and ``tokens`` after);
- ``moves``: ``rows`` and ``tokens`` alone (one kernel each), beside ``moves_torch``, the
  same through the plain torch path (``pure.ragged_rows``/``ragged_tokens``: what a traced
  step runs before inductor fuses it; index_select and masked_fill launches);
- ``map``: ``ragged_blocks`` alone (once a step: one launch of ``ragged_map_kernel``; ~25 torch
  launches before it, 54 us graphed on the H200).

Checks the ragged step's tokens against the uniform step's rows bit for bit (a request with all
``qlen`` tokens), and the kernels' moves against the torch path. Writes OUT_DIR/ragged_moves.json.
Predicted on the H200: graphed moves 2-4 us a layer (two small launches with PDL) against
10-16 us for the torch path's eight; the ragged step within a few us of the step.
"""
import sys

import _ab
import torch

import mla_dcp
from mla_dcp import bench, pure


def main(out_dir: str, names: list[str]) -> None:
    bench.wait_for_native_plans()   # nothing is timed beside the native plans' build
    results = {}
    for name in names:
        case = bench.make_case(name, torch.bfloat16)
        cfg = case.cfg
        seq_lens, table, q, kv, scale = case.inputs[0]
        batch = seq_lens.shape[0]
        g = torch.Generator().manual_seed(0)
        counts = torch.randint(1, cfg.qlen + 1, (batch,), generator=g)
        counts[0] = cfg.qlen                                  # one request with a full block: checked below
        starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32).cuda()
        # Each request's tokens: its last rows in the benchmark's q (the rows a padded block holds).
        keep = torch.cat([torch.arange(b * cfg.qlen + cfg.qlen - int(n), (b + 1) * cfg.qlen)
                          for b, n in enumerate(counts)]).cuda()
        tokens = q[keep].contiguous()
        total = tokens.shape[0]

        def view():
            return mla_dcp.build_view(cfg, seq_lens, table, q_dtype=q.dtype, kv_dtype=kv.dtype)

        def step():
            return mla_dcp.verify(cfg, view(), q, kv, scale)

        def ragged():
            blocks = mla_dcp.ragged_blocks(starts, cfg.qlen, total)
            out, lse = mla_dcp.verify(cfg, view(), blocks.rows(tokens), kv, scale)
            return blocks.tokens(out, lse)

        blocks = mla_dcp.ragged_blocks(starts, cfg.qlen, total)
        rows = blocks.rows(tokens)
        out, lse = mla_dcp.verify(cfg, view(), rows, kv, scale)

        def moves():
            blocks.tokens(out, lse)
            return blocks.rows(tokens)

        def moves_torch():
            pure.ragged_tokens(out, lse, blocks.row_of_token)
            return pure.ragged_rows(tokens, blocks.token_of_row)

        def map_only():
            return mla_dcp.ragged_blocks(starts, cfg.qlen, total)

        want_out, want_lse = step()
        got_out, got_lse = ragged()
        first = int(counts[0])
        same = bool(torch.equal(got_out[:first], want_out[:first]) and torch.equal(got_lse[:first], want_lse[:first]))
        kernels_equal = bool(torch.equal(blocks.rows(tokens), pure.ragged_rows(tokens, blocks.token_of_row))
                             and torch.equal(torch.nan_to_num(blocks.tokens(out, lse)[0]),
                                             torch.nan_to_num(pure.ragged_tokens(out, lse, blocks.row_of_token)[0])))
        row = {"counts": counts.tolist(), "first_request_bitwise": same, "kernels_equal_torch": kernels_equal}
        for label, fn in (("step", step), ("ragged", ragged), ("moves", moves), ("moves_torch", moves_torch),
                          ("map", map_only)):
            _ab.time_step(row, label, fn)
        results[name] = row
        _ab.print_row(name, {k: v for k, v in row.items() if k != "counts"})
    _ab.save(out_dir, "ragged_moves.json", results)


if __name__ == "__main__":
    main(sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "C4,C7,R1,C1").split(","))
