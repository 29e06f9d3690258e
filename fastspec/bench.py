"""`fastspec bench`: end-to-end decoding speed, side by side, in one process.

Every method decodes the same prompts with the same settings. Methods are interleaved inside each repeat
(method A, B, C on prompt 1, then on prompt 2, ...) so a noisy shared machine slows them alike; each method is
warmed up once first; tokens/s is the median over repeats of (new tokens / seconds) summed over the prompts
(the harness, shared with bench/auto_vs_fixed.py and bench/long_run.py, is `fastspec.timing`).
Greedy outputs of every method are checked against HF greedy output of the same run.

Methods: HF `generate` (normal decoding, the 1.0x baseline), `fastspec.autoregressive_generate`, HF assisted
generation with the draft and HF prompt lookup (batch 1 only: HF supports no more), fastspec chain
speculation for each K of the sweep and with adaptive K, tree speculation, fastspec prompt lookup, and prompt
lookup with the draft model as fallback; with a draft head (the shipped one by default), head chains (K = 4,
adaptive K, prompt lookup then head) and a dynamic head tree, for each head when several are compared
(`BenchConfig.compare_heads`: their rows are named ``method@label`` and interleaved with the rest, so two heads are
timed side by side in one run); with `--compile` (batch 1), HF generate with its
static cache and torch.compile, and fastspec autoregressive, adaptive-K chain and head chain with `compile=True`.
Adaptive-K rows (``*_auto``) pass one `fastspec.DraftLengthController` per method and setting to all of that
method's calls, warm-up included, as a server keeping one per model pair would (`AUTO_NOTE`, written under every
table); ``num_draft_tokens="auto"`` starts afresh every call and explores at its start.
Compiled methods run over the prompts before timing until a pass compiles no new step shape, compiled adaptive K
first at every fixed K that has a step width of its own (`_precompile`); a compile that still lands in a timed call
is counted in the row (`compiles_while_timed`) and named in the table.

Grids: `BenchConfig.settings` lists the (batch, temperature, method patterns) to run. The default
(`DEFAULT_SETTINGS`, about 4 minutes on 2 idle CPU cores) keeps the most informative rows: every method at batch 1
greedy, the main ones at batch 1 temperature 0.7 and at batch 4 greedy. `settings=None` is the full grid: every
method at every batch size x temperature (`fastspec bench --full`). A Ctrl-C keeps what was measured:
`run_bench` returns the finished rows (a setting cut short gives rows over its finished repeats, marked) with
`interrupted` and the `missing_rows`, and `fastspec bench` prints and writes them and exits with status 130.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

import fastspec
from fastspec.compiled import WIDTHS
from fastspec.generate import call_capacity
from fastspec.timing import Interrupted, Progress, interleave

__all__ = ["AUTO_NOTE", "DEFAULT_SETTINGS", "BenchConfig", "grid_rows", "run_bench"]

AUTO_NOTE = (
    "adaptive-K rows (`*_auto`) keep one `DraftLengthController` per method and setting across its calls (warm-up "
    "included): step costs and acceptance carry over, so only the first call explores; a fresh "
    '`num_draft_tokens="auto"` explores at the start of every call'
)

_BATCH1_GREEDY = (
    "hf_generate", "fastspec_autoregressive", "hf_assisted", "hf_prompt_lookup", "fastspec_chain_k4",
    "fastspec_chain_auto", "fastspec_tree_dynamic_d4", "fastspec_prompt_lookup_n*",
    "fastspec_lookup_n*_then_chain_auto", "fastspec_head_chain_k4", "fastspec_head_chain_auto",
    "fastspec_lookup_n*_then_head_auto", "fastspec_head_tree_dynamic_d6", "*_compiled",
)  # fmt: skip
_BATCH1_SAMPLED = (
    "hf_generate", "fastspec_autoregressive", "hf_assisted", "fastspec_chain_k4", "fastspec_chain_auto",
    "fastspec_lookup_n*_then_chain_auto", "fastspec_head_chain_k4", "fastspec_head_chain_auto",
    "fastspec_head_tree_dynamic_d6", "*_compiled",
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
chains greedily. Compiled rows (`--compile`) are kept wherever they run (batch 1)."""


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
    repeats: int = 3
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


