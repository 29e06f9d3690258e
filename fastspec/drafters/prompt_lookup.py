"""Prompt lookup decoding: draft what followed the most recent earlier occurrence of the row's last n-gram.

No model, no cache: the search runs over the whole row (prompt and generated text) with tensor ops on the buffer's
device: `unfold` builds every window, one comparison finds the matches, a max picks the most recent.
"""

from __future__ import annotations

import torch

from fastspec.drafters.base import Drafter, DraftPlan, Drafts
from fastspec.sampling import Sampler

__all__ = ["PromptLookupDrafter", "lookup_ngram"]


class PromptLookupDrafter(Drafter):
    """Drafts the continuation of the last n-gram's most recent earlier occurrence, falling back to shorter n-grams
    (n-1, ..., 1) for rows without a match; rows with no match at all draft nothing. Every row's source is
    "lookup"; the drafts are one-hot (`Drafts.probs` None), so they are lossless at any temperature."""

    source = "lookup"

    def __init__(self, ngram: int):
        self.ngram = ngram

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Look up `max_tokens` tokens per row, once per step."""
        drafts, num_draft, _ = lookup_ngram(tokens, mask, self.ngram, max_tokens)
        return DraftPlan([self.source] * tokens.shape[0], drafts, num_draft > 0)

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler: Sampler) -> Drafts:  # fmt: skip
        """The first `num_tokens` of the plan's lookup. Returns tokens [R, K] (entries past num_draft are
        arbitrary), probs None (one-hot q), num_draft [R] (K for rows with a match, 0 without)."""
        return Drafts(plan.lookup_tokens[:, :num_tokens], None, plan.lookup_rows.long() * num_tokens)


def lookup_ngram(tokens: torch.Tensor, mask: torch.Tensor, ngram: int, num_tokens: int):
    """Continuations of the most recent earlier occurrence of each row's last n-gram (n = ngram, ..., 1).

    Args:
        tokens: [R, S] right-aligned rows; mask: [R, S] (windows touching left padding never match).
        ngram: longest n-gram to match; num_tokens: K, the most tokens to propose.
    Returns:
        drafts [R, K] int64, num_draft [R] int64 (K for rows with a match, 0 (drafts all 0) without) and
        match_len [R] int64 (the n of the n-gram that matched, 0 for none). When fewer than K tokens follow the
        match, the continuation repeats them (period = distance to the end), the natural guess for text that loops.
    """
    rows, width = tokens.shape
    drafts = tokens.new_zeros(rows, num_tokens)
    match_len = torch.zeros(rows, dtype=torch.long, device=tokens.device)
    offsets = torch.arange(num_tokens, device=tokens.device)
    for n in range(min(ngram, width - 1), 0, -1):
        windows = tokens.unfold(1, n, 1)  # [R, S-n+1, n]
        hit = (windows == tokens[:, None, -n:]).all(-1) & mask.unfold(1, n, 1).bool().all(-1)
        hit[:, -1] = False  # the suffix itself has no continuation
        starts = torch.arange(hit.shape[1], device=tokens.device)
        last = torch.where(hit, starts, -1).max(-1).values  # most recent match, -1 if none
        new = (last >= 0) & (match_len == 0)
        follow = last + n  # first column after the match
        # a match d columns before the end continues periodically with period d (repeated text loops on)
        period = (width - follow).clamp_min(1)
        candidates = tokens.gather(1, follow[:, None] + offsets % period[:, None])
        drafts = torch.where(new[:, None], candidates, drafts)
        match_len = torch.where(new, n, match_len)
    return drafts, (match_len > 0).long() * num_tokens, match_len
