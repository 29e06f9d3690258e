"""Chain draft sources: a small draft model proposing K tokens, n-gram prompt lookup, and both combined.

A proposer answers two calls per step, with values passed explicitly between them:
- `plan(tokens, mask, max_tokens) -> DraftPlan`: where each row's drafts come from ("draft" or "lookup"), decided
  before K is chosen, since adaptive K prices a step by its sources; a lookup is done here, once, for max_tokens;
- `propose(tokens, mask, plan, K, sampler) -> Drafts`: `tokens [R, K]`, `probs [R, K, V]` and `num_draft [R]`
  (or None: every row has K). `probs` is the exact distribution q each token was drawn from (after the same
  temperature / top-k / top-p as the target), which the verifier needs to stay lossless; None means a one-hot q
  (greedy drafts, n-gram lookup), which is lossless at any temperature because a token x is then accepted with
  probability p(x) and otherwise resampled from p with x removed.
`caches` lists the KV caches the proposer keeps in step with the token buffer (`fastspec.batch.RowBatch` crops,
realigns and compacts them with the target's).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fastspec.cache import DynamicKVCache
from fastspec.checks import check_finite_logits, vocab_size
from fastspec.compiled import CompiledForward
from fastspec.runner import (
    BufferCache,
    CachedModel,
    KeptPositions,
    additive_mask,
    causal_visibility,
    position_ids,
    repeat_last,
)
from fastspec.sampling import Sampler
from fastspec.static_cache import StaticKVCache

__all__ = [
    "DraftModelProposer",
    "DraftPlan",
    "DraftVocabulary",
    "Drafts",
    "HeadProposer",
    "LookupThenDraftProposer",
    "PromptLookupProposer",
    "lookup_ngram",
]


class DraftPlan(NamedTuple):
    """Where each row's drafts come from this step."""

    sources: list[str]  # per row: "draft" (the draft model) or "lookup" (prompt lookup)
    lookup_tokens: torch.Tensor | None = None  # [R, M] lookup continuations (M = max_tokens of `plan`)
    lookup_rows: torch.Tensor | None = None  # [R] bool, rows that draft by lookup


class Drafts(NamedTuple):
    """One step's chain drafts."""

    tokens: torch.Tensor  # [R, K] int64 (entries past num_draft are arbitrary)
    probs: torch.Tensor | None  # [R, K, V] fp32 q of each token, None for one-hot q
    num_draft: torch.Tensor | None  # [R] int64 valid drafts per row, None when every row has K


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


class DraftModelProposer:
    """Proposes K tokens autoregressively with a draft model that keeps its own KV cache in step."""

    def __init__(self, model: torch.nn.Module, target_vocab: int, check_logits: bool = True,
                 runner: CachedModel | None = None):  # fmt: skip
        self.runner = runner or CachedModel(model)  # `runner`: the model with a static or compiled cache
        self.caches = [self.runner]
        self.vocab = DraftVocabulary(model, target_vocab, check_logits)
        self.steps = 0  # draft calls so far, named in NonFiniteLogitsError

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Every row drafts with the model."""
        return DraftPlan(["draft"] * tokens.shape[0])

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int, sampler: Sampler
    ) -> Drafts:
        """Draft `num_tokens` tokens after the buffer.

        Args:
            tokens: [R, S] right-aligned token buffer; mask: [R, S] its attention mask.
            plan: this step's `plan` (unused: every row drafts with the model).
            num_tokens: K >= 1.
        Returns:
            Drafts: tokens [R, K] int64, probs [R, K, V] fp32 (None for greedy drafts), num_draft None (all K).
        """
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

    def kept(self, width: int, num_accepted: torch.Tensor) -> list[tuple[BufferCache, KeptPositions]]:
        """The draft keeps the buffer and each row's accepted drafts (those it has fed are cached already)."""
        return [(self.runner, KeptPositions(width, num_accepted))]


