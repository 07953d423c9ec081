"""Bad input: a clear error naming the argument, what was expected and what was given."""

import dataclasses
import os

import pytest
import torch

import mla_dcp

TestCase = pytest.importorskip("expecttest").TestCase   # a test dependency the GPU machines lack

CFG = mla_dcp.VerifyConfig(num_heads=4, qlen=2, block_size=16, max_model_len=128, dcp_world_size=2,
                           kv_lora_rank=32, rope_dim=8, softmax_scale=0.15)


def good_inputs():
    seq_lens = torch.tensor([5, 20], dtype=torch.int32)
    block_table = torch.zeros(2, 4, dtype=torch.int32)
    view = mla_dcp.build_view(CFG, seq_lens, block_table)
    q = torch.randn(4, 4, 40)
    kv = torch.randn(3, 16, 40)
    return seq_lens, block_table, view, q, kv


def message(fn, *args, **kwargs):
    with pytest.raises((ValueError, TypeError)) as info:
        fn(*args, **kwargs)
    return f"{type(info.value).__name__}: {info.value}"


class ValidationGolden(TestCase):
    def test_good_inputs_pass(self):
        seq_lens, block_table, view, q, kv = good_inputs()
        out, lse = mla_dcp.verify(CFG, view, q, kv)
        assert out.shape == (4, 4, 32) and lse.shape == (4, 4)

    def test_build_view_errors(self):
        seq_lens, block_table, _, _, _ = good_inputs()
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, seq_lens.long(), block_table),
                                  """TypeError: seq_lens must have dtype torch.int32, got torch.int64""")
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, seq_lens, block_table.long()),
                                  """TypeError: block_table must have dtype torch.int32, got torch.int64""")
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, seq_lens[None], block_table),
                                  """ValueError: seq_lens must have shape [B], got [1, 2]""")
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, seq_lens, block_table[:1]),
                                  """ValueError: block_table must have shape [2, max_blocks], got [1, 4]""")
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, seq_lens, block_table[:, :3]),
                                  """ValueError: block_table must have at least 4 columns (cdiv(max_local_len=64, block_size=16) for max_model_len=128), got [2, 3]""")
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, [5, 20], block_table),
                                  """TypeError: seq_lens must be a torch.Tensor, got list""")
        self.assertExpectedInline(message(mla_dcp.build_view, "cfg", seq_lens, block_table),
                                  """TypeError: cfg must be a mla_dcp.VerifyConfig, got str""")

    def test_verify_errors(self):
        _, _, view, q, kv = good_inputs()
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q[0], kv),
                                  """ValueError: q must have shape [4, 4, 40], got [4, 40]""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q[:, :3], kv),
                                  """ValueError: q must have shape [4, 4, 40], got [4, 3, 40]""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q[..., :32], kv),
                                  """ValueError: q must have shape [4, 4, 40], got [4, 4, 32]""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q.double(), kv),
                                  """TypeError: q must have dtype torch.float32 or torch.float16 or torch.bfloat16, got torch.float64""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv[:, :8]),
                                  """ValueError: kv_cache must have shape [num_blocks, 16, 40], got [3, 8, 40]""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv.half()),
                                  """TypeError: kv_cache must have q's dtype (torch.float32) or an fp8 e4m3 dtype (torch.float8_e4m3fn or torch.float8_e4m3fnuz), got torch.float16""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv.to(torch.float8_e4m3fn)),
                                  """ValueError: kv_scale is required for an fp8 kv_cache (torch.float8_e4m3fn): pass the float32 [1] per-tensor dequantization scale, got None""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv.to(torch.float8_e4m3fn), torch.ones(1, dtype=torch.float64)),
                                  """TypeError: kv_scale must have dtype torch.float32, got torch.float64""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv.to(torch.float8_e4m3fn), torch.ones(2)),
                                  """ValueError: kv_scale must have shape [1], got [2]""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view._replace(row_lens=view.row_lens.long()), q, kv),
                                  """TypeError: view.row_lens must have dtype torch.int32, got torch.int64""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view._replace(page_table=view.page_table[:, :2]), q, kv),
                                  """ValueError: view.page_table must have shape [2, 4], got [2, 2]""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, (view.row_lens, view.page_table), q, kv),
                                  """TypeError: view must be the mla_dcp.VerifyView or MaskedView from build_view, got tuple""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, torch.randn(3, 40, 16).transpose(1, 2)),
                                  """ValueError: kv_cache must be contiguous in its last dim with blocks evenly strided (stride(0) == block_size * stride(1)), got strides (640, 1, 16)""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, torch.randn(4, 40, 4).transpose(1, 2), kv),
                                  """ValueError: q must be contiguous in its last dim, got strides (160, 1, 4)""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv.to("meta")),
                                  """ValueError: kv_cache must be on the same device as q (cpu), got meta""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv, torch.ones(1)),
                                  """ValueError: kv_scale must be None for a torch.float32 kv_cache (it dequantizes fp8 caches only), got a Tensor""")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, kv.to(torch.float8_e5m2), torch.ones(1)),
                                  """TypeError: kv_cache must have q's dtype (torch.float32) or an fp8 e4m3 dtype (torch.float8_e4m3fn or torch.float8_e4m3fnuz), got torch.float8_e5m2""")
        other_rank = dataclasses.replace(CFG, dcp_rank=1)
        self.assertExpectedInline(message(mla_dcp.verify, other_rank, view, q, kv),
                                  """ValueError: view was built by build_view for another cfg than verify's (dcp_rank=0 vs 1): build each rank's view with the config it is verified with""")

    def test_merge_ranks_errors(self):
        outs, lses = torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 4)
        self.assertExpectedInline(message(mla_dcp.merge_ranks, outs[0], lses),
                                  """ValueError: outs must have shape [W, T, H, Dl], got [3, 4, 8]""")
        self.assertExpectedInline(message(mla_dcp.merge_ranks, outs, lses[:, :2]),
                                  """ValueError: lses must have shape [2, 3, 4], got [2, 2, 4]""")
        self.assertExpectedInline(message(mla_dcp.merge_ranks, outs, lses.half()),
                                  """TypeError: lses must have dtype torch.float32, got torch.float16""")
        self.assertExpectedInline(message(mla_dcp.merge_ranks, outs[:0], lses[:0]),
                                  """ValueError: outs must hold at least one rank's partial (W >= 1), got shape [0, 3, 4, 8]""")

    def test_config_errors(self):
        def make(**overrides):
            base = dict(num_heads=4, qlen=2, block_size=16, max_model_len=128, softmax_scale=0.15)
            return mla_dcp.VerifyConfig(**{**base, **overrides})
        self.assertExpectedInline(message(make, dcp_world_size=2, dcp_rank=2),
                                  """ValueError: VerifyConfig.dcp_rank must be an int in [0, dcp_world_size=2), got 2""")
        self.assertExpectedInline(message(make, interleave=0),
                                  """ValueError: VerifyConfig.interleave must be an int >= 1, got 0""")
        self.assertExpectedInline(message(make, qlen=0),
                                  """ValueError: VerifyConfig.qlen must be an int >= 1, got 0""")
        self.assertExpectedInline(message(make, block_size=-16),
                                  """ValueError: VerifyConfig.block_size must be an int >= 1, got -16""")
        self.assertExpectedInline(message(make, softmax_scale=float("nan")),
                                  """ValueError: VerifyConfig.softmax_scale must be a finite float > 0 (the model's own scale, e.g. mla_dcp.softmax_scale_for(...)), got nan""")
        self.assertExpectedInline(message(make, num_segments=0),
                                  """ValueError: VerifyConfig.num_segments must be an int >= 1 or None, got 0""")
        self.assertExpectedInline(message(make, max_model_len=1, qlen=2),
                                  """ValueError: VerifyConfig.max_model_len must be >= qlen=2 (a request holds its qlen verify tokens), got 1""")
        self.assertExpectedInline(message(make, softmax_scale=None),
                                  """ValueError: VerifyConfig.softmax_scale must be a finite float > 0 (the model's own scale, e.g. mla_dcp.softmax_scale_for(...)), got None""")
        self.assertExpectedInline(message(make, stream=1),
                                  """ValueError: VerifyConfig.stream must be None, True or False, got 1""")
        self.assertExpectedInline(message(make, stream=True, batch_invariant=True),
                                  """ValueError: VerifyConfig.stream=True needs batch_invariant=False and num_segments=None (both keep one piece per program), got batch_invariant=True, num_segments=None""")
        self.assertExpectedInline(message(make, stream=True, num_segments=2),
                                  """ValueError: VerifyConfig.stream=True needs batch_invariant=False and num_segments=None (both keep one piece per program), got batch_invariant=False, num_segments=2""")
        self.assertExpectedInline(message(mla_dcp.VerifyConfig, num_heads=4, qlen=2, block_size=16, max_model_len=128),
                                  """TypeError: VerifyConfig.__init__() missing 1 required keyword-only argument: 'softmax_scale'""")


