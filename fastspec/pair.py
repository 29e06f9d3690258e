"""The small target/draft model pair shipped with fastspec, and held-out prompts to benchmark it.

The pair is a ``LlamaForCausalLM`` target and a much cheaper ``LlamaForCausalLM`` draft that share one byte-level
BPE tokenizer. Both were trained on the Python standard library source (the draft distilled from the target) by
``python -m training.train_pair``; the modules in :data:`HELD_OUT_MODULES` were left out of training and are used for
evaluation prompts.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

import torch

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

PAIR_DIR = Path(__file__).parent / "pair"


def _checked_dir(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no trained model at {path}; run `python -m training.train_pair` to create the pair")
    return path


def default_target_dir() -> Path:
    """Return the directory of the shipped target model, raising FileNotFoundError if it has not been trained."""
    return _checked_dir(PAIR_DIR / "target")


def default_head_dir() -> Path:
    """The directory of the draft head shipped for the shipped target (``fastspec/pair/head``; `fastspec.heads
    .load_head` reads it)."""
    return PAIR_DIR / "head"


def default_draft_dir() -> Path:
    """Return the directory of the shipped draft model, raising FileNotFoundError if it has not been trained."""
    return _checked_dir(PAIR_DIR / "draft")


def load_pair(
    target_dir: str | Path | None = None,
    draft_dir: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """Load ``(tokenizer, target, draft)``; models are cast to ``dtype``, moved to ``device`` and put in eval mode.

    Defaults to the pair shipped in :data:`PAIR_DIR`. The tokenizer is loaded from the target directory.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_dir = Path(target_dir) if target_dir is not None else default_target_dir()
    draft_dir = Path(draft_dir) if draft_dir is not None else default_draft_dir()
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype).to(device).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype).to(device).eval()
    return tokenizer, target, draft


def heldout_sources() -> dict[str, str]:
    """Return ``{module file name: source text}`` for the held-out modules of the running interpreter's stdlib."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
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


def heldout_prompts(tokenizer, num_prompts: int, prompt_tokens: int) -> list[str]:
    """Return ``num_prompts`` deterministic code prompts cut at function boundaries of the held-out modules.

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
    if num_prompts > len(candidates):
        raise ValueError(f"asked for {num_prompts} prompts but only {len(candidates)} fit in {prompt_tokens} tokens")
    return [candidates[i * len(candidates) // num_prompts] for i in range(num_prompts)]


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
    if num_prompts > len(candidates):
        raise ValueError(f"asked for {num_prompts} prompts but only {len(candidates)} fit in {prompt_tokens} tokens")
    return [candidates[i * len(candidates) // num_prompts] for i in range(num_prompts)]


def mixed_prompts(tokenizer, num_prompts: int, prompt_tokens: int) -> list[str]:
    """Held-out and repeat prompts alternating (held-out first), so easy and hard text share every batch of 2+."""
    prompts = [""] * num_prompts
    prompts[0::2] = heldout_prompts(tokenizer, num_prompts - num_prompts // 2, prompt_tokens)
    prompts[1::2] = repeat_prompts(tokenizer, num_prompts // 2, prompt_tokens)
    return prompts


PROMPT_SETS = {"heldout": heldout_prompts, "repeat": repeat_prompts, "mixed": mixed_prompts}
"""Prompt sets by name (``fastspec bench --prompt-set``): each maps ``(tokenizer, num_prompts, prompt_tokens)`` to
a list of prompts."""
