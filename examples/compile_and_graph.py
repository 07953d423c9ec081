"""A verify step inside an engine-style decode loop: torch.compile and CUDA graphs.

Two DCP ranks (simulated in this process) verify `q` rows per request every
step, then merge; the lengths grow every step, some requests finish (become
padding). The step is compiled once with `torch.compile(fullgraph=True)`
and, on a GPU, captured once in a CUDA graph; every later step only writes
new values into the static input buffers (lengths, queries) and replays.
Each step is checked against attention in global coordinates.

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
    seq_lens = torch.tensor([64, 20, 90], dtype=torch.int32, device=device)   # static buffer
    queries = problem.q.clone()                                               # static buffer

    def step(seq_lens, queries):
        partials = []
        for shard in shards:
            view = mla_dcp.build_view(shard.cfg, seq_lens, shard.block_table)
            partials.append(mla_dcp.verify(shard.cfg, view, queries, shard.kv_cache))
        return mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))

    compiled = torch.compile(step, fullgraph=True)
    run = lambda: compiled(seq_lens, queries)   # noqa: E731
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
        # The engine's side: new queries, lengths grown by the accepted tokens;
        # request 1 finishes at step 3 and becomes padding (length 0).
        queries.copy_(torch.randn(queries.shape, generator=gen).to(queries.dtype))
        new_lens = [64 + qlen * index, 0 if index >= 3 else 20 + qlen * index, 90 + qlen * index]
        seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        out, lse = run()
        want_out, want_lse = reference_attention(queries, problem.global_kv, seq_lens, qlen=qlen,
                                                 kv_lora_rank=64, softmax_scale=shards[0].cfg.scale)
        err = assert_close_special("out", out, want_out, 1e-4)
        assert_close_special("lse", lse, want_lse, 1e-4)
        print(f"step {index}: lengths {new_lens} -> max |out - reference| {err:.1e}")
    print(f"recompilations after the first: {torch._dynamo.utils.counters['stats']['unique_graphs'] - 1}")


if __name__ == "__main__":
    main()
