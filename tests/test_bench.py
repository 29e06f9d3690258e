"""The benchmark harness (`fastspec.benchmarks`: `fastspec bench`, its suite and the scripts in bench/) warms up
untimed, interleaves methods, reports medians of repeats and measures memory without disturbing the timing; counts
compiles with `fastspec.compiled`'s counter; `fastspec bench` reports what it could not measure, shows the time left
(warm-ups included) from its first line, keeps what it finished when interrupted, and runs a default grid much smaller
than `--full`."""

import dataclasses
import io
import json
import threading
from types import SimpleNamespace

import pytest
import torch

import fastspec
from fastspec import compiled
from fastspec.benchmarks import (
    DEFAULT_SETTINGS,
    BenchConfig,
    CompileCounter,
    Progress,
    grid,
    grid_rows,
    interleave,
    run_bench,
    timing,
)
from fastspec.benchmarks.methods import AUTO_NOTE, head_labels, method_table, precompile
from fastspec.benchmarks.report import grid_markdown as markdown
from fastspec.benchmarks.timing import Interrupted, PeakRSS, format_duration
from fastspec.cli import bench_config, build_parser, main


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


def test_precompile_runs_compiled_methods_until_a_pass_compiles_nothing_new(monkeypatch):
    """`precompile` reads the real compile counter (`fastspec.compiled.compile_count`), not log lines."""
    shapes = [0]
    monkeypatch.setattr(compiled, "compile_count", lambda: shapes[0])
    counter = CompileCounter()
    seeds = []

    def compiled_method(x, seed):  # a new step shape on the first two passes only
        seeds.append(seed)
        if seed < 2:
            shapes[0] += 1

    precompile([(1, 0.0, ["prompt"], {"eager": lambda x, seed: None, "m_compiled": compiled_method})], counter, 4)
    assert seeds == [0, 1, 2] and counter.count == 2
    row = {"batch": 1, "temperature": 0.0, "method": "m_compiled", "tokens_per_s": 10.0, "speedup_vs_hf": 1.0,
           "peak_mem_mb": None, "greedy_equal_hf": True, "compiles_while_timed": 3}  # fmt: skip
    config = {"command": "c", "num_prompts": 1, "prompt_set": "heldout", "prompt_tokens": 8, "max_new_tokens": 4,
              "repeats": 1}  # fmt: skip
    table = markdown({"config": config, "environment": {"device": "cpu", "torch": "t", "threads": 1, "commit": ""},
                      "rows": [row]})  # fmt: skip
    assert "| m_compiled (3 compiles timed) |" in table.splitlines()[-1]


def test_precompile_drafts_every_compiled_width_of_adaptive_k_once_per_cache_capacity(monkeypatch):
    """A compiled adaptive-K row first runs its drafter at one fixed K per step width the controller can pick
    (K + 1 in `WIDTHS`: K = 1, 2, 4, 8), on one batch per static-cache capacity, before its own passes: a
    controller kept across calls once picked a K that no warm-up call drafted, and compiled inside a timed call."""
    calls = []

    def generate(target, ids, **kwargs):
        calls.append((kwargs["num_draft_tokens"], ids.shape[1]))
        return ids, None

    monkeypatch.setattr(fastspec, "generate", generate)
    target = SimpleNamespace(generation_config=SimpleNamespace(pad_token_id=0))
    cfg = BenchConfig(**TINY, compile=True)
    table = method_table(cfg, target, object(), 1, 0.0)
    auto_compiled = {n: f for n, f in table.items() if n == "fastspec_chain_auto_compiled"}
    assert list(auto_compiled) == ["fastspec_chain_auto_compiled"]
    batches = [(torch.ones(1, n, dtype=torch.long),) * 2 for n in (5, 6, 300)]  # capacities 256, 256, 512
    precompile([(1, 0.0, batches, auto_compiled)], CompileCounter(), cfg.max_new_tokens)
    fixed = [c for c in calls if isinstance(c[0], int)]
    assert sorted(fixed) == [(k, n) for k in (1, 2, 4, 8) for n in (6, 300)]
    assert calls.index(fixed[-1]) < len(fixed)  # the sweep comes before the adaptive passes
    assert all(isinstance(k, fastspec.DraftLengthController) for k, _ in calls[len(fixed) :])


def test_format_duration():
    assert [format_duration(s) for s in (0, 0.4, 59.6, 61, 754, 3599.4, 3662, -5)] == [
        "0:00", "0:00", "1:00", "1:01", "12:34", "59:59", "1:01:02", "0:00",
    ]  # fmt: skip


