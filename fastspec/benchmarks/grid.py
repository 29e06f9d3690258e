"""`fastspec bench`: end-to-end decoding speed of the shipped pair (or any target), side by side, in one process.

Every method (`fastspec.benchmarks.methods`) decodes the same prompts with the same settings. Methods are interleaved
inside each repeat (method A, B, C on prompt 1, then on prompt 2, ...) so a noisy shared machine slows them alike; each
method is warmed up once first; tokens/s is the median over repeats of (new tokens / seconds) summed over the prompts
(`fastspec.benchmarks.timing`). Greedy outputs of every method are checked against HF greedy output of the same run. A
compile that still lands in a timed call is counted in the row (`compiles_while_timed`) and named in the table.

Grids: `BenchConfig.settings` lists the (batch, temperature, method patterns) to run. The default (`DEFAULT_SETTINGS`, 2
repeats: sized to finish within 5 minutes on 2 CPU cores beside one other job) keeps the most informative rows: every
method at batch 1 greedy, the main ones at batch 1 temperature 0.7 and at batch 4 greedy. `settings=None` is the full
grid: every method at every batch size x temperature (`fastspec bench --full`). A Ctrl-C keeps what was measured:
`run_bench` returns the finished rows (a setting cut short gives rows over its finished repeats, marked) with
`interrupted` and the `missing_rows`, and `fastspec bench` prints and writes them and exits with status 130.
"""

from __future__ import annotations

import fnmatch
import os
import sys
from dataclasses import dataclass, field

import torch

from fastspec.benchmarks.environment import CompileCounter, environment, load_average
from fastspec.benchmarks.methods import (
    AUTO_NOTE,
    PROCESSED,
    PROCESSED_NOTE,
    acceptance_summary,
    first_head_dir,
    head_suffixes,
    hf_static_compiled,
    load_heads,
    method_kind,
    method_table,
    new_tokens,
    precompile,
    processed_group,
)
from fastspec.benchmarks.timing import Interrupted, Progress, interleave

__all__ = ["DEFAULT_SETTINGS", "BenchConfig", "grid_rows", "run_bench", "settings_of"]

_BATCH1_GREEDY = (
    "hf_generate", "fastspec_autoregressive", "hf_assisted", "hf_prompt_lookup", "fastspec_chain_k4",
    "fastspec_chain_auto", "fastspec_tree_dynamic_d4", "fastspec_prompt_lookup_n*",
    "fastspec_lookup_n*_then_chain_auto", "fastspec_head_chain_k4", "fastspec_head_chain_auto",
    "fastspec_lookup_n*_then_head_auto", "fastspec_head_tree_dynamic_d6", "*_compiled", "*_rp1.1_minp0.05",
)  # fmt: skip
_BATCH1_SAMPLED = (
    "hf_generate", "fastspec_autoregressive", "hf_assisted", "fastspec_chain_k4", "fastspec_chain_auto",
    "fastspec_lookup_n*_then_chain_auto", "fastspec_head_chain_k4", "fastspec_head_chain_auto",
    "fastspec_head_tree_dynamic_d6", "*_compiled", "*_rp1.1_minp0.05",
)  # fmt: skip
_BATCH4_GREEDY = (
    "hf_generate", "fastspec_autoregressive", "fastspec_chain_k4", "fastspec_chain_auto",
    "fastspec_lookup_n*_then_chain_auto", "fastspec_head_chain_k4", "fastspec_head_chain_auto",
    "fastspec_lookup_n*_then_head_auto",
)  # fmt: skip
DEFAULT_SETTINGS = ((1, 0.0, _BATCH1_GREEDY), (1, 0.7, _BATCH1_SAMPLED), (4, 0.0, _BATCH4_GREEDY))
"""The default grid of `fastspec bench`: (batch, temperature, method name patterns). Batch 1 greedy has every
method but the K=2 and K=6 chains and the small static tree; temperature 0.7 drops the rows that sampling makes
pointless (prompt lookup, which drafts nearly nothing there) or slow (the draft model's tree); batch 4 runs the
chains greedily. Compiled rows (`--compile`) are kept wherever they run (batch 1), and so are the rows with HF's
repetition penalty and min-p (batch 1; `fastspec.benchmarks.methods.PROCESSORS`)."""


