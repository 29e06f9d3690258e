"""Every bad argument of `fastspec.generate` raises ValueError/TypeError whose message names the argument."""

import pytest
import torch
from conftest import NullStreamer, tiny_model

import fastspec

TARGET = tiny_model("llama")
IDS = torch.randint(3, 256, (2, 6))


def call(**overrides):
    kwargs = {"input_ids": IDS, "max_new_tokens": 4}
    kwargs.update(overrides)
    return fastspec.generate(TARGET, **kwargs)


@pytest.mark.parametrize(
    "overrides, error, name",
    [
        ({"draft": tiny_model("llama", vocab=300)}, ValueError, "draft"),  # vocabulary mismatch
        ({"draft": "not a model"}, TypeError, "draft"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens"),
        ({"max_new_tokens": 2.5}, TypeError, "max_new_tokens"),
        ({"input_ids": torch.zeros(2, 0, dtype=torch.long)}, ValueError, "input_ids"),  # empty prompt
        ({"input_ids": torch.zeros(6, dtype=torch.long)}, ValueError, "input_ids"),  # not [B, T]
        ({"input_ids": torch.zeros(1, 6)}, TypeError, "input_ids"),  # float ids
        ({"input_ids": torch.full((1, 6), 999)}, ValueError, "input_ids"),  # ids outside the vocabulary
        ({"input_ids": torch.ones(1, 300, dtype=torch.long)}, ValueError, "input_ids"),  # longer than the context
        ({"max_new_tokens": 251}, ValueError, "max_new_tokens"),  # prompt + new tokens exceed the context
        ({"do_sample": True, "temperature": 0.0}, ValueError, "temperature"),
        ({"do_sample": True, "temperature": -1.0}, ValueError, "temperature"),
        ({"do_sample": True, "top_p": 0.0}, ValueError, "top_p"),
        ({"do_sample": True, "top_p": 1.5}, ValueError, "top_p"),
        ({"do_sample": True, "top_k": -3}, ValueError, "top_k"),
        ({"attention_mask": torch.ones(2, 5, dtype=torch.long)}, ValueError, "attention_mask"),  # shape mismatch
        ({"attention_mask": torch.tensor([[1] * 6, [0] * 6])}, ValueError, "attention_mask"),  # empty row
        ({"attention_mask": torch.tensor([[1] * 6, [1] * 5 + [0]])}, ValueError, "attention_mask"),  # right padding
        ({"num_draft_tokens": 0}, ValueError, "num_draft_tokens"),
        ({"prompt_lookup": 0}, ValueError, "prompt_lookup"),
        ({"eos_token_id": 1000}, ValueError, "eos_token_id"),
        ({"pad_token_id": -1}, ValueError, "pad_token_id"),
        ({"verify_backend": "cuda-magic"}, ValueError, "backend"),
    ],
)
def test_bad_argument_is_named(overrides, error, name):
    with pytest.raises(error, match=name):
        call(**overrides)


def test_draft_on_another_device_is_named():
    draft = tiny_model("llama").to("meta")
    with pytest.raises(ValueError, match="draft"):
        call(draft=draft)


def test_streamer_needs_batch_one():
    with pytest.raises(ValueError, match="streamer"):
        call(streamer=NullStreamer())
