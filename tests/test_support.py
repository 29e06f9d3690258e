"""Refusals by name before decoding (`fastspec.support`): what the architecture sweep found fastspec cannot decode
losslessly in a path is refused with the argument, the model type and the reason, before the first forward; what
it can decode in other paths still decodes there, equal to HF generate."""

import pytest
import torch

import fastspec
from fastspec import support
from tests.conftest import left_padded_batch
from tests.tiny_configs import partial_draft, tiny_causal_lm

IDS = torch.randint(3, 100, (1, 12), generator=torch.Generator().manual_seed(1))


def no_forward(model):
    """A list that records every forward of `model` (a refusal must come before the first)."""
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    return calls


REFUSED = [
    # (model type, generate arguments, argument named, words of the reason)
    ("xlstm", {}, "target", "its own xLSTMCache"),
    ("cpmant", {}, "target", "prompt segment"),
    ("moshi", {}, "target", "sliding_window"),  # HF's cache keeps the window, its masks do not
    ("doge", {"draft": "self"}, "draft", "top keep_window_size keys"),
    ("doge", {"prompt_lookup": 2}, "prompt_lookup", "top keep_window_size keys"),
    ("gpt_neo", {"tree": "small", "draft": "self"}, "tree", "local attention layers"),
    ("gpt_neo", {"static_cache": True}, "static_cache", "local attention layers"),
    ("dory", {"static_cache": True}, "static_cache", "copies of its cache layers"),
    ("mpt", {"tree": "small", "draft": "self"}, "tree", "ALiBi"),
    ("rwkv", {"tree": "small", "draft": "self"}, "tree", "takes no KV cache"),
    ("git", {"draft": "self", "batch": 2}, "draft", "amount of padding"),
]


@pytest.mark.parametrize(("model_type", "kwargs", "argument", "reason"), REFUSED)
def test_refused_by_argument_model_type_and_reason_before_any_forward(model_type, kwargs, argument, reason):
    target = tiny_causal_lm(model_type)
    if kwargs.get("draft") == "self":
        kwargs = dict(kwargs, draft=partial_draft(target, 1))
    ids = IDS.expand(kwargs.pop("batch", 1), -1)
    calls = no_forward(target)
    with pytest.raises(ValueError, match=f"^{argument}: .*{model_type}.*{reason}"):
        fastspec.generate(target, ids, max_new_tokens=4, **kwargs)
    assert not calls


@pytest.mark.parametrize("model_type", ["doge", "gpt_neo", "dory", "mpt", "git"])
def test_what_is_refused_in_one_path_still_decodes_equal_in_the_others(model_type):
    """Doge decodes normally; GPT-Neo, Dory, MPT and GIT (one row) speculate in chains."""
    target = tiny_causal_lm(model_type)
    expected = target.generate(IDS, max_new_tokens=16, do_sample=False)
    draft = None if model_type == "doge" else partial_draft(target, 1)
    assert torch.equal(fastspec.generate(target, IDS, draft=draft, max_new_tokens=16), expected)


def test_a_model_without_a_kv_cache_decodes_with_a_warning_and_refuses_padded_batches(monkeypatch):
    monkeypatch.setattr(support, "_WARNED", set())  # warned once per model type and process
    target = tiny_causal_lm("rwkv")
    expected = target.generate(IDS, max_new_tokens=12, do_sample=False)
    with pytest.warns(UserWarning, match="rwkv takes no KV cache: fastspec feeds it the whole sequence"):
        out = fastspec.generate(target, IDS, draft=partial_draft(target, 1), max_new_tokens=12)
    assert torch.equal(out, expected)
    ids, mask = left_padded_batch(100, [12, 7])
    with pytest.raises(ValueError, match="^attention_mask: the target \\(rwkv\\) takes no KV cache"):
        fastspec.generate(target, ids, attention_mask=mask, max_new_tokens=4)
