"""`LookupThenDrafter`: prompt lookup where the row's last n-gram occurred before, another drafter elsewhere."""

from __future__ import annotations

import torch

from fastspec.drafters.base import Drafter, DraftPlan, Drafts
from fastspec.drafters.prompt_lookup import lookup_ngram
from fastspec.layout import BufferLayout
from fastspec.sampling import Sampler

__all__ = ["LookupThenDrafter"]


class LookupThenDrafter(Drafter):
    """Prompt lookup first, `fallback` (any chain drafter: a draft model, a head) where lookup has nothing good.

    A row drafts by lookup when its whole last n-gram (n = `ngram`, no shorter fallback) occurs earlier in the
    row: text that repeats its context (code edits, quoting) is then copied for free, at up to K tokens. Other
    rows draft with `fallback`, which skips steps where every row used lookup; a drafter with a cache feeds the
    columns it missed at its next forward. With sampling, lookup rows carry one-hot draft probabilities.
    """

    def __init__(self, ngram: int, fallback: Drafter):
        self.ngram = ngram
        self.fallback = fallback
        self.caches = fallback.caches

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Rows whose whole last n-gram occurs earlier look up (`max_tokens` tokens), the others use the fallback
        (its source name)."""
        looked_up, _, match_len = lookup_ngram(tokens, mask, self.ngram, max_tokens)
        use_lookup = match_len == self.ngram
        sources = ["lookup" if used else self.fallback.source for used in use_lookup.tolist()]
        return DraftPlan(sources, looked_up, use_lookup)

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler: Sampler) -> Drafts:  # fmt: skip
        """K tokens per row from the plan's source. Returns tokens [R, K] int64, probs [R, K, V] fp32 (None when
        every row's q is one-hot: greedy, or all rows looked up) and num_draft: the fallback's for its rows, K for
        lookup rows (None when every row has K)."""
        looked_up, use_lookup = plan.lookup_tokens[:, :num_tokens], plan.lookup_rows
        if bool(use_lookup.all()):
            return Drafts(looked_up, None, None)
        drafted, probs, num_draft = self.fallback.propose(tokens, mask, self.fallback.plan(tokens, mask, num_tokens),
                                                          num_tokens, sampler)  # fmt: skip
        drafts = torch.where(use_lookup[:, None], looked_up, drafted)
        if num_draft is not None:
            num_draft = torch.where(use_lookup, num_tokens, num_draft)
        if probs is not None:
            one_hot = torch.nn.functional.one_hot(looked_up, probs.shape[-1]).to(probs.dtype)
            probs = torch.where(use_lookup[:, None, None], one_hot, probs)
        return Drafts(drafts, probs, num_draft)

    def kept(self, layout: BufferLayout, num_accepted: torch.Tensor):
        """What the fallback's caches keep."""
        return self.fallback.kept(layout, num_accepted)
