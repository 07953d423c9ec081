"""A verify step inside an engine-style decode loop: torch.compile and CUDA graphs.

Two DCP ranks (simulated in this process) hold a paged cache each, empty
(NaN) at first: a prefill writes the prompts, then every step writes its new
tokens into the rank that holds each (`mla_dcp.cache_slots`,
`mla_dcp.write_cache`), verifies them and merges the ranks. The tokens come
packed as an engine packs them (`[T, H, D]` and `query_start_loc`), each
request with its own count from 1 to `q` (a drafter that found fewer drafts
for some), placed in the verify rows by `mla_dcp.ragged_blocks`; one request
finishes (no tokens, length 0). The step (write, verify, merge) is compiled
once with `torch.compile(fullgraph=True)` and, on a GPU, captured once in a
CUDA graph; every later step only writes new values into the static input
buffers (lengths, token counts, queries, latents) and replays. Each step is
checked against attention in global coordinates, each request's tokens as
its own block.

    python examples/compile_and_graph.py [--steps 6]
"""

import argparse
import dataclasses

import torch

import mla_dcp
from mla_dcp.pure import reference_attention
from mla_dcp.testing import assert_close_special, make_problem


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    qlen, world, heads, dl, dr = 3, 2, 16, 64, 16
    prompts = [64, 20, 90]
    batch = len(prompts)

    # Every key the loop will write, in global order (problem.global_kv), and each rank's block
    # table; the caches themselves start empty.
    final_lens = [n + qlen * args.steps for n in prompts]
    problem = make_problem(final_lens, qlen=qlen, num_heads=heads, kv_lora_rank=dl, rope_dim=dr, world=world,
                           interleave=2, block_size=16, max_model_len=256, device=device, seed=0)
    shards = problem.shards
    caches = [torch.full_like(shard.kv_cache, float("nan")) for shard in shards]
    keys = problem.global_kv

    # Prefill: each prompt's keys into the ranks that hold them (a block of the longest prompt).
    prompt_lens = torch.tensor(prompts, dtype=torch.int32, device=device)
    longest = max(prompts)
    rows = torch.stack([torch.cat([torch.zeros(longest - n, dl + dr, device=device), keys[b, :n]])
                        for b, n in enumerate(prompts)]).view(batch * longest, dl + dr)
    for shard, cache in zip(shards, caches):
        prefill = dataclasses.replace(shard.cfg, qlen=longest)
        mla_dcp.write_cache(cache, mla_dcp.cache_slots(prefill, prompt_lens, shard.block_table), rows)

    seq_lens = torch.tensor(prompts, dtype=torch.int32, device=device)         # static buffers
    starts = torch.arange(0, batch * qlen + 1, qlen, dtype=torch.int32, device=device)   # query_start_loc
    tokens = problem.q.clone()                   # room for q tokens a request; the unused ones padding
    latents = torch.zeros(batch * qlen, dl + dr, device=device)                # the tokens' own keys

    def step(seq_lens, starts, tokens, latents):
        blocks = mla_dcp.ragged_blocks(starts, qlen, tokens.shape[0])
        rows = blocks.rows(tokens)
        partials = []
        for shard, cache in zip(shards, caches):
            mla_dcp.write_cache(cache, mla_dcp.cache_slots(shard.cfg, seq_lens, shard.block_table, blocks=blocks),
                                latents)
            view = mla_dcp.build_view(shard.cfg, seq_lens, shard.block_table)
            partials.append(mla_dcp.verify(shard.cfg, view, rows, cache))
        out, lse = mla_dcp.merge_ranks(torch.stack([o for o, _ in partials]), torch.stack([l for _, l in partials]))
        return blocks.tokens(out, lse)

    compiled = torch.compile(step, fullgraph=True)
    run = lambda: compiled(seq_lens, starts, tokens, latents)   # noqa: E731
    if device == "cuda":
        # Compile and warm up outside the capture, on a step that writes nothing (no request has a
        # token there, so the prefilled caches stay as they are).
        seq_lens.zero_()
        for _ in range(2):
            run()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = run()

        def run():
            graph.replay()
            return static_out
        print("captured one CUDA graph of the compiled step (cache writes, verify, merge)")
    else:
        print("no GPU: running the compiled step (CUDA-graph capture needs a GPU)")

    gen = torch.Generator().manual_seed(1)
    context = list(prompts)
    for index in range(args.steps):
        # The engine's side: 1 to q new tokens a request (request 1 finishes at step 3: none, length
        # 0), their queries and keys, the lengths grown to include them.
        counts = torch.randint(1, qlen + 1, (batch,), generator=gen).tolist()
        if index >= 3:
            counts[1] = 0
        lens = [0 if index >= 3 and b == 1 else n + c for b, (n, c) in enumerate(zip(context, counts))]
        first = [0] + torch.tensor(counts).cumsum(0).tolist()
        tokens.copy_(torch.randn(tokens.shape, generator=gen).to(tokens.dtype))
        latents.zero_()
        for b, (n, c) in enumerate(zip(context, counts)):
            latents[first[b]:first[b + 1]] = keys[b, n:n + c]
        seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        starts.copy_(torch.tensor(first, dtype=torch.int32))
        out, lse = run()
        errors = []
        for b, count in enumerate(counts):
            if count == 0:
                continue
            mine = slice(first[b], first[b + 1])
            want_out, want_lse = reference_attention(tokens[mine], keys[b:b + 1], seq_lens[b:b + 1], qlen=count,
                                                     kv_lora_rank=dl, softmax_scale=shards[0].cfg.scale)
            errors.append(assert_close_special("out", out[mine], want_out, 1e-4))
            assert_close_special("lse", lse[mine], want_lse, 1e-4)
        padding = slice(first[-1], None)          # the tokens past the last request: 0 and -inf
        assert bool(out[padding].eq(0).all()) and bool(lse[padding].isneginf().all())
        context = [n + c for n, c in zip(context, counts)]
        print(f"step {index}: lengths {lens}, tokens {counts} -> max |out - reference| {max(errors):.1e}")
    written = sum(int((~cache.isnan().all(-1)).sum()) for cache in caches)
    print(f"keys written: {written} (every prompt and step token once, on its own rank: {sum(context)})")
    assert written == sum(context)
    print(f"recompilations after the first: {torch._dynamo.utils.counters['stats']['unique_graphs'] - 1}")


if __name__ == "__main__":
    main()
