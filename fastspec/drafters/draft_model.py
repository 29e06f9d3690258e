"""`DraftModelDrafter`: a small HF causal LM with the target's tokenizer drafts chains and trees.

Chains: K autoregressive draft forwards per step, the first also feeding every buffer column the draft has not
seen (1 or 2 after a step). Trees: one draft forward per tree level under the tree-attention mask of
`fastspec.kernels.tree_mask`, so every node sees the prefix, its ancestors and itself. The draft's cache is laid
out like the buffer (`fastspec.layout`): the buffer, then the accepted drafts it has fed (chains) or the nodes it
scored, level by level (trees; `DraftTree.draft_pos` records where, so the cache is compacted to the accepted path).
"""

from __future__ import annotations

import torch

from fastspec.checks import check_finite_logits, vocab_size
from fastspec.drafters.base import DraftPlan, Drafts, DraftSetup, DraftTree, TreeDrafter
from fastspec.layout import BufferLayout
from fastspec.runner import CachedModel
from fastspec.sampling import Sampler
from fastspec.verify import tree_mask

__all__ = ["DraftModelDrafter", "DraftVocabulary"]


class DraftVocabulary:
    """Maps between a draft model's vocabulary and the target's (they differ only by embedding padding)."""

    def __init__(self, model: torch.nn.Module, target_vocab: int, check_logits: bool = True):
        self.target_vocab = target_vocab
        self.draft_vocab = vocab_size(model)
        eos = getattr(model.config.get_text_config(), "eos_token_id", None)
        # target ids the draft has no embedding for (padded target vocabulary) are fed to it as this id
        self.unknown_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
        self.check_logits = check_logits

    def draft_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """Target token ids -> ids the draft can embed."""
        if self.draft_vocab >= self.target_vocab:
            return tokens
        return tokens.masked_fill(tokens >= self.draft_vocab, self.unknown_id)

    def target_logits(self, logits: torch.Tensor, step: int) -> torch.Tensor:
        """Draft logits [..., V_draft] -> [..., V_target]: ids the target lacks are dropped, ids the draft lacks
        get -inf (q = 0), so q is exactly the distribution the draft token was drawn from. Raises
        NonFiniteLogitsError on NaN/inf when checking."""
        extra = self.target_vocab - logits.shape[-1]
        if extra > 0:
            logits = torch.nn.functional.pad(logits, (0, extra), value=float("-inf"))
        logits = logits[..., : self.target_vocab]
        if self.check_logits:
            check_finite_logits(logits, "draft", step)
        return logits


class DraftModelDrafter(TreeDrafter):
    """Drafts with an independent draft model that keeps its own KV cache in step with the buffer.

    Args:
        model: HF causal LM whose token ids mean the target's (`fastspec.checks.check_shared_vocabulary`).
        setup: the call's `DraftSetup` (vocabulary, cache capacity, compile, logits check, kernel backend).
    """

    def __init__(self, model: torch.nn.Module, setup: DraftSetup):
        self.runner = CachedModel(model, setup.capacity, "draft" if setup.compile else None)
        self.caches = [self.runner]
        self.vocab = DraftVocabulary(model, setup.target_vocab, setup.check_logits)
        self.backend = setup.backend
        self.steps = 0  # draft calls so far, named in NonFiniteLogitsError

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler: Sampler) -> Drafts:  # fmt: skip
        """K draft forwards (`Drafter.propose`). Returns tokens [R, K], probs [R, K, V] fp32 (None for greedy
        drafts), num_draft None (every row has K)."""
        tokens = self.vocab.draft_ids(tokens)
        drafts = tokens.new_empty(tokens.shape[0], 0)
        probs = []
        for position in range(num_tokens):
            # the first call also feeds every buffer column the draft has not seen (1 or 2 after a step)
            logits = self.vocab.target_logits(self.runner.forward(tokens, mask, extra=drafts)[:, -1], self.steps)
            token, q = sampler.draft(logits, position)
            drafts = torch.cat([drafts, token[:, None]], dim=1)
            probs.append(q)
        self.steps += 1
        return Drafts(drafts, None if probs[0] is None else torch.stack(probs, dim=1), None)

    def kept(self, layout: BufferLayout, num_accepted: torch.Tensor):
        """The buffer and each row's accepted drafts (those it has fed are cached already; the rest it feeds at
        its next forward)."""
        return [(self.runner, layout.keep_buffer(num_accepted))]

    def tree_root(self, tokens: torch.Tensor, mask: torch.Tensor, step: int):
        """Feed every buffer column the draft has not seen, the root included: (the root's children logits [R, V],
        no state)."""
        return self.vocab.target_logits(self.runner.forward(self.vocab.draft_ids(tokens), mask)[:, -1], step), None

    def score_nodes(self, new_tokens, scored_parents, mask, state, step: int) -> torch.Tensor:
        """Draft logits [R, L, V] of L new nodes after the scored ones (`TreeDrafter.score_nodes`)."""
        layout = BufferLayout(mask.shape[1])
        tm = tree_mask(scored_parents, layout.before_root(mask), self.runner.dtype, backend=self.backend)
        num = new_tokens.shape[1]
        logits = self.runner.forward_tree(
            self.vocab.draft_ids(new_tokens), tm.mask[:, :, -num:], tm.position_ids[:, -num:]
        )
        return self.vocab.target_logits(logits, step)

    def tree_kept(self, layout: BufferLayout, tree: DraftTree, path: torch.Tensor, num_accepted: torch.Tensor):
        """The buffer, then the accepted nodes the draft scored, up to the first it did not score."""
        pos = tree.draft_pos.gather(1, path)
        on_path = torch.arange(path.shape[1], device=pos.device)[None, :] < num_accepted[:, None]
        scored = ((pos >= 0) & on_path).long().cumprod(dim=1).sum(dim=1)
        return [(self.runner, layout.keep_buffer(scored, pos))]
