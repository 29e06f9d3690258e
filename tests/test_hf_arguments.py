"""transformers' generate arguments in `fastspec.generate`: HF's names, HF's precedence, HF's greedy output.

Every argument is checked the same way: greedy output equals `target.generate(do_sample=False)` with the same
arguments, at batch 1 and on a left-padded ragged batch, decoding normally, with a draft model chain, a token tree,
prompt lookup and a draft head. Each case first checks that the argument changes HF's own output on these prompts, so
a fastspec that ignored it would fail. Arguments that need an EOS take one the model emits early in these prompts.
"""

import pytest
import torch
from conftest import left_padded_batch, perturbed_copy, tiny_model
from test_head_generate import random_head
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

import fastspec

TARGET = tiny_model("llama")
DRAFT = perturbed_copy(TARGET, 0.005)
HEAD = random_head(TARGET)
NEW = 16
METHODS = {
    "normal": {},
    "chain": dict(draft=DRAFT, num_draft_tokens=3),
    "tree": dict(draft=DRAFT, tree="small", num_draft_tokens=3),
    "lookup": dict(prompt_lookup_ngram_size=2, num_draft_tokens=3),
    "head": dict(draft=HEAD, num_draft_tokens=3),
}
BATCHES = {"batch1": left_padded_batch(256, [7], seed=4), "ragged": left_padded_batch(256, [9, 5, 12], seed=5)}


def hf(ids, mask, **kwargs):
    kwargs.setdefault("max_new_tokens", NEW)
    return TARGET.generate(ids, attention_mask=mask, do_sample=False, pad_token_id=0, **kwargs)


def plain(batch: str) -> torch.Tensor:
    return hf(*BATCHES[batch])


def early_token(batch: str, position: int = 2) -> int:
    """A token HF's plain greedy output emits at `position` of row 0: an EOS that stops early."""
    ids = BATCHES[batch][0]
    return int(plain(batch)[0, ids.shape[1] + position])


class BanAfterEven(LogitsProcessor):
    """A user processor that reads the prefix: after an even last token, tokens 3..130 are banned."""

    def __call__(self, input_ids, scores):
        even = (input_ids[:, -1] % 2 == 0)[:, None]
        banned = torch.zeros_like(scores, dtype=torch.bool)
        banned[:, 3:131] = True
        return scores.masked_fill(even & banned, -float("inf"))


def arguments(batch: str) -> dict[str, dict]:
    """Each argument under test, with values that change HF's greedy output on `batch`."""
    out, width = plain(batch), BATCHES[batch][0].shape[1]
    first, second = int(out[0, width]), int(out[0, width + 1])
    eos = early_token(batch)
    return {
        "repetition_penalty": dict(repetition_penalty=1.5),
        "no_repeat_ngram_size": dict(no_repeat_ngram_size=1),
        "bad_words_ids": dict(bad_words_ids=[[second], [first, int(out[0, width + 2])]]),
        "suppress_tokens": dict(suppress_tokens=[first, second]),
        "begin_suppress_tokens": dict(begin_suppress_tokens=[first]),
        "sequence_bias": dict(sequence_bias=[[[7], 9.0], [[first, 11], 20.0]]),
        "min_new_tokens": dict(min_new_tokens=8, eos_token_id=eos),
        "min_length": dict(min_length=width + 9, eos_token_id=eos),
        "eos_token_id": dict(eos_token_id=eos),
        "forced_eos_token_id": dict(forced_eos_token_id=5),
        "max_length": dict(max_length=width + 7, max_new_tokens=None),
        "exponential_decay_length_penalty": dict(exponential_decay_length_penalty=(2, 30.0), eos_token_id=9),
        "logits_processor": dict(logits_processor=LogitsProcessorList([BanAfterEven()])),
        "generation_config": dict(generation_config=GenerationConfig(repetition_penalty=1.5, no_repeat_ngram_size=2)),
    }


NAMES = list(arguments("batch1"))


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("batch", list(BATCHES))
@pytest.mark.parametrize("name", NAMES)
def test_greedy_equals_hf_generate(name, batch, method):
    ids, mask = BATCHES[batch]
    kwargs = arguments(batch)[name]
    expected = hf(ids, mask, **kwargs)
    if name != "eos_token_id" or batch == "batch1":  # EOS from row 0 need not change the other rows
        assert not torch.equal(expected, plain(batch)) or expected.shape != plain(batch).shape, "argument has no effect"
    call = {"max_new_tokens": NEW, **kwargs, **METHODS[method]}
    if call["max_new_tokens"] is None:
        del call["max_new_tokens"]
    out = fastspec.generate(TARGET, ids, attention_mask=mask, **call)
    assert torch.equal(out, expected)


def test_precedence_keyword_over_generation_config_over_model():
    ids, mask = BATCHES["ragged"]
    before = plain("ragged")
    model_config = TARGET.generation_config
    saved = model_config.repetition_penalty
    try:
        model_config.repetition_penalty = 3.0  # the model's own: overridden by the generation_config passed
        config = GenerationConfig(repetition_penalty=1.5, max_new_tokens=9)
        out = fastspec.generate(TARGET, ids, attention_mask=mask, generation_config=config, max_new_tokens=NEW)
        assert torch.equal(out, hf(ids, mask, repetition_penalty=1.5))
        out = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW)  # the model's own applies
        assert torch.equal(out, hf(ids, mask, repetition_penalty=3.0))
        assert not torch.equal(out, before)
    finally:
        model_config.repetition_penalty = saved


