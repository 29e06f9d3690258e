"""The small target/draft model pair shipped with fastspec, and where its files are.

The pair is a ``LlamaForCausalLM`` target and a much cheaper ``LlamaForCausalLM`` draft that share one byte-level
BPE tokenizer. Both were trained on the Python standard library source (the draft distilled from the target) by
``python -m fastspec.training.train_pair``; the modules of `fastspec.prompts.HELD_OUT_MODULES` were left out of
training, and the benchmarks' prompts come from them (`fastspec.prompts`).
"""

from __future__ import annotations

from pathlib import Path

import torch

PAIR_DIR = Path(__file__).parent / "pair"


def _checked_dir(path: Path) -> Path:
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"no trained model at {path}: `python -m fastspec.training.train_pair` creates the pair"
        )
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
