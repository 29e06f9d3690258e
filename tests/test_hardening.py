"""NaN/inf policy, padded vocabularies, and bounded KV caches over long generations."""

import pytest
import torch
from conftest import hf_greedy, left_padded_batch, perturbed_copy, tiny_model

import fastspec
from fastspec.checks import NonFiniteLogitsError
from fastspec.runner import CachedModel


class Poisoned(torch.nn.Module):
    """Wraps a model; from the `after`-th forward on, logit `index` of every position becomes `value`."""

    def __init__(self, model, value: float, after: int = 0, index: int | slice = 5):
        super().__init__()
        self.model, self.value, self.after, self.index, self.calls = model, value, after, index, 0
        self.config, self.generation_config = model.config, model.generation_config

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, *args, **kwargs):
        out = self.model(*args, **kwargs)
        self.calls += 1
        if self.calls > self.after:
            out.logits[..., self.index] = self.value
        return out


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_target_logits_raise_naming_model_and_step(value):
    target = Poisoned(tiny_model("llama"), value, after=2)
    with pytest.raises(NonFiniteLogitsError, match=r"target .* step 2"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), max_new_tokens=8)


def test_fully_masked_row_raises():
    target = Poisoned(tiny_model("llama"), float("-inf"), index=slice(None))
    with pytest.raises(NonFiniteLogitsError, match="fully masked"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), max_new_tokens=4, do_sample=True, top_k=3)


def test_nan_draft_logits_raise_naming_the_draft():
    target = tiny_model("qwen2")
    draft = Poisoned(perturbed_copy(target, 0.01), float("nan"), after=3)
    with pytest.raises(NonFiniteLogitsError, match="draft"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), draft=draft, max_new_tokens=16)


def test_check_can_be_switched_off():
    target = Poisoned(tiny_model("llama"), float("-inf"), index=7)  # partly masked rows are fine anyway
    out = fastspec.generate(target, torch.tensor([[3, 4, 5]]), max_new_tokens=6, check_logits=True)
    assert 7 not in out[0, 3:].tolist()
    nan_target = Poisoned(tiny_model("llama"), float("nan"), index=7)
    fastspec.generate(nan_target, torch.tensor([[3, 4, 5]]), max_new_tokens=4, check_logits=False)


@pytest.mark.parametrize("draft_vocab", [240, 272])  # draft embedding smaller / padded larger than the target's
def test_padded_draft_vocabulary_is_masked_and_lossless(draft_vocab):
    target = tiny_model("llama", vocab=256)
    draft = tiny_model("llama", vocab=draft_vocab, seed=3)
    with torch.no_grad():  # share the target's weights on the common ids so the draft is useful
        rows = min(draft_vocab, 256)
        draft.model.embed_tokens.weight[:rows] = target.model.embed_tokens.weight[:rows]
    ids, mask = left_padded_batch(256, [6, 9])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=16, pad_token_id=0)
    out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=16, num_draft_tokens=3)
    assert torch.equal(out, expected)
    sampled = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=16, do_sample=True,
                                seed=0)  # fmt: skip
    assert int(sampled.max()) < 256


def test_different_tokenizer_is_refused_with_options():
    target = tiny_model("llama", vocab=256)
    draft = tiny_model("llama", vocab=128)
    with pytest.raises(ValueError, match="prompt_lookup"):
        fastspec.generate(target, torch.tensor([[3, 4]]), draft=draft, max_new_tokens=4)


def test_kv_caches_stay_bounded_over_a_long_run():
    """The caches never hold more than prompt + generated + K positions, and Python-side state stays O(K)."""
    target = tiny_model("gpt2")
    draft = perturbed_copy(target, 0.02)
    lengths = []
    original = target.forward

    def recording_forward(*args, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        lengths.append((cache.get_seq_length(), kwargs["input_ids"].shape[1]))
        return original(*args, **kwargs)

    target.forward = recording_forward
    ids = torch.tensor([[3, 4, 5, 6]])
    k, new = 4, 240
    out, stats = fastspec.generate(target, ids, draft=draft, max_new_tokens=new, num_draft_tokens=k,
                                   return_stats=True)  # fmt: skip
    assert out.shape[1] == 4 + new
    for cached, fed in lengths:
        assert cached + fed <= 4 + new + k
    # every forward after the first starts from the accepted prefix: the cache never keeps rejected drafts
    assert all(cached <= 4 + new for cached, _ in lengths)
    assert len(stats.drafted_per_position) == k


@pytest.mark.parametrize("tree", [None, "small"], ids=["chain", "tree"])
def test_columns_padded_in_every_row_are_dropped(tree, monkeypatch):
    """Ragged acceptance adds left padding; columns that every row pads are cut from the buffer and both caches
    (the first column fed after the prefill is real in some row), and the output still equals HF greedy."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.05)
    ids, mask = left_padded_batch(target.config.vocab_size, [12, 5, 8])
    masks = []
    original = target.forward

    def recording_forward(*args, **kwargs):
        masks.append(kwargs["attention_mask"])
        return original(*args, **kwargs)

    target.forward = recording_forward
    dropped = []
    drop_leading = CachedModel.drop_leading
    monkeypatch.setattr(CachedModel, "drop_leading", lambda self, n: dropped.append(n) or drop_leading(self, n))
    out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=40, num_draft_tokens=4,
                            tree=tree, eos_token_id=None)  # fmt: skip
    target.forward = original
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=40))
    buffer_masks = [m if m.dim() == 2 else (m[:, 0, -1] == 0) for m in masks[1:]]  # a tree mask: its last query
    assert all(bool(m[:, 0].any()) for m in buffer_masks)
    assert dropped, "rows never all fell behind: the case this test is for did not happen"