def test_generation_config_alone_sets_the_length():
    ids, mask = BATCHES["batch1"]
    out = fastspec.generate(TARGET, ids, attention_mask=mask, generation_config=GenerationConfig(max_new_tokens=5))
    assert out.shape[1] == ids.shape[1] + 5


def test_default_length_is_128_new_tokens_when_nothing_sets_it():
    ids = torch.randint(3, 256, (1, 4), generator=torch.Generator().manual_seed(0))
    assert fastspec.generate(TARGET, ids).shape[1] == 4 + 128


def test_use_cache_true_is_accepted():
    ids, mask = BATCHES["batch1"]
    out = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, use_cache=True, draft=DRAFT)
    assert torch.equal(out, plain("batch1"))


@pytest.mark.parametrize(
    "kwargs",
    [dict(assistant_model=DRAFT), dict(assistant_model=DRAFT, num_assistant_tokens=2),
     dict(prompt_lookup_num_tokens=5), dict(prompt_lookup_num_tokens=3, max_matching_ngram_size=1),
     dict(assistant_model=DRAFT, num_assistant_tokens=2, num_assistant_tokens_schedule="heuristic")],
    ids=["assistant_model", "num_assistant_tokens", "prompt_lookup_num_tokens", "max_matching_ngram_size", "heuristic"],
)  # fmt: skip
def test_hf_speculation_names(kwargs):
    ids, mask = BATCHES["ragged"]
    out, stats = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, return_stats=True, **kwargs)
    assert torch.equal(out, plain("ragged"))
    assert stats.drafted > 0
    if "num_assistant_tokens" in kwargs and "num_assistant_tokens_schedule" not in kwargs:
        assert len(stats.drafted_per_position) == kwargs["num_assistant_tokens"]
    if "prompt_lookup_num_tokens" in kwargs:
        assert len(stats.drafted_per_position) <= kwargs["prompt_lookup_num_tokens"]


def test_heuristic_schedule_grows_the_draft_length():
    ids, mask = BATCHES["batch1"]
    draft = perturbed_copy(TARGET, 1e-5)  # accepts (nearly) everything: HF's rule adds 2 per step
    _, stats = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=40, assistant_model=draft,
                                 num_assistant_tokens=1, num_assistant_tokens_schedule="heuristic",
                                 return_stats=True)  # fmt: skip
    assert len(stats.drafted_per_position) >= 5


def test_prompt_lookup_old_name_still_works_and_conflicts_are_named():
    ids, mask = BATCHES["ragged"]
    old = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, prompt_lookup=2)
    new = fastspec.generate(TARGET, ids, attention_mask=mask, max_new_tokens=NEW, prompt_lookup_ngram_size=2)
    assert torch.equal(old, new)
    with pytest.raises(ValueError, match="prompt_lookup_ngram_size"):
        fastspec.generate(TARGET, ids, max_new_tokens=4, prompt_lookup=2, prompt_lookup_ngram_size=3)
    with pytest.raises(ValueError, match="assistant_model"):
        fastspec.generate(TARGET, ids, max_new_tokens=4, draft=DRAFT, assistant_model=perturbed_copy(TARGET, 0.1))
    with pytest.raises(ValueError, match="num_assistant_tokens"):
        fastspec.generate(TARGET, ids, max_new_tokens=4, draft=DRAFT, num_draft_tokens=3, num_assistant_tokens=5)


def test_num_return_sequences_shape_and_independence():
    ids = BATCHES["ragged"][0][:1, -5:]
    out = fastspec.generate(TARGET, ids, draft=DRAFT, do_sample=True, num_return_sequences=6, max_new_tokens=12,
                            seed=0)  # fmt: skip
    assert out.shape == (6, 5 + 12)
    assert torch.equal(out[:, :5], ids.expand(6, -1))
    assert len({tuple(row.tolist()) for row in out}) == 6  # each sequence draws its own tokens
    # each sequence is the one its row's seed gives alone (normal decoding: the same steps batched or alone)
    out = fastspec.generate(TARGET, ids, do_sample=True, num_return_sequences=6, max_new_tokens=12, seed=0)
    for i in (1, 4):
        alone = fastspec.generate(TARGET, ids, do_sample=True, max_new_tokens=12, seed=i)
        assert torch.equal(out[i], alone[0])
    with pytest.raises(ValueError, match="num_return_sequences"):
        fastspec.generate(TARGET, ids, num_return_sequences=2, max_new_tokens=4)  # greedy: HF refuses too


def test_model_inputs_and_unknown_keywords_are_named():
    ids = BATCHES["batch1"][0]
    with pytest.raises(TypeError, match="not_an_argument"):
        fastspec.generate(TARGET, ids, max_new_tokens=4, not_an_argument=1)
    with pytest.raises(TypeError, match="update"):  # a GenerationConfig method is no field
        fastspec.generate(TARGET, ids, max_new_tokens=4, update=1)
    with pytest.raises(ValueError, match="position_ids"):
        fastspec.generate(TARGET, ids, max_new_tokens=4, position_ids=torch.arange(ids.shape[1])[None])
    with pytest.raises(TypeError, match="repetition_penalty"):
        fastspec.generate(TARGET, ids, max_new_tokens=4, repetition_penalty="high")
    with pytest.raises(ValueError, match="max_length"):
        fastspec.generate(TARGET, ids, max_length=ids.shape[1])