def _methods(cfg: BenchConfig, target, draft, batch: int, temperature: float, heads=(), hf_compiled=None):
    """{name: fn((ids, mask), seed) -> (sequences, SpecStats | None)} for one setting, in table order.

    ``heads``: ``(suffix, head)`` pairs, each giving the head rows with its suffix ("" for the first head,
    ``@label`` for compared ones; `_load_heads`).

    The seed is unused: `timing.interleave` sets torch's global seed before each call, which HF and fastspec
    (with `seed=None`) both draw from.
    """
    sample = temperature > 0
    common = {"max_new_tokens": cfg.max_new_tokens, "do_sample": sample}
    if sample:
        common.update(temperature=temperature)
    hf_common = dict(common, pad_token_id=target.generation_config.pad_token_id, top_k=None, top_p=None)

    def hf(**extra):
        return lambda batch, seed: (target.generate(batch[0], attention_mask=batch[1], **hf_common, **extra), None)

    def fs(**extra):
        return lambda batch, seed: fastspec.generate(target, batch[0], attention_mask=batch[1], return_stats=True,
                                                     **common, **extra)  # fmt: skip

    def auto() -> fastspec.DraftLengthController:  # one per method: what it learns carries over to its next call
        return fastspec.DraftLengthController()

    def auto_compiled(drafter):
        """A compiled adaptive-K method, with `fixed_k`: the same drafter at one fixed K per compiled step width
        (`fastspec.compiled.WIDTHS`) the controller can pick, which `_precompile` runs first: a controller kept
        across calls may pick a K that no warm-up call of its own drafted."""
        controller = auto()
        run = fs(draft=drafter, num_draft_tokens=controller, compile=True)
        ks = [w - 1 for w in WIDTHS if 2 <= w <= controller.max_k + 1]
        run.fixed_k = [fs(draft=drafter, num_draft_tokens=k, compile=True) for k in ks]
        return run

    methods = [("hf_generate", hf()), ("fastspec_autoregressive", fs())]
    if batch == 1:  # HF assisted generation and prompt lookup support batch 1 only
        if draft is not None:
            methods.append(("hf_assisted", hf(assistant_model=draft)))
        if cfg.prompt_lookup:
            methods.append(("hf_prompt_lookup", hf(prompt_lookup_num_tokens=cfg.ks[-1])))
    if draft is not None:  # no draft model: a target whose vocabulary differs from the shipped draft's
        methods += [(f"fastspec_chain_k{k}", fs(draft=draft, num_draft_tokens=k)) for k in cfg.ks]
        methods.append(("fastspec_chain_auto", fs(draft=draft, num_draft_tokens=auto())))
        methods += [(f"fastspec_tree_{tree}_d4", fs(draft=draft, tree=tree, num_draft_tokens=4)) for tree in cfg.trees]
    if cfg.prompt_lookup:
        lookup = fs(prompt_lookup=cfg.prompt_lookup, num_draft_tokens=cfg.ks[-1])
        methods.append((f"fastspec_prompt_lookup_n{cfg.prompt_lookup}", lookup))
        if draft is not None:
            both = fs(prompt_lookup=cfg.prompt_lookup, draft=draft, num_draft_tokens=auto())
            methods.append((f"fastspec_lookup_n{cfg.prompt_lookup}_then_chain_auto", both))
    for suffix, head in heads:
        methods.append((f"fastspec_head_chain_k4{suffix}", fs(draft=head, num_draft_tokens=4)))
        methods.append((f"fastspec_head_chain_auto{suffix}", fs(draft=head, num_draft_tokens=auto())))
        if cfg.prompt_lookup:
            both = fs(prompt_lookup=cfg.prompt_lookup, draft=head, num_draft_tokens=auto())
            methods.append((f"fastspec_lookup_n{cfg.prompt_lookup}_then_head_auto{suffix}", both))
        methods.append((f"fastspec_head_tree_dynamic_d6{suffix}", fs(draft=head, tree="dynamic", num_draft_tokens=6)))
    if cfg.compile and batch == 1:  # batch 1 only: each batch size compiles its own graphs (minutes on a CPU)
        if hf_compiled is not None:
            methods.append(("hf_generate_static_compiled", hf_compiled(hf_common)))
        methods.append(("fastspec_autoregressive_compiled", fs(compile=True)))
        if draft is not None:
            methods.append(("fastspec_chain_auto_compiled", auto_compiled(draft)))
        for suffix, head in heads:
            methods.append((f"fastspec_head_chain_auto_compiled{suffix}", auto_compiled(head)))
    return dict(methods)


