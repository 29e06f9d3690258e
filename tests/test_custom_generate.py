"""`target.generate(..., custom_generate=fastspec.custom_generate, draft=...)`: transformers prepares, fastspec decodes.

The output equals `fastspec.generate` with the same arguments (and so HF's own greedy output): greedy with processors
and stopping criteria, sampled with a seed, `return_dict_in_generate`, `num_return_sequences`, HF's prompt lookup
names; `assistant_model=` and `streamer=`, which transformers drops before calling a callable, are refused rather
than decoded without them; what fastspec cannot speculate is refused by name as in `fastspec.generate`.
"""

import pytest
import torch
from conftest import NullStreamer, left_padded_batch, perturbed_copy, tiny_model
from transformers import StoppingCriteria, StoppingCriteriaList

import fastspec

TARGET = tiny_model("llama")
DRAFT = perturbed_copy(TARGET, 0.005)
IDS, MASK = left_padded_batch(256, [9, 5, 12], seed=5)


class StopAfterOdd(StoppingCriteria):
    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids[:, -1] % 9 == 1) & (input_ids.shape[-1] > 14)


def via_hf(**kwargs):
    return TARGET.generate(IDS, attention_mask=MASK, pad_token_id=0, custom_generate=fastspec.custom_generate, **kwargs)


CASES = {
    "chain_penalty": dict(draft=DRAFT, num_draft_tokens=3, repetition_penalty=1.4, no_repeat_ngram_size=3),
    "tree_min_new": dict(draft=DRAFT, tree="small", num_draft_tokens=3, min_new_tokens=6, eos_token_id=7),
    "lookup_hf_names": dict(prompt_lookup_num_tokens=4, max_matching_ngram_size=2, suppress_tokens=[5, 6]),
    "criteria": dict(draft=DRAFT, stopping_criteria=StoppingCriteriaList([StopAfterOdd()]), eos_token_id=2),
    "sampled": dict(
        draft=DRAFT, do_sample=True, temperature=0.8, top_k=20, min_p=0.05, repetition_penalty=1.2, seed=7
    ),  # fmt: skip
    "sampled_sequences": dict(draft=DRAFT, do_sample=True, top_k=50, num_return_sequences=2, seed=3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_equals_fastspec_generate(name):
    kwargs = dict(CASES[name], max_new_tokens=16)
    out = via_hf(**kwargs)
    expected = fastspec.generate(TARGET, IDS, attention_mask=MASK, pad_token_id=0, **kwargs)
    assert torch.equal(out, expected)
    if not kwargs.get("do_sample"):  # and greedy is HF's own output
        hf_kwargs = {k: v for k, v in kwargs.items() if k not in ("draft", "num_draft_tokens", "tree")}
        hf_kwargs.pop("prompt_lookup_num_tokens", None), hf_kwargs.pop("max_matching_ngram_size", None)
        assert torch.equal(out, TARGET.generate(IDS, attention_mask=MASK, pad_token_id=0, **hf_kwargs))


def test_outputs_and_stats():
    kwargs = dict(draft=DRAFT, max_new_tokens=10, return_dict_in_generate=True, output_scores=True, output_logits=True)
    out, stats = via_hf(return_stats=True, **kwargs)
    expected = fastspec.generate(TARGET, IDS, attention_mask=MASK, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert all(torch.equal(a, b) for a, b in zip(out.scores, expected.scores, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(out.logits, expected.logits, strict=True))
    assert stats.drafted > 0 and stats.accepted > 0


def test_what_generate_drops_is_refused():
    with pytest.raises(ValueError, match="assistant_model.*draft="):
        via_hf(assistant_model=DRAFT, max_new_tokens=4)

    with pytest.raises(ValueError, match="streamer"):
        TARGET.generate(IDS[:1], custom_generate=fastspec.custom_generate, draft=DRAFT, max_new_tokens=4,
                        streamer=NullStreamer())  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(num_beams=2), "num_beams"), (dict(penalty_alpha=0.6, top_k=4), "penalty_alpha"),
     (dict(use_cache=False), "use_cache"), (dict(max_new_tokens=4, guidance_scale=1.5), "guidance_scale")],
)  # fmt: skip
def test_unspeculable_arguments_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        via_hf(draft=DRAFT, **{"max_new_tokens": 4, **kwargs})