@dataclass
class BenchConfig:
    """What `run_bench` measures. `ks` is the chain-length sweep; `trees` the tree specs to try; `settings` picks
    the (batch, temperature, methods) to run (`DEFAULT_SETTINGS`; None: every method at every `batch_sizes` x
    `temperatures`, the full grid)."""

    target_dir: str | None = None
    draft_dir: str | None = None
    num_prompts: int = 4
    prompt_tokens: int = 192
    max_new_tokens: int = 96
    repeats: int = 2  # the default grid's; `fastspec bench --quick` and `--full` take 3
    batch_sizes: tuple[int, ...] = (1, 4)
    temperatures: tuple[float, ...] = (0.0, 0.7)
    ks: tuple[int, ...] = (2, 4, 6)
    trees: tuple[str, ...] = ("small", "dynamic")
    prompt_lookup: int | None = 3
    prompt_set: str = "heldout"  # "heldout": functions cut after their docstring; "repeat": copy a function;
    # "mixed": both, alternating
    head_dir: str | None = None  # draft head directory (None: the shipped head, when there is one)
    use_head: bool = True  # time the draft-head rows
    # more head directories whose head rows run beside the first head's in every setting, named method@<label>
    # (`head_labels`), so heads are compared side by side in one run
    compare_heads: tuple[str, ...] = ()
    compile: bool = False  # also time compiled rows (compile=True) and HF's static cache + torch.compile
    dtype: str = "float32"
    device: str = "cpu"
    threads: int | None = None
    command: str = ""
    extra: dict = field(default_factory=dict)
    # (batch, temperature, method name patterns (fnmatch; None: every method)) to run, in order; None: the full
    # grid, every method at every batch size x temperature. hf_generate, the baseline, always runs.
    settings: tuple[tuple[int, float, tuple[str, ...] | None], ...] | None = DEFAULT_SETTINGS
    grid: str = "default"  # the grid's name in the table header: "default", "full", "quick" or "custom"


def _batches(tokenizer, prompts: list[str], batch: int, device: str):
    """Left-padded (input_ids, attention_mask) batches of `batch` prompts."""
    tokenizer.padding_side = "left"
    out = []
    for i in range(0, len(prompts) - batch + 1, batch):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True)
        out.append((enc.input_ids.to(device), enc.attention_mask.to(device)))
    return out


def settings_of(cfg: BenchConfig) -> list[tuple[int, float, tuple[str, ...] | None]]:
    """The (batch, temperature, method patterns) `cfg` runs, in order."""
    if cfg.settings is None:
        return [(b, t, None) for t in cfg.temperatures for b in cfg.batch_sizes]
    return [(b, t, None if keep is None else tuple(keep)) for b, t, keep in cfg.settings]


def grid_rows(cfg: BenchConfig, head: bool = True, draft: bool = True) -> list[tuple[int, float, str]]:
    """The (batch, temperature, method) rows `cfg` plans, without loading a model (`head`: with a draft head's
    rows; `draft`: with a draft model's rows; settings with fewer prompts than their batch size are skipped by
    `run_bench` but listed here)."""
    from types import SimpleNamespace

    target = SimpleNamespace(generation_config=SimpleNamespace(pad_token_id=0))
    hf_compiled = (lambda hf_common: None) if cfg.compile else None
    rows = []
    for batch, temperature, keep in settings_of(cfg):
        paths = [first_head_dir(cfg) or "head", *cfg.compare_heads]  # the suffixes `load_heads` gives the heads
        heads = [(suffix, object()) for suffix in head_suffixes(paths)] if head else []
        methods = _select(method_table(cfg, target, object() if draft else None, batch, temperature, heads,
                                       hf_compiled), keep)  # fmt: skip
        rows += [(batch, temperature, name) for name in methods]
    return rows


