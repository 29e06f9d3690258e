"""Token-tree shapes for tree speculation: static trees from "choices" and dynamic EAGLE-2 trees.

A tree of N nodes is stored as parent indices in topological order (parent index < child index), nodes sorted
by depth; node 0 is the root (the words: docs/glossary.md), with parent -1.

- Static trees (Medusa, EAGLE-1): a list of paths of child ranks, e.g. [[0], [1], [0, 0], [0, 1], [1, 0]]: path
  [0, 1] is the second-ranked child of the top-ranked child of the root. Greedy drafting takes rank r = the
  draft's r-th most likely token; sampled drafting draws each node's children i.i.d. from the draft (SpecInfer).
  Paths are sorted by (length, lexicographic), as Medusa's `generate_medusa_buffers` does. Named defaults
  ("small", "medium", "large": 16, 32, 64 draft nodes) are built for depth `num_draft_tokens` by best-first
  search under a prior that the rank-r child is accepted with probability RANK_PRIOR[r].
- Dynamic trees (EAGLE-2, Li et al. 2024, arXiv 2406.16858): at each depth the draft expands the top_k
  candidates with the highest cumulative draft probability by its top_k tokens; after the last depth the
  num_nodes candidates with the highest cumulative probability form the tree (`select_nodes`). The probabilities
  are the draft's at `rank_temperature` (0.25 by default, EAGLE-2 uses 1): a draft trained on the target's
  distribution is calibrated for sampling, and a greedy verifier accepts a token when it is the target's argmax,
  which a top-1 draft token is far more often than its probability says; sharpening spends the node budget on
  depth (the measurements, `bench/tree_shapes.py`: docs/results.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

import torch

__all__ = ["NAMED_TREES", "DynamicTree", "StaticTree", "default_choices", "resolve_tree", "select_nodes"]

# prior acceptance of the rank-r child given its parent was accepted (decays geometrically past the table)
RANK_PRIOR = (0.6, 0.15, 0.07, 0.04, 0.03, 0.02)
NAMED_TREES = {"small": 16, "medium": 32, "large": 64}  # draft nodes (root excluded)


@dataclass(frozen=True)
class StaticTree:
    """A static tree: `parents`, `ranks` (child rank, root -1) and `depths` of its nodes, root first."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...]

    @classmethod
    def from_choices(cls, choices) -> StaticTree:
        """Build from paths of child ranks; raises ValueError (naming `tree`) on a malformed list."""
        paths = []
        for path in choices:
            if not isinstance(path, list | tuple) or not path:
                raise ValueError(f"tree: every path must be a non-empty list of child ranks, got {path!r}")
            if not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in path):
                raise ValueError(f"tree: child ranks must be ints >= 0, got {path!r}")
            paths.append(tuple(path))
        if not paths:
            raise ValueError("tree: the list of paths is empty (use tree=None for chain speculation)")
        if len(set(paths)) != len(paths):
            raise ValueError("tree: a path appears twice")
        known = set(paths)
        for path in paths:
            if len(path) > 1 and path[:-1] not in known:
                raise ValueError(f"tree: path {list(path)} has no parent path {list(path[:-1])}")
        paths.sort(key=lambda p: (len(p), p))
        index = {(): 0}
        parents, ranks, depths = [-1], [-1], [0]
        for i, path in enumerate(paths, start=1):
            index[path] = i
            parents.append(index[path[:-1]])
            ranks.append(path[-1])
            depths.append(len(path))
        return cls(tuple(parents), tuple(ranks), tuple(depths))

    @property
    def depth(self) -> int:
        return self.depths[-1]

    def truncated(self, depth: int) -> StaticTree:
        """The nodes of depth <= `depth` (a prefix of the node list, since nodes are sorted by depth)."""
        n = sum(d <= depth for d in self.depths)
        return StaticTree(self.parents[:n], self.ranks[:n], self.depths[:n])


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2 dynamic tree: expand `top_k` candidates per depth by `top_k` tokens each, keep `num_nodes` drafts,
    ranking candidates by their cumulative draft log-probability at `rank_temperature` (greedy rows; see the
    module docstring). `depth` None takes `num_draft_tokens` of the generate call.
    """

    top_k: int = 4
    num_nodes: int = 32
    depth: int | None = None
    rank_temperature: float = 0.25

    def __post_init__(self):
        for name in ("top_k", "num_nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"tree: DynamicTree.{name} must be an int >= 1, got {value!r}")
        if self.depth is not None and (isinstance(self.depth, bool) or not isinstance(self.depth, int)
                                       or self.depth < 1):  # fmt: skip
            raise ValueError(f"tree: DynamicTree.depth must be an int >= 1 or None, got {self.depth!r}")
        if (
            isinstance(self.rank_temperature, bool)
            or not isinstance(self.rank_temperature, int | float)
            or not (0 < self.rank_temperature < float("inf"))
        ):
            raise ValueError(f"tree: DynamicTree.rank_temperature must be a number > 0, got {self.rank_temperature!r}")


def default_choices(num_nodes: int, depth: int) -> list[list[int]]:
    """The `num_nodes` paths of depth <= `depth` with the highest prior (product of RANK_PRIOR over the path).

    Best-first: a path's first child and next sibling have a lower prior than the path, so the result is closed
    under parents and earlier siblings.
    """

    def prior(rank: int) -> float:
        return RANK_PRIOR[rank] if rank < len(RANK_PRIOR) else RANK_PRIOR[-1] * 0.5 ** (rank - len(RANK_PRIOR) + 1)

    heap = [(-prior(0), (0,))]
    chosen = []
    while heap and len(chosen) < num_nodes:
        neg, path = heapq.heappop(heap)
        chosen.append(list(path))
        if len(path) < depth:
            heapq.heappush(heap, (neg * prior(0), path + (0,)))
        sibling = path[:-1] + (path[-1] + 1,)
        heapq.heappush(heap, (neg / prior(path[-1]) * prior(path[-1] + 1), sibling))
    return chosen


def resolve_tree(tree, num_draft_tokens: int) -> StaticTree | DynamicTree:
    """Turn the `tree` argument of `generate` into a StaticTree or a DynamicTree with its depth set.

    Accepts "dynamic", a name in NAMED_TREES (depth `num_draft_tokens`), a DynamicTree, or a list of paths of
    child ranks (its own depth).
    """
    if isinstance(tree, str):
        if tree == "dynamic":
            return DynamicTree(depth=num_draft_tokens)
        if tree in NAMED_TREES:
            return StaticTree.from_choices(default_choices(NAMED_TREES[tree], num_draft_tokens))
        raise ValueError(f"tree must be 'dynamic', one of {sorted(NAMED_TREES)} or a list of paths, got {tree!r}")
    if isinstance(tree, DynamicTree):
        return tree if tree.depth is not None else replace(tree, depth=num_draft_tokens)
    if isinstance(tree, list | tuple):
        return StaticTree.from_choices(tree)
    raise ValueError(f"tree must be None, 'dynamic', a tree name, a DynamicTree or a list of paths, got {tree!r}")


def select_nodes(scores: torch.Tensor, parents: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep the `num_nodes` candidates with the highest scores, as a tree (EAGLE-2's final selection).

    Args:
        scores: [R, C] cumulative draft log-probabilities of the candidates, in creation order (parents first).
        parents: [R, C] candidate index of each candidate's parent (-1: the root).
        num_nodes: drafts to keep (<= C).

    Returns:
        keep [R, M] candidate indices in creation order (M = num_nodes), tree_parents [R, M] the parent of each
        kept candidate as a node index of the tree (root 0, kept candidate m is node m + 1).
        A child never scores above its parent and a stable sort breaks ties by creation order, so the parent of
        a kept candidate is kept: the tree is closed and topologically ordered.
    """
    rows, count = scores.shape
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :num_nodes]
    keep = torch.sort(order, dim=1).values
    node = torch.full((rows, count), -1, dtype=torch.long, device=scores.device)
    node.scatter_(1, keep, torch.arange(1, num_nodes + 1, device=scores.device).expand(rows, -1))
    parent = parents.gather(1, keep)
    tree_parents = torch.where(parent < 0, 0, node.gather(1, parent.clamp_min(0)))
    return keep, tree_parents
