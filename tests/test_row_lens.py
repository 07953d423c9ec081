"""Stage 1 against a token-by-token dealing simulation (mla_dcp.testing.deal_positions)."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mla_dcp
from mla_dcp import pure
from mla_dcp.testing import deal_positions

TestCase = pytest.importorskip("expecttest").TestCase   # a test dependency the GPU machines lack

MAX_LEN = 500


def dealt_count(length: int, world: int, rank: int, interleave: int) -> int:
    return sum(1 for p in deal_positions(MAX_LEN, world, interleave)[rank] if p < length)


def simulated_row_lens(seq_lens, qlen, world, rank, interleave):
    return [dealt_count(max(0, length - qlen + 1 + t), world, rank, interleave)
            for length in seq_lens for t in range(qlen)]


def committed_prefix_mutant(seq_lens, qlen, world, rank, interleave):
    """The known-wrong formula: local_len(L) - (q-1-t)."""
    local = pure.local_lens(torch.tensor(seq_lens, dtype=torch.int32), world, rank, interleave)
    rows = local[:, None] - (qlen - 1 - torch.arange(qlen))[None, :]
    return rows.clamp_min(0).reshape(-1).tolist()


@pytest.mark.parametrize("world", range(1, 9))
@pytest.mark.parametrize("interleave", [1, 2, 3, 4, 7, 16])
def test_local_lens_exhaustive(world, interleave):
    lengths = torch.arange(MAX_LEN + 1, dtype=torch.int32)
    total = torch.zeros_like(lengths)
    for rank in range(world):
        got = pure.local_lens(lengths, world, rank, interleave)
        assert got.dtype == torch.int32
        want = [dealt_count(n, world, rank, interleave) for n in range(MAX_LEN + 1)]
        assert got.tolist() == want, f"{world=} {rank=} {interleave=}"
        assert [pure.local_len(n, world, rank, interleave) for n in range(0, MAX_LEN + 1, 37)] == want[::37]
        total += got
    assert torch.equal(total, lengths)


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (3, 2), (4, 4), (8, 1), (8, 16), (5, 3)])
@pytest.mark.parametrize("qlen", range(1, 9))
def test_verify_row_lens_exhaustive(world, interleave, qlen):
    seq_lens = list(range(0, MAX_LEN + 1, 7)) + [1, 2, qlen, qlen + 1]
    visible = [max(0, n - qlen + 1 + t) for n in seq_lens for t in range(qlen)]
    total = torch.zeros(len(visible), dtype=torch.int32)
    for rank in range(world):
        got = pure.verify_row_lens(torch.tensor(seq_lens, dtype=torch.int32), qlen, world, rank, interleave)
        assert got.dtype == torch.int32 and got.shape == (len(seq_lens) * qlen,)
        assert got.tolist() == simulated_row_lens(seq_lens, qlen, world, rank, interleave)
        total += got
    assert total.tolist() == visible


@settings(max_examples=300, deadline=None)
@given(world=st.integers(1, 8), interleave=st.integers(1, 16), qlen=st.integers(1, 8),
       seq_lens=st.lists(st.integers(0, MAX_LEN), min_size=1, max_size=6), data=st.data())
def test_verify_row_lens_properties(world, interleave, qlen, seq_lens, data):
    rank = data.draw(st.integers(0, world - 1))
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    got = pure.verify_row_lens(lens, qlen, world, rank, interleave).view(-1, qlen)
    assert got.flatten().tolist() == simulated_row_lens(seq_lens, qlen, world, rank, interleave)
    # Later rows see a superset of earlier rows' keys, one more global key each.
    assert bool((got[:, 1:] >= got[:, :-1]).all())
    assert bool(((got[:, 1:] - got[:, :-1]) <= 1).all())
    # Padding requests give empty rows.
    assert bool((got[lens == 0] == 0).all())
    summed = sum(pure.verify_row_lens(lens, qlen, world, r, interleave) for r in range(world))
    assert summed.tolist() == [max(0, n - qlen + 1 + t) for n in seq_lens for t in range(qlen)]


def test_committed_prefix_formula_is_caught():
    """Negative control: the committed-prefix mutant disagrees with the simulation
    on cases the exhaustive test above covers."""
    caught = []
    for world, interleave, qlen in itertools.product((2, 3, 8), (1, 2), (2, 3, 4)):
        seq_lens = list(range(0, 60, 7))
        for rank in range(world):
            truth = simulated_row_lens(seq_lens, qlen, world, rank, interleave)
            if committed_prefix_mutant(seq_lens, qlen, world, rank, interleave) != truth:
                caught.append((world, interleave, qlen, rank))
            assert pure.verify_row_lens(
                torch.tensor(seq_lens, dtype=torch.int32), qlen, world, rank, interleave).tolist() == truth
    assert len(caught) > 0
    # The mutant is only right without DCP.
    assert all(world > 1 for world, *_ in caught)


class RowLensGolden(TestCase):
    def test_dcp2_rank0_q4(self):
        cfg = mla_dcp.VerifyConfig(num_heads=16, qlen=4, block_size=2, max_model_len=32,
                                   dcp_world_size=2, dcp_rank=0, kv_lora_rank=8, rope_dim=0,
                                   softmax_scale=0.25)
        view = mla_dcp.build_view(cfg, torch.tensor([10, 12], dtype=torch.int32),
                                  torch.arange(16, dtype=torch.int32).view(2, 8))
        self.assertExpectedInline(str(view.row_lens.tolist()), """[4, 4, 5, 5, 5, 5, 6, 6]""")

    def test_dcp8_block1536(self):
        cfg = mla_dcp.VerifyConfig(num_heads=16, qlen=3, block_size=1536, max_model_len=24576,
                                   dcp_world_size=8, dcp_rank=0, kv_lora_rank=8, rope_dim=0,
                                   softmax_scale=0.25)
        view = mla_dcp.build_view(cfg, torch.tensor([1000], dtype=torch.int32),
                                  torch.tensor([[0, 1]], dtype=torch.int32))
        self.assertExpectedInline(str(view.row_lens.tolist()), """[125, 125, 125]""")
        self.assertExpectedInline(str(view.page_table.tolist()), """[[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]]""")
