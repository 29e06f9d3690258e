"""The cache-column layout: which buffer columns each model's cache holds around a step, named once.

The words (buffer, root, feature columns, kept entries) are defined in docs/glossary.md; here are the column rules
behind them, for a buffer `tokens [R, S]` whose root is column S - 1. Before a step:
- the target's cache holds columns [0, S - 1) (after the first step, which prefills them);
- a draft model's cache holds a prefix of [0, S) (it feeds what it misses at its next forward);
- a draft head's cache holds a prefix of the *feature columns* [0, S - 1): head position p reads the target's
  feature of column p and the token of column p + 1, so it can read only columns whose feature the target has
  computed. Its last entry, at column S - 2, is where its drafts start (`HeadDrafter`).

A step then scores, after the target's cached columns, either the root and a chain of K drafts (cache positions
S - 1, S, ..., S - 1 + K) or a token tree whose node i (the root is node 0) sits at position S - 1 + i. A draft
model scoring a tree puts its scored node j at position S - 1 + j the same way; a head, whose root is column
S - 2, at S - 2 + j. After verification every cache keeps a `KeptPositions`: the buffer (or for a head the
feature columns), then the row's accepted entries, which `RowBatch.commit` applies after appending the accepted
tokens to the buffer.

"Holds columns [0, c)" means, per layer kind (`fastspec.cache_kinds`): an attention layer (any window) holds keys and
values of each of those columns, an indexed-attention layer also its indexer's keys; a recurrent / conv-state layer
(linear attention, SSM) holds no columns but the state after column c - 1 of each row, and, between two commits, the
states after every column fed since the last one (`fastspec.state_cache`), from which a commit gives each row the
state after its newest kept column. A recurrent layer can keep only a contiguous run of fed columns (a chain's
accepted drafts, realigned): never a tree path.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["BufferLayout", "KeptPositions"]


class KeptPositions(NamedTuple):
    """The cache entries each row keeps after a verification: positions [0, prefix_len), then its accepted ones.

    prefix_len: leading positions every row keeps (the buffer before the step's new entries).
    num_kept: [R] accepted entries each row keeps after the prefix.
    positions: [R, M] cache positions of those entries in path order (a tree's accepted nodes; padding ignored), or
        None when they are the contiguous positions prefix_len, prefix_len + 1, ... (a chain's accepted drafts).
    """

    prefix_len: int
    num_kept: torch.Tensor
    positions: torch.Tensor | None = None


class BufferLayout:
    """The column rules of the module docstring for a buffer of `width` S columns."""

    def __init__(self, width: int):
        self.width = width
        self.root = width - 1  # the root's column, and the target's cache length before it scores a step
        self.feature_end = width - 1  # columns [0, feature_end) have the target's features after the prefill
        self.head_root = width - 2  # the head's position of the root: its last feature column

    def before_root(self, mask: torch.Tensor) -> torch.Tensor:
        """The attention mask [R, S - 1] of the columns a model holds before the root (a tree's prefix)."""
        return mask[:, : self.root]

    def before_head_root(self, mask: torch.Tensor) -> torch.Tensor:
        """The attention mask [R, S - 2] of the columns a head holds before its root (its tree's prefix)."""
        return mask[:, : self.head_root]

    def node_positions(self, index: torch.Tensor) -> torch.Tensor:
        """Cache positions of tree nodes (or a draft's scored nodes) `index` (root = 0) in a model whose root is
        the buffer's last column; -1 entries (never scored) stay -1."""
        return torch.where(index >= 0, self.root + index, -1)

    def keep_buffer(self, num_accepted: torch.Tensor, positions: torch.Tensor | None = None) -> KeptPositions:
        """The buffer [0, S) and each row's `num_accepted` [R] accepted entries: the chain drafts after the root
        (`positions` None), or the tree entries at `positions` [R, M] in path order."""
        return KeptPositions(self.width, num_accepted, positions)

    def keep_features(self, num_accepted: torch.Tensor) -> KeptPositions:
        """The feature columns [0, S - 1) and nothing drafted (a head recomputes drafted positions from the
        target's features at the next step)."""
        return KeptPositions(self.feature_end, torch.zeros_like(num_accepted))
