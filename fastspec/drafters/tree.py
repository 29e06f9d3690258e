"""`TreeBuilder`: drafts a static or dynamic token tree with any `TreeDrafter` (a draft model or a draft head).

The drafter reads the buffer up to the root (`TreeDrafter.tree_root`), then scores one tree level per forward
(`TreeDrafter.score_nodes`): only the nodes that need children are scored. `DraftTree.draft_pos` records where a
draft model's cache holds each scored node (`fastspec.layout.BufferLayout.node_positions`; -1: never scored, e.g.
leaves), so its cache is compacted to the accepted path.

Children of a node:
- static trees, greedy: the draft's rank-r token for a node of rank r (deterministic: `draft_probs` None);
- static trees, sampling: drawn i.i.d. from the draft distribution q (after temperature / top-k / top-p), which
  is returned as `draft_probs[:, parent]` for SpecInfer verification;
- dynamic trees (EAGLE-2), greedy: the draft's top-k tokens of the candidates with the highest cumulative draft
  probability at `DynamicTree.rank_temperature` (deterministic, `draft_probs` None);
- dynamic trees, sampling: the static tree of the same node budget and depth (`default_choices`), children drawn
  i.i.d. from q. Deterministic top-k children are lossless too, but a row then accepts only when the target's
  sample falls among them, where an i.i.d. draw from a q close to p is accepted with probability about
  1 - TV(p, q). And what EAGLE-2 ranks by, the draft's confidence, does not predict that acceptance, nor may a
  lossless tree keep a sampled node for its own value (measurements: docs/design.md).
"""

from __future__ import annotations

import functools

import torch

from fastspec.drafters.base import DraftTree, TreeDrafter
from fastspec.layout import BufferLayout
from fastspec.sampling import Sampler
from fastspec.tree import DynamicTree, StaticTree, default_choices, select_nodes

__all__ = ["TreeBuilder"]


