"""What `fastspec.generate` cannot speculate, or does not implement, is refused by name with the reason.

Every entry of `fastspec.generation_config.REFUSED` / `REFUSED_WHEN_SET` / `REFUSED_GENERATE_ARGUMENTS` raises a
ValueError whose message names the argument and says why; values that ask for nothing (HF's defaults) pass; an
unknown keyword stays a TypeError. Randomness: with `seed=None` the call draws one seed from torch's global
generator and nothing else, so `torch.manual_seed(s)` before a call reproduces it.
"""

import pytest
import torch
from conftest import perturbed_copy, tiny_model
from transformers import CompileConfig, GenerationConfig

import fastspec
from fastspec.generation_config import REFUSED, REFUSED_GENERATE_ARGUMENTS, REFUSED_WHEN_SET

TARGET = tiny_model("llama")
DRAFT = perturbed_copy(TARGET, 0.005)
IDS = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(0))

# a value of each refused GenerationConfig field that asks for something fastspec does not do
REFUSED_VALUES = {
    "num_beams": 2, "num_beam_groups": 2, "diversity_penalty": 0.5, "constraints": ["c"], "force_words_ids": [[5]],
    "low_memory": True, "penalty_alpha": 0.6, "dola_layers": "high", "guidance_scale": 1.5, "use_cache": False,
    "cache_implementation": "offloaded", "cache_config": {"backend": "x"}, "max_cache_len": 64,
    "output_attentions": True, "output_hidden_states": True, "encoder_repetition_penalty": 1.2,
    "encoder_no_repeat_ngram_size": 2, "token_healing": True, "watermarking_config": {"bias": 2.0},
    "assistant_ensemble_weight": 0.5, "speculation_type": "dflash",
    "compile_config": CompileConfig(), "continuous_batching_config": "x", "prefill_chunk_size": 16,
    "assistant_confidence_threshold": 0.2, "assistant_lookbehind": 5, "target_lookbehind": 5,
}  # fmt: skip
GENERATE_VALUES = {
    "prefix_allowed_tokens_fn": lambda batch_id, ids: [1], "synced_gpus": True, "negative_prompt_ids": IDS,
    "negative_prompt_attention_mask": torch.ones_like(IDS), "assistant_tokenizer": "tok", "custom_generate": "repo",
    "trust_remote_code": True,
}  # fmt: skip


def test_every_refusal_has_a_case():
    assert set(REFUSED_VALUES) == set(REFUSED) | set(REFUSED_WHEN_SET)
    assert set(GENERATE_VALUES) == set(REFUSED_GENERATE_ARGUMENTS)


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_generation_config_field_is_refused_by_name(name):
    extra = dict(top_k=4) if name == "penalty_alpha" else {}  # contrastive search needs top_k > 1 in HF
    config = None  # HF deprecates passing continuous_batching_config in a GenerationConfig: a keyword only
    if name != "continuous_batching_config":
        config = GenerationConfig(**{name: REFUSED_VALUES[name]}, **extra)
    with pytest.raises(ValueError, match=name) as keyword:
        fastspec.generate(TARGET, IDS, draft=DRAFT, max_new_tokens=4, **{name: REFUSED_VALUES[name]}, **extra)
    assert "not supported by fastspec: " in str(keyword.value) and len(str(keyword.value)) > len(name) + 40
    if config is not None:
        with pytest.raises(ValueError, match=name):
            fastspec.generate(TARGET, IDS, draft=DRAFT, max_new_tokens=4, generation_config=config)


@pytest.mark.parametrize("name", sorted(GENERATE_VALUES))
def test_generate_argument_is_refused_by_name(name):
    with pytest.raises(ValueError, match=name) as error:
        fastspec.generate(TARGET, IDS, max_new_tokens=4, **{name: GENERATE_VALUES[name]})
    assert "not supported by fastspec" in str(error.value)


def test_defaults_and_neutral_values_pass():
    neutral = dict(num_beams=1, penalty_alpha=0.0, guidance_scale=1.0, use_cache=True, cache_implementation="dynamic",
                   output_attentions=False, encoder_repetition_penalty=1.0, synced_gpus=False, early_stopping=False,
                   length_penalty=1.0, disable_compile=True, assistant_confidence_threshold=None)  # fmt: skip
    out = fastspec.generate(TARGET, IDS, draft=DRAFT, max_new_tokens=6, **neutral)
    assert torch.equal(out, TARGET.generate(IDS, do_sample=False, max_new_tokens=6, pad_token_id=0))
    static = fastspec.generate(TARGET, IDS, draft=DRAFT, max_new_tokens=6, cache_implementation="static")
    assert torch.equal(static, out)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'temprature'"):
        fastspec.generate(TARGET, IDS, max_new_tokens=4, temprature=0.5)


@pytest.mark.parametrize("draft", [None, DRAFT])
def test_manual_seed_reproduces_a_call_and_only_one_draw_is_taken(draft):
    kwargs = dict(draft=draft, do_sample=True, max_new_tokens=12, repetition_penalty=1.2, min_p=0.02)
    runs = []
    for _ in range(2):
        torch.manual_seed(1234)
        out = fastspec.generate(TARGET, IDS, **kwargs)
        runs.append((out, torch.rand(3)))  # the user's next draw
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    torch.manual_seed(1234)
    torch.randint(0, 2**62, (1,))  # the one draw fastspec takes: the call's seed
    assert torch.equal(torch.rand(3), runs[0][1])
    torch.manual_seed(99)
    assert not torch.equal(fastspec.generate(TARGET, IDS, **kwargs), runs[0][0])
