"""Non-causal draft blocks (VerifyConfig(causal=False)): every row of request b sees all L_b keys."""

import contextlib
import dataclasses

import pytest
import torch

import mla_dcp
from mla_dcp import pure
from mla_dcp.testing import assert_close_special, check_problem, make_problem, merge_partials, platform_fp8

SMALL = dict(num_heads=4, kv_lora_rank=16, rope_dim=8)
LENS = [0, 1, 2, 7, 40, 130]


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (2, 4), (3, 2), (8, 1), (8, 3)])
@pytest.mark.parametrize("qlen", [1, 2, 3, 5, 8])
def test_non_causal_blocks_match_the_global_reference(world, interleave, qlen):
    """Against attention in global coordinates with no causal mask, on caches
    with NaN in every slot a rank must not read; per rank and merged."""
    problem = make_problem(LENS, qlen=qlen, world=world, interleave=interleave, block_size=16, max_model_len=160,
                           causal=False, seed=world * 10 + qlen, **SMALL)
    check_problem(problem, torch.float32, None)


def test_the_causal_path_fails_the_non_causal_test():
    """Negative control: a non-causal block sent down the causal path comes
    back silently masked; the comparison must catch it."""
    problem = make_problem(LENS, qlen=4, world=2, interleave=2, block_size=16, max_model_len=160, causal=False,
                           **SMALL)
    want_out, want_lse = problem.reference()                      # non-causal: the truth
    causal_path = [mla_dcp.verify(cfg, mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table), problem.q,
                                  shard.kv_cache)
                   for shard in problem.shards for cfg in [dataclasses.replace(shard.cfg, causal=True)]]
    out, lse = merge_partials(causal_path)
    with pytest.raises(AssertionError):
        assert_close_special("out", out, want_out, 1e-4)
    # The right path passes the same comparison.
    check_problem(problem, torch.float32, None)


def test_every_row_of_a_request_sees_its_whole_sequence():
    seq_lens = torch.tensor([0, 3, 10, 13], dtype=torch.int32)
    for world, interleave in [(1, 1), (3, 2)]:
        lens = torch.stack([pure.verify_row_lens(seq_lens, 4, world, r, interleave, causal=False)
                            for r in range(world)])
        assert torch.equal(lens.sum(0), seq_lens.repeat_interleave(4))
        assert bool((lens.view(world, 4, 4) == lens.view(world, 4, 4)[:, :, :1]).all())


def test_causal_is_static_one_graph_per_value_no_recompile_on_lengths():
    torch._dynamo.reset()
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def step(cfg, seq_lens, table, q, kv):
        return mla_dcp.verify(cfg, mla_dcp.build_view(cfg, seq_lens, table), q, kv)

    compiled = torch.compile(step, backend=backend, fullgraph=True, dynamic=False)
    problem = make_problem([9, 60], qlen=3, world=2, block_size=16, max_model_len=64, causal=False, **SMALL)
    shard = problem.shards[0]
    for causal in (False, True):
        cfg = dataclasses.replace(shard.cfg, causal=causal)
        for lens in ([9, 60], [3, 33]):
            seq_lens = torch.tensor(lens, dtype=torch.int32)
            got = compiled(cfg, seq_lens, shard.block_table, problem.q, shard.kv_cache)
            want = step(cfg, seq_lens, shard.block_table, problem.q, shard.kv_cache)
            torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(graphs) == 2


def test_causal_must_be_a_bool():
    with pytest.raises(ValueError, match="VerifyConfig.causal must be a bool, got 0"):
        mla_dcp.VerifyConfig(num_heads=2, qlen=2, block_size=16, max_model_len=64, softmax_scale=0.1, causal=0)


@pytest.mark.interpret
def test_the_row_lengths_kernel_equals_the_oracle():
    from mla_dcp.ops import launchers

    seq_lens = torch.tensor([0, 1, 2, 7, 33, 500], dtype=torch.int32)
    for world, rank, interleave, qlen in [(1, 0, 1, 1), (3, 2, 2, 4), (8, 5, 3, 3)]:
        got = launchers.row_lens(seq_lens, qlen, world, rank, interleave, False)
        assert torch.equal(got, pure.verify_row_lens(seq_lens, qlen, world, rank, interleave, causal=False))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_name", ["auto", "pointer", "tma", "seesaw", "narrow16", "narrow32"])
@pytest.mark.parametrize("kv", ["bf16", "fp8"])
@pytest.mark.parametrize("qlen,heads,world,interleave", [(2, 16, 2, 2), (4, 64, 3, 1), (8, 16, 8, 3)])
def test_non_causal_through_every_kernel(kernel_name, kv, qlen, heads, world, interleave):
    from test_poisoned import kernel

    kv_dtype = platform_fp8() if kv == "fp8" else torch.bfloat16
    problem = make_problem([0, 3, 777, 5000], qlen=qlen, num_heads=heads, kv_lora_rank=512, rope_dim=64,
                           world=world, interleave=interleave, block_size=64, max_model_len=5100,
                           dtype=torch.bfloat16, kv_dtype=kv_dtype, causal=False, device="cuda")
    with kernel(kernel_name) if kernel_name != "auto" else contextlib.nullcontext():
        check_problem(problem, torch.bfloat16, kv_dtype)
