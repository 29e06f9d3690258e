"""The reduced draft vocabulary of an EAGLE-3 head: the N most frequent target tokens of the regenerated answers.

Published EAGLE-3 heads (EAGLE's own trainer, SpecForge) keep the top N tokens by frequency over the training answers,
**sorted ascending**, and store two maps: ``d2t[i] = kept[i] - i`` (so target id = draft id + ``d2t[draft id]``) and
``t2d[j] = j in kept`` (bool over the target's vocabulary). Invariant: ``nonzero(t2d) == arange(N) + d2t``.
Ties in frequency, and tokens the answers never use (when N exceeds the distinct tokens seen), are ranked by
ascending id, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["select_draft_vocab", "token_counts", "vocab_coverage", "vocab_maps"]


def token_counts(sequences: Iterable[torch.Tensor | list[int]], vocab_size: int) -> torch.Tensor:
    """int64 [vocab_size]: how often each token id occurs in ``sequences`` (ValueError for ids outside the vocab)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        ids = torch.as_tensor(seq, dtype=torch.long).flatten()
        if ids.numel() == 0:
            continue
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise ValueError(f"token id outside the target's vocabulary [0, {vocab_size}) in the answers")
        counts += torch.bincount(ids, minlength=vocab_size)
    return counts


def select_draft_vocab(counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids of ``counts`` [V] (ties and unseen tokens by ascending id), sorted
    ascending: int64 [size]."""
    vocab = counts.numel()
    if not 1 <= size <= vocab:
        raise ValueError(f"draft_vocab: must be in [1, {vocab}] (the target's vocabulary size), got {size}")
    order = torch.sort(-counts.to(torch.long), stable=True).indices  # most frequent first, ties by id
    return torch.sort(order[:size]).values


def vocab_maps(kept: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t int64 [N], t2d bool [vocab_size])`` of the kept ids (sorted ascending, distinct)."""
    kept = torch.as_tensor(kept, dtype=torch.long)
    if kept.numel() > 1 and not bool((kept[1:] > kept[:-1]).all()):
        raise ValueError("draft_vocab_ids: must be distinct and sorted ascending")
    d2t = kept - torch.arange(kept.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[kept] = True
    return d2t, t2d


def vocab_coverage(counts: torch.Tensor, kept: torch.Tensor) -> float:
    """Share of the counted tokens that the kept ids cover."""
    total = int(counts.sum())
    return float(counts[kept].sum()) / total if total else 1.0
