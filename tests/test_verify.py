"""End to end: every rank's verify, then merge_ranks, against global coordinates."""

import math

import pytest
import torch

import mla_dcp
from mla_dcp.testing import assert_close_special, check_problem, make_problem, merge_partials, run_ranks

SMALL = dict(num_heads=4, kv_lora_rank=32, rope_dim=8)


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (2, 4), (3, 2), (8, 1), (8, 3)])
@pytest.mark.parametrize("qlen", range(1, 9))
def test_fp32_matches_global_reference(world, interleave, qlen):
    # Lengths chosen so some rows are empty on some ranks (1, 2, 5), a request
    # is padding (0), one spans many blocks, and one is shorter than qlen.
    seq_lens = [0, 1, 2, 5, qlen + 3, 97, 260]
    problem = make_problem(seq_lens, qlen=qlen, world=world, interleave=interleave, block_size=16,
                           max_model_len=300, seed=world * 100 + qlen, **SMALL)
    check_problem(problem, torch.float32, None)


@pytest.mark.parametrize("block_size", [1, 16, 96])
@pytest.mark.parametrize("num_segments", [1, 3, None])
def test_block_sizes_and_segments(block_size, num_segments):
    problem = make_problem([3, 50, 200], qlen=3, world=2, interleave=2, block_size=block_size,
                           max_model_len=256, num_segments=num_segments, seed=block_size, **SMALL)
    check_problem(problem, torch.float32, None)


@pytest.mark.parametrize("dtype,kv_dtype", [
    (torch.bfloat16, None),
    (torch.float16, None),
    (torch.bfloat16, torch.float8_e4m3fn),
    (torch.float16, torch.float8_e4m3fnuz),
])
def test_low_precision_within_data_budget(dtype, kv_dtype):
    problem = make_problem([4, 77, 180], qlen=4, world=3, interleave=1, block_size=16, max_model_len=200,
                           dtype=dtype, kv_dtype=kv_dtype or dtype, seed=7, **SMALL)
    check_problem(problem, dtype, kv_dtype)


def test_fp8_scale_is_applied():
    """A wrong (or ignored) kv_scale must change the answer noticeably."""
    problem = make_problem([40], qlen=2, world=1, dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn, **SMALL)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    out, lse = mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
    out2, lse2 = mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale * 2)
    assert (lse2 - lse).abs().max() > 0.1
    assert (out2.float() - 2 * out.float()).abs().max() > 0.1 * out.float().abs().max()


def test_all_rows_of_every_request_empty():
    problem = make_problem([0, 0, 0], qlen=3, world=2, block_size=16, max_model_len=64, **SMALL)
    partials, _ = run_ranks(problem)
    for out, lse in partials + [merge_partials(partials)]:
        assert bool((out == 0).all())
        assert bool(lse.isneginf().all())


def test_rank_with_no_keys_at_all():
    # Length 1 with W=4: ranks 1..3 hold nothing.
    problem = make_problem([1, 2], qlen=2, world=4, block_size=16, max_model_len=64, **SMALL)
    partials, views = run_ranks(problem)
    assert int(views[3].row_lens.sum()) == 0
    out3, lse3 = partials[3]
    assert bool((out3 == 0).all()) and bool(lse3.isneginf().all())
    check_problem(problem, torch.float32, None)


def test_result_does_not_depend_on_segment_count():
    base = dict(qlen=3, world=2, block_size=16, max_model_len=512, seed=3, **SMALL)
    results = []
    for ns in (1, 2, 5, 32):
        problem = make_problem([130, 400], num_segments=ns, **base)
        results.append(merge_partials(run_ranks(problem)[0]))
    for out, lse in results[1:]:
        assert_close_special("out", out, results[0][0], 1e-5)
        assert_close_special("lse", lse, results[0][1], 1e-5)


@pytest.mark.parametrize("stream, columns", [(None, 5), (True, 5), (False, 3)])
def test_either_schedule_matches_global_reference(stream, columns):
    """VerifyConfig.stream picks the schedule (the CPU takes the stream by
    default); both answer the global reference on a ragged, poisoned problem
    (long enough a bound for several segments: one segment takes no schedule)."""
    import dataclasses

    problem = make_problem([3, 700, 0, 45, 9000], qlen=2, world=2, block_size=16, max_model_len=20000, seed=4,
                           **SMALL)
    for shard in problem.shards:
        shard.cfg = dataclasses.replace(shard.cfg, stream=stream)
    _, views = run_ranks(problem)
    assert all(view.work.shape[1] == columns for view in views)
    check_problem(problem, torch.float32, None)


def test_large_scores_do_not_overflow():
    """Scores far beyond exp's range: base-2 running max must keep it finite."""
    problem = make_problem([60], qlen=3, world=2, block_size=16, max_model_len=64, **SMALL)
    problem.q.mul_(300.0)
    partials, _ = run_ranks(problem)
    out, lse = merge_partials(partials)
    exact_out, exact_lse = problem.reference()
    assert bool(torch.isfinite(lse).all()) and lse.max() > 100
    assert_close_special("lse", lse, exact_lse, 1e-3 * exact_lse.abs().max().item())
    assert_close_special("out", out, exact_out, 1e-4 * math.sqrt(problem.q.shape[-1]))


def test_lengths_beyond_the_static_bound_are_loud_not_wrong():
    """seq_lens past max_model_len cannot be checked on the host without a sync:
    such rows must come out NaN (and nothing read past the page table), while
    the other rows stay right."""
    problem = make_problem([50, 60], qlen=2, world=2, block_size=16, max_model_len=64, seed=4, **SMALL)
    too_long = torch.tensor([50, 200], dtype=torch.int32)
    partials = []
    for shard in problem.shards:
        view = mla_dcp.build_view(shard.cfg, too_long, shard.block_table)
        partials.append(mla_dcp.verify(shard.cfg, view, problem.q, shard.kv_cache))
    out, lse = merge_partials(partials)
    assert bool(out[2:].isnan().all()), "rows past the static bound must be NaN"
    exact_out, exact_lse = problem.reference()
    assert_close_special("request 0 out", out[:2], exact_out[:2], 1e-4)
    assert_close_special("request 0 lse", lse[:2], exact_lse[:2], 1e-4)


def test_pure_pipeline_equals_the_public_verify():
    problem = make_problem([0, 3, 70], qlen=3, world=3, interleave=2, block_size=16, max_model_len=96,
                           dtype=torch.float16, kv_dtype=torch.float8_e4m3fn, seed=8, **SMALL)
    for shard in problem.shards:
        cfg = shard.cfg
        view = mla_dcp.build_view(cfg, problem.seq_lens, shard.block_table)
        want = mla_dcp.verify(cfg, view, problem.q, shard.kv_cache, problem.kv_scale)
        got = mla_dcp.pure.verify(problem.q, shard.kv_cache, problem.seq_lens, shard.block_table, qlen=cfg.qlen,
                                  world=cfg.dcp_world_size, rank=cfg.dcp_rank, interleave=cfg.interleave,
                                  max_local_len=cfg.max_local_len, kv_lora_rank=cfg.kv_lora_rank,
                                  softmax_scale=cfg.scale, kv_scale=problem.kv_scale)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
