"""`HeuristicDraftLength`: transformers' `num_assistant_tokens_schedule="heuristic"` as a fastspec draft-length policy.

HF's assisted generation (`AssistedCandidateGenerator.update_candidate_strategy`) drafts `num_assistant_tokens`
tokens, adds 2 after a step whose drafts were all accepted and removes 1 (down to 1) after any other. Here the rule is
the same over a batch: +2 when every row that drafted accepted all its drafts. HF keeps the grown length in the
assistant's generation config for later calls with "heuristic" and restores it with "heuristic_transient"; a
fastspec policy lives for one call, so both start every call from the call's draft length. The draft length only
decides how much is drafted, never what is emitted, so output is unchanged either way.
"""

from __future__ import annotations

import torch

__all__ = ["HeuristicDraftLength"]


class HeuristicDraftLength:
    """Draft `start` tokens, then +2 after a fully accepted step, -1 (>= 1) after any other, at most `max_k`.

    The draft-length policy protocol of `fastspec.adaptive` (`max_k`, `choose`, `update`), untimed.
    """

    def __init__(self, start: int, max_k: int = 64):
        self.k = max(1, min(start, max_k))
        self.max_k = max_k

    def choose(self, cap: int, rows: list[int], remaining: list[int], sources: list[str] | None = None) -> int:
        """The current length, capped by the caller (at least 0)."""
        return max(min(self.k, cap), 0)

    def update(self, rows: list[int], num_draft: torch.Tensor, num_accepted: torch.Tensor, seconds: float | None,
               sources: list[str] | None = None) -> None:  # fmt: skip
        """HF's rule on the committed step's drafts [R] and acceptances [R] (host tensors)."""
        drafted = num_draft > 0
        if not bool(drafted.any()):
            return
        if bool((num_accepted[drafted] >= num_draft[drafted]).all()):
            self.k = min(self.k + 2, self.max_k)
        else:
            self.k = max(1, self.k - 1)