def test_config_is_hashable_and_frozen():
    assert hash(CFG) == hash(mla_dcp.VerifyConfig(**{f: getattr(CFG, f) for f in CFG.__dataclass_fields__}))
    with pytest.raises(AttributeError):
        CFG.qlen = 3


def test_validation_reads_no_values():
    """Meta tensors have no values: validation and shape inference must still work."""
    seq_lens, block_table, view, q, kv = good_inputs()
    meta_view = mla_dcp.build_view(CFG, seq_lens.to("meta"), block_table.to("meta"))
    out, lse = mla_dcp.verify(CFG, meta_view, q.to("meta"), kv.to("meta"))
    assert out.shape == (4, 4, 32) and lse.shape == (4, 4) and out.device.type == "meta"


class CheckedModeGolden(TestCase):
    """MLA_DCP_CHECK=1 / check=True: values validated before any launch."""

    def test_build_view_values(self):
        seq_lens, block_table, _, _, _ = good_inputs()
        bad_table = block_table.clone()
        bad_table[1, 0] = -1
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, seq_lens, bad_table, check=True),
                                  """ValueError: block_table[1, 0] must be >= 0 where a request reads it (its first cdiv(local_len, block_size=16) columns), got -1 (1 bad entries)""")
        too_long = torch.tensor([5, 129], dtype=torch.int32)
        self.assertExpectedInline(message(mla_dcp.build_view, CFG, too_long, block_table, check=True),
                                  """ValueError: seq_lens[1] must be in [0, max_model_len=128], got 129 (1 bad entries)""")
        # Entries a request never reads may hold anything.
        unused = block_table.clone()
        unused[0, 3] = -7
        mla_dcp.build_view(CFG, seq_lens, unused, check=True)

    def test_verify_values(self):
        seq_lens, block_table, view, q, kv = good_inputs()
        far = block_table.clone()
        far[1, 0] = 3          # kv holds 3 blocks
        self.assertExpectedInline(
            message(mla_dcp.verify, CFG, mla_dcp.build_view(CFG, seq_lens, far), q, kv, check=True), """ValueError: view.page_table[1, 0] must be a page id in [0, 3) where a row reads it (block ids in [0, num_blocks=3) of kv_cache, 1 pages per block), got 3 (1 bad entries)""")
        bad_q = q.clone()
        bad_q[3, 1, 7] = float("inf")
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, bad_q, kv, check=True), """ValueError: q[3, 1, 7] must be finite on rows that have keys (NaN or inf there poisons the row), got inf (1 bad entries)""")
        fp8 = kv.to(torch.float8_e4m3fn)
        self.assertExpectedInline(message(mla_dcp.verify, CFG, view, q, fp8, torch.zeros(1), check=True), """ValueError: kv_scale[0] must be finite and > 0, got 0.0 (1 bad entries)""")
        too_long = mla_dcp.build_view(CFG, torch.tensor([5, 300], dtype=torch.int32), block_table)
        self.assertExpectedInline(message(mla_dcp.verify, CFG, too_long, q, kv, check=True), """ValueError: view.row_lens[2] must be in [0, max_local_len=64] (seq_lens beyond max_model_len=128?), got 150 (2 bad entries)""")


