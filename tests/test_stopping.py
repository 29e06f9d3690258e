"""Stopping criteria and per-token outputs of `fastspec.generate` against transformers' `generate`.

- `stop_strings` (+ `tokenizer`) and a user's `stopping_criteria` stop each row at the same token as HF's greedy
  loop, at batch 1 and on a ragged batch, decoding normally, with a draft chain, a tree, prompt lookup and a head: a
  stop inside an accepted draft cuts the row there (each case checks that HF's output was cut).
- `max_time` stops between steps.
- `return_dict_in_generate` with `output_scores` / `output_logits`: a `GenerateDecoderOnlyOutput` whose per-token
  scores and logits are allclose to HF's for greedy decoding (processors and `renormalize_logits` included) on every
  token before a row ends; sampled scores are HF's warpers applied to the returned logits.
"""

import pytest
import torch
from conftest import left_padded_batch, perturbed_copy, tiny_model
from test_head_generate import random_head
from transformers import AutoTokenizer, StoppingCriteria, StoppingCriteriaList
from transformers.generation import GenerateDecoderOnlyOutput, logits_process

import fastspec
from fastspec.pair import PAIR_DIR

TOKENIZER = AutoTokenizer.from_pretrained(PAIR_DIR / "target")
TARGET = tiny_model("llama", vocab=512)
DRAFT = perturbed_copy(TARGET, 0.002)  # accepts most drafts: stops fall inside accepted chains
METHODS = {
    "normal": {},
    "chain": dict(draft=DRAFT, num_draft_tokens=4),
    "tree": dict(draft=DRAFT, tree="small", num_draft_tokens=3),
    "lookup": dict(prompt_lookup_ngram_size=2, num_draft_tokens=4),
    "head": dict(draft=random_head(TARGET), num_draft_tokens=3),
}
BATCHES = {"batch1": left_padded_batch(512, [6], seed=2), "ragged": left_padded_batch(512, [6, 9, 4], seed=2)}
NEW = 40


def hf(batch: str, **kwargs):
    ids, mask = BATCHES[batch]
    return TARGET.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW, pad_token_id=0, **kwargs)


class SumStop(StoppingCriteria):
    """Reads the whole sequence: stop when the last three tokens sum to a multiple of 7."""

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -3:].sum(-1) % 7 == 0


STRINGS = ["ataata", " the", "ame2", "text(", ",,<", "ath"]
# without EOS ids HF keeps generating a stopped row until every row has stopped; with them it pads the row
STOPS = {
    "stop_strings": lambda: dict(stop_strings=STRINGS, tokenizer=TOKENIZER),
    "stop_strings_eos": lambda: dict(stop_strings=STRINGS, tokenizer=TOKENIZER, eos_token_id=1),
    "stopping_criteria": lambda: dict(stopping_criteria=StoppingCriteriaList([SumStop()])),
    "stopping_criteria_eos": lambda: dict(stopping_criteria=StoppingCriteriaList([SumStop()]), eos_token_id=1),
}


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("stop", list(STOPS))
def test_stops_where_hf_stops(stop, batch, method):
    kwargs = STOPS[stop]()
    expected = hf(batch, **kwargs)
    assert not torch.equal(expected, hf(batch, eos_token_id=kwargs.get("eos_token_id"))), "nothing stopped"
    ids, mask = BATCHES[batch]
    out = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, **kwargs, **METHODS[method])
    assert torch.equal(out, expected)


def test_stop_inside_an_accepted_draft():
    """With a draft that is always accepted, the step that emits the stop string's last token emits tokens after it
    too: they are cut, as HF never generates them."""
    ids, mask = BATCHES["batch1"]
    expected = hf("batch1", stop_strings=[",,<"], tokenizer=TOKENIZER)
    out, stats = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, draft=TARGET,
                                   num_draft_tokens=6, stop_strings=[",,<"], tokenizer=TOKENIZER,
                                   return_stats=True)  # fmt: skip
    assert torch.equal(out, expected)
    new = expected.shape[1] - ids.shape[1]
    assert new % 7 != 0 and stats.steps * 7 > new  # the stop fell inside a step of 7 tokens


def test_max_time_stops_between_steps():
    ids, mask = BATCHES["ragged"]
    full = hf("ragged")
    out = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, draft=DRAFT, max_time=0.0)
    new = out.shape[1] - ids.shape[1]
    assert 1 <= new <= 5  # one step: at most K + 1 tokens
    assert torch.equal(out, full[:, : out.shape[1]])


def test_stop_strings_need_a_tokenizer():
    ids, mask = BATCHES["batch1"]
    with pytest.raises(ValueError, match="tokenizer"):
        fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=4, stop_strings=["ab"])


@pytest.mark.parametrize("method", ["normal", "chain", "tree", "lookup"])
def test_greedy_scores_and_logits_match_hf(method):
    ids, mask = BATCHES["ragged"]
    eos = int(hf("ragged")[1, ids.shape[1] + 5])  # row 1 ends early: its later entries are HF's padding scores
    kwargs = dict(return_dict_in_generate=True, output_scores=True, output_logits=True, repetition_penalty=1.3,
                  renormalize_logits=True, eos_token_id=eos, max_new_tokens=12)  # fmt: skip
    expected = TARGET.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kwargs)
    out = fastspec.generate(TARGET, ids, attention_mask=mask, **kwargs, **METHODS[method])
    assert isinstance(out, GenerateDecoderOnlyOutput)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == len(out.logits) == len(expected.logits)
    ended = (out.sequences[:, ids.shape[1] :] == eos).int().cumsum(-1).roll(1, -1)
    ended[:, 0] = 0  # a row's EOS itself still has its scores
    for g, (s, es, lg, elg) in enumerate(zip(out.scores, expected.scores, out.logits, expected.logits, strict=True)):
        live = ended[:, g] == 0
        torch.testing.assert_close(s[live], es[live], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(lg[live], elg[live], atol=1e-4, rtol=1e-4)
    assert torch.allclose(out.scores[0].exp().sum(-1), torch.ones(3))  # renormalised: log-probabilities


def test_sampled_scores_are_hf_warpers_of_the_logits():
    ids, mask = BATCHES["ragged"]
    out = fastspec.generate(TARGET, ids, attention_mask=mask, draft=DRAFT, do_sample=True, temperature=0.7, top_k=5,
                            min_p=0.05, max_new_tokens=8, seed=0, return_dict_in_generate=True, output_scores=True,
                            output_logits=True)  # fmt: skip
    warpers = [logits_process.TemperatureLogitsWarper(0.7), logits_process.TopKLogitsWarper(5),
               logits_process.MinPLogitsWarper(0.05)]  # fmt: skip
    for g, (scores, logits) in enumerate(zip(out.scores, out.logits, strict=True)):
        expected = logits
        for warper in warpers:
            expected = warper(None, expected)
        assert torch.equal(scores, expected)
        token = out.sequences[:, ids.shape[1] + g]
        assert scores.gather(1, token[:, None]).isfinite().all()  # every token was drawn from its own scores