def _select(methods: dict, patterns: tuple[str, ...] | None) -> dict:
    """The methods whose names (without a compared head's ``@label``) match one of `patterns` (all when None),
    hf_generate (the baseline) always."""
    if patterns is None:
        return methods
    return {name: fn for name, fn in methods.items() if name == "hf_generate"
            or any(fnmatch.fnmatchcase(method_kind(name), p) for p in patterns)}  # fmt: skip


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict:
    """Run every setting of `cfg`; return a JSON-able dict with one row per (setting, method).

    On a KeyboardInterrupt (Ctrl-C) it returns what was finished instead of raising: the rows of the finished
    settings and, for the setting cut short, rows over its finished repeats (their `repeats` says how many), with
    `interrupted: True` and `missing_rows` (each `{"batch", "temperature", "method"}`) added.
    """
    from fastspec.models import load_models
    from fastspec.prompts import PROMPT_SETS

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_at_start = load_average()
    if progress:
        print("fastspec bench: loading the models and prompts", file=sys.stderr, flush=True)
        cores = os.cpu_count() or 1
        if cfg.device == "cpu" and load_at_start is not None and load_at_start >= 0.75 * cores:
            busy = f"the machine is busy (load average {load_at_start:.1f} on {cores} cores, before this run)"
            print(f"fastspec bench: {busy}: other processes on these cores make every row slower and noisier",
                  file=sys.stderr)  # fmt: skip
    loaded = load_models(cfg.target_dir, cfg.draft_dir, getattr(torch, cfg.dtype), cfg.device)
    tokenizer, target, draft = loaded.tokenizer, loaded.target, loaded.draft
    if loaded.note and progress:
        print(f"fastspec bench: {loaded.note}: the draft-model rows are skipped (pass --draft DIR for a draft on "
              "the target's tokenizer)", file=sys.stderr)  # fmt: skip
    prompts = PROMPT_SETS[cfg.prompt_set](tokenizer, cfg.num_prompts, cfg.prompt_tokens)
    heads = load_heads(cfg, target)
    hf_compiled = hf_static_compiled(target) if cfg.compile else None
    pad, eos = target.generation_config.pad_token_id, target.generation_config.eos_token_id
    plan = []
    for batch, temperature, keep in settings_of(cfg):
        batches = _batches(tokenizer, prompts, batch, cfg.device)
        if not batches:
            print(f"fastspec bench: batch {batch} skipped: it needs at least {batch} prompts, not {len(prompts)}",
                  file=sys.stderr)  # fmt: skip
            continue
        methods = _select(method_table(cfg, target, draft, batch, temperature, heads, hf_compiled), keep)
        plan.append((batch, temperature, batches, methods))
    planned = [(b, t, name) for b, t, _, methods in plan for name in methods]
    compiles = CompileCounter()
    rows, interrupted = [], False
    bar = None
    try:
        if cfg.compile:
            if progress:
                print("fastspec bench: compiling (--compile: minutes on a CPU)", file=sys.stderr, flush=True)
            precompile(plan, compiles, cfg.max_new_tokens)
        if progress:  # a call's weight is the tokens it generates; the + 1 is each method's warm-up call
            totals = {(b, t, name): (len(batches) * cfg.repeats + 1) * batches[0][0].shape[0] * cfg.max_new_tokens
                      for b, t, batches, methods in plan for name in methods}  # fmt: skip
            calls = sum((len(batches) * cfg.repeats + 1) * len(methods) for _, _, batches, methods in plan)
            bar = Progress(totals, calls, "fastspec bench")
        for index, (batch, temperature, batches, methods) in enumerate(plan):
            step = None
            if bar is not None:
                bar.note = f"setting {index + 1} of {len(plan)}: batch {batch}, temperature {temperature}"
                weight = batches[0][0].shape[0] * cfg.max_new_tokens
                step = lambda name, b=batch, t=temperature, w=weight: bar.step(w, (b, t, name))  # noqa: E731
            setting_rows, interrupted = _run_setting(cfg, batch, temperature, batches, methods, compiles, pad, eos,
                                                     step)  # fmt: skip
            rows += setting_rows
            if interrupted:
                break
    except KeyboardInterrupt:  # outside a setting's timing (precompiling, between settings)
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    record = dict(environment(cfg.device), load_average_start=load_at_start, load_average_end=load_average())
    notes = [AUTO_NOTE] + ([PROCESSED_NOTE] if any(PROCESSED in r["method"] for r in rows) else [])
    result = {"config": cfg.__dict__, "environment": record, "rows": rows, "notes": notes}
    if loaded.note:
        result["notes"].append(f"{loaded.note}: the draft-model rows are skipped")
    if interrupted:
        done = {(r["batch"], r["temperature"], r["method"]) for r in rows}
        result["interrupted"] = True
        result["missing_rows"] = [{"batch": b, "temperature": t, "method": name} for b, t, name in planned
                                  if (b, t, name) not in done]  # fmt: skip
    return result


def _run_setting(cfg, batch, temperature, batches, methods, compiles, pad, eos, step):
    """Time `methods` at one (batch, temperature): (rows, interrupted). Interrupted, the rows are those over the
    finished repeats (none when the first repeat did not finish)."""
    stats = {name: [] for name in methods}  # (repeat, SpecStats) of each call
    reference, greedy_equal = {}, dict.fromkeys(methods, True)
    compiles_timed, seen = dict.fromkeys(methods, 0), [compiles.count]

    def keep(name, rep, i, result):
        compiles_timed[name] += compiles.count - seen[0]  # calls run one at a time: this one compiled them
        seen[0] = compiles.count
        seqs, st = result
        if st is not None:
            stats[name].append((rep, st))
        if temperature == 0.0 and rep == 0:  # the group's first method (its HF generate) gives the reference
            greedy_equal[name] &= bool(torch.equal(seqs, reference.setdefault((processed_group(name), i), seqs)))

    try:
        timed = interleave(
            methods, batches, lambda result, batch: new_tokens(result[0], batch[0].shape[1], pad, eos),
            repeats=cfg.repeats, device=cfg.device, on_result=keep, progress=step, on_warmup=step,
        )  # fmt: skip
        repeats, interrupted = cfg.repeats, False
    except Interrupted as exc:
        timed, repeats, interrupted = exc.times, exc.repeats_done, True
    if repeats == 0:
        return [], interrupted
    rows = []
    for name, t in timed.items():
        base = timed.get(processed_group(name), timed["hf_generate"]).tokens_per_s
        row = {
            "batch": batch, "temperature": temperature, "method": name, "tokens_per_s": t.tokens_per_s,
            "speedup_vs_hf": t.tokens_per_s / base,
            "peak_mem_mb": None if t.peak_bytes is None else t.peak_bytes / 2**20,
            "greedy_equal_hf": greedy_equal[name] if temperature == 0.0 else None,
            "compiles_while_timed": compiles_timed[name], "repeats": repeats,
        }  # fmt: skip
        finished = [st for rep, st in stats[name] if rep < repeats]
        if finished:
            summary = acceptance_summary(finished)
            row.update(summary, per_position_acceptance=[round(a, 3) for a in summary["per_position_acceptance"]])
        rows.append(row)
    return rows, interrupted