def test_check_mode_from_the_environment(monkeypatch):
    seq_lens, block_table, view, q, kv = good_inputs()
    bad_table = block_table.clone()
    bad_table[1, 0] = -1
    mla_dcp.build_view(CFG, seq_lens, bad_table)            # off by default: no value is read
    monkeypatch.setenv("MLA_DCP_CHECK", "1")
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] must be >= 0"):
        mla_dcp.build_view(CFG, seq_lens, bad_table)
    bad_q = q.clone()
    bad_q[0, 0, 0] = float("nan")                            # row 0 (request 0) has keys
    with pytest.raises(ValueError, match=r"q\[0, 0, 0\] must be finite"):
        mla_dcp.verify(CFG, view, bad_q, kv)
    # A row without keys may hold anything (padding rows often do).
    padding = mla_dcp.build_view(CFG, torch.tensor([0, 20], dtype=torch.int32), block_table)
    mla_dcp.verify(CFG, padding, bad_q, kv)


def test_the_check_flag_is_read_as_os_environ_holds_it(monkeypatch):
    """check_requested answers from os.environ's own dict: it must follow every write
    through os.environ, and a replaced os.environ (a mapping without that dict)."""
    from mla_dcp import _checks

    for value, wanted in (("1", True), ("0", False), ("", False), ("11", False), ("1", True)):
        monkeypatch.setenv("MLA_DCP_CHECK", value)
        assert _checks.check_requested() is wanted, value
        assert _checks.values_checked(False) is wanted, value
    monkeypatch.delenv("MLA_DCP_CHECK")
    assert _checks.check_requested() is False
    os.environ["MLA_DCP_CHECK"] = "1"     # a plain write (monkeypatch undoes it below)
    assert _checks.check_requested() is True
    monkeypatch.setattr(os, "environ", {"MLA_DCP_CHECK": "1"})
    assert _checks.check_requested() is True
    monkeypatch.setattr(os, "environ", {})
    assert _checks.check_requested() is False
    # Any reader made on a mapping without the dict reads it publicly.
    monkeypatch.setattr(os, "environ", {"MLA_DCP_X": "on"})
    reader = _checks._env_reader("MLA_DCP_X", "on")
    assert reader() is True
    os.environ["MLA_DCP_X"] = "off"
    assert reader() is False


