"""Medusa heads in `fastspec.generate` (`fastspec.drafters.MedusaDrafter`): independent drafts from the target's last
hidden state, verified by standard rejection sampling, so greedy output equals HF's and sampling stays the target's."""

import pytest
import torch
from conftest import hf_greedy, left_padded_batch, tiny_model

import fastspec
from fastspec.heads import MedusaHead
from fastspec.runner import target_logits_and_features

HEADS = 3
MAX_NEW = 24


PROMPTS = [([10, 6, 13], 7), ([10, 6], 8)]  # (lengths, seed) of the left-padded batches the tests decode


def fitted_medusa(target, prompts=PROMPTS, steps: int = 200) -> MedusaHead:
    """Medusa heads (no residual blocks) fitted by cross-entropy to the target's greedy continuations of the test
    prompts: head i maps the last hidden state at t to the token at t + i + 2. Fitted to the very text it drafts
    (a tiny random target's continuations do not generalise), so it accepts a share of its drafts, which the
    tests need; losslessness never depends on the head."""
    rows, states = [], []
    for lengths, seed in prompts:
        ids, mask = left_padded_batch(target.config.vocab_size, lengths, seed=seed)
        sequences = hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW)
        full = torch.cat([mask, torch.ones_like(sequences[:, ids.shape[1] :])], dim=1)
        with torch.no_grad():
            _, hidden = target_logits_and_features(target, 1, [-1], input_ids=sequences, attention_mask=full)
        start = ids.shape[1] - 1  # the last prompt column, then the generated text
        rows.append(sequences[:, start:])
        states.append(hidden[:, start:])
    sequences, states = torch.cat(rows), torch.cat(states)
    head = MedusaHead(target.config.hidden_size, target.config.vocab_size, HEADS, num_layers=0, bias=False)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    for _ in range(steps):
        logits = head(states)  # [B, T, heads, V]
        loss = 0.0
        for i in range(HEADS):
            span = sequences.shape[1] - i - 2
            loss = loss + torch.nn.functional.cross_entropy(
                logits[:, :span, i].flatten(0, 1), sequences[:, i + 2 :].flatten()
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()


@pytest.fixture(scope="module")
def target_and_medusa():
    target = tiny_model("llama", init=0.5)
    return target, fitted_medusa(target)


@pytest.mark.parametrize("k", [1, 3, 5, "auto"])
def test_medusa_greedy_equals_hf(target_and_medusa, k):
    target, head = target_and_medusa
    ids, mask = left_padded_batch(target.config.vocab_size, *PROMPTS[0])
    out, stats = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=MAX_NEW,
                                   num_draft_tokens=k, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW))
    assert stats.accepted > 0  # the fitted heads draft something the target agrees with
    assert len(stats.drafted_per_position) <= HEADS  # never more drafts than heads


def test_medusa_behind_prompt_lookup_and_static_cache(target_and_medusa):
    target, head = target_and_medusa
    ids, mask = left_padded_batch(target.config.vocab_size, *PROMPTS[1])
    out = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=MAX_NEW, prompt_lookup=2,
                            static_cache=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW))


def test_medusa_refuses_trees(target_and_medusa):
    target, head = target_and_medusa
    with pytest.raises(ValueError, match="tree"):
        fastspec.generate(target, torch.tensor([[1, 2, 3]]), draft=head, tree="small")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_medusa_sampled_tokens_follow_the_target(temperature):
    """The joint distribution of the first two sampled tokens (the second drafted by Medusa head 0 and verified)
    against the target's exact one: chi-square p-value > 1e-3 over 20,000 rows (`test_generate_sampling`)."""
    from test_generate_sampling import VOCAB, N, chi_square_pvalue, exact_two_token_distribution

    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    torch.manual_seed(0)
    head = MedusaHead(32, VOCAB, HEADS, num_layers=1).eval()  # random: over 8 tokens it overlaps the target's q
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = exact_two_token_distribution(target, prompt, temperature, None, None)
    out, stats = fastspec.generate(target, prompt.expand(N, -1), draft=head, max_new_tokens=3, do_sample=True,
                                   temperature=temperature, num_draft_tokens=2, seed=13, return_stats=True)  # fmt: skip
    assert 0.05 < stats.acceptance_rate < 0.95  # accept and reject paths are exercised
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3