def test_progress_shows_done_over_total_elapsed_and_the_time_left_by_weight():
    now = [100.0]
    out = io.StringIO()  # not a terminal: one line per update, at most every log_interval seconds
    bar = Progress(12.0, 5, "bench", stream=out, clock=lambda: now[0], log_interval=5.0)
    assert bar.text() == "bench: 0/5 calls, 0:00 elapsed, estimating the time left"
    now[0] += 30
    bar.step(2.0)  # the first line has an estimate: 2 units in 30 s (a warm-up counts), 10 units left take 150 s
    assert out.getvalue() == "bench: 1/5 calls, 0:30 elapsed, about 2:30 left\n"
    now[0] += 10
    bar.step(2.0)  # 4 units in 40 s: 8 units left take 80 s
    assert out.getvalue().splitlines()[-1] == "bench: 2/5 calls, 0:40 elapsed, about 1:20 left"
    bar.note = "batch 4"
    now[0] += 3
    bar.step(2.0)  # 3 s after the last line: not shown
    assert out.getvalue().count("\n") == 2
    assert bar.text() == "bench: 3/5 calls, 0:43 elapsed, about 0:43 left (batch 4)"
    now[0] += 57
    bar.step(2.0)  # 8 units in 100 s: 4 units left
    assert out.getvalue().splitlines()[-1] == "bench: 4/5 calls, 1:40 elapsed, about 0:50 left (batch 4)"
    now[0] += 1
    bar.step(4.0)  # the last step is always shown
    bar.close()
    bar.close()
    assert out.getvalue().splitlines()[-1] == "bench: 5/5 calls, 1:41 elapsed, done (batch 4)"
    assert out.getvalue().count("\n") == 4


def test_progress_prices_each_method_at_its_own_pace_warm_ups_included():
    """With a key per method, the time left is each method's remaining weight at its own pace so far; a method that
    has not run yet is priced at the pace of every call so far, so the first line already has an estimate."""
    now = [0.0]
    bar = Progress({"slow": 4.0, "fast": 4.0}, 8, "bench", stream=io.StringIO(), clock=lambda: now[0])
    now[0] += 20
    bar.step(1.0, "slow")  # the slow method's warm-up: 20 s a unit, and the fast one is priced alike for now
    assert bar.remaining() == pytest.approx(3 * 20 + 4 * 20)
    now[0] += 2
    bar.step(1.0, "fast")  # the fast one's own pace: 2 s a unit
    assert bar.remaining() == pytest.approx(3 * 20 + 3 * 2)
    now[0] += 10
    bar.step(1.0, "slow")  # 30 s over 2 units
    assert bar.remaining() == pytest.approx(2 * 15 + 3 * 2)


def test_interleave_interrupted_keeps_the_repeats_every_method_finished():
    calls = []

    def fn(x, seed):
        calls.append(seed)
        if len(calls) == 7:  # warm-ups 1-2, repeat 0: 3-4, repeat 1: 5-6, Ctrl-C in repeat 2
            raise KeyboardInterrupt
        return x

    with pytest.raises(Interrupted) as info:
        interleave({"a": fn, "b": fn}, ["x"], lambda result, x: 3, repeats=4)
    assert isinstance(info.value, KeyboardInterrupt) and info.value.repeats_done == 2
    assert info.value.times["a"].tokens == [3, 3] and info.value.times["b"].tokens == [3, 3]
    calls.clear()
    with pytest.raises(Interrupted) as info:  # in the warm-up: nothing finished
        interleave({"a": fn}, ["x"], lambda result, x: 3, repeats=4, warmup=7)
    assert info.value.repeats_done == 0 and info.value.times["a"].tokens == []


