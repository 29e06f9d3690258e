"""Adaptive draft length (`num_draft_tokens="auto"`): draft one more token only while it pays for itself.

The rule is Leviathan et al.'s expected-gain argument (arXiv 2211.17192, section 3.4) applied token by token,
with the draft's own confidence as the signal (as HF's `assistant_confidence_threshold`, but calibrated online
instead of a fixed threshold):

- Each drafted token gets a confidence c (the draft probability of the token it chose: max q for greedy drafts,
  q(x) for sampled ones). Its acceptance estimate a(c) is the measured acceptance rate of earlier drafted tokens
  with a confidence in the same bucket (an exponential moving average per bucket, updated after every step).
  Raw draft probabilities of a small distilled draft are badly calibrated (on the shipped pair, tokens drafted
  with q < 0.1 are accepted half the time, tokens with q in [0.1, 0.5] 93 % of the time); the buckets learn that.
- After drafting j tokens a row expects E_j = 1 + sum_{i<=j} S_i tokens from the step, S_i = a_1 ... a_i being
  the chance that drafts 1..i are all accepted. One more draft token adds about S_j * a_j expected tokens
  (assuming it is as predictable as the last one) and costs t, the measured draft time per token, on top of
  the step's T + j t (T: measured time of the rest of a step: target forward, verification, bookkeeping).
  It is drafted when that improves tokens per second: S_j a_j (T + j t) >= E_j t, for at least one row.

The choice only changes how much is drafted, never how drafts are verified, so the output stays lossless.
Proposers without a per-token cost or confidence (prompt lookup) simply draft `max_k` tokens.
"""

from __future__ import annotations

import torch

__all__ = ["DraftLengthController"]

# upper edges of the confidence buckets (the last bucket is (0.9, 1])
CONFIDENCE_EDGES = (0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9)


class DraftLengthController:
    """Per-step draft length: `begin` a draft, ask `keep_drafting` after each token, `update` after verification."""

    def __init__(self, max_k: int = 8, prior: float = 0.8, momentum: float = 0.9):
        self.max_k = max_k
        self.momentum = momentum
        self.edges = torch.tensor(CONFIDENCE_EDGES)
        self.acceptance = torch.full((len(CONFIDENCE_EDGES) + 1,), prior)  # P(accept | bucket, draft reached)
        self.step_time: float | None = None  # seconds per step, drafting excluded (T)
        self.draft_time: float | None = None  # seconds per draft token (t)
        self.buckets: list[torch.Tensor] = []  # this step: confidence bucket [R] of each drafted position

    def begin(self, rows: int) -> None:
        """Start drafting for `rows` rows."""
        self.buckets = []
        self.survival = torch.ones(rows)
        self.expected = torch.ones(rows)

    def keep_drafting(self, confidence: torch.Tensor) -> bool:
        """Record the draft probability [R] of the token just drafted; True when one more token pays off for a row."""
        bucket = torch.bucketize(confidence.float().cpu(), self.edges)
        self.buckets.append(bucket)
        accept = self.acceptance[bucket]
        self.survival = self.survival * accept
        self.expected = self.expected + self.survival
        if self.step_time is None or self.draft_time is None:
            return True  # nothing measured yet: draft the most, which measures every bucket it meets
        drafted = len(self.buckets)
        gain = self.survival * accept * (self.step_time + drafted * self.draft_time)
        return bool((gain >= self.expected * self.draft_time).any())

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.momentum * old + (1 - self.momentum) * new

    def update(self, num_draft: torch.Tensor, num_accepted: torch.Tensor, draft_seconds: float,
               step_seconds: float) -> None:  # fmt: skip
        """Record one verified step: num_draft [R] and num_accepted [R] (CPU), the wall time spent drafting and
        the wall time of the whole step (drafting included)."""
        k = int(num_draft.max()) if num_draft.numel() else 0
        self.step_time = self._ema(self.step_time, max(step_seconds - draft_seconds, 0.0))
        if k > 0:
            self.draft_time = self._ema(self.draft_time, draft_seconds / k)
        for j, bucket in enumerate(self.buckets[:k]):
            reached = (num_accepted >= j) & (num_draft > j)  # rows whose draft j was verified
            accepted = (num_accepted > j).float()
            for b in bucket[reached].unique().tolist():
                hits = accepted[reached & (bucket == b)]
                weight = 1 - self.momentum ** hits.numel()  # an EMA step per observation
                self.acceptance[b] = (1 - weight) * self.acceptance[b] + weight * hits.mean()
        self.buckets = []
