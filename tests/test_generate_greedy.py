"""Greedy speculative output equals `target.generate(do_sample=False)` token for token."""

import pytest
import torch
from conftest import hf_greedy, left_padded_batch, perturbed_copy, tiny_model

import fastspec

MAX_NEW = 24


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("lengths", [[9], [12, 5, 8]], ids=["batch1", "padded3"])
def test_greedy_chain_equals_hf(target_and_draft, k, lengths):
    arch, target, draft = target_and_draft
    ids, mask = left_padded_batch(target.config.vocab_size, lengths)
    expected = hf_greedy(target, ids, mask)
    out, stats = fastspec.generate(
        target, ids, draft=draft, attention_mask=mask, max_new_tokens=MAX_NEW, num_draft_tokens=k,
        eos_token_id=None, return_stats=True,
    )  # fmt: skip
    assert torch.equal(out, expected), f"{arch} K={k}: first mismatch row {(out != expected).any(1).nonzero()[0]}"
    # the perturbed draft must exercise partial acceptance, not only the trivial all/none cases
    assert 0.0 < stats.acceptance_rate < 1.0


@pytest.mark.parametrize("lengths", [[9], [12, 5, 8]], ids=["batch1", "padded3"])
def test_autoregressive_equals_hf(target_and_draft, lengths):
    arch, target, _ = target_and_draft
    ids, mask = left_padded_batch(target.config.vocab_size, lengths, seed=3)
    out, stats = fastspec.autoregressive_generate(
        target, ids, attention_mask=mask, max_new_tokens=MAX_NEW, eos_token_id=None, return_stats=True
    )
    assert torch.equal(out, hf_greedy(target, ids, mask)), arch
    assert stats.steps == MAX_NEW and stats.mean_accepted_length == 1.0


@pytest.mark.parametrize("k", [1, 4])
def test_draft_equal_to_target_accepts_everything(k):
    target = tiny_model("llama")
    ids, _ = left_padded_batch(256, [7])
    # max_new_tokens a multiple of K+1, so no step is shortened by the budget
    out, stats = fastspec.generate(
        target, ids, draft=target, max_new_tokens=4 * (k + 1), num_draft_tokens=k, eos_token_id=None,
        return_stats=True,
    )  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, max_new_tokens=4 * (k + 1)))
    assert stats.acceptance_rate == 1.0
    assert stats.mean_accepted_length == k + 1
    assert stats.steps == 4


def test_every_draft_rejected():
    target = tiny_model("qwen2")
    draft = tiny_model("qwen2", seed=7)  # unrelated weights: (almost) nothing is accepted
    ids, mask = left_padded_batch(256, [6, 10])
    out, stats = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=16,
                                   num_draft_tokens=4, eos_token_id=None, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert stats.acceptance_rate < 0.2


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7, 11])
def test_max_new_tokens_reached_inside_a_draft(max_new_tokens):
    target = tiny_model("gpt2")
    ids, mask = left_padded_batch(256, [5, 9, 3])
    out = fastspec.generate(target, ids, draft=target, attention_mask=mask, max_new_tokens=max_new_tokens,
                            num_draft_tokens=4, eos_token_id=None)  # fmt: skip
    assert out.shape == (3, 9 + max_new_tokens)
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=max_new_tokens))


def test_eos_inside_accepted_draft():
    target = tiny_model("llama")
    ids, mask = left_padded_batch(256, [8, 8, 5], seed=5)
    free = hf_greedy(target, ids, mask, max_new_tokens=20)
    # stop on a token that row 0 emits mid-generation: with draft == target it lies inside an accepted draft
    eos = int(free[0, 8 + 6])
    expected = hf_greedy(target, ids, mask, max_new_tokens=20, eos_token_id=eos)
    out = fastspec.generate(target, ids, draft=target, attention_mask=mask, max_new_tokens=20, num_draft_tokens=5,
                            eos_token_id=eos)  # fmt: skip
    assert torch.equal(out, expected)
    assert (out[0, 8:] == eos).nonzero()[0].item() <= 6


def test_cross_architecture_draft():
    target = tiny_model("gpt2")
    draft = perturbed_copy(tiny_model("llama", layers=1), 0.0)
    ids, mask = left_padded_batch(256, [6, 4])
    out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=12, num_draft_tokens=3,
                            eos_token_id=None)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=12))
