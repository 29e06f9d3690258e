"""Speculative sampling end to end reproduces the target's distribution (chi-square against exact probabilities).

A tiny target (V = 8) and a different tiny draft generate 3 tokens for N identical prompts in one batch (rows
get independent randomness). The joint distribution of the first two tokens is computed exactly from the
target with the same sampling transform, and compared with a chi-square test (cells expected < 5 times pooled):
p-value > 1e-3 (a correct
sampler fails this 0.1 % of the time at a fixed seed; the seeds are fixed so the test is deterministic).
"""

import pytest
import torch
from conftest import perturbed_copy, tiny_model

import fastspec
from fastspec.kernels.sampling import sampling_probs


def chisquare(observed, expected):
    """scipy's chi-square test; the calling test skips where scipy is missing (the GPU image may lack it)."""
    return pytest.importorskip("scipy.stats").chisquare(observed, expected)


VOCAB = 8
N = 20_000


@torch.no_grad()
def exact_two_token_distribution(target, prompt, temperature, top_k, top_p):
    """P(t1, t2 | prompt) [V, V] under the transformed target distribution."""
    first = sampling_probs(target(prompt).logits[0, -1], temperature, top_k, top_p)
    joint = torch.zeros(VOCAB, VOCAB)
    for t1 in range(VOCAB):
        extended = torch.cat([prompt, torch.tensor([[t1]])], dim=1)
        joint[t1] = first[t1] * sampling_probs(target(extended).logits[0, -1], temperature, top_k, top_p)
    return joint.double()


def chi_square_pvalue(samples, expected_probs):
    observed = torch.bincount(samples[:, 0] * VOCAB + samples[:, 1], minlength=VOCAB * VOCAB).double()
    expected = expected_probs.flatten() / expected_probs.sum() * samples.shape[0]
    assert observed[expected == 0].sum() == 0, "sampled a pair the target gives probability 0"
    # cells expected fewer than 5 times are pooled into one, so the chi-square approximation holds
    big, small = expected >= 5, (expected > 0) & (expected < 5)
    observed = torch.cat([observed[big], observed[small].sum()[None]])
    expected = torch.cat([expected[big], expected[small].sum()[None]])
    if expected[-1] == 0:  # nothing to pool
        observed, expected = observed[:-1], expected[:-1]
    return chisquare(observed.numpy(), expected.numpy()).pvalue


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, None, None), (0.7, None, None), (1.0, 4, None), (1.3, None, 0.8)],
    ids=["plain", "temp0.7", "topk4", "topp0.8"],
)
@pytest.mark.parametrize("method", ["speculative", "autoregressive"])
def test_first_two_tokens_follow_target(method, temperature, top_k, top_p):
    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    draft = perturbed_copy(target, 0.25)  # a different model that agrees with the target part of the time
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = exact_two_token_distribution(target, prompt, temperature, top_k, top_p)
    out, stats = fastspec.generate(
        target, prompt.expand(N, -1), draft=draft if method == "speculative" else None, max_new_tokens=3,
        do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, num_draft_tokens=2, eos_token_id=None,
        seed=11, return_stats=True,
    )  # fmt: skip
    if method == "speculative":  # both accept and reject paths are exercised
        assert 0.1 < stats.acceptance_rate < 0.95
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("source", ["prompt_lookup", "lookup_then_draft"])
def test_prompt_lookup_first_two_tokens_follow_target(source, temperature):
    """One-hot lookup drafts (alone, or mixed with sampled draft-model drafts in one batch) stay lossless."""
    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    draft = perturbed_copy(target, 0.25) if source == "lookup_then_draft" else None
    prompt = torch.tensor([[1, 5, 3, 1, 5]])  # "1 5" occurred before: lookup proposes "3 1"
    expected = exact_two_token_distribution(target, prompt, temperature, None, None)
    out, stats = fastspec.generate(
        target, prompt.expand(N, -1), draft=draft, prompt_lookup=2, max_new_tokens=3, do_sample=True,
        temperature=temperature, num_draft_tokens=2, eos_token_id=None, seed=5, return_stats=True,
    )  # fmt: skip
    assert 0.05 < stats.acceptance_rate < 0.95  # lookups are accepted and rejected
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3
