"""Adaptive draft length (`num_draft_tokens="auto"`): pick K each step from measured acceptance and cost.

Leviathan et al. 2023 (arXiv 2211.17192, section 3.4) choose K to maximise the expected tokens per unit of
time. Here acceptance is tracked per position (alpha_j = P(draft j accepted | drafts < j accepted), an
exponential moving average over steps), so the expected tokens of a K-chain are

    E(K) = 1 + sum_{j=1..K} prod_{i<=j} alpha_i

and a step costs T + K * t, with T the measured target-forward time and t the measured draft time per token
(both moving averages of wall time). K* = argmax_K E(K) / (T + K t). The choice only changes how much is
drafted, never how drafts are verified, so the output stays lossless.
Positions never drafted keep the optimistic prior, so K grows back when recent acceptance is high.
"""

from __future__ import annotations

import torch

__all__ = ["DraftLengthController"]


class DraftLengthController:
    """Chooses the chain length per step; `update` feeds it what the last step measured."""

    def __init__(self, max_k: int = 8, prior: float = 0.8, momentum: float = 0.8):
        self.max_k = max_k
        self.alpha = [prior] * max_k  # per-position conditional acceptance
        self.momentum = momentum
        self.target_time: float | None = None  # seconds per target forward
        self.draft_time: float | None = None  # seconds per draft token

    def choose(self, cap: int) -> int:
        """Best K in [1, min(cap, max_k)] (0 when cap < 1)."""
        cap = min(cap, self.max_k)
        if cap < 1:
            return 0
        if self.target_time is None or self.draft_time is None:
            return cap  # nothing measured yet: draft the most, which measures every position
        best_k, best_rate, expected, survive = 1, 0.0, 1.0, 1.0
        for k in range(1, cap + 1):
            survive *= self.alpha[k - 1]
            expected += survive
            rate = expected / (self.target_time + k * self.draft_time)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.momentum * old + (1 - self.momentum) * new

    def update(self, num_draft: torch.Tensor, num_accepted: torch.Tensor, draft_seconds: float,
               target_seconds: float) -> None:  # fmt: skip
        """Record one step: num_draft [R] and num_accepted [R] (CPU), and the wall time of drafting / verifying."""
        k = int(num_draft.max()) if num_draft.numel() else 0
        self.target_time = self._ema(self.target_time, target_seconds)
        if k > 0:
            self.draft_time = self._ema(self.draft_time, draft_seconds / k)
        for j in range(k):
            reached = (num_accepted >= j) & (num_draft > j)  # rows whose draft j was verified
            if bool(reached.any()):
                rate = float((num_accepted[reached] > j).float().mean())
                self.alpha[j] = self._ema(self.alpha[j], rate)
