"""Same seed, same output: per-row counter-based randomness, independent of the rest of the batch."""

import torch
from conftest import left_padded_batch, perturbed_copy, tiny_model

import fastspec


def test_same_seed_same_output_and_different_seed_differs():
    target = tiny_model("llama", vocab=64, init=0.5)
    draft = perturbed_copy(target, 0.05)
    ids, mask = left_padded_batch(64, [7, 4, 9])
    kwargs = dict(draft=draft, attention_mask=mask, max_new_tokens=20, do_sample=True, num_draft_tokens=3)
    a = fastspec.generate(target, ids, seed=5, **kwargs)
    b = fastspec.generate(target, ids, seed=5, **kwargs)
    c = fastspec.generate(target, ids, seed=6, **kwargs)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_row_output_does_not_depend_on_batch_composition():
    target = tiny_model("qwen2", vocab=64, init=0.5)
    draft = perturbed_copy(target, 0.05)
    ids, mask = left_padded_batch(64, [6, 9, 4], seed=2)
    seeds = [101, 202, 303]
    kwargs = dict(draft=draft, max_new_tokens=16, do_sample=True, temperature=0.9, top_p=0.95, num_draft_tokens=3)
    batched = fastspec.generate(target, ids, attention_mask=mask, seed=seeds, **kwargs)
    for row in range(3):
        real = mask[row].bool()
        alone = fastspec.generate(target, ids[row : row + 1, real], seed=[seeds[row]], **kwargs)
        assert batched[row, ids.shape[1] :].tolist() == alone[0, int(real.sum()) :].tolist(), f"row {row}"
    # the same row in another position of another batch
    swapped = fastspec.generate(target, ids[[2, 0]], attention_mask=mask[[2, 0]], seed=[seeds[2], seeds[0]], **kwargs)
    assert torch.equal(swapped[1, ids.shape[1] :], batched[0, ids.shape[1] :])


def test_global_torch_seed_fixes_unseeded_calls():
    target = tiny_model("gpt2", vocab=64, init=0.5)
    ids = torch.tensor([[3, 4, 5]])
    torch.manual_seed(0)
    a = fastspec.generate(target, ids, max_new_tokens=12, do_sample=True)
    torch.manual_seed(0)
    b = fastspec.generate(target, ids, max_new_tokens=12, do_sample=True)
    assert torch.equal(a, b)