class TreeBuilder:
    """Drafts a static or dynamic token tree (`tree`) with a tree drafter (module docstring)."""

    def __init__(self, drafter: TreeDrafter, tree: StaticTree | DynamicTree):
        self.drafter = drafter
        self.tree = tree
        # the static tree drafted: `tree` itself, or for a dynamic tree the one its sampling rows draft (see the
        # module docstring)
        self.static_tree = tree
        if isinstance(tree, DynamicTree):
            self.static_tree = StaticTree.from_choices(default_choices(tree.num_nodes, tree.depth))
        self.steps = 0

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, depth: int, sampler: Sampler) -> DraftTree:
        """Draft a tree of depth <= `depth` after the buffer.

        Args:
            tokens: [R, S] right-aligned token buffer (its last column is the root); mask: [R, S] attention mask.
            depth: the deepest level to draft (0: the root alone; a head drafts nothing before the target ran).
            sampler: the call's sampling settings and random streams.
        """
        root_logits, state = self.drafter.tree_root(tokens, mask, self.steps)
        self.steps += 1
        depth = depth if root_logits is not None else 0
        score_nodes = functools.partial(self.drafter.score_nodes, mask=mask, state=state, step=self.steps)
        if isinstance(self.tree, DynamicTree) and not sampler.do_sample:
            return self._dynamic(tokens, min(depth, self.tree.depth), root_logits, score_nodes)
        return self._static(tokens, self.static_tree.truncated(depth), root_logits, sampler, score_nodes)

    def _static(self, tokens, tree: StaticTree, root_logits, sampler, score_nodes) -> DraftTree:
        rows, width = tokens.shape
        n = len(tree.parents)
        has_children = [False] * n
        for parent in tree.parents[1:]:
            has_children[parent] = True
        node_tokens = tokens.new_zeros(rows, n)
        node_tokens[:, 0] = tokens[:, -1]
        draft_probs = None
        if sampler.do_sample and n > 1:
            draft_probs = root_logits.new_zeros(rows, n, root_logits.shape[-1], dtype=torch.float32)
        logits_of = {0: root_logits}  # draft logits at each scored node
        scored = {0: 0}  # node -> index among the scored nodes (root 0)
        scored_parents = [-1]
        for level in range(1, tree.depth + 1):
            nodes = [i for i in range(n) if tree.depths[i] == level]
            if sampler.do_sample:  # i.i.d. children of each parent, one random stream per node
                for i in nodes:
                    node_tokens[:, i], draft_probs[:, tree.parents[i]] = sampler.draft(logits_of[tree.parents[i]], i)
            else:  # the rank-r child is the draft's r-th most likely token
                parents = sorted({tree.parents[i] for i in nodes})
                width_k = max(tree.ranks[i] for i in nodes) + 1
                top = torch.stack([logits_of[p] for p in parents], dim=1).topk(width_k, dim=-1).indices
                for i in nodes:
                    node_tokens[:, i] = top[:, parents.index(tree.parents[i]), tree.ranks[i]]
            # score the level's nodes that have children: their logits give the next level
            feed = [i for i in nodes if has_children[i]]
            if not feed:
                continue
            for i in feed:
                scored[i] = len(scored_parents)
                scored_parents.append(scored[tree.parents[i]])
            parents_t = torch.tensor(scored_parents, device=tokens.device).expand(rows, -1)
            logits = score_nodes(node_tokens[:, feed], parents_t)
            for a, i in enumerate(feed):
                logits_of[i] = logits[:, a]
        scored_index = torch.tensor([scored.get(i, -1) for i in range(n)], device=tokens.device)
        return DraftTree(
            node_tokens,
            torch.tensor(tree.parents, device=tokens.device).expand(rows, -1),
            draft_probs,
            BufferLayout(width).node_positions(scored_index).expand(rows, -1),
            tree.depth,
        )

    def _dynamic(self, tokens, depth: int, root_logits, score_nodes) -> DraftTree:
        rows, width = tokens.shape
        device = tokens.device
        layout = BufferLayout(width)
        if depth == 0:
            root = torch.full((rows, 1), -1, device=device)
            return DraftTree(tokens[:, -1:], root, None, layout.node_positions(root + 1), 0)
        k = min(self.tree.top_k, root_logits.shape[-1])

        def log_probs(logits):
            return torch.log_softmax(logits.float() / self.tree.rank_temperature, dim=-1)

        # candidates in creation order: token, cumulative log-probability, parent candidate, scored index
        score, cand_tokens = log_probs(root_logits).topk(k, dim=-1)  # depth 1: the root's top-k
        cand_parent = torch.full((rows, k), -1, device=device)
        cand_scored = torch.full((rows, k), -1, device=device)
        frontier = torch.arange(k, device=device).expand(rows, -1)  # [R, k] candidates to expand next
        scored_parents = torch.full((rows, 1), -1, device=device)
        for _ in range(1, depth):
            # score the frontier; its parents (root or an earlier frontier) are scored already
            first = scored_parents.shape[1]
            parent = cand_parent.gather(1, frontier)
            parent_scored = torch.where(parent < 0, 0, cand_scored.gather(1, parent.clamp_min(0)))
            scored_parents = torch.cat([scored_parents, parent_scored], dim=1)
            new_index = torch.arange(first, first + k, device=device).expand(rows, -1)
            cand_scored = cand_scored.scatter(1, frontier, new_index)
            logits = score_nodes(cand_tokens.gather(1, frontier), scored_parents)  # [R, k, V]
            # each frontier node's top-k children; the best k of those k*k form the next frontier
            child_score, child_tokens = log_probs(logits).topk(k, dim=-1)  # [R, k, k]
            child_score = (score.gather(1, frontier)[:, :, None] + child_score).flatten(1)
            count = score.shape[1]
            score = torch.cat([score, child_score], dim=1)
            cand_tokens = torch.cat([cand_tokens, child_tokens.flatten(1)], dim=1)
            cand_parent = torch.cat([cand_parent, frontier.repeat_interleave(k, dim=1)], dim=1)
            cand_scored = torch.cat([cand_scored, torch.full_like(child_score, -1, dtype=torch.long)], dim=1)
            frontier = count + child_score.topk(k, dim=-1).indices

        # the tree: the num_nodes candidates of highest cumulative probability (closed under parents)
        keep, parents = select_nodes(score, cand_parent, min(self.tree.num_nodes, score.shape[1]))
        pos = cand_scored.gather(1, keep)
        root = torch.full((rows, 1), -1, device=device)
        return DraftTree(
            torch.cat([tokens[:, -1:], cand_tokens.gather(1, keep)], dim=1),
            torch.cat([root, parents], dim=1),
            None,
            layout.node_positions(torch.cat([root + 1, pos], dim=1)),
            depth,
        )
