"""Draft sources: a small draft model proposing a chain of K tokens.

A proposer fills `draft_tokens [R, K]` and, when sampling, `draft_probs [R, K, V]`: the exact distribution
q each token was drawn from (after the same temperature / top-k / top-p as the target), which the verifier
needs to stay lossless. Greedy drafts return `None` probabilities (one-hot q).
"""

from __future__ import annotations

import torch

from fastspec.runner import CachedModel
from fastspec.sampling import Sampler

__all__ = ["DraftModelProposer"]


class DraftModelProposer:
    """Proposes K tokens autoregressively with a draft model that keeps its own KV cache in step."""

    def __init__(self, model: torch.nn.Module):
        self.runner = CachedModel(model)

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, num_tokens: int, sampler: Sampler
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draft `num_tokens` tokens after the buffer.

        Args:
            tokens: [R, S] right-aligned token buffer; mask: [R, S] its attention mask.
            num_tokens: K >= 1.
        Returns:
            draft_tokens [R, K] int64 and draft_probs [R, K, V] fp32 (None for greedy drafts).
        """
        drafts = tokens.new_empty(tokens.shape[0], 0)
        probs = []
        for _ in range(num_tokens):
            # the first call also feeds every buffer column the draft has not seen (1 or 2 after a step)
            logits = self.runner.forward(tokens, mask, extra=drafts)[:, -1]
            token, q = sampler.draft(logits)
            drafts = torch.cat([drafts, token[:, None]], dim=1)
            probs.append(q)
        return drafts, None if probs[0] is None else torch.stack(probs, dim=1)

    def realign(self, accepted_len: torch.Tensor, shift: torch.Tensor, shifted: bool) -> None:
        """Roll the draft cache back to the accepted prefix (see `CachedModel.realign`)."""
        self.runner.realign(accepted_len, shift, shifted)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows."""
        self.runner.select_rows(rows)
