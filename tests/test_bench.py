"""`fastspec bench` measures memory without disturbing the timing, and reports what it could not measure."""

import threading

import pytest
import torch

from fastspec.bench import PeakRSS, markdown


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
