"""Model-level exactness: verifying drafts under DCP equals one-at-a-time decoding."""

import pytest
import torch

from mla_dcp.tiny_mla import ShardedPagedCache, TinyMLA, greedy_reference, speculative_generate

DRAFTS = 3
STEPS = 4


@pytest.fixture(scope="module")
def setup():
    model = TinyMLA(seed=0)
    prompt = torch.randint(0, model.cfg.vocab, (2, 5), generator=torch.Generator().manual_seed(1))
    reference = greedy_reference(model, prompt, prompt.shape[1] + STEPS * (DRAFTS + 1) + DRAFTS + 1)
    return model, prompt, reference


def reference_drafts(reference):
    def draft(step, committed):
        # The tokens greedy decoding would produce after the next one.
        return torch.tensor([reference["tokens"][b][len(row) + 1:len(row) + 1 + DRAFTS]
                             for b, row in enumerate(committed)])
    return draft


def wrong_at(reference, index_of_step):
    good = reference_drafts(reference)

    def draft(step, committed):
        drafts = good(step, committed).clone()
        wrong = index_of_step(step)
        if wrong is not None:
            drafts[:, wrong] = (drafts[:, wrong] + 1) % 97
        return drafts
    return draft


def check_against_reference(result, reference):
    for b, tokens in enumerate(result["tokens"]):
        assert tokens == reference["tokens"][b][:len(tokens)], f"request {b}: committed tokens differ"
        got = torch.stack(result["logits"][b])
        want = torch.stack(reference["logits"][b][:len(tokens)])
        # fp32 end to end; the verify path absorbs W_uk into the query, the
        # reference does not: rounding differs, nothing else may.
        budget = 64 * torch.finfo(torch.float32).eps * want.abs().max().item()
        err = (got - want).abs().max().item()
        assert err <= budget, f"request {b}: logits differ by {err:.2e} > {budget:.2e}"


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 1), (2, 2), (4, 1), (4, 3)])
def test_all_drafts_accepted(setup, world, interleave):
    model, prompt, reference = setup
    result = speculative_generate(model, prompt, STEPS, reference_drafts(reference), world, interleave)
    assert result["accepted"] == [[DRAFTS, DRAFTS]] * STEPS
    check_against_reference(result, reference)


@pytest.mark.parametrize("world,interleave", [(1, 1), (2, 2), (4, 1)])
def test_wrong_drafts_rejected_at_first_mismatch(setup, world, interleave):
    model, prompt, reference = setup
    # Step s puts a wrong token at draft index s % 3 (step 3: none wrong).
    result = speculative_generate(model, prompt, STEPS, wrong_at(reference, lambda s: s if s < DRAFTS else None),
                                  world, interleave)
    assert result["accepted"] == [[0, 0], [1, 1], [2, 2], [DRAFTS, DRAFTS]]
    check_against_reference(result, reference)


def test_a_wrong_rank_merge_is_caught(setup):
    """Negative control: merging ranks by a plain average (ignoring LSEs) must
    break exactness under DCP, so the tests above can see a merge bug."""
    model, prompt, reference = setup
    cache = ShardedPagedCache(model.cfg, prompt.shape[0], world=2)
    good = model.verify_step(prompt, torch.zeros(2, dtype=torch.long), cache)
    cache = ShardedPagedCache(model.cfg, prompt.shape[0], world=2)
    bad = model.verify_step(prompt, torch.zeros(2, dtype=torch.long), cache,
                            merge=lambda outs, lses: (outs.mean(0), lses.amax(0)))
    want = torch.stack([torch.stack(reference["logits"][b][:prompt.shape[1]]) for b in range(2)])
    assert (good - want).abs().max() < 1e-4
    assert (bad - want).abs().max() > 1e-2
