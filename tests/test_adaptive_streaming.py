"""Adaptive draft length stays lossless and picks sensible K; streamers receive exactly the returned tokens."""

import pytest
import torch
from conftest import left_padded_batch, perturbed_copy, tiny_model

import fastspec
from fastspec.adaptive import DraftLengthController


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_adaptive_k_greedy_equals_hf(arch):
    target = tiny_model(arch)
    draft = perturbed_copy(target, 0.005 if arch != "gpt2" else 0.02)
    ids, mask = left_padded_batch(256, [12, 5, 8])
    expected = target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=30, pad_token_id=0)
    out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=30, num_draft_tokens="auto")
    assert torch.equal(out, expected)


def test_controller_prefers_long_drafts_when_cheap_and_accepted():
    ctl = DraftLengthController(max_k=8)
    for _ in range(20):  # every draft accepted, draft 50x cheaper than the target
        ctl.update(torch.tensor([8]), torch.tensor([8]), draft_seconds=8 * 0.001, target_seconds=0.05)
    assert ctl.choose(8) == 8
    assert ctl.choose(3) == 3  # never more than the cap (the max_new_tokens budget)


def test_controller_shrinks_when_drafts_fail_or_cost_much():
    ctl = DraftLengthController(max_k=8)
    for _ in range(20):  # only the first position is ever accepted
        ctl.update(torch.tensor([8, 8]), torch.tensor([1, 0]), draft_seconds=8 * 0.005, target_seconds=0.05)
    assert ctl.choose(8) <= 2
    costly = DraftLengthController(max_k=8)
    for _ in range(20):  # high acceptance but the draft costs as much as the target
        costly.update(torch.tensor([4]), torch.tensor([3]), draft_seconds=4 * 0.05, target_seconds=0.05)
    assert costly.choose(8) == 1


class RecordingStreamer:
    """Collects what `put` receives, as transformers' streamers would see it."""

    def __init__(self):
        self.chunks, self.ended = [], 0

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended += 1


@pytest.mark.parametrize("source", ["draft", "prompt_lookup", "none"])
def test_streamer_receives_returned_tokens_once_in_order(source):
    target = tiny_model("llama", vocab=32, init=0.5)
    kwargs = {"draft": perturbed_copy(target, 0.01)} if source == "draft" else {}
    if source == "prompt_lookup":
        kwargs["prompt_lookup"] = 2
    ids = torch.tensor([[5, 6, 7, 5, 6, 7, 5]])
    streamer = RecordingStreamer()
    out = fastspec.generate(target, ids, max_new_tokens=25, streamer=streamer, num_draft_tokens=4, **kwargs)
    assert streamer.ended == 1
    assert streamer.chunks[0] == ids[0].tolist()  # the prompt first, like HF generate
    streamed = [t for chunk in streamer.chunks[1:] for t in chunk]
    assert streamed == out[0, ids.shape[1] :].tolist()


def test_text_iterator_streamer_works():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, TextIteratorStreamer

    vocab = {f"t{i}": i for i in range(32)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    target = tiny_model("llama", vocab=32, init=0.5)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    ids = torch.tensor([[1, 2, 3]])
    out = fastspec.generate(target, ids, draft=target, max_new_tokens=12, streamer=streamer)
    text = "".join(streamer)
    assert text.split() == tokenizer.decode(out[0, 3:]).split()
