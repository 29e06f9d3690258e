"""Speculators: one step of speculative (or normal) decoding over a `RowBatch`, as one protocol.

A `Speculator` has two calls, and keeps nothing between them but its drafts' caches and its draft-length policy:
- `step(target, batch, sampler) -> StepResult`: choose the draft length, draft, score the buffer's new columns and
  the drafts in one target forward, verify (fused Triton kernel on CUDA, eager reference otherwise), and say which
  cache entries each model keeps (`KeptPositions`); `RowBatch.commit` applies them;
- `commit(step, outcome, seconds)`: feed the draft-length policy what the committed step measured.

`ChainSpeculator` drafts a chain of K tokens with a chain proposer (`fastspec.proposers`: draft model, prompt
lookup, lookup then draft model) or none (normal decoding, K = 0). `TreeSpeculator` drafts a token tree with a
draft model (`fastspec.tree_proposer`), scores all its nodes in one target forward under a tree-attention mask and
verifies it: the buffer's last column is the tree root; the target's cache covers columns [0, S - 1) (the first
step prefills the prompt minus its last token), so the tree forward feeds exactly the N nodes with the additive
mask of `tree_mask(parents, mask[:, :S-1])` and position ids prefix length + depth. Node i's logits are the target
distribution of its children. The target keeps positions [0, S) (buffer and root) then the accepted nodes in path
order; the draft keeps only the accepted nodes it scored (a leading part of the path: a node is scored iff the
draft needed its children); the missing columns are fed at its next forward.

Both take a draft-length policy (`fastspec.adaptive`: a fixed K, or `DraftLengthController` for "auto"), which
for a tree picks its depth from the per-depth acceptance of the accepted paths. The choice only changes how much
is drafted, never how drafts are verified, so the output stays lossless.
"""

from __future__ import annotations

from typing import Protocol

import torch

from fastspec.adaptive import DraftLengthController, FixedDraftLength
from fastspec.batch import RowBatch, StepOutcome, StepResult
from fastspec.checks import check_finite_logits
from fastspec.proposers import DraftModelProposer, Drafts, HeadProposer, LookupThenDraftProposer, PromptLookupProposer
from fastspec.runner import CachedModel, KeptPositions
from fastspec.sampling import Sampler
from fastspec.tree_proposer import TreeDraftProposer
from fastspec.verify import tree_mask, verify_chain, verify_tree

__all__ = ["ChainSpeculator", "Speculator", "TreeSpeculator"]

DraftLength = FixedDraftLength | DraftLengthController
ChainProposer = DraftModelProposer | HeadProposer | PromptLookupProposer | LookupThenDraftProposer


class Speculator(Protocol):
    """One speculation step over the batch, and the feedback of its commit."""

    caches: list[CachedModel]  # the drafts' caches, kept in step with the buffer by `RowBatch`

    def step(self, target: CachedModel, batch: RowBatch, sampler: Sampler) -> StepResult: ...

    def commit(self, step: StepResult, outcome: StepOutcome, seconds: float) -> None: ...


class _Verifier:
    """What both speculators share: the draft-length policy, the verify backend and the finite-logits check."""

    def __init__(self, length: DraftLength, backend: str, check_logits: bool):
        self.length = length
        self.backend = backend
        self.check_logits = check_logits

    def _draft_cap(self, batch: RowBatch) -> int:
        """The most drafts (or tree depth) this step: the policy's longest, and none past max_new_tokens."""
        return min(self.length.max_k, max(batch.remaining()) - 1)

    def _draft_length(self, batch: RowBatch, sources: list[str] | None) -> int:
        """This step's K (or depth): the policy's choice, capped by `_draft_cap`."""
        return self.length.choose(self._draft_cap(batch), batch.rows, batch.remaining(), sources)

    def _checked(self, logits: torch.Tensor, batch: RowBatch) -> torch.Tensor:
        if self.check_logits:
            check_finite_logits(logits, "target", batch.steps)
        return logits

    def _unfed(self, target: CachedModel) -> list:
        """The models that have read nothing yet (asked at the start of a step)."""
        return [model for model in (target, *self.caches) if model.cached == 0]

    @staticmethod
    def _read_prompt(unfed: list) -> bool:
        """Whether one of the models `_unfed` named at the start of this step ran in it, reading the prompt: the
        target on the first step, a draft on its first forward (a draft head's comes a step later, once the
        target's features exist; a draft model behind prompt lookup waits for a row without a match)."""
        return any(model.cached > 0 for model in unfed)

    def commit(self, step: StepResult, outcome: StepOutcome, seconds: float) -> None:
        """Feed the draft-length policy the committed step's drafts, acceptances and wall time (none for a step
        that read the prompt: it is no measure of a decode step's cost)."""
        seconds = None if step.read_prompt else seconds
        self.length.update(outcome.rows, outcome.num_draft, outcome.num_accepted, seconds, step.sources)