def _hf_static_compiled(target):
    """HF generate with its static cache and torch.compile (HF's documented compiled path; off CUDA HF compiles
    only with `CompileConfig._compile_all_devices`), on a copy of the target so the other rows stay eager."""
    import copy

    from transformers import CompileConfig

    model = copy.deepcopy(target)
    config = CompileConfig(mode="default" if target.device.type != "cuda" else "reduce-overhead")
    config._compile_all_devices = True

    def method(hf_common):
        kwargs = dict(hf_common, cache_implementation="static", compile_config=config)
        return lambda batch, seed: (model.generate(batch[0], attention_mask=batch[1], **kwargs), None)

    return method


def _head_dir(cfg: BenchConfig):
    """The first head's directory: `cfg.head_dir`, else the head shipped for the target
    (`fastspec.models.shipped_head_dir`); None when head rows are off or there is none."""
    from fastspec.models import shipped_head_dir

    path = cfg.head_dir if cfg.head_dir is not None else shipped_head_dir(cfg.target_dir)
    return path if cfg.use_head else None


def _load_head(cfg: BenchConfig, target):
    """The draft head of the head rows (`_head_dir`), bound to `target`; None when off or when there is none."""
    from fastspec.heads import load_head

    path = _head_dir(cfg)
    return None if path is None else load_head(path, target)


def head_labels(paths) -> list[str]:
    """Row-name labels of compared head directories: each one's name, with its parents' prepended while two
    would be equal. ValueError when two paths are the same directory."""
    paths = [Path(p).resolve() for p in paths]
    if len(set(paths)) != len(paths):
        raise ValueError(f"compare_heads: a head directory is given twice: {[str(p) for p in paths]}")
    depth = 1
    while True:
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels):
            return labels
        depth += 1


def _head_suffixes(paths) -> list[str]:
    """Row-name suffixes of the heads in `paths`, in order: "" for the first, ``@label`` (`head_labels`) for the
    compared ones."""
    return ["@" + label if i else "" for i, label in enumerate(head_labels(paths))]


def _method_kind(name: str) -> str:
    """A row's method name without a compared head's ``@label`` (what grid patterns and `_precompile` read)."""
    return name.split("@", 1)[0]


def _load_heads(cfg: BenchConfig, target) -> list[tuple[str, torch.nn.Module]]:
    """``(row-name suffix, head)`` of every head with rows, bound to `target`: the first head (`_head_dir`, suffix
    "") and each of `cfg.compare_heads` (suffix ``@label``, `head_labels`); empty when head rows are off or there is
    no head."""
    from fastspec.heads import load_head

    first = _head_dir(cfg)
    if first is None:
        if cfg.compare_heads:
            raise ValueError("compare_heads: comparing heads needs head rows and a first head (head_dir, or a head "
                             "shipped for the target)")  # fmt: skip
        return []
    paths = [first, *cfg.compare_heads]
    return [(suffix, load_head(path, target)) for suffix, path in zip(_head_suffixes(paths), paths, strict=True)]


def _batches(tokenizer, prompts: list[str], batch: int, device: str):
    """Left-padded (input_ids, attention_mask) batches of `batch` prompts."""
    tokenizer.padding_side = "left"
    out = []
    for i in range(0, len(prompts) - batch + 1, batch):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True)
        out.append((enc.input_ids.to(device), enc.attention_mask.to(device)))
    return out


