"""The public API under random shapes, dtypes and metadata (hypothesis, CPU).

Every call either returns what the global reference says (NaN where DESIGN
says NaN, exact -inf/NaN positions) or raises a ValueError / TypeError that
names an argument; never another exception, never a silently wrong answer.
"""

import dataclasses
import math
import re

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import mla_dcp
from mla_dcp.testing import assert_close_special, error_budget, make_problem, merge_partials

ARGUMENTS = ("cfg", "view", "seq_lens", "block_table", "q", "kv_cache", "kv_scale", "outs", "lses",
             "VerifyConfig", "softmax_scale")
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Inputs a user could get wrong, each applied to an otherwise valid call.
BREAKAGES = ["none", "none", "none", "q_heads", "q_dtype", "kv_dtype_e5m2", "kv_width", "scale_with_16bit",
             "no_scale_with_fp8", "int64_lens", "narrow_table", "view_of_other_rank", "merge_no_ranks",
             "q_nan", "q_inf", "too_long"]
MODES = ["causal", "causal", "non-causal", "tree", "batch-invariant"]


def names_an_argument(error: Exception) -> bool:
    return any(re.search(rf"\b{name}\b", str(error)) for name in ARGUMENTS)


@st.composite
def problems(draw):
    world = draw(st.integers(1, 3))
    case = dict(
        qlen=draw(st.integers(1, 4)), num_heads=draw(st.integers(1, 3)), kv_lora_rank=draw(st.sampled_from([4, 8, 16])),
        rope_dim=draw(st.sampled_from([0, 4, 8])), world=world, interleave=draw(st.integers(1, 3)),
        block_size=draw(st.sampled_from([1, 2, 3, 16, 24])), num_segments=draw(st.sampled_from([None, 1, 2, 5])),
        softmax_scale=draw(st.floats(0.05, 1.0)), seed=draw(st.integers(0, 1000)))
    max_model_len = draw(st.integers(case["qlen"], 80))
    lens = draw(st.lists(st.integers(0, max_model_len), min_size=0, max_size=4))
    dtype = draw(st.sampled_from(DTYPES))
    kv = draw(st.sampled_from(["same", "fp8"])) if dtype != torch.float32 else "same"
    breakage = draw(st.sampled_from(BREAKAGES))
    # The static modes each change which keys a row sees or how its sum is cut; every breakage
    # must be refused or answered right under each of them too.
    mode = draw(st.sampled_from(MODES))
    if mode == "non-causal":
        case["causal"] = False
    elif mode == "tree":
        # Node i hangs from an earlier node or the context (-1): a random token tree.
        parents = [draw(st.integers(-1, i - 1)) for i in range(case["qlen"])]
        case["block_mask"] = mla_dcp.tree_mask(torch.tensor(parents, dtype=torch.int32))
    elif mode == "batch-invariant":
        case["num_segments"] = None
    return case, max_model_len, lens, dtype, kv, breakage, mode


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_call_is_right_or_names_an_argument(drawn):
    case, max_model_len, lens, dtype, kv, breakage, mode = drawn
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else dtype
    problem = make_problem(lens, max_model_len=max_model_len, dtype=dtype, kv_dtype=kv_dtype, **case)
    seq_lens, q, kv_scale = problem.seq_lens, problem.q, problem.kv_scale
    rows = q.shape[0]
    poisoned_rows = torch.zeros(rows, dtype=torch.bool)
    if breakage == "q_nan" and rows:
        q[0, 0, 0] = math.nan
    elif breakage == "q_inf" and rows:
        q[rows - 1, 0, -1] = -math.inf
    elif breakage == "too_long" and lens:
        seq_lens = seq_lens.clone()
        seq_lens[-1] = max_model_len + 5
        poisoned_rows[-case["qlen"]:] = True
    try:
        partials = []
        for shard in problem.shards:
            cfg, table, cache, scale, query, lens_in = shard.cfg, shard.block_table, shard.kv_cache, kv_scale, q, seq_lens
            if mode == "batch-invariant":
                cfg = dataclasses.replace(cfg, batch_invariant=True, invariant_segment_tokens=128)
            if breakage == "int64_lens":
                lens_in = lens_in.long()
            if breakage == "narrow_table":
                table = table[:, :cfg.min_table_blocks - 1]
            view = mla_dcp.build_view(cfg, lens_in, table, block_mask=problem.block_mask)
            if breakage == "view_of_other_rank" and cfg.dcp_world_size > 1:
                cfg = dataclasses.replace(cfg, dcp_rank=(cfg.dcp_rank + 1) % cfg.dcp_world_size)
            if breakage == "q_heads":
                query = query[:, :0]
            if breakage == "q_dtype":
                query = query.double()
            if breakage == "kv_dtype_e5m2":
                cache, scale = cache.float().to(torch.float8_e5m2), torch.ones(1)
            if breakage == "kv_width":
                cache = cache[..., :-1]
            if breakage == "scale_with_16bit" and scale is None:
                scale = torch.ones(1)
            if breakage == "no_scale_with_fp8":
                scale = None
            partials.append(mla_dcp.verify(cfg, view, query, cache, scale))
        if breakage == "merge_no_ranks":
            partials = partials[:0]
            mla_dcp.merge_ranks(torch.zeros(0, rows, case["num_heads"], case["kv_lora_rank"]),
                                torch.zeros(0, rows, case["num_heads"]))
        out, lse = merge_partials(partials)
    except (ValueError, TypeError) as error:
        assert names_an_argument(error), f"{type(error).__name__} names no argument: {error}"
        event(f"refused: {breakage}")
        return
    event(f"answered: {breakage}")
    event(f"answered in mode {mode}")
    exact_out, exact_lse = problem.reference()
    exact_out[poisoned_rows] = math.nan
    exact_lse[poisoned_rows] = math.nan
    assert out.shape == exact_out.shape and out.dtype == dtype and lse.dtype == torch.float32
    low = dtype != torch.float32 or kv_dtype != dtype
    reference_low = problem.reference(dtype)[0]
    reference_low[poisoned_rows] = math.nan
    budget = max(error_budget(exact_out, reference_low, dtype), 1e-4) if low else 1e-4
    assert_close_special("lse", lse, exact_lse, max(budget, 1e-4))
    assert_close_special("out", out, exact_out, budget)


@pytest.mark.parametrize("argv", [["--world", "0"], ["--device", "cuda"], ["--device", "nonsense"],
                                  ["--seq-lens", "600"], ["--softmax-scale", "0"]])
def test_demo_refuses_bad_options_in_one_line(argv, capsys):
    from mla_dcp import demo

    if argv == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit) as info:
        demo.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("python -m mla_dcp demo: error: ")