class PromptLookupProposer:
    """Prompt lookup decoding: propose what followed the most recent earlier occurrence of the last n-gram.

    The search runs over the whole row (prompt and generated text) with tensor ops on the buffer's device:
    `unfold` builds every window, one comparison finds the matches, a max picks the most recent. It falls
    back to shorter n-grams (n-1, ..., 1) for rows without a match; rows with no match at all draft nothing.
    """

    def __init__(self, ngram: int):
        self.ngram = ngram
        self.caches = []  # stateless

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Look up `max_tokens` tokens per row; every row's source is "lookup" (rows without a match draft 0)."""
        drafts, num_draft, _ = lookup_ngram(tokens, mask, self.ngram, max_tokens)
        return DraftPlan(["lookup"] * tokens.shape[0], drafts, num_draft > 0)

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int, sampler: Sampler
    ) -> Drafts:
        """The first `num_tokens` <= max_tokens of the plan's lookup.

        Returns:
            Drafts: tokens [R, K] (entries past num_draft are arbitrary), probs None (one-hot q), num_draft [R]
            (K for rows with a match, 0 without).
        """
        return Drafts(plan.lookup_tokens[:, :num_tokens], None, plan.lookup_rows.long() * num_tokens)

    def kept(self, width: int, num_accepted: torch.Tensor) -> list[tuple[BufferCache, KeptPositions]]:
        """Stateless: no cache."""
        return []