def _new_tokens(sequences: torch.Tensor, prompt_len: int, pad: int | None, eos) -> int:
    """Generated tokens, not counting padding after EOS."""
    new = sequences[:, prompt_len:]
    if pad is None:
        return new.numel()
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    count = 0
    for row in new.tolist():
        stop = next((j + 1 for j, t in enumerate(row) if t in eos_ids), len(row))
        count += stop
    return count


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
        paths = [_head_dir(cfg) or "head", *cfg.compare_heads]  # the suffixes `_load_heads` gives the heads
        heads = [(suffix, object()) for suffix in _head_suffixes(paths)] if head else []
        methods = _select(_methods(cfg, target, object() if draft else None, batch, temperature, heads,
                                   hf_compiled), keep)  # fmt: skip
        rows += [(batch, temperature, name) for name in methods]
    return rows


def _select(methods: dict, patterns: tuple[str, ...] | None) -> dict:
    """The methods whose names (without a compared head's ``@label``) match one of `patterns` (all when None),
    hf_generate (the baseline) always."""
    if patterns is None:
        return methods
    return {name: fn for name, fn in methods.items() if name == "hf_generate"
            or any(fnmatch.fnmatchcase(_method_kind(name), p) for p in patterns)}  # fmt: skip


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict:
    """Run every setting of `cfg`; return a JSON-able dict with one row per (setting, method).

    On a KeyboardInterrupt (Ctrl-C) it returns what was finished instead of raising: the rows of the finished
    settings and, for the setting cut short, rows over its finished repeats (their `repeats` says how many), with
    `interrupted: True` and `missing_rows` (each `{"batch", "temperature", "method"}`) added.
    """
    from fastspec.models import load_models
    from fastspec.pair import PROMPT_SETS

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_at_start = _load_average()
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
    heads = _load_heads(cfg, target)
    hf_compiled = _hf_static_compiled(target) if cfg.compile else None
    pad, eos = target.generation_config.pad_token_id, target.generation_config.eos_token_id
    plan = []
    for batch, temperature, keep in settings_of(cfg):
        batches = _batches(tokenizer, prompts, batch, cfg.device)
        if not batches:
            print(f"fastspec bench: batch {batch} skipped: it needs at least {batch} prompts, not {len(prompts)}",
                  file=sys.stderr)  # fmt: skip
            continue
        methods = _select(_methods(cfg, target, draft, batch, temperature, heads, hf_compiled), keep)
        plan.append((batch, temperature, batches, methods))
    planned = [(b, t, name) for b, t, _, methods in plan for name in methods]
    compiles = _CompileCounter(echo=progress)
    logging.getLogger("fastspec").addHandler(compiles)
    rows, interrupted = [], False
    bar = None
    try:
        if cfg.compile:
            if progress:
                print("fastspec bench: compiling (--compile: minutes on a CPU)", file=sys.stderr, flush=True)
            _precompile(plan, compiles, cfg.max_new_tokens)
        calls = [(len(m), len(b) * cfg.repeats + 1, b[0][0].shape[0] * cfg.max_new_tokens) for _, _, b, m in plan]
        if progress:  # a call's weight is the tokens it generates; the + 1 is each method's warm-up call
            bar = Progress(sum(n * c * w for n, c, w in calls), sum(n * c for n, c, _ in calls), "fastspec bench")
        for index, (batch, temperature, batches, methods) in enumerate(plan):
            if bar is not None:
                bar.note = f"setting {index + 1} of {len(plan)}: batch {batch}, temperature {temperature}"
            step = (lambda w=batches[0][0].shape[0] * cfg.max_new_tokens: bar.step(w)) if bar is not None else None
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
        logging.getLogger("fastspec").removeHandler(compiles)
    environment = dict(_environment(cfg), load_average_start=load_at_start, load_average_end=_load_average())
    result = {"config": cfg.__dict__, "environment": environment, "rows": rows, "notes": [AUTO_NOTE]}
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
        if temperature == 0.0 and rep == 0:  # the first method (HF generate) gives the reference
            greedy_equal[name] &= bool(torch.equal(seqs, reference.setdefault(i, seqs)))

    try:
        timed = interleave(
            methods, batches, lambda result, batch: _new_tokens(result[0], batch[0].shape[1], pad, eos),
            repeats=cfg.repeats, device=cfg.device, on_result=keep, progress=step, on_warmup=step,
        )  # fmt: skip
        repeats, interrupted = cfg.repeats, False
    except Interrupted as exc:
        timed, repeats, interrupted = exc.times, exc.repeats_done, True
    if repeats == 0:
        return [], interrupted
    base = timed["hf_generate"].tokens_per_s
    rows = []
    for name, t in timed.items():
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


