"""Speculators: one step of speculative (or normal) decoding over a `RowBatch`, as one protocol.

A `Speculator` has two calls, and keeps nothing between them but its drafter's caches and its draft-length policy:
- `step(target, batch, sampler) -> StepResult`: choose the draft length, draft, score the buffer's new columns and
  the drafts in one target forward, verify (fused Triton kernel on CUDA, eager reference otherwise), and say which
  cache entries each model keeps (`fastspec.layout.KeptPositions`); `RowBatch.commit` applies them;
- `commit(step, outcome, seconds)`: feed the draft-length policy what the committed step measured.

`ChainSpeculator` drafts a chain of K tokens with any `fastspec.drafters.Drafter`, or none (normal decoding,
K = 0). `TreeSpeculator` drafts a token tree with a `TreeDrafter` (`fastspec.drafters.tree.TreeBuilder`), scores
all its nodes in one target forward under a tree-attention mask and verifies it. The column rules are
`fastspec.layout`: the target's cache covers the columns before the root (the first step prefills them), so the
tree forward feeds exactly the N nodes with the additive mask of `tree_mask(parents, mask before the root)` and
position ids prefix length + depth; node i's logits are the target distribution of its children. The target keeps
the buffer, then the accepted nodes in path order; the drafter says what its caches keep.

Both run the call's logits processors (`Sampler.process`, `fastspec.processors`) on the target's logits at every
scored position, each with its own prefix (`fastspec.prefixes.PositionPrefixes`: the row's history, then the drafts
on the path to it), before verification, and hand `RowBatch` the verified logits, the raw ones and the position each
emitted token was chosen at (for `scores` / `logits` outputs and stopping criteria).

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
from fastspec.drafters import Drafter, Drafts, TreeBuilder, TreeDrafter
from fastspec.layout import BufferLayout
from fastspec.prefixes import PositionPrefixes
from fastspec.runner import BufferCache, CachedModel
from fastspec.sampling import Sampler
from fastspec.tree import DynamicTree, StaticTree
from fastspec.verify import tree_mask, verify_chain, verify_tree

__all__ = ["ChainSpeculator", "Speculator", "TreeSpeculator"]

DraftLength = FixedDraftLength | DraftLengthController


class Speculator(Protocol):
    """One speculation step over the batch, and the feedback of its commit."""

    caches: list[BufferCache]  # the drafter's caches, kept in step with the buffer by `RowBatch`
    timed: bool  # whether `commit` learns from step times (adaptive draft length)

    def step(self, target: CachedModel, batch: RowBatch, sampler: Sampler) -> StepResult: ...

    def commit(self, step: StepResult, outcome: StepOutcome, seconds: float) -> None: ...


class _SpeculatorBase:
    """What both speculators share: the draft-length policy, the verify backend and the finite-logits check."""

    def __init__(self, drafter: Drafter | None, length: DraftLength, backend: str, check_logits: bool):
        self.drafter = drafter
        self.caches = [] if drafter is None else list(drafter.caches)
        self.length = length
        self.timed = isinstance(length, DraftLengthController)
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


class ChainSpeculator(_SpeculatorBase):
    """Chain speculation: `drafter` drafts up to K tokens per row (None: normal decoding, K = 0), the target scores
    the buffer's uncached columns and the drafts in one forward, `verify_chain` accepts a prefix per row."""

    def __init__(self, drafter: Drafter | None, length: DraftLength, backend: str = "auto",
                 check_logits: bool = True):  # fmt: skip
        super().__init__(drafter, length, backend, check_logits)

    def step(self, target: CachedModel, batch: RowBatch, sampler: Sampler) -> StepResult:
        """Draft, score and verify one chain per row. Returns out [R, K+1], num_accepted [R], num_draft [R] or None
        (every row drafted K) and the kept entries: the buffer, then each row's accepted drafts."""
        tokens, mask = batch.tokens, batch.mask
        layout = BufferLayout(tokens.shape[1])
        unfed = self._unfed(target)
        drafts, sources = Drafts(tokens.new_empty(tokens.shape[0], 0), None, None), None
        if self.drafter is not None:
            plan = self.drafter.plan(tokens, mask, self._draft_cap(batch))
            sources = plan.sources
            k = self._draft_length(batch, sources)
            if k > 0:
                drafts = self.drafter.propose(tokens, mask, plan, k, sampler)
        draft_tokens, num_draft = drafts.tokens, drafts.num_draft
        if num_draft is not None:  # ragged proposal: drop columns no row uses (all of them if nothing matched)
            k = int(num_draft.max())
            draft_tokens, num_draft = draft_tokens[:, :k], num_draft.clamp(max=k)
        k = draft_tokens.shape[1]
        raw = self._checked(target.forward(tokens, mask, extra=draft_tokens, num_logits=k + 1), batch)
        device = raw.device  # verify where the logits are (a device-mapped target's last device); no-op moves else

        def prefixes() -> PositionPrefixes:
            history, lengths = batch.prefix_history(sampler.rows, sampler.counter)
            return PositionPrefixes.chain(history.to(device), lengths.to(device), draft_tokens.to(device))

        logits = sampler.process(raw, prefixes)
        uniforms, noise = sampler.verify_randomness(k, logits)
        kernel = sampler.verify_sampling()
        out, num_accepted = verify_chain(
            logits, draft_tokens.to(device), _to(drafts.probs, device), _to(num_draft, device),
            kernel.temperature, kernel.top_k, kernel.top_p, uniforms, noise, min_p=kernel.min_p, backend=self.backend,
        )  # fmt: skip
        num_accepted = num_accepted.to(tokens.device)
        kept = [(target, layout.keep_buffer(num_accepted))]
        if self.drafter is not None:
            kept += self.drafter.kept(layout, num_accepted)
        return StepResult(out, num_accepted, num_draft, None, kept, sources, self._read_prompt(unfed), logits, raw)