def test_default_grid_keeps_the_informative_rows_at_a_fraction_of_the_full_grid():
    def cfg(*args):
        return bench_config(build_parser().parse_args(["bench", *args]))

    default, full, quick = cfg(), cfg("--full"), cfg("--quick")
    assert (default.grid, full.grid, quick.grid) == ("default", "full", "quick")
    assert default.settings == DEFAULT_SETTINGS and full.settings is None and BenchConfig().settings == DEFAULT_SETTINGS
    rows, full_rows = grid_rows(default), grid_rows(full)
    assert len(rows) == 36 and len(full_rows) == 66 and len(grid_rows(quick)) == 32
    processed = {(b, t, name) for b, t, name in rows if name.endswith("_rp1.1_minp0.05")}
    assert {name for _, _, name in processed} == {"hf_generate_rp1.1_minp0.05", "fastspec_chain_auto_rp1.1_minp0.05",
                                                  "fastspec_head_chain_auto_rp1.1_minp0.05"}  # fmt: skip
    assert {(b, t) for b, t, _ in processed} == {(1, 0.0), (1, 0.7)}  # batch 1, greedy and sampled
    assert set(rows) < set(full_rows)
    greedy = {name for b, t, name in rows if (b, t) == (1, 0.0)}
    assert {
        "hf_generate", "fastspec_autoregressive", "hf_assisted", "fastspec_chain_k4", "fastspec_chain_auto",
        "fastspec_prompt_lookup_n3", "fastspec_lookup_n3_then_chain_auto", "fastspec_head_chain_k4",
        "fastspec_head_chain_auto", "fastspec_tree_dynamic_d4", "fastspec_head_tree_dynamic_d6",
    } <= greedy  # fmt: skip
    assert {(b, t) for b, t, _ in rows} == {(1, 0.0), (1, 0.7), (4, 0.0)}
    assert all(any(r == (b, t, "hf_generate") for r in rows) for b, t, _ in rows)  # every setting has its baseline

    def tokens(config, rows):  # generated tokens, warm-ups included: the run time is about proportional
        calls_per_method = {b: config.num_prompts // b * config.repeats + 1 for b in (1, 4)}
        return sum(calls_per_method[b] * b * config.max_new_tokens for b, _, _ in rows)

    # the default grid is sized for 5 minutes on a busy day: 2 repeats (--quick and --full keep 3)
    assert (default.repeats, quick.repeats, full.repeats) == (2, 3, 3) and cfg("--repeats", "5").repeats == 5
    assert tokens(default, rows) < 0.75 * tokens(dataclasses.replace(default, repeats=3), rows)
    assert tokens(default, rows) < 0.5 * tokens(full, full_rows)
    # the grid-shaping flags still run the full grid over the values given (as before the default grid)
    shaped = cfg("--ks", "4", "6", "--trees", "dynamic", "--compile")
    assert shaped.settings is None and shaped.ks == (4, 6) and shaped.trees == ("dynamic",)
    assert (1, 0.0, "hf_generate_static_compiled") in grid_rows(shaped)
    assert grid_rows(cfg("--no-head"), head=False) == [r for r in rows if "head" not in r[2]]
    with pytest.raises(SystemExit):
        cfg("--quick", "--full")


def _interrupt_at(monkeypatch, call: int):
    """Make the `call`-th `fastspec.generate` call raise KeyboardInterrupt, as Ctrl-C would."""
    generate, count = fastspec.generate, [0]

    def interrupting(*args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    monkeypatch.setattr(fastspec, "generate", interrupting)


TINY = dict(num_prompts=1, prompt_tokens=24, max_new_tokens=4, repeats=2, use_head=False, device="cpu")


@pytest.mark.parametrize("call", [5, 6])
def test_interrupted_run_returns_the_rows_it_finished_and_names_the_missing(monkeypatch, call):
    # per setting, fastspec.generate runs 3 times: warm-up, repeat 0, repeat 1
    settings = ((1, 0.0, ("fastspec_chain_k4",)), (1, 0.7, ("fastspec_chain_k4",)))
    _interrupt_at(monkeypatch, call)
    result = run_bench(BenchConfig(**TINY, settings=settings, command="t"), progress=False)
    assert result["interrupted"] is True
    first = [(r["batch"], r["temperature"], r["method"], r["repeats"]) for r in result["rows"][:2]]
    assert first == [(1, 0.0, "hf_generate", 2), (1, 0.0, "fastspec_chain_k4", 2)]
    if call == 5:  # in repeat 0 of the second setting: its rows are missing
        assert len(result["rows"]) == 2
        assert result["missing_rows"] == [{"batch": 1, "temperature": 0.7, "method": "hf_generate"},
                                          {"batch": 1, "temperature": 0.7, "method": "fastspec_chain_k4"}]  # fmt: skip
    else:  # in repeat 1: the second setting's rows are over its one finished repeat, marked
        assert [(r["temperature"], r["repeats"]) for r in result["rows"][2:]] == [(0.7, 1), (0.7, 1)]
        assert result["missing_rows"] == []
    table = markdown(result)
    assert "**INTERRUPTED** (Ctrl-C)" in table.splitlines()[1]
    assert ("median of 1 of 2 repeats" in table) == (call == 6)
    assert ("batch 1, temperature 0.7: hf_generate, fastspec_chain_k4" in table) == (call == 5)


def test_cli_interrupted_prints_and_writes_the_finished_rows_and_exits_130(monkeypatch, tmp_path, capsys):
    _interrupt_at(monkeypatch, 9)  # 2 fastspec methods, 3 calls each a setting: in the second setting's repeat 0
    path = tmp_path / "out.json"
    args = ["bench", "--device", "cpu", "--num-prompts", "1", "--prompt-tokens", "24", "--max-new-tokens", "4",
            "--repeats", "2", "--no-head", "--batch-sizes", "1", "--temperatures", "0", "0.7", "--ks", "4",
            "--trees", "--json", str(path)]  # fmt: skip
    monkeypatch.setattr(grid, "method_table", _two_methods(grid.method_table))
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 130
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert "interrupted (Ctrl-C): 3 rows finished; written to" in err
    written = json.loads(path.read_text())
    assert written["interrupted"] is True and len(written["rows"]) == 3
    assert [r["method"] for r in written["missing_rows"]] == ["hf_generate", "fastspec_chain_k4", "fastspec_chain_auto"]
    assert "**INTERRUPTED**" in out and "| 1 | 0.0 | fastspec_chain_auto |" in out
    assert "batch 1, temperature 0.7: hf_generate, fastspec_chain_k4, fastspec_chain_auto" in out


def _two_methods(table):
    """`method_table` cut to HF generate and two fastspec chains, to keep the CLI test short."""

    def cut(*args, **kwargs):
        keep = ("hf_generate", "fastspec_chain_k4", "fastspec_chain_auto")
        return {name: fn for name, fn in table(*args, **kwargs).items() if name in keep}

    return cut


def test_head_labels_are_directory_names_made_unique_by_their_parents(tmp_path):
    assert head_labels([tmp_path / "a", tmp_path / "b"]) == ["a", "b"]
    assert head_labels([tmp_path / "x" / "head", tmp_path / "y" / "head"]) == ["x/head", "y/head"]
    with pytest.raises(ValueError, match="compare_heads: a head directory is given twice"):
        head_labels([tmp_path / "a", tmp_path / "b" / ".." / "a"])


def test_compared_heads_are_timed_side_by_side_in_one_run(tmp_path):
    """`fastspec bench --head A B`: B's head rows beside A's in every setting, named method@B."""
    from fastspec.heads.eagle3 import Eagle3Head
    from fastspec.pair import load_pair

    _, target, _ = load_pair()
    Eagle3Head.from_target(target).save_pretrained(tmp_path / "eagle3")
    args = build_parser().parse_args(["bench", "--head", "fastspec/pair/head", str(tmp_path / "eagle3")])
    cfg = bench_config(args)
    assert cfg.head_dir == "fastspec/pair/head" and cfg.compare_heads == (str(tmp_path / "eagle3"),)
    planned = {name for b, t, name in grid_rows(cfg) if (b, t) == (1, 0.0)}
    assert {
        "fastspec_head_chain_k4",
        "fastspec_head_chain_k4@eagle3",
        "fastspec_head_tree_dynamic_d6@eagle3",
    } <= planned
    settings = ((1, 0.0, ("fastspec_head_chain_k4",)),)
    result = run_bench(BenchConfig(**dict(TINY, use_head=True), head_dir=cfg.head_dir, compare_heads=cfg.compare_heads,
                                   settings=settings, command="t"), progress=False)  # fmt: skip
    rows = {r["method"]: r for r in result["rows"]}
    assert list(rows) == ["hf_generate", "fastspec_head_chain_k4", "fastspec_head_chain_k4@eagle3"]
    assert all(r["greedy_equal_hf"] for r in rows.values())
    assert "| fastspec_head_chain_k4@eagle3 |" in markdown(result)
    with pytest.raises(ValueError, match="compare_heads: comparing heads needs head rows"):
        run_bench(BenchConfig(**TINY, compare_heads=cfg.compare_heads, settings=settings), progress=False)


def test_adaptive_rows_keep_one_controller_per_method_across_calls(monkeypatch):
    """Every call of an adaptive row gets the same `DraftLengthController` (what it measured carries over, as the
    note under every table says); each adaptive method and setting has its own."""
    seen = []
    monkeypatch.setattr(fastspec, "generate", lambda *args, **kwargs: seen.append(kwargs["num_draft_tokens"]))
    target = SimpleNamespace(generation_config=SimpleNamespace(pad_token_id=0))
    cfg = BenchConfig(**TINY)
    batch = (torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    names = ("fastspec_chain_auto", "fastspec_lookup_n3_then_chain_auto")
    for temperature in (0.0, 0.7):
        table = method_table(cfg, target, object(), 1, temperature)
        for name in names:
            table[name](batch, 0)
            table[name](batch, 0)
    assert all(isinstance(c, fastspec.DraftLengthController) for c in seen)
    pairs = [seen[i : i + 2] for i in range(0, len(seen), 2)]
    assert all(a is b for a, b in pairs)  # one controller across a method's calls
    assert len({id(a) for a, _ in pairs}) == len(pairs)  # none shared between methods or settings
    monkeypatch.undo()
    run = run_bench(BenchConfig(**TINY, settings=((1, 0.0, ("fastspec_chain_k4",)),)), progress=False)
    assert AUTO_NOTE in run["notes"] and AUTO_NOTE in markdown(run)
