"""The benchmarks' timing harness (`fastspec.timing`, used by `fastspec bench`, bench/auto_vs_fixed.py and
bench/long_run.py) warms up untimed, interleaves methods, reports medians of repeats and measures memory without
disturbing the timing; `fastspec bench` reports what it could not measure."""

import logging
import threading
from types import SimpleNamespace

import pytest
import torch

from fastspec import timing
from fastspec.bench import _CompileCounter, _precompile, markdown
from fastspec.timing import PeakRSS, interleave


def test_peak_rss_measures_growth_with_nothing_running_beside_the_timed_code():
    threads = threading.active_count()
    with PeakRSS("cpu") as mem:
        assert threading.active_count() == threads  # a sampling thread slowed the timed decoding by 10 %
        block = torch.ones(16 * 2**20)  # 64 MiB, written so every page is resident
        del block
    if mem.base is None:
        pytest.skip("no /proc/self/clear_refs here: peak RSS is not measured")
    assert 60 * 2**20 <= mem.peak < 200 * 2**20
    with PeakRSS("cpu") as quiet:  # the high-water mark starts again at the current RSS
        pass
    assert quiet.peak < 16 * 2**20


def test_markdown_leaves_unmeasured_memory_blank():
    config = {"command": "fastspec bench", "num_prompts": 1, "prompt_set": "heldout", "prompt_tokens": 8,
              "max_new_tokens": 4, "repeats": 1}  # fmt: skip
    environment = {"device": "cpu", "torch": torch.__version__, "threads": 1, "commit": "abc"}
    row = {"batch": 1, "temperature": 0.0, "method": "hf_generate", "tokens_per_s": 10.0, "speedup_vs_hf": 1.0,
           "peak_mem_mb": None, "greedy_equal_hf": True}  # fmt: skip
    table = markdown({"config": config, "environment": environment, "rows": [row, dict(row, peak_mem_mb=2.5)]})
    assert table.splitlines()[-2].endswith("|  |  |  |  | yes |")
    assert table.splitlines()[-1].endswith("| 2.5 | yes |")


def test_interleave_times_only_after_warm_up_interleaves_methods_and_takes_the_median_of_repeats(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []
    seconds = {"a": iter([100.0, 1, 1, 2, 2, 0.5, 0.5]), "b": iter([100.0, 1, 1, 1, 1, 1, 1])}  # warm-up first

    def method(name):
        def fn(x, seed):
            assert torch.initial_seed() == seed  # torch's global seed is set before every call
            calls.append((name, x, seed))
            now[0] += next(seconds[name])
            return f"{name}{x}{seed}"

        return fn

    seen = []
    timed = interleave({"a": method("a"), "b": method("b")}, ["x", "y"], lambda result, x: 10, repeats=3,
                       on_result=lambda *call: seen.append(call))  # fmt: skip
    assert calls[:2] == [("a", "x", 0), ("b", "x", 0)]  # one untimed warm-up each, on the first input
    assert calls[2:6] == [("a", "x", 0), ("b", "x", 0), ("a", "y", 1), ("b", "y", 1)]  # interleaved per input
    assert calls[6] == ("a", "x", 1000)
    assert timed["a"].seconds == [2.0, 4.0, 1.0] and timed["a"].tokens == [20, 20, 20]
    assert timed["a"].rates == [10.0, 5.0, 20.0] and timed["a"].tokens_per_s == 10.0  # the median, not the mean
    assert timed["b"].tokens_per_s == 10.0
    assert seen[-4:] == [("a", 2, 0, "ax2000"), ("b", 2, 0, "bx2000"), ("a", 2, 1, "ay2001"), ("b", 2, 1, "by2001")]
    assert len(seen) == 12  # the timed calls only
    assert timed["a"].peak_bytes is None or timed["a"].peak_bytes >= 0
    calls.clear()
    seconds["a"] = iter([1.0, 1.0])
    interleave({"a": method("a")}, ["x"], lambda result, x: 1, repeats=2, warmup=0, seed_stride=100)
    assert calls == [("a", "x", 0), ("a", "x", 100)]


def test_precompile_runs_compiled_methods_until_a_pass_compiles_nothing_new():
    log = logging.getLogger("fastspec")
    counter = _CompileCounter()
    log.addHandler(counter)
    seeds = []

    def compiled(x, seed):  # a new step shape on the first two passes only
        seeds.append(seed)
        if seed < 2:
            log.warning("fastspec: compiling the target's %d-token step for 1 rows", seed + 2)

    try:
        _precompile([(1, 0.0, ["prompt"], {"eager": lambda x, seed: None, "m_compiled": compiled})], counter)
    finally:
        log.removeHandler(counter)
    assert seeds == [0, 1, 2] and counter.count == 2
    row = {"batch": 1, "temperature": 0.0, "method": "m_compiled", "tokens_per_s": 10.0, "speedup_vs_hf": 1.0,
           "peak_mem_mb": None, "greedy_equal_hf": True, "compiles_while_timed": 3}  # fmt: skip
    config = {"command": "c", "num_prompts": 1, "prompt_set": "heldout", "prompt_tokens": 8, "max_new_tokens": 4,
              "repeats": 1}  # fmt: skip
    table = markdown({"config": config, "environment": {"device": "cpu", "torch": "t", "threads": 1, "commit": ""},
                      "rows": [row]})  # fmt: skip
    assert "| m_compiled (3 compiles timed) |" in table.splitlines()[-1]
