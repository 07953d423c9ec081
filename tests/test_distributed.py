"""DCP over real processes: mla_dcp.distributed with gloo on the CPU."""

import pytest
import torch

import mla_dcp
from mla_dcp import distributed
from mla_dcp.testing import assert_close_special, error_budget, launch_group, make_problem

HEADS = 8


def _case_checks(rank, world, device="cpu"):
    if device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    for method in distributed.METHODS:
        for interleave in (1, 2):
            # Rows empty on some ranks (1, 2), padding (0), and, for W=4,
            # requests [1, 2] leave ranks 2 and 3 with no key at all.
            for lens in ([0, 1, 2, 33, 150], [1, 2]):
                problem = make_problem(lens, qlen=3, num_heads=HEADS, kv_lora_rank=16, rope_dim=8, world=world,
                                       interleave=interleave, block_size=8, max_model_len=160, ranks=[rank],
                                       seed=interleave, device=device)
                shard = problem.shards[0]
                view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
                out, lse = distributed.verify(shard.cfg, view, problem.q, shard.kv_cache, method=method)
                want_out, want_lse = problem.reference()
                if method != "all_reduce":
                    heads = slice(rank * HEADS // world, (rank + 1) * HEADS // world)
                    want_out, want_lse = want_out[:, heads], want_lse[:, heads]
                where = f"W={world} rank={rank} {method} I={interleave} lens={lens}"
                assert out.shape == want_out.shape, where
                assert_close_special(f"{where} out", out, want_out, 1e-4)
                assert_close_special(f"{where} lse", lse, want_lse, 1e-4)
                if lens == [1, 2] and rank >= 2:
                    assert int(view.row_lens.sum()) == 0, "this rank must hold no key"


def _low_precision_and_errors(rank, world):
    problem = make_problem([5, 90], qlen=2, num_heads=HEADS, kv_lora_rank=16, rope_dim=8, world=world,
                           block_size=16, max_model_len=96, dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn,
                           ranks=[rank], seed=3)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    exact_out, exact_lse = problem.reference()
    budget = error_budget(exact_out, problem.reference(torch.bfloat16)[0], torch.bfloat16)
    for method in distributed.METHODS:
        out, lse = distributed.verify(shard.cfg, view, problem.q, shard.kv_cache, problem.kv_scale, method=method)
        assert out.dtype == torch.bfloat16
        want = exact_out if method == "all_reduce" else exact_out[:, rank * HEADS // world:(rank + 1) * HEADS // world]
        assert_close_special(f"{method} bf16/fp8 out", out, want, budget)

    # Errors come before any collective, so every rank raises and none hangs.
    with pytest.raises(ValueError, match=r"5 heads, which method='reduce_scatter' cannot split"):
        distributed.merge(torch.zeros(3, 5, 16), torch.zeros(3, 5), method="reduce_scatter")
    with pytest.raises(ValueError, match=r"5 heads, which method='all_to_all' cannot split"):
        distributed.merge(torch.zeros(3, 5, 16), torch.zeros(3, 5), method="all_to_all")
    with pytest.raises(ValueError, match=r"method must be one of"):
        distributed.merge(torch.zeros(3, 8, 16), torch.zeros(3, 8), method="gather")
    wrong = mla_dcp.VerifyConfig(num_heads=HEADS, qlen=2, block_size=16, max_model_len=96,
                                 dcp_world_size=world + 1, dcp_rank=rank, kv_lora_rank=16, rope_dim=8,
                                 softmax_scale=0.2)
    with pytest.raises(ValueError, match=rf"group size {world} and rank {rank}, got cfg.dcp_world_size={world + 1}"):
        distributed.verify(wrong, view, problem.q, shard.kv_cache, problem.kv_scale)
    # all_reduce has no head split, so 5 heads over W ranks is fine.
    five = distributed.merge(torch.ones(3, 5, 16), torch.zeros(3, 5), method="all_reduce")
    assert torch.allclose(five[0], torch.ones(3, 5, 16))
    assert torch.allclose(five[1], torch.full((3, 5), torch.log(torch.tensor(float(world))).item()))


def _poisoned_checks(rank, world, device="cpu"):
    """DESIGN stage 5 over collectives: a NaN key on the last rank poisons
    the rows that see it on every rank's merged heads; a FlashMLA-style
    partial (+inf lse, 0 out) is "no key"; NaN lse on one rank only is NaN."""
    import math

    from mla_dcp.testing import poison_key

    if device == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    problem = make_problem([0, 3, 40, 90], qlen=3, num_heads=HEADS, kv_lora_rank=16, rope_dim=8, world=world,
                           block_size=8, max_model_len=96, ranks=[rank], seed=9, device=device)
    holder = world - 1
    position = max(p for p in range(87) if p % world == holder)        # seen by request 3's rows
    poison_key(problem, 3, position, slice(None), math.nan)
    shard = problem.shards[0]
    view = mla_dcp.build_view(shard.cfg, problem.seq_lens, shard.block_table)
    want_out, want_lse = problem.reference()
    assert bool(want_lse[9:].isnan().all()) and not bool(want_lse[:9].isnan().any())
    for method in distributed.METHODS:
        out, lse = distributed.verify(shard.cfg, view, problem.q, shard.kv_cache, method=method)
        heads = slice(None) if method == "all_reduce" else slice(rank * HEADS // world, (rank + 1) * HEADS // world)
        assert_close_special(f"poisoned {method} out", out, want_out[:, heads], 1e-4)
        assert_close_special(f"poisoned {method} lse", lse, want_lse[:, heads], 1e-4)
        # Rank 0 reports "no key" FlashMLA's way; rank 1 poisons row 0 of head 0.
        part_out = torch.ones(2, HEADS, 16, device=device)
        part_lse = torch.zeros(2, HEADS, device=device)
        if rank == 0:
            part_out.zero_()
            part_lse.fill_(math.inf)
        if rank == 1:
            part_lse[0, 0] = math.nan
        out, lse = distributed.merge(part_out, part_lse, method=method)
        got_heads = range(HEADS)[heads]
        for i, h in enumerate(got_heads):
            poisoned = h == 0
            assert bool(lse[0, i].isnan()) == poisoned and bool(out[0, i].isnan().all()) == poisoned, method
        finite = ~lse.isnan()
        want = math.log(world - 1)
        assert torch.allclose(lse[finite], torch.full_like(lse[finite], want)), (method, lse)
        assert torch.allclose(out[finite], torch.ones_like(out[finite])), method


def _bitwise_checks(rank, world, device="cpu"):
    """Batch-invariant mode's stage 5: all_to_all equals merge_ranks of the
    same partials bit for bit (its head slice), and every method gives the
    same bits from run to run."""
    torch.manual_seed(7)          # the same partials on every rank's view of the group
    outs = torch.randn(world, 6, HEADS, 16, device=device)
    lses = torch.randn(world, 6, HEADS, device=device)
    lses[1, 0] = float("-inf")    # a rank with no key for one row
    heads = slice(rank * HEADS // world, (rank + 1) * HEADS // world)
    want_out, want_lse = mla_dcp.merge_ranks(outs, lses)
    for method in distributed.METHODS:
        first = distributed.merge(outs[rank], lses[rank], method=method)
        again = distributed.merge(outs[rank].clone(), lses[rank].clone(), method=method)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1]), method
    out, lse = distributed.merge(outs[rank], lses[rank], method="all_to_all")
    assert torch.equal(out, want_out[:, heads]) and torch.equal(lse, want_lse[:, heads])


@pytest.mark.parametrize("world", [2, 4])
def test_all_to_all_equals_merge_ranks_bit_for_bit(world):
    launch_group(_bitwise_checks, world, backend="gloo")


@pytest.mark.parametrize("world", [2, 4])
def test_merge_methods_keep_poisoned_rows(world):
    launch_group(_poisoned_checks, world, backend="gloo")


@pytest.mark.parametrize("world", [2, 4])
def test_merge_methods_match_global_reference(world):
    launch_group(_case_checks, world, backend="gloo")


def test_low_precision_and_errors():
    launch_group(_low_precision_and_errors, 2, backend="gloo")


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="initialized process group"):
        distributed.merge(torch.zeros(1, 2, 4), torch.zeros(1, 2))


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_nccl_merge_methods(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, found {torch.cuda.device_count()}")
    launch_group(_case_checks, world, "cuda", backend="nccl")


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4, 8])
def test_nccl_merge_methods_keep_poisoned_rows(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, found {torch.cuda.device_count()}")
    launch_group(_poisoned_checks, world, "cuda", backend="nccl")


def test_multi_gpu_script_refuses_fewer_than_two_gpus_and_runs_every_merge_method(tmp_path):
    """scripts/multi_gpu.sh: on a machine without two GPUs it says so and
    exits 2 before running anything; its demo loop names exactly the merge
    methods the library has, and each command line it runs parses."""
    import pathlib
    import re
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    script = root / "scripts" / "multi_gpu.sh"
    text = script.read_text()
    loop = re.search(r"for method in ([a-z_ ]+); do", text)
    assert loop and tuple(loop.group(1).split()) == distributed.METHODS
    if torch.cuda.device_count() < 2:
        done = subprocess.run(["bash", str(script), str(tmp_path / "out")], capture_output=True, text=True,
                              cwd=root)
        assert done.returncode == 2 and "needs 2 or more CUDA GPUs" in done.stderr
        assert not (tmp_path / "out" / "tests.log").exists()
    for args in (["-m", "mla_dcp.bench", "--distributed", "--ranks", "2", "--device", "cuda", "--help"],
                 ["-m", "mla_dcp", "hf-demo", "--device", "cuda", "--ranks", "2", "--help"],
                 ["-m", "mla_dcp", "demo", "--device", "cuda", "--ranks", "2", "--method", "all_to_all", "--help"]):
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=root)
        assert done.returncode == 0, done.stderr
