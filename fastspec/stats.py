"""`SpecStats`: what one speculative (or normal) decoding call did, counted per target forward."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SpecStats"]


@dataclass
class SpecStats:
    """Counters of one `fastspec.generate` call.

    A *step* is one target forward over the drafts of every unfinished row (normal decoding: one token).
    Per-row counts are summed over rows, so with a batch they are totals, not averages.

    Attributes:
        steps: target forwards after the prefill.
        drafted: draft tokens proposed (summed over rows and steps; tree nodes with tree speculation).
        accepted: draft tokens accepted.
        emitted: tokens appended to the outputs (accepted + recovered/bonus, cut at EOS and max_new_tokens).
        row_steps: row-steps (a row taking part in a target forward counts one).
        accepted_per_position: accepted_per_position[j] counts rows whose draft token j (tree: the node at
            depth j + 1 of the accepted path) was accepted.
        drafted_per_position: drafted_per_position[j] counts rows that had a draft token j (tree: depth >= j + 1).
        wall_time: seconds spent in the call (prefill included).
    """

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    row_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    wall_time: float = 0.0

    def record(
        self,
        num_draft: torch.Tensor,
        num_accepted: torch.Tensor,
        num_emitted: int,
        num_nodes: torch.Tensor | None = None,
    ) -> None:
        """Add one step: num_draft [R] and num_accepted [R] for the R rows that took part (CPU tensors).

        Tree speculation passes each row's tree depth as num_draft (position j is depth j + 1, so the per-position
        counts are per depth) and its number of draft nodes as num_nodes [R] (counted in `drafted`).
        """
        self.steps += 1
        self.row_steps += int(num_draft.numel())
        self.drafted += int((num_draft if num_nodes is None else num_nodes).sum())
        self.accepted += int(num_accepted.sum())
        self.emitted += num_emitted
        width = int(num_draft.max()) if num_draft.numel() else 0
        if width > len(self.drafted_per_position):
            grow = width - len(self.drafted_per_position)
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for j in range(width):
            self.drafted_per_position[j] += int((num_draft > j).sum())
            self.accepted_per_position[j] += int((num_accepted > j).sum())

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens (0.0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per row per target forward, bonus included (normal decoding: 1.0)."""
        return (self.accepted + self.row_steps) / self.row_steps if self.row_steps else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft token j accepted | it was drafted) for each position j."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=True)]

    @property
    def tokens_per_second(self) -> float:
        """Emitted tokens per second of wall time."""
        return self.emitted / self.wall_time if self.wall_time > 0 else 0.0
