"""An EAGLE-3 head with a reduced draft vocabulary keeps sampling lossless: its q is 0 outside the kept tokens, where
the target puts real mass, and the residual of rejection sampling covers them (chi-square against the target's exact
joint distribution of the first two tokens, `test_generate_sampling`)."""

import pytest
import torch
from conftest import tiny_model

import fastspec
from fastspec.heads import Eagle3Head


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_reduced_vocab_head_samples_the_targets_distribution(temperature):
    from test_generate_sampling import VOCAB, N, chi_square_pvalue, exact_two_token_distribution

    target = tiny_model("llama", vocab=VOCAB, hidden=32, layers=4, init=0.5)
    torch.manual_seed(0)
    kept = torch.tensor([0, 2, 5, 6])  # half the vocabulary: the head can never draft 1, 3, 4 or 7
    head = Eagle3Head.from_target(target, draft_vocab_ids=kept, aux_layers=[1, 2, 3]).eval()
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = exact_two_token_distribution(target, prompt, temperature, None, None)
    outside = expected.sum(0)[[1, 3, 4, 7]].sum()  # P(second token is one the head cannot draft)
    assert outside > 0.05, "the target must put real mass outside the kept tokens for this test to mean anything"
    out, stats = fastspec.generate(target, prompt.expand(N, -1), draft=head, max_new_tokens=3, do_sample=True,
                                   temperature=temperature, num_draft_tokens=2, seed=21, return_stats=True)  # fmt: skip
    assert 0.05 < stats.acceptance_rate < 0.95
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3