def test_a_negative_block_id_is_loud_without_check_mode_too():
    """Unchecked, the CPU path must not read block -1 as the last block: the
    rows that read it come out NaN."""
    seq_lens, block_table, _, q, kv = good_inputs()
    bad_table = block_table.clone()
    bad_table[1, 0] = -1
    out, lse = mla_dcp.verify(CFG, mla_dcp.build_view(CFG, seq_lens, bad_table), q, kv)
    assert bool(lse[2:].isnan().all()) and bool(out[2:].isnan().all()) and bool(lse[:2].isfinite().all())


def test_empty_batch_gives_empty_outputs():
    for num_segments in (None, 1, 3):
        cfg = dataclasses.replace(CFG, num_segments=num_segments)
        view = mla_dcp.build_view(cfg, torch.zeros(0, dtype=torch.int32), torch.zeros(0, 4, dtype=torch.int32))
        out, lse = mla_dcp.verify(cfg, view, torch.randn(0, 4, 40), torch.randn(3, 16, 40))
        assert out.shape == (0, 4, 32) and lse.shape == (0, 4)


def test_backward_says_inference_only():
    seq_lens, block_table, view, q, kv = good_inputs()
    out, lse = mla_dcp.verify(CFG, view, q.requires_grad_(), kv)
    with pytest.raises(RuntimeError, match="mla_dcp is inference-only"):
        out.float().sum().backward()


def test_rope_dim_zero_is_a_model_without_rope():
    from mla_dcp.testing import check_problem, make_problem

    problem = make_problem([0, 7, 40], qlen=2, num_heads=2, kv_lora_rank=16, rope_dim=0, world=2, block_size=8,
                           max_model_len=48)
    check_problem(problem, torch.float32, None)