class LookupThenDraftProposer:
    """Prompt lookup first, the draft model where lookup has nothing good: the best of both on mixed workloads.

    A row drafts by lookup when its whole last n-gram (n = `ngram`, no shorter fallback) occurs earlier in the
    row: text that repeats its context (code edits, quoting) is then copied for free, at up to K tokens. Other
    rows draft with the model. The draft model skips steps where every row used lookup; its next call feeds the
    columns it missed (`CachedModel.forward`). With sampling, lookup rows carry one-hot draft probabilities.
    """

    def __init__(self, ngram: int, draft: DraftModelProposer):
        self.ngram = ngram
        self.draft = draft
        self.caches = draft.caches

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Rows whose whole last n-gram occurs earlier look up (`max_tokens` tokens), the others use the model."""
        looked_up, _, match_len = lookup_ngram(tokens, mask, self.ngram, max_tokens)
        use_lookup = match_len == self.ngram
        sources = ["lookup" if used else "draft" for used in use_lookup.tolist()]
        return DraftPlan(sources, looked_up, use_lookup)

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int, sampler: Sampler
    ) -> Drafts:
        """Draft `num_tokens` <= max_tokens tokens per row from the plan's source (arguments as
        `DraftModelProposer.propose`).

        Returns:
            Drafts: tokens [R, K] int64, probs [R, K, V] fp32 (None when every row's q is one-hot: greedy, or all
            rows looked up) and num_draft None (every row has K).
        """
        looked_up, use_lookup = plan.lookup_tokens[:, :num_tokens], plan.lookup_rows
        if bool(use_lookup.all()):
            return Drafts(looked_up, None, None)
        drafted, probs, _ = self.draft.propose(tokens, mask, plan, num_tokens, sampler)
        drafts = torch.where(use_lookup[:, None], looked_up, drafted)
        if probs is not None:
            one_hot = torch.nn.functional.one_hot(looked_up, probs.shape[-1]).to(probs.dtype)
            probs = torch.where(use_lookup[:, None, None], one_hot, probs)
        return Drafts(drafts, probs, None)

    def kept(self, width: int, num_accepted: torch.Tensor) -> list[tuple[BufferCache, KeptPositions]]:
        """What the draft model (or head) keeps."""
        return self.draft.kept(width, num_accepted)


class HeadProposer:
    """Proposes K tokens with an EAGLE-style draft head (`fastspec.heads.DraftHead`) over the target's features.

    Head position p reads (the target's feature of column p, the token of column p + 1) and predicts the feature
    of column p + 1 and the token of column p + 2 (Li et al. 2024, EAGLE, arXiv 2401.15077). After a step the
    target's runner holds its features for buffer columns [0, S - 1) (compacted with its cache); the head first
    catches up on the columns it has not read, then drafts K tokens feeding its own predicted features. The head
    keeps only positions read with the target's features: drafted positions are recomputed from the target's
    features at the next step, as EAGLE does. The first step (the prefill) has no features yet and drafts nothing.
    """

    def __init__(self, head: torch.nn.Module, target: CachedModel, check_logits: bool = True,
                 capacity: int | None = None, compiled: CompiledForward | None = None):  # fmt: skip
        """`capacity`: None for a growing `DynamicKVCache`, else positions per row of a preallocated
        `StaticKVCache` for the head's layer; `compiled`: a `CompiledForward` of the head's `step` (over the static
        cache, every forward after the first padded to a `CompiledForward.width`), or None (eager)."""
        self.head = head
        self.target = target
        self.dtype = next(head.parameters()).dtype
        self.capacity = capacity
        self.compiled = compiled
        if capacity is None:
            self.cache = DynamicKVCache()
        else:
            self.cache = StaticKVCache(1, capacity, next(head.parameters()).device)
        self.runner = BufferCache([self.cache])  # head positions [0, cached) read target features
        self.caches = [self.runner]
        self.check_logits = check_logits
        self.steps = 0

    def plan(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> DraftPlan:
        """Every row drafts with the head."""
        return DraftPlan(["draft"] * tokens.shape[0])

    def forward(self, features, ids, positions, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over n new positions after its cache: features [R, n, H], ids [R, n], positions [R, n] and an
        additive mask [R, 1, n, cached + n]. Returns (hidden [R, n, H], logits [R, n, V])."""
        if self.capacity is None:
            hidden, logits = self.head(features, ids, positions, mask.to(self.dtype), self.cache)
        else:
            hidden, logits = self._forward_static(features, ids, positions, mask)
        self.runner.cached += ids.shape[1]
        if self.check_logits:
            check_finite_logits(logits, "draft", self.steps)
        return hidden, logits

    def _forward_static(self, features, ids, positions, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` over the static cache: after the first forward (the prompt, one shape per call, eager) the n
        new positions are padded to the compiled width w (copies of the last one, written past the live entries,
        masked, overwritten later) and the mask to every cache column; the outputs of the n real ones."""
        num = ids.shape[1]
        compiled = self.compiled if self.runner.cached > 0 else None
        pad = (num if compiled is None else compiled.width(num)) - num
        self.cache.check_room(num + pad)
        if pad:
            features, ids, positions = (repeat_last(x, pad) for x in (features, ids, positions))
            mask = repeat_last(mask, pad, dim=2)
        mask = torch.nn.functional.pad(mask.to(self.dtype), (0, self.capacity - mask.shape[-1]),
                                       value=torch.finfo(self.dtype).min)  # fmt: skip
        # fresh contiguous inputs: a compiled graph guards on strides
        inputs = {name: value.clone(memory_format=torch.contiguous_format) for name, value in
                  (("features", features), ("input_ids", ids), ("position_ids", positions))}  # fmt: skip
        inputs.update(attention_mask=mask, cache=self.cache)
        hidden, logits = self.head.step(**inputs) if compiled is None else compiled(inputs)
        self.cache.advance(num)
        return hidden[:, :num], logits[:, :num]

    def _forward_visible(self, features, ids, positions, visible):
        """`forward` with a bool visibility [R, n, cached + n] instead of an additive mask."""
        return self.forward(features, ids, positions, additive_mask(visible, self.dtype, self.capacity))

    def catch_up(self, tokens: torch.Tensor, mask: torch.Tensor):
        """Read the target's features of the columns [cached, S - 1) the head has not read; returns the head's
        (hidden [R, H], logits [R, V]) at column S - 2 (the feature and the first draft after the buffer), or None
        before the target has run (the prefill)."""
        width = tokens.shape[1]
        start = self.runner.cached
        features = self.target.features.values
        if features is None or self.target.cached < width - 1 or start >= width - 1:
            return None
        hidden, logits = self._forward_visible(
            self.head.target_features(features[:, start : width - 1]), tokens[:, start + 1 :],
            position_ids(mask)[:, start : width - 1],
            causal_visibility(mask[:, : width - 1], start),
        )  # fmt: skip
        return hidden[:, -1], logits[:, -1]

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int, sampler: Sampler
    ) -> Drafts:
        """Draft `num_tokens` tokens after the buffer (arguments and results as `DraftModelProposer.propose`; on
        the first step every row drafts 0 tokens)."""
        rows, width = tokens.shape
        caught_up = self.catch_up(tokens, mask)
        if caught_up is None:
            return Drafts(tokens.new_zeros(rows, num_tokens), None, tokens.new_zeros(rows))
        hidden, logits = caught_up
        last_position = (mask.long().sum(-1) - 1)[:, None]  # position of the buffer's last column
        real = mask[:, : width - 1].bool()
        drafts, probs = [], []
        for position in range(num_tokens):
            token, q = sampler.draft(logits, position)
            drafts.append(token)
            probs.append(q)
            if position + 1 < num_tokens:  # the head's own feature and its draft, one position further
                visible = torch.cat([real, real.new_ones(rows, position + 1)], dim=1)[:, None]
                hidden, logits = self._forward_visible(hidden[:, None], token[:, None], last_position + position,
                                                       visible)  # fmt: skip
                hidden, logits = hidden[:, -1], logits[:, -1]
        self.steps += 1
        return Drafts(torch.stack(drafts, dim=1), None if probs[0] is None else torch.stack(probs, dim=1), None)

    def kept(self, width: int, num_accepted: torch.Tensor) -> list[tuple[BufferCache, KeptPositions]]:
        """Only the positions read with target features: [0, S - 1), whatever was accepted."""
        return [(self.runner, KeptPositions(width - 1, torch.zeros_like(num_accepted)))]


def lookup_ngram(tokens: torch.Tensor, mask: torch.Tensor, ngram: int, num_tokens: int):
    """Continuations of the most recent earlier occurrence of each row's last n-gram (n = ngram, ..., 1).

    Args:
        tokens: [R, S] right-aligned rows; mask: [R, S] (windows touching left padding never match).
        ngram: longest n-gram to match; num_tokens: K, the most tokens to propose.
    Returns:
        drafts [R, K] int64, num_draft [R] int64 (K for rows with a match, 0 (drafts all 0) without) and
        match_len [R] int64 (the n of the n-gram that matched, 0 for none). When fewer than K tokens follow the
        match, the continuation repeats them (period = distance to the end), the natural guess for text that loops.
    """
    rows, width = tokens.shape
    drafts = tokens.new_zeros(rows, num_tokens)
    match_len = torch.zeros(rows, dtype=torch.long, device=tokens.device)
    offsets = torch.arange(num_tokens, device=tokens.device)
    for n in range(min(ngram, width - 1), 0, -1):
        windows = tokens.unfold(1, n, 1)  # [R, S-n+1, n]
        hit = (windows == tokens[:, None, -n:]).all(-1) & mask.unfold(1, n, 1).bool().all(-1)
        hit[:, -1] = False  # the suffix itself has no continuation
        starts = torch.arange(hit.shape[1], device=tokens.device)
        last = torch.where(hit, starts, -1).max(-1).values  # most recent match, -1 if none
        new = (last >= 0) & (match_len == 0)
        follow = last + n  # first column after the match
        # a match d columns before the end continues periodically with period d (repeated text loops on)
        period = (width - follow).clamp_min(1)
        candidates = tokens.gather(1, follow[:, None] + offsets % period[:, None])
        drafts = torch.where(new[:, None], candidates, drafts)
        match_len = torch.where(new, n, match_len)
    return drafts, (match_len > 0).long() * num_tokens, match_len