class _CompileCounter(logging.Handler):
    """Counts the step shapes `fastspec.compiled` compiles (it logs one "compiling" line per new shape) and, with
    `echo`, still prints fastspec's log lines to stderr (a handler of its own replaces Python's default one)."""

    def __init__(self, echo: bool = False):
        super().__init__(logging.WARNING)
        self.count = 0
        self.echo = echo

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "compiling" in record.getMessage()
        if self.echo:
            print(record.getMessage(), file=sys.stderr)


def _precompile(plan, compiles: _CompileCounter, max_new_tokens: int, max_passes: int = 4) -> None:
    """Compile every compiled method's step shapes before timing. First each method's `fixed_k` variants (compiled
    adaptive K: one fixed K per step width) run on one batch per static-cache capacity (`call_capacity`: a graph's
    shape includes it); then every compiled method runs over its batches (seeds 0, 1, ...) until a pass compiles
    no new step shape, at most `max_passes` times. A head's catch-up and the controller pick step widths at run
    time, so a shape can still be missed; any that are show in `compiles_while_timed`."""
    for _, _, batches, methods in plan:
        sweep = [fixed for fn in methods.values() for fixed in getattr(fn, "fixed_k", ())]
        by_capacity = {call_capacity(x[0].shape[1], max_new_tokens): x for x in batches} if sweep else {}
        for fixed in sweep:
            for x in by_capacity.values():
                torch.manual_seed(0)
                fixed(x, 0)
    for seed in range(max_passes):
        before = compiles.count
        for _, _, batches, methods in plan:
            for name, fn in methods.items():
                for x in batches if _method_kind(name).endswith("_compiled") else []:
                    torch.manual_seed(seed)
                    fn(x, seed)
        if compiles.count == before:
            return


def acceptance_summary(stats: list) -> dict:
    """Acceptance over several calls' `SpecStats`: acceptance rate, mean accepted length (tokens per target forward,
    bonus included) and per-position acceptance."""
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    row_steps = sum(s.row_steps for s in stats)
    per_pos_d = _sum_lists([s.drafted_per_position for s in stats])
    per_pos_a = _sum_lists([s.accepted_per_position for s in stats])
    return dict(
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=(accepted + row_steps) / row_steps,
        per_position_acceptance=[a / d if d else 0.0 for a, d in zip(per_pos_a, per_pos_d, strict=True)],
    )


def _sum_lists(lists: list[list[int]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[j] for x in lists if j < len(x)) for j in range(width)]


def _load_average() -> float | None:
    """The 1-minute load average (runnable processes, ours included); None where unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _environment(cfg: BenchConfig) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=False).stdout.strip()  # fmt: skip
    except OSError:
        commit = ""
    device = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else platform.processor() or "cpu"
    return {
        "device": device, "torch": torch.__version__, "threads": torch.get_num_threads(), "commit": commit,
        "python": platform.python_version(),
    }  # fmt: skip


def describe_sample(cfg: dict) -> str:
    """What a table's tokens/s are: over which prompts, tokens and repeats, and what is a median of what."""
    n = cfg["num_prompts"]
    return (
        f"{n} '{cfg['prompt_set']}' prompts of <= {cfg['prompt_tokens']} tokens, {cfg['max_new_tokens']} new tokens "
        f"each; tokens/s = median over {cfg['repeats']} repeats of (new tokens / seconds, summed over the {n} "
        "prompts; at batch B the prompts go B to a call), after one untimed warm-up call per method; methods "
        "interleaved per prompt"
    )


