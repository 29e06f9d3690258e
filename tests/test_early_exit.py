"""HF's `assistant_early_exit=N` (`fastspec.drafters.early_exit`): the target's first N layers and its head draft.

Greedy output equals `target.generate` (and HF's own early-exit assisted generation at batch 1) with a chain, a tree
and adaptive K, through `fastspec.generate` and `custom_generate`; the draft shares every parameter with the target
and leaves it untouched; a bad N and a second draft are refused by name.
"""

import pytest
import torch
from conftest import left_padded_batch, tiny_model

import fastspec
from fastspec.drafters.early_exit import early_exit_draft

TARGET = tiny_model("llama", layers=4)
BATCHES = {"batch1": left_padded_batch(256, [6], seed=1), "ragged": left_padded_batch(256, [5, 8, 3], seed=1)}


def hf(batch: str, **kwargs):
    ids, mask = BATCHES[batch]
    return TARGET.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0, **kwargs)


@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize(
    "kwargs", [{}, dict(tree="small"), dict(num_draft_tokens="auto")], ids=["chain", "tree", "auto"]
)
def test_greedy_equals_hf(batch, kwargs):
    ids, mask = BATCHES[batch]
    out, stats = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=16, assistant_early_exit=2,
                                   return_stats=True, **kwargs)  # fmt: skip
    assert torch.equal(out, hf(batch))
    assert stats.drafted > 0
    via_hf = TARGET.generate(ids, attention_mask=mask, max_new_tokens=16, pad_token_id=0, assistant_early_exit=2,
                             custom_generate=fastspec.custom_generate, **kwargs)  # fmt: skip
    assert torch.equal(via_hf, out)


def test_equals_hf_early_exit_assisted_generation():
    assert torch.equal(fastspec.generate(TARGET, *BATCHES["batch1"][:1], attention_mask=BATCHES["batch1"][1],
                                         max_new_tokens=16, assistant_early_exit=3),
                       hf("batch1", assistant_early_exit=3))  # fmt: skip


def test_draft_shares_the_targets_weights_and_leaves_it_whole():
    draft = early_exit_draft(TARGET, 2)
    assert len(draft.model.layers) == 2 and draft.config.num_hidden_layers == 2
    assert len(TARGET.model.layers) == 4 and TARGET.config.num_hidden_layers == 4
    target_params = {id(p) for p in TARGET.parameters()}
    assert all(id(p) in target_params for p in draft.parameters())
    assert draft.lm_head is TARGET.lm_head and draft.model.norm is TARGET.model.norm


@pytest.mark.parametrize("layers", [0, 4, 2.5])
def test_bad_layer_count_is_named(layers):
    with pytest.raises(ValueError, match="assistant_early_exit"):
        fastspec.generate(TARGET, BATCHES["batch1"][0], max_new_tokens=4, assistant_early_exit=layers)


def test_early_exit_and_a_draft_are_refused_together():
    with pytest.raises(ValueError, match="assistant_early_exit"):
        fastspec.generate(TARGET, BATCHES["batch1"][0], max_new_tokens=4, assistant_early_exit=2,
                          draft=tiny_model("llama", layers=4))  # fmt: skip
