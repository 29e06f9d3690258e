"""`HeadDrafter`: an EAGLE-style draft head (`fastspec.heads.DraftHeadBase`) drafts from the target's own features.

Head position p reads (the target's feature of column p, the token of column p + 1) and predicts the feature of
column p + 1 and the token of column p + 2 (Li et al. 2024, EAGLE, arXiv 2401.15077). The target's runner keeps
its features for the feature columns [0, S - 1) (`fastspec.layout`; compacted with its cache). Each step the head
first catches up on the feature columns it has not read, which ends at the head's root (column S - 2) with the
logits of the first draft; chains then feed the head's own predicted features, trees score each level's nodes
reading their parent's predicted feature. The head keeps only positions read with the target's features:
drafted positions are recomputed from the target's features at the next step, as EAGLE does. The first step (the
prefill) has no features yet and drafts nothing.
"""

from __future__ import annotations

import torch

from fastspec.checks import check_finite_logits
from fastspec.drafters.base import DraftPlan, Drafts, DraftSetup, DraftTree, TreeDrafter
from fastspec.layout import BufferLayout
from fastspec.runner import HeadRunner, causal_visibility, position_ids
from fastspec.sampling import Sampler
from fastspec.verify import tree_mask

__all__ = ["HeadDrafter"]


class HeadDrafter(TreeDrafter):
    """Drafts chains and trees with a draft head over the target's features.

    Args:
        head: a `fastspec.heads.DraftHeadBase` (EAGLE-1, EAGLE-3) for this target; setting up the drafter binds
            it to the target (a ValueError naming `draft` when it does not fit) and makes the target's runner keep
            the hidden states the head reads.
        setup: the call's `DraftSetup`.
    """

    def __init__(self, head: torch.nn.Module, setup: DraftSetup):
        target = setup.target
        head.bind(target.model)
        target.keep_features(head.feature_layers)
        self.head = head
        self.target = target
        self.runner = HeadRunner(head, setup.capacity, setup.compile)
        self.caches = [self.runner]
        self.check_logits = setup.check_logits
        self.backend = setup.backend
        self.steps = 0

    def _forward(self, features, ids, positions, visible=None, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over n new positions: `visible` [R, n, cached + n] bool, or a tree's additive `mask`."""
        if mask is None:
            hidden, logits = self.runner.forward(features, ids, positions, visible)
        else:
            hidden, logits = self.runner.forward_tree(features, ids, positions, mask)
        logits = self.head.to_target_logits(logits)
        if self.check_logits:
            check_finite_logits(logits, "draft", self.steps)
        return hidden, logits

    def _catch_up(self, tokens: torch.Tensor, mask: torch.Tensor):
        """Read the target's features of the feature columns the head has not read; returns the head's (hidden
        [R, H], logits [R, V]) at its root (the feature and the first draft after the buffer), or None before the
        target has run (the prefill)."""
        end = BufferLayout(tokens.shape[1]).feature_end
        start = self.runner.cached
        features = self.target.features.values
        if features is None or self.target.cached < end or start >= end:
            return None
        hidden, logits = self._forward(
            self.head.target_features(features[:, start:end]), tokens[:, start + 1 :],
            position_ids(mask)[:, start:end], causal_visibility(mask[:, :end], start),
        )  # fmt: skip
        return hidden[:, -1], logits[:, -1]

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler: Sampler) -> Drafts:  # fmt: skip
        """Catch up, then K head steps on the head's own features (`Drafter.propose`). Returns tokens [R, K],
        probs [R, K, V] or None (greedy), num_draft None; on the first step every row drafts 0 (num_draft [R])."""
        rows, width = tokens.shape
        caught_up = self._catch_up(tokens, mask)
        if caught_up is None:
            return Drafts(tokens.new_zeros(rows, num_tokens), None, tokens.new_zeros(rows))
        hidden, logits = caught_up
        last_position = (mask.long().sum(-1) - 1)[:, None]  # position of the buffer's last column
        real = mask[:, : BufferLayout(width).feature_end].bool()
        drafts, probs = [], []
        for position in range(num_tokens):
            token, q = sampler.draft(logits, position)
            drafts.append(token)
            probs.append(q)
            if position + 1 < num_tokens:  # the head's own feature and its draft, one position further
                visible = torch.cat([real, real.new_ones(rows, position + 1)], dim=1)[:, None]
                hidden, logits = self._forward(hidden[:, None], token[:, None], last_position + position, visible)
                hidden, logits = hidden[:, -1], logits[:, -1]
        self.steps += 1
        return Drafts(torch.stack(drafts, dim=1), None if probs[0] is None else torch.stack(probs, dim=1), None)

    def kept(self, layout: BufferLayout, num_accepted: torch.Tensor):
        """Only the feature columns, whatever was accepted."""
        return [(self.runner, layout.keep_features(num_accepted))]

    def tree_root(self, tokens: torch.Tensor, mask: torch.Tensor, step: int):
        """Catch up: (the root's children logits [R, V] or None on the first step, the call's state: hidden
        [R, 1, H] of each scored node, root first)."""
        caught_up = self._catch_up(tokens, mask)
        if caught_up is None:
            return None, None
        hidden, logits = caught_up
        # a compiled step's outputs are valid until its next call (CUDA graphs overwrite them): keep a copy
        return logits, [hidden[:, None].clone()]

    def score_nodes(self, new_tokens, scored_parents, mask, state, step: int) -> torch.Tensor:
        """Node c reads (its parent's predicted feature, its own token) under the tree-attention mask over the
        head's cache, whose last entry is the root (`TreeDrafter.score_nodes`)."""
        num = new_tokens.shape[1]
        prefix = BufferLayout(mask.shape[1]).before_head_root(mask)
        tm = tree_mask(scored_parents, prefix, self.runner.dtype, backend=self.backend)
        parent_hidden = torch.cat(state, dim=1)
        parents = scored_parents[:, -num:]
        features = parent_hidden.gather(1, parents[:, :, None].expand(-1, -1, parent_hidden.shape[-1]))
        hidden, logits = self._forward(features, new_tokens, tm.position_ids[:, -num:], mask=tm.mask[:, :, -num:])
        state.append(hidden.clone())  # read after later compiled calls (see `tree_root`)
        return logits

    def tree_kept(self, layout: BufferLayout, tree: DraftTree, path: torch.Tensor, num_accepted: torch.Tensor):
        """Only the feature columns."""
        return self.kept(layout, num_accepted)
