"""A verify step inside an engine-style decode loop: torch.compile and CUDA graphs.

Two DCP ranks (simulated in this process) verify each request's tokens every
step, then merge. The tokens come packed as an engine packs them (`[T, H, D]`
and `query_start_loc`), each request with its own count from 1 to `q` (a
drafter that found fewer drafts for some), placed in the verify rows by
`mla_dcp.ragged_blocks`; the lengths grow every step, one request finishes
(no tokens, length 0). The step is compiled once with
`torch.compile(fullgraph=True)` and, on a GPU, captured once in a CUDA graph;
every later step only writes new values into the static input buffers
(lengths, token counts, queries) and replays. Each step is checked against
attention in global coordinates, each request's tokens as its own block.

    python examples/compile_and_graph.py [--steps 6]
"""

import argparse

import torch

import mla_dcp
from mla_dcp.pure import reference_attention
from mla_dcp.testing import assert_close_special, make_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    qlen, world = 3, 2

    # The cache is written ahead for the longest lengths the loop reaches;
    # each step's seq_lens says how much of it the step may see.
    final_lens = [64 + qlen * args.steps, 20 + qlen * args.steps, 90 + qlen * args.steps]
    problem = make_problem(final_lens, qlen=qlen, num_heads=16, kv_lora_rank=64, rope_dim=16, world=world,
                           interleave=2, block_size=16, max_model_len=256, device=device, seed=0)
    shards = problem.shards
    seq_lens = torch.tensor([64, 20, 90], dtype=torch.int32, device=device)   # static buffers
    starts = torch.tensor([0, 3, 6, 9], dtype=torch.int32, device=device)      # query_start_loc
    tokens = problem.q.clone()                  # room for q tokens a request; the unused ones padding

    def step(seq_lens, starts, tokens):
        blocks = mla_dcp.ragged_blocks(starts, qlen, tokens.shape[0])
        rows = blocks.rows(tokens)
        partials = []
        for shard in shards:
            view = mla_dcp.build_view(shard.cfg, seq_lens, shard.block_table)
            partials.append(mla_dcp.verify(shard.cfg, view, rows, shard.kv_cache))
        out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
        return blocks.tokens(out, lse)

    compiled = torch.compile(step, fullgraph=True)
    run = lambda: compiled(seq_lens, starts, tokens)   # noqa: E731
    if device == "cuda":
        for _ in range(2):
            run()                       # compile and warm up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = run()

        def run():
            graph.replay()
            return static_out
        print("captured one CUDA graph of the compiled step")
    else:
        print("no GPU: running the compiled step (CUDA-graph capture needs a GPU)")

    gen = torch.Generator().manual_seed(1)
    for index in range(args.steps):
        # The engine's side: new tokens, 1 to q a request, the lengths grown to include them;
        # request 1 finishes at step 3 (no tokens, length 0).
        counts = torch.randint(1, qlen + 1, (3,), generator=gen)
        counts[1] = 0 if index >= 3 else counts[1]
        new_lens = [64 + qlen * index, 0 if index >= 3 else 20 + qlen * index, 90 + qlen * index]
        tokens.copy_(torch.randn(tokens.shape, generator=gen).to(tokens.dtype))
        seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        starts.copy_(torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32))
        out, lse = run()
        first = starts.tolist()
        errors = []
        for b, count in enumerate(counts.tolist()):
            if count == 0:
                continue
            mine = slice(first[b], first[b + 1])
            want_out, want_lse = reference_attention(tokens[mine], problem.global_kv[b:b + 1], seq_lens[b:b + 1],
                                                     qlen=count, kv_lora_rank=64, softmax_scale=shards[0].cfg.scale)
            errors.append(assert_close_special("out", out[mine], want_out, 1e-4))
            assert_close_special("lse", lse[mine], want_lse, 1e-4)
        padding = slice(first[-1], None)          # the tokens past the last request: 0 and -inf
        assert bool(out[padding].eq(0).all()) and bool(lse[padding].isneginf().all())
        print(f"step {index}: lengths {new_lens}, tokens {counts.tolist()} -> max |out - reference| "
              f"{max(errors):.1e}")
    print(f"recompilations after the first: {torch._dynamo.utils.counters['stats']['unique_graphs'] - 1}")


if __name__ == "__main__":
    main()
