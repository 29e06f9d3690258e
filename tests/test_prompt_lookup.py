"""Prompt lookup drafting: proposals equal a plain Python search; greedy output equals HF greedy output."""

import pytest
import torch
from conftest import left_padded_batch, perturbed_copy, tiny_model

import fastspec
from fastspec.drafters import DraftModelDrafter, DraftSetup, LookupThenDrafter, PromptLookupDrafter, lookup_ngram
from fastspec.rng import RowRandom
from fastspec.sampling import Sampler


def reference_lookup(row: list[int], ngram: int, k: int) -> list[int]:
    """The obvious loop: the most recent earlier occurrence of the longest matching suffix n-gram."""
    for n in range(min(ngram, len(row) - 1), 0, -1):
        suffix = row[-n:]
        for start in range(len(row) - n - 1, -1, -1):  # most recent first, never the suffix itself
            if row[start : start + n] == suffix:
                follow = start + n
                period = len(row) - follow
                return [row[follow + j % period] for j in range(k)]
    return []


@pytest.mark.parametrize("seed", range(20))
def test_lookup_matches_reference_search(seed):
    gen = torch.Generator().manual_seed(seed)
    vocab = [3, 5, 8][seed % 3]  # small vocabularies: many repeated n-grams; larger: often no match at all
    tokens = torch.randint(0, vocab, (4, 12 + seed), generator=gen)
    for ngram, k in [(1, 3), (2, 4), (3, 5)]:
        drafts, num, _ = lookup_ngram(tokens, torch.ones_like(tokens), ngram, k)
        for row in range(tokens.shape[0]):
            expected = reference_lookup(tokens[row].tolist(), ngram, k)
            assert drafts[row, : num[row]].tolist() == expected, (row, ngram, k)


def test_lookup_edge_cases():
    ones = lambda t: torch.ones_like(t)  # noqa: E731
    # no match: nothing drafted
    t = torch.tensor([[1, 2, 3, 4]])
    assert lookup_ngram(t, ones(t), 2, 3)[1].item() == 0
    # the most recent of repeated n-grams wins
    t = torch.tensor([[7, 8, 1, 7, 8, 2, 7, 8]])
    drafts, num, match_len = lookup_ngram(t, ones(t), 2, 2)
    assert num.item() == 2 and drafts[0].tolist() == [2, 7] and match_len.item() == 2
    # a match just before the end continues periodically
    t = torch.tensor([[4, 5, 6, 5, 6]])
    drafts, num, _ = lookup_ngram(t, ones(t), 2, 5)
    assert drafts[0].tolist() == [5, 6, 5, 6, 5]
    # windows that touch left padding never match
    t = torch.tensor([[9, 9, 1, 9]])
    drafts, num, _ = lookup_ngram(t, torch.tensor([[0, 0, 1, 1]]), 1, 2)
    assert num.item() == 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_prompt_lookup_greedy_equals_hf(arch):
    target = tiny_model(arch, vocab=16, init=0.5)  # small vocabulary: the text repeats, so lookups hit
    ids, mask = left_padded_batch(16, [20, 9, 14])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0)
    out, stats = fastspec.generate(target, ids, attention_mask=mask, prompt_lookup=3, max_new_tokens=30,
                                   num_draft_tokens=4, return_stats=True)  # fmt: skip
    assert torch.equal(out, expected)
    assert stats.accepted > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("num_draft_tokens", [3, "auto"])
def test_lookup_then_draft_greedy_equals_hf(arch, num_draft_tokens):
    target = tiny_model(arch, vocab=16, init=0.5)
    draft = perturbed_copy(target, 0.05)
    ids, mask = left_padded_batch(16, [20, 9, 14])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0)
    out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, prompt_lookup=3, max_new_tokens=30,
                            num_draft_tokens=num_draft_tokens)  # fmt: skip
    assert torch.equal(out, expected)


def _model_drafter(model, target_vocab: int) -> DraftModelDrafter:
    """A draft-model drafter with a growing cache, outside a generate call (no target runner needed)."""
    return DraftModelDrafter(model, DraftSetup(None, target_vocab, None, False, True, "auto"))


def test_lookup_then_draft_picks_a_source_per_row():
    target = tiny_model("llama", vocab=16, init=0.5)
    drafter = LookupThenDrafter(2, _model_drafter(perturbed_copy(target, 0.05), 16))
    tokens = torch.tensor([[7, 8, 9, 1, 7, 8], [1, 2, 3, 4, 5, 6]])  # row 0: "7 8" occurred; row 1: no match
    sampler = Sampler(do_sample=True, temperature=1.0, rng=RowRandom(torch.tensor([0, 1])))
    sampler = sampler.for_step(torch.tensor([0, 1]), torch.tensor([0, 0]))
    mask = torch.ones_like(tokens)
    drafts, probs, num_draft = drafter.propose(tokens, mask, drafter.plan(tokens, mask, 3), 3, sampler)
    assert drafts[0].tolist() == [9, 1, 7] and drafts.shape == (2, 3) and num_draft is None  # every row has K
    assert torch.equal(probs[0], torch.nn.functional.one_hot(drafts[0], 16).float())  # lookup: one-hot q
    assert torch.allclose(probs[1].sum(-1), torch.ones(3)) and probs[1].max() < 1  # the model's sampled q
    assert drafter.fallback.runner.cached == 6 + 2  # the model drafted for row 1 (buffer + 2 fed drafts)
    # every row matched: the draft model is not called at all
    tokens = torch.tensor([[7, 8, 9, 1, 7, 8]])
    idle = LookupThenDrafter(2, _model_drafter(perturbed_copy(target, 0.05), 16))
    mask = torch.ones_like(tokens)
    drafts, probs, num_draft = idle.propose(tokens, mask, idle.plan(tokens, mask, 3), 3, sampler)
    assert probs is None and drafts.shape == (1, 3) and num_draft is None and idle.fallback.runner.cached == 0


def test_lookup_then_draft_names_each_rows_source_before_drafting():
    """`plan` names each row's source (what adaptive K prices a step by) before K is chosen, and its lookup of
    max_tokens, cut to K by `propose`, gives the drafts a lookup of K tokens gives."""
    target = tiny_model("llama", vocab=16, init=0.5)
    drafter = LookupThenDrafter(2, _model_drafter(perturbed_copy(target, 0.05), 16))
    tokens = torch.tensor([[7, 8, 9, 1, 7, 8], [1, 2, 3, 4, 5, 6], [5, 6, 1, 2, 5, 6]])
    mask = torch.ones_like(tokens)
    plan = drafter.plan(tokens, mask, 8)
    assert plan.sources == ["lookup", "draft", "lookup"]
    greedy = Sampler(do_sample=False, temperature=1.0, rng=RowRandom(torch.tensor([0, 1, 2])))
    greedy = greedy.for_step(torch.tensor([0, 1, 2]), torch.tensor([0, 0, 0]))
    routed = drafter.propose(tokens, mask, plan, 3, greedy).tokens
    fresh = LookupThenDrafter(2, _model_drafter(perturbed_copy(target, 0.05), 16))
    assert torch.equal(routed, fresh.propose(tokens, mask, fresh.plan(tokens, mask, 3), 3, greedy).tokens)
    assert routed[0].tolist() == [9, 1, 7] and routed[2].tolist() == [1, 2, 5]
    assert PromptLookupDrafter(2).plan(tokens, mask, 8).sources == ["lookup"] * 3
    assert drafter.fallback.plan(tokens, mask, 8).sources == ["draft"] * 3
