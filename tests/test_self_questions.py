"""`fastspec.training.self_questions`: user requests a chat target writes itself, cleaned, filtered and cached.

The target's sampling is replaced by a scripted one (a tiny random model almost never ends a reply), so the tests
can say which replies end, which are repeats and which quote a benchmark."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import fastspec
from fastspec.training import self_questions as sq

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}<assistant>"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from fastspec.pair import default_target_dir

    tok = AutoTokenizer.from_pretrained(default_target_dir())
    tok.chat_template = TEMPLATE
    return tok


def reply(seed: int) -> str | None:
    """The scripted reply to request ``seed``: every 5th never ends, every 7th repeats request 1's reply."""
    if seed % 5 == 4:
        return None
    if seed % 7 == 6:
        seed = 1
    return f' "Please explain topic {seed} to me in a few short paragraphs."'


@pytest.fixture
def scripted(tokenizer, monkeypatch):
    calls = []

    def generate(target, ids, attention_mask, max_new_tokens, seed, eos_token_id, pad_token_id, **kwargs):
        calls.append(list(seed))
        rows = []
        for s in seed:
            text = reply(s)
            new = tokenizer(text).input_ids + [eos_token_id[0]] if text else [5] * max_new_tokens
            rows.append(torch.tensor((new + [pad_token_id] * max_new_tokens)[:max_new_tokens]))
        return torch.cat([ids, torch.stack(rows)], dim=1)

    monkeypatch.setattr(fastspec, "autoregressive_generate", generate)
    monkeypatch.setattr(sq, "benchmark_windows", lambda: set())
    return calls


def texts(prompts) -> list[str]:
    assert all(len(p) == 1 and p[0]["role"] == "user" for p in prompts)
    return [p[0]["content"] for p in prompts]


def test_clean_request_strips_preamble_label_and_quotes_and_bounds_length():
    assert sq.clean_request(' Request: "Write a poem about the sea, please."') == "Write a poem about the sea, please."
    assert sq.clean_request("User: How do tides work on other planets?") == "How do tides work on other planets?"
    assert sq.clean_request("**User's message:** Explain entropy simply.") == "Explain entropy simply."
    assert sq.clean_request("Short?") is None
    assert sq.clean_request("x" * (sq.MAX_CHARS + 1)) is None


def test_request_prompts_cycle_the_kinds_and_do_not_depend_on_count():
    kinds = [sq.request_prompt(i)[0] for i in range(2 * len(sq.REQUEST_KINDS))]
    assert kinds == [k for k, _, _ in sq.REQUEST_KINDS] * 2
    assert sq.request_prompt(11, seed=0) == sq.request_prompt(11, seed=0)
    assert any(sq.request_prompt(i, seed=0) != sq.request_prompt(i, seed=1) for i in range(8))
    assert all(sq.request_prompt(i)[1].startswith("Here are some ") for i in range(8))
    assert all(sq.request_prompt(i)[1].endswith("\n2.") for i in range(8))


def test_self_questions_keep_ended_distinct_replies_and_extend_their_cache(tokenizer, scripted, tmp_path):
    target = tiny_model("llama", vocab=4096, layers=1)
    cache = tmp_path / "self_questions.jsonl"
    first = texts(sq.self_questions(target, tokenizer, 5, cache, batch_size=4))
    # replies 0-7 asked in two batches; 4 never ends, 6 repeats 1: requests 0, 1, 2, 3, 5
    assert scripted == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert first == [f"Please explain topic {i} to me in a few short paragraphs." for i in (0, 1, 2, 3, 5)]
    assert texts(sq.self_questions(target, tokenizer, 3, cache, batch_size=4)) == first[:3]  # cached: no call
    more = texts(sq.self_questions(target, tokenizer, 8, cache, batch_size=4))
    assert scripted[2:] == [[8, 9, 10, 11]] and more[:5] == first and len(more) == 8
    assert "topic 9 " not in " ".join(more) and "topic 13 " not in " ".join(more)
    with pytest.raises(ValueError, match="another target or other settings"):
        sq.self_questions(target, tokenizer, 3, cache, seed=1)


def test_self_questions_drop_requests_that_quote_a_benchmark(tokenizer, scripted, tmp_path, monkeypatch):
    quoted = "Please explain topic 2 to me in a few short paragraphs."
    monkeypatch.setattr(sq, "benchmark_windows", lambda: {quoted[5:45]})
    out = texts(sq.self_questions(tiny_model("llama", vocab=4096, layers=1), tokenizer, 4, tmp_path / "q.jsonl"))
    assert quoted not in out and len(out) == 4


def test_self_questions_need_a_chat_template(tmp_path):
    from transformers import AutoTokenizer

    from fastspec.pair import default_target_dir

    plain = AutoTokenizer.from_pretrained(default_target_dir())
    plain.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        sq.self_questions(tiny_model("llama", vocab=4096, layers=1), plain, 2, tmp_path / "q.jsonl")


def test_train_head_takes_self_questions_as_a_prompt_source(tmp_path):
    """`fastspec train-head --prompts self-questions` reaches `self_questions` (here: a target without a chat
    template, refused by name)."""
    from transformers import AutoTokenizer

    from fastspec.pair import default_target_dir
    from fastspec.training.cli import main as train_head_main

    model = tiny_model("llama", vocab=4096, layers=1)
    model.save_pretrained(tmp_path / "target")
    AutoTokenizer.from_pretrained(default_target_dir()).save_pretrained(tmp_path / "target")
    args = ["--target", str(tmp_path / "target"), "--prompts", "self-questions", "--out", str(tmp_path / "head"),
            "--max-prompts", "4", "--max-steps", "1", "--device", "cpu", "--no-progress"]  # fmt: skip
    with pytest.raises(ValueError, match="'self-questions' needs a chat target"):
        train_head_main(args)