class TreeSpeculator(_SpeculatorBase):
    """Tree speculation with a tree drafter (module docstring): static or dynamic trees, depth from `length`."""

    def __init__(self, drafter: TreeDrafter, tree: StaticTree | DynamicTree, length: DraftLength,
                 backend: str = "auto", check_logits: bool = True):  # fmt: skip
        super().__init__(drafter, length, backend, check_logits)
        self.builder = TreeBuilder(drafter, tree)

    def step(self, target: CachedModel, batch: RowBatch, sampler: Sampler) -> StepResult:
        """Draft, score and verify one tree per row. Returns out [R, D+1], num_accepted [R], each row's tree depth
        [R], its number of draft nodes [R] and the kept entries of the target and the drafter."""
        tokens, mask = batch.tokens, batch.mask
        layout = BufferLayout(tokens.shape[1])
        sources = ["draft"] * tokens.shape[0]
        unfed = self._unfed(target)
        tree = self.builder.propose(tokens, mask, self._draft_length(batch, sources), sampler)
        if target.cached < layout.root:  # first step only: the target has not seen the prompt; prefill it, no root
            target.forward(tokens[:, : layout.root], layout.before_root(mask))
        tm = tree_mask(tree.parents, layout.before_root(mask), target.dtype, backend=self.backend)
        raw = self._checked(target.forward_tree(tree.tokens, tm.mask, tm.position_ids), batch)  # [R, N, V]
        rows, num_nodes, _ = raw.shape
        device = raw.device

        def prefixes() -> PositionPrefixes:
            history, lengths = batch.prefix_history(sampler.rows, sampler.counter)
            ancestors = tm.mask[:, 0, :, -num_nodes:].to(device) == 0  # [R, N, N] ancestor-or-self
            return PositionPrefixes.tree(history.to(device), lengths.to(device), tree.tokens.to(device), ancestors,
                                         tm.depth.to(device))  # fmt: skip

        logits = sampler.process(raw, prefixes)
        uniforms, noise = sampler.verify_randomness(num_nodes, logits)
        kernel = sampler.verify_sampling()
        out, num_accepted, accept_index = verify_tree(
            logits, tree.tokens.to(device), tree.parents.to(device), _to(tree.draft_probs, device),
            kernel.temperature, kernel.top_k, kernel.top_p, uniforms, noise, max_depth=tree.depth, min_p=kernel.min_p,
            backend=self.backend,
        )  # fmt: skip
        path = accept_index.clamp_min(0).to(tokens.device)
        num_accepted = num_accepted.to(tokens.device)
        # the target scored every node after the columns before the root
        kept = [(target, layout.keep_buffer(num_accepted, layout.node_positions(path)))]
        kept += self.drafter.tree_kept(layout, tree, path, num_accepted)
        nodes = torch.full((rows,), num_nodes - 1)
        return StepResult(out, num_accepted, tm.depth.amax(dim=-1), nodes, kept, sources, self._read_prompt(unfed),
                          logits, raw, accept_index)  # fmt: skip


def _to(value: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if value is None else value.to(device)