class ChainSpeculator(_Verifier):
    """Chain speculation: `proposer` drafts up to K tokens per row (None: normal decoding, K = 0), the target scores
    the buffer's uncached columns and the drafts in one forward, `verify_chain` accepts a prefix per row."""

    def __init__(self, proposer: ChainProposer | None, length: DraftLength, backend: str = "auto",
                 check_logits: bool = True):  # fmt: skip
        super().__init__(length, backend, check_logits)
        self.proposer = proposer
        self.caches = [] if proposer is None else proposer.caches

    def step(self, target: CachedModel, batch: RowBatch, sampler: Sampler) -> StepResult:
        """Draft, score and verify one chain per row. Returns out [R, K+1], num_accepted [R], num_draft [R] or None
        (every row drafted K) and the kept entries: the buffer, then each row's accepted drafts."""
        tokens, mask = batch.tokens, batch.mask
        unfed = self._unfed(target)
        drafts, sources = Drafts(tokens.new_empty(tokens.shape[0], 0), None, None), None
        if self.proposer is not None:
            plan = self.proposer.plan(tokens, mask, self._draft_cap(batch))
            sources = plan.sources
            k = self._draft_length(batch, sources)
            if k > 0:
                drafts = self.proposer.propose(tokens, mask, plan, k, sampler)
        draft_tokens, num_draft = drafts.tokens, drafts.num_draft
        if num_draft is not None:  # ragged proposal: drop columns no row uses (all of them if nothing matched)
            k = int(num_draft.max())
            draft_tokens, num_draft = draft_tokens[:, :k], num_draft.clamp(max=k)
        k = draft_tokens.shape[1]
        logits = self._checked(target.forward(tokens, mask, extra=draft_tokens, num_logits=k + 1), batch)
        uniforms, noise = sampler.verify_randomness(k, logits)
        out, num_accepted = verify_chain(
            logits, draft_tokens, drafts.probs, num_draft, sampler.verify_temperature, sampler.top_k, sampler.top_p,
            uniforms, noise, backend=self.backend,
        )  # fmt: skip
        kept = [(target, KeptPositions(tokens.shape[1], num_accepted))]  # old columns, then the accepted drafts
        if self.proposer is not None:
            kept += self.proposer.kept(tokens.shape[1], num_accepted)
        return StepResult(out, num_accepted, num_draft, None, kept, sources, self._read_prompt(unfed))


class TreeSpeculator(_Verifier):
    """Tree speculation with a draft model or head (module docstring): static or dynamic trees, depth from
    `length`."""

    def __init__(self, proposer: TreeDraftProposer, length: DraftLength, backend: str = "auto",
                 check_logits: bool = True):  # fmt: skip
        super().__init__(length, backend, check_logits)
        self.proposer = proposer
        self.caches = proposer.caches

    def step(self, target: CachedModel, batch: RowBatch, sampler: Sampler) -> StepResult:
        """Draft, score and verify one tree per row. Returns out [R, D+1], num_accepted [R], each row's tree depth
        [R], its number of draft nodes [R] and the kept entries of the target and the draft."""
        tokens, mask = batch.tokens, batch.mask
        width = tokens.shape[1]
        sources = ["draft"] * tokens.shape[0]
        unfed = self._unfed(target)
        tree = self.proposer.propose(tokens, mask, self._draft_length(batch, sources), sampler)
        if target.cached < width - 1:  # first step only: the target has not seen the prompt; prefill it, no root
            target.forward(tokens[:, :-1], mask[:, :-1])
        tm = tree_mask(tree.parents, mask[:, :-1], target.dtype, backend=self.backend)
        logits = self._checked(target.forward_tree(tree.tokens, tm.mask, tm.position_ids), batch)  # [R, N, V]
        rows, num_nodes, _ = logits.shape
        uniforms, noise = sampler.verify_randomness(num_nodes, logits)
        out, num_accepted, accept_index = verify_tree(
            logits, tree.tokens, tree.parents, tree.draft_probs, sampler.verify_temperature, sampler.top_k,
            sampler.top_p, uniforms, noise, max_depth=tree.depth, backend=self.backend,
        )  # fmt: skip
        path = accept_index.clamp_min(0)
        # the target scored every node: node i sits at cache position width - 1 + i
        target_kept = KeptPositions(width, num_accepted, width - 1 + path)
        draft_kept = self.proposer.nodes.kept(width, tree, path, num_accepted)
        nodes = torch.full((rows,), num_nodes - 1)
        kept = [(target, target_kept), (self.proposer.nodes.runner, draft_kept)]
        return StepResult(out, num_accepted, tm.depth.amax(dim=-1), nodes, kept, sources, self._read_prompt(unfed))
