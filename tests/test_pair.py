"""The shipped target/draft pair loads offline from package data and decodes losslessly."""

import torch

import fastspec
from fastspec.checks import vocab_size
from fastspec.pair import default_draft_dir, default_target_dir, load_pair
from fastspec.prompts import heldout_prompts, repeat_prompts


def test_shipped_pair_loads_and_speculates_losslessly():
    assert default_target_dir().is_dir() and default_draft_dir().is_dir()
    tokenizer, target, draft = load_pair()
    assert vocab_size(target) == vocab_size(draft) == len(tokenizer)
    assert sum(p.numel() for p in draft.parameters()) * 6 < sum(p.numel() for p in target.parameters())
    prompt = heldout_prompts(tokenizer, 2, 96)[1]
    assert prompt.rstrip().endswith(('"', ":", "'"))  # a docstring or a signature closes every prompt
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = target.generate(ids, do_sample=False, max_new_tokens=12)
    out, stats = fastspec.generate(target, ids, draft=draft, max_new_tokens=12, num_draft_tokens=4, return_stats=True)
    assert torch.equal(out, expected)
    assert stats.acceptance_rate > 0.2  # a trained, distilled draft agrees with its target, unlike a random one


def test_repeat_prompts_end_with_the_repeated_signature():
    tokenizer, _, _ = load_pair()
    for prompt in repeat_prompts(tokenizer, 3, 256):
        body_def = prompt.splitlines()[0]
        assert prompt.rstrip("\n").endswith(body_def)