def _grid_note(cfg: dict, rows: int) -> str:
    grid = cfg.get("grid")
    if grid == "default":
        return f"default grid ({rows} rows; `fastspec bench --full` runs every method at every setting)"
    return f"{grid} grid ({rows} rows)" if grid else f"{rows} rows"


def markdown(result: dict) -> str:
    """The results as a markdown table (one line per setting and method) with the producing command, what the
    numbers sample, and, for an interrupted run, that it was interrupted and which rows are missing."""
    env, cfg = result["environment"], result["config"]
    missing = result.get("missing_rows", [])
    lines = [f"`{cfg['command']}`  "]
    if result.get("interrupted"):
        lines.append(
            f"**INTERRUPTED** (Ctrl-C): {len(result['rows'])} of {len(result['rows']) + len(missing)} rows finished; "
            "the missing ones are listed under the table  "
        )
    load = env.get("load_average_start")
    load = "" if load is None else f", load average {load} at the start and {env.get('load_average_end')} at the end"
    lines += [
        f"device: {env['device']}, torch {env['torch']}, {env['threads']} threads{load}, commit {env['commit']}; "
        f"{_grid_note(cfg, len(result['rows']) + len(missing))}; {describe_sample(cfg)}",
        *(f"{note}  " for note in result.get("notes", [])),
        "",
        "| batch | temp | method | tokens/s | vs HF generate | acceptance | tokens/step | per-position acceptance "
        "| peak mem MB | greedy == HF |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in result["rows"]:
        acc = f"{r['acceptance_rate']:.3f}" if "acceptance_rate" in r else ""
        mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""
        per = " ".join(f"{a:.2f}" for a in r.get("per_position_acceptance", []))
        eq = {True: "yes", False: "NO", None: "n/a (sampled)"}[r["greedy_equal_hf"]]
        mem = "" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.1f}"
        timed = r.get("compiles_while_timed")
        method = r["method"] + (f" ({timed} compiles timed)" if timed else "")
        if r.get("repeats", cfg["repeats"]) < cfg["repeats"]:
            method += f" (interrupted: median of {r['repeats']} of {cfg['repeats']} repeats)"
        lines.append(
            f"| {r['batch']} | {r['temperature']} | {method} | {r['tokens_per_s']:.1f} | "
            f"{r['speedup_vs_hf']:.2f}x | {acc} | {mal} | {per} | {mem} | {eq} |"
        )
    if result.get("interrupted"):
        lines += ["", missing_text(missing)]
    return "\n".join(lines)


def missing_text(missing: list[dict]) -> str:
    """The rows an interrupted run did not finish, one line per setting."""
    if not missing:
        return "Missing rows: none (interrupted after the last row)."
    settings = {}
    for r in missing:
        settings.setdefault((r["batch"], r["temperature"]), []).append(r["method"])
    return "Missing rows (interrupted):  \n" + "  \n".join(
        f"batch {b}, temperature {t}: {', '.join(names)}" for (b, t), names in settings.items()
    )


def write_outputs(result: dict, json_path: str | None, plot_path: str | None) -> None:
    """Write the JSON results and, if asked, a speedup-vs-K chart (needs matplotlib: `pip install .[plot]`)."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    if plot_path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for batch in sorted({r["batch"] for r in result["rows"]}):
            for temp in sorted({r["temperature"] for r in result["rows"]}):
                pts = [(int(r["method"].rsplit("k", 1)[1]), r["speedup_vs_hf"]) for r in result["rows"]
                       if r["batch"] == batch and r["temperature"] == temp and "_chain_k" in r["method"]]  # fmt: skip
                if pts:
                    ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=f"batch {batch}, temperature {temp}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens/s vs HF generate")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plot_path, dpi=120)
