"""One step of tree speculation inside the decoding loop: draft a tree, score it in one target forward, verify it,
then compact both KV caches to the accepted path.

The token buffer [R, S] is the loop's (right-aligned rows); its last column is the tree root. The target's cache
covers columns [0, S - 1) (after the first step the previous step's compaction leaves it there; on the first step
the prompt minus its last token is prefilled normally), so the tree forward feeds exactly the N nodes with the
additive mask of `tree_mask(parents, mask[:, :S-1])` and position ids prefix length + depth. Node i's logits are
the target distribution of its children: `verify_tree` walks the tree and returns the accepted node indices.

Compaction keeps, per row, the cache positions [0, S) (buffer and root) then the accepted nodes in path order,
and shifts each row right by the loop's right-alignment shift: one gather per layer (`CachedModel.keep`). The
draft keeps only the accepted nodes it scored (a leading part of the path: a node is scored iff the draft needed
its children); the missing columns are fed at its next forward.
"""

from __future__ import annotations

import torch

from fastspec.checks import check_finite_logits
from fastspec.runner import CachedModel
from fastspec.sampling import Sampler
from fastspec.tree import DynamicTree, StaticTree
from fastspec.tree_proposer import DraftTree, TreeDraftProposer
from fastspec.verify import tree_mask, verify_tree

__all__ = ["TreeSpeculator"]


class TreeSpeculator:
    """Tree speculation with a draft model for one generate call (holds the draft's cache between steps)."""

    def __init__(
        self,
        draft: torch.nn.Module,
        tree: StaticTree | DynamicTree,
        vocab: int,
        check_logits: bool = True,
        backend: str = "auto",
    ):
        if isinstance(tree, StaticTree) and max(tree.ranks) >= vocab:
            raise ValueError(f"tree: child rank {max(tree.ranks)} needs a vocabulary larger than {vocab} tokens")
        self.proposer = TreeDraftProposer(draft, tree, vocab, check_logits, backend)
        self.depth = tree.depth  # deepest level a step drafts
        self.check_logits = check_logits
        self.backend = backend
        self._step: tuple[int, DraftTree, torch.Tensor] | None = None

    def step(
        self, target: CachedModel, tokens: torch.Tensor, mask: torch.Tensor, depth: int, sampler: Sampler
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        """Draft, score and verify one tree of depth <= `depth` for every row of the buffer.

        Returns:
            out_tokens [R, D+1] (accepted path then the recovered/bonus token, -1 padded), num_accepted [R],
            each row's tree depth [R] and the number of draft nodes per row.
        """
        width = tokens.shape[1]
        tree = self.proposer.propose(tokens, mask, depth, sampler)
        # first step only: the target has not seen the prompt; prefill it without the root
        if target.cached < width - 1:
            target.forward(tokens[:, :-1], mask[:, :-1])
        dtype = next(target.model.parameters()).dtype
        tm = tree_mask(tree.parents, mask[:, :-1], dtype, backend=self.backend)
        logits = target.forward_tree(tree.tokens, tm.mask, tm.position_ids)  # [R, N, V]
        if self.check_logits:
            check_finite_logits(logits, "target", self.proposer.steps - 1)
        rows, num_nodes, vocab = logits.shape
        if sampler.do_sample:
            uniforms, noise = sampler.verify_randomness(num_nodes, vocab)
        else:  # greedy rows ignore randomness
            uniforms, noise = logits.new_ones(rows, num_nodes), logits.new_ones(rows, vocab)
        out, num_accepted, accept_index = verify_tree(
            logits, tree.tokens, tree.parents, tree.draft_probs, sampler.verify_temperature, sampler.top_k,
            sampler.top_p, uniforms, noise, max_depth=tree.depth, backend=self.backend,
        )  # fmt: skip
        self._step = (width, tree, accept_index)
        return out, num_accepted, tm.depth.amax(dim=-1), num_nodes - 1

    def realign(self, target: CachedModel, num_accepted: torch.Tensor, shift: torch.Tensor) -> None:
        """Compact the target's and the draft's caches to each row's accepted path, right-aligned by `shift` [R]."""
        width, tree, accept_index = self._step
        # the target scored every node: node i sits at cache position width - 1 + i
        target.keep(width, width - 1 + accept_index.clamp_min(0), num_accepted, shift)
        # the draft scored only nodes with children: keep the accepted ones up to the first it did not score
        pos = tree.draft_pos.gather(1, accept_index.clamp_min(0))
        on_path = torch.arange(accept_index.shape[1], device=pos.device)[None, :] < num_accepted[:, None]
        num_scored = ((pos >= 0) & on_path).long().cumprod(dim=1).sum(dim=1)
        self.proposer.runner.keep(width, pos, num_scored, shift)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows from the draft's cache."""
        self.proposer.select_rows(rows)

    def drop_leading(self, columns: int) -> None:
        """Drop the draft's cache entries of the buffer's first `columns` columns (padding in every row)."""
        self.proposer.drop_leading(columns)
