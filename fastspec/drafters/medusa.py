"""`MedusaDrafter`: Medusa heads (Cai et al. 2024, arXiv 2401.10774) draft K tokens at once from the target's state.

Head i reads the target's last hidden state (after the final norm) at column t and scores the token at t + i + 2.
After a step the target has computed that state for the feature columns [0, S - 1) (`fastspec.layout`); the last
one, column S - 2, is the state that predicted the root, so head i drafts the token i + 1 places after the root.
The drafts are independent: draft i is drawn from head i's distribution q_i whatever the drafts before it, which is
a valid (prefix-independent) draft distribution, so the standard rejection sampling of `verify_chain` keeps the
output exactly the target's. Medusa's own "typical acceptance" is not lossless and is not used. No cache: a Medusa
drafter keeps nothing between steps. The first step (the prefill) has no state yet and drafts nothing.
"""

from __future__ import annotations

import torch

from fastspec.checks import check_finite_logits
from fastspec.drafters.base import Drafter, DraftPlan, Drafts, DraftSetup
from fastspec.layout import BufferLayout
from fastspec.sampling import Sampler

__all__ = ["MedusaDrafter"]


class MedusaDrafter(Drafter):
    """Drafts up to `head.num_heads` tokens per row with Medusa heads (chains only).

    Args:
        head: a `fastspec.heads.MedusaHead` for this target (`load_head` checks sizes and places it).
        setup: the call's `DraftSetup`; the target's runner is asked to keep its last hidden state.
    """

    def __init__(self, head: torch.nn.Module, setup: DraftSetup):
        hidden = setup.target.model.config.get_text_config().hidden_size
        if head.hidden_size != hidden:
            raise ValueError(f"draft: Medusa head hidden size {head.hidden_size} != target hidden size {hidden}")
        setup.target.keep_features([-1])
        self.head = head
        self.target = setup.target
        self.check_logits = setup.check_logits
        self.steps = 0

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler: Sampler) -> Drafts:  # fmt: skip
        """min(K, heads) independent drafts per row (`Drafter.propose`): tokens [R, K], probs [R, K, V] or None
        (greedy), num_draft None, or [R] = heads when K > heads; on the first step every row drafts 0."""
        rows = tokens.shape[0]
        end = BufferLayout(tokens.shape[1]).feature_end
        features = self.target.features.values
        if features is None or self.target.cached < end:
            return Drafts(tokens.new_zeros(rows, num_tokens), None, tokens.new_zeros(rows))
        with torch.no_grad():
            logits = self.head(features[:, end - 1].to(next(self.head.parameters()).dtype))  # [R, heads, V]
        if self.check_logits:
            check_finite_logits(logits, "draft", self.steps)
        drafts, probs = [], []
        for position in range(min(num_tokens, logits.shape[1])):
            token, q = sampler.draft(logits[:, position], position)
            drafts.append(token)
            probs.append(q)
        self.steps += 1
        drafted = len(drafts)
        drafts = torch.stack(drafts, dim=1)
        probs = None if probs[0] is None else torch.stack(probs, dim=1)
        if drafted == num_tokens:
            return Drafts(drafts, probs, None)
        # more tokens asked than heads: K columns, the ones past the heads unused (num_draft)
        drafts = torch.nn.functional.pad(drafts, (0, num_tokens - drafted))
        probs = None if probs is None else torch.nn.functional.pad(probs, (0, 0, 0, num_tokens - drafted))
        return Drafts(drafts, probs, torch.full((rows,), drafted, device=drafts.device))
