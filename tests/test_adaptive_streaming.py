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


def _train(ctl, confidences, accepted, draft_seconds, step_seconds, steps=30):
    """Feed `steps` identical verified steps: one row drafting len(confidences) tokens, `accepted` of them kept."""
    for _ in range(steps):
        ctl.begin(1)
        for c in confidences:
            ctl.keep_drafting(torch.tensor([c]))
        ctl.update(torch.tensor([len(confidences)]), torch.tensor([accepted]), draft_seconds, step_seconds)


def test_controller_drafts_everything_before_measuring():
    ctl = DraftLengthController()
    ctl.begin(2)
    assert all(ctl.keep_drafting(torch.tensor([0.01, 0.01])) for _ in range(8))


def test_controller_learns_which_confidences_get_accepted():
    ctl = DraftLengthController()
    # tokens drafted with q ~ 0.3 are always accepted, tokens with q ~ 0.01 never: calibration, not raw q
    _train(ctl, [0.3, 0.3, 0.3, 0.01], accepted=3, draft_seconds=4 * 0.002, step_seconds=0.05 + 4 * 0.002)
    assert ctl.acceptance[torch.bucketize(torch.tensor(0.3), ctl.edges)] > 0.95
    assert ctl.acceptance[torch.bucketize(torch.tensor(0.01), ctl.edges)] < 0.05
    ctl.begin(1)
    assert ctl.keep_drafting(torch.tensor([0.3]))  # cheap draft, confident token: go on
    assert not ctl.keep_drafting(torch.tensor([0.01]))  # a token that will be rejected: stop
    ctl.begin(2)  # batch: go on while any row is worth drafting for
    assert ctl.keep_drafting(torch.tensor([0.01, 0.3]))


def test_controller_stops_early_when_the_draft_costs_as_much_as_the_target():
    ctl = DraftLengthController()
    _train(ctl, [0.6, 0.6, 0.6], accepted=2, draft_seconds=3 * 0.05, step_seconds=0.05 + 3 * 0.05)
    ctl.begin(1)
    assert not ctl.keep_drafting(torch.tensor([0.6]))  # 2/3 acceptance does not pay for a second target-sized call
    cheap = DraftLengthController()
    _train(cheap, [0.6, 0.6, 0.6], accepted=2, draft_seconds=3 * 0.001, step_seconds=0.05 + 3 * 0.001)
    cheap.begin(1)
    assert cheap.keep_drafting(torch.tensor([0.6]))


def test_adaptive_k_stops_drafting_when_drafts_fail(monkeypatch):
    target = tiny_model("llama")
    draft = tiny_model("llama", seed=7)  # unrelated weights, same cost as the target: drafting never pays
    ids = torch.randint(1, 256, (1, 10), generator=torch.Generator().manual_seed(0))
    drafted = []
    update = DraftLengthController.update

    def record(self, num_draft, num_accepted, draft_seconds, step_seconds):
        drafted.append(int(num_draft.max()))
        update(self, num_draft, num_accepted, draft_seconds, step_seconds)

    monkeypatch.setattr(DraftLengthController, "update", record)
    out = fastspec.generate(target, ids, draft=draft, max_new_tokens=40, num_draft_tokens="auto")
    expected = target.generate(ids, do_sample=False, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(out, expected)
    assert drafted[0] == 8  # nothing measured yet: the most
    assert sum(drafted[5:]) / len(drafted[5:]) < 2  # then about one token per step


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
