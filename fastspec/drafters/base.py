"""The drafter interface: what a speculator asks of anything that proposes draft tokens.

Words used throughout:
- *buffer*: the right-aligned token buffer `tokens [R, S]` of the rows still decoding, with its attention mask
  `mask [R, S]` (left padding), owned by `fastspec.batch.RowBatch`.
- *root*: the buffer's last column, the newest token; drafts continue it, and the target scores it with them.
- *draft*: the tokens a drafter proposes after the root: a chain of up to K per row (`Drafts`), or a token tree
  rooted at the root (`DraftTree`), with the distribution q each was drawn from when sampling.
- *caches*: the `fastspec.runner.BufferCache`s a drafter keeps in step with the buffer (a draft model's KV cache);
  `RowBatch` compacts, realigns and drops rows from them together with the target's. A stateless drafter has none.
- *kept entries*: after verification, which entries of each cache survive (`fastspec.layout.KeptPositions`):
  the buffer, then each row's accepted drafts. Which columns each cache holds is `fastspec.layout.BufferLayout`.

A chain drafter (`Drafter`) answers two calls per step, values passed explicitly between them:
1. `plan(tokens, mask, max_tokens) -> DraftPlan`: where each row's drafts come from (a *source* name such as
   "draft" or "lookup"), decided before K is chosen, since adaptive K prices a step by its sources;
2. `propose(tokens, mask, plan, num_tokens, sampler) -> Drafts`;
then `kept(layout, num_accepted)` says what its caches keep. A tree drafter (`TreeDrafter`, a draft model or
head) also scores tree nodes under a tree-attention mask: `tree_root` gives the root's children logits, `score_nodes`
the logits of a tree level, `tree_kept` what it keeps; `fastspec.drafters.tree.TreeBuilder` grows static and
dynamic trees from those two calls.

A drafter is built for one `generate` call (its caches are that call's). `fastspec.generate` accepts a `Drafter`
as `draft=` (used as is, so pass a fresh one per call when it keeps caches) and builds the library's own
(`fastspec.drafters.build_drafter`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fastspec.layout import BufferLayout, KeptPositions
from fastspec.runner import BufferCache
from fastspec.sampling import Sampler

__all__ = ["DraftPlan", "DraftSetup", "DraftTree", "Drafter", "Drafts", "TreeDrafter"]


class DraftPlan(NamedTuple):
    """Where each row's drafts come from this step."""

    sources: list[str]  # per row: "draft" (a model or head) or "lookup" (prompt lookup)
    lookup_tokens: torch.Tensor | None = None  # [R, M] lookup continuations (M = max_tokens of `plan`)
    lookup_rows: torch.Tensor | None = None  # [R] bool, rows that draft by lookup


class Drafts(NamedTuple):
    """One step's chain drafts.

    `probs` is the exact distribution q each token was drawn from (after the same temperature / top-k / top-p as
    the target), which the verifier needs to stay lossless; None means a one-hot q (greedy drafts, n-gram lookup),
    which is lossless at any temperature: a token x is then accepted with probability p(x) and otherwise resampled
    from p with x removed.
    """

    tokens: torch.Tensor  # [R, K] int64 (entries past num_draft are arbitrary)
    probs: torch.Tensor | None  # [R, K, V] fp32 q of each token, None for one-hot q
    num_draft: torch.Tensor | None  # [R] int64 valid drafts per row, None when every row has K


class DraftTree(NamedTuple):
    """One step's token tree for R rows (N nodes, root first, topological order)."""

    tokens: torch.Tensor  # [R, N] int64, tokens[:, 0] the root (the buffer's last token)
    parents: torch.Tensor  # [R, N] int64, parent node index, -1 for the root
    draft_probs: torch.Tensor | None  # [R, N, V]: q node i's children were drawn from (None: deterministic)
    draft_pos: torch.Tensor  # [R, N] int64, a draft model's cache position of each node, -1 when never scored
    depth: int  # deepest node's depth


class DraftSetup(NamedTuple):
    """What `generate` gives the drafters it builds for one call."""

    target: object  # the target's `fastspec.runner.CachedModel` (a head reads its features)
    target_vocab: int  # logits the target emits; draft probabilities are over these ids
    capacity: int | None  # static KV cache positions per row (None: growing caches)
    compile: bool  # compile the drafter's fixed-width steps
    check_logits: bool  # raise NonFiniteLogitsError on NaN/inf draft logits
    backend: str  # kernel backend for tree masks ("auto", "triton", "reference")


class Drafter:
    """A chain drafter (module docstring). Subclasses implement `propose`; the defaults suit a stateless drafter
    whose every row drafts from one source."""

    caches: tuple[BufferCache, ...] | list[BufferCache] = ()  # kept in step with the buffer; stateless: none
    source = "draft"  # the source name `plan` gives every row (adaptive K tracks acceptance per source)

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Where each row's drafts come from, before K is chosen; `max_tokens` is the most K may be.

        Args:
            tokens: [R, S] buffer; mask: [R, S] its attention mask.
        """
        return DraftPlan([self.source] * tokens.shape[0])

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler: Sampler) -> Drafts:  # fmt: skip
        """Draft `num_tokens` (1 <= K <= the plan's max_tokens) tokens per row after the root.

        Args:
            tokens: [R, S] buffer; mask: [R, S] its attention mask; plan: this step's `plan`.
            sampler: the call's sampling settings and per-row random streams (`Sampler.draft` draws a token and
                returns its q, None when greedy).
        Returns:
            Drafts: tokens [R, K], probs [R, K, V] or None, num_draft [R] or None.
        """
        raise NotImplementedError

    def kept(self, layout: BufferLayout, num_accepted: torch.Tensor) -> list[tuple[BufferCache, KeptPositions]]:
        """What each of `caches` keeps after rows accepted `num_accepted` [R] of this step's drafts."""
        return []


class TreeDrafter(Drafter):
    """A drafter that can also score token-tree nodes (a draft model or a draft head).

    `TreeBuilder` calls `tree_root` once per step, then `score_nodes` once per tree level with the nodes of that
    level that need children; `tree_kept` says what the caches keep of the tree.
    """

    def tree_root(self, tokens: torch.Tensor, mask: torch.Tensor, step: int):
        """Read the buffer up to the root: (the root's children logits [R, V] over the target's vocabulary, or None
        when the drafter cannot draft this step, a state passed to `score_nodes`)."""
        raise NotImplementedError

    def score_nodes(self, new_tokens: torch.Tensor, scored_parents: torch.Tensor, mask: torch.Tensor, state,
                    step: int) -> torch.Tensor:  # fmt: skip
        """Draft logits [R, L, V] of L new nodes `new_tokens` [R, L], the last L of the scored tree whose parent
        indices are `scored_parents` [R, F + 1] (root first); `mask` [R, S] is the buffer's."""
        raise NotImplementedError

    def tree_kept(self, layout: BufferLayout, tree: DraftTree, path: torch.Tensor,
                  num_accepted: torch.Tensor) -> list[tuple[BufferCache, KeptPositions]]:  # fmt: skip
        """What the caches keep after rows accepted the nodes `path` [R, D + 1] (node indices, root first;
        `num_accepted` [R] of them past the root)."""
        raise NotImplementedError
