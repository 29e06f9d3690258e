"""Draft sources: a small draft model proposing a chain of K tokens, n-gram prompt lookup, and both combined.

A proposer returns `draft_tokens [R, K]`, `draft_probs [R, K, V]` and `num_draft [R]` (or None: every row has
K). `draft_probs` is the exact distribution q each token was drawn from (after the same temperature / top-k /
top-p as the target), which the verifier needs to stay lossless; `None` means a one-hot q (greedy drafts,
n-gram lookup), which is lossless at any temperature because a token x is then accepted with probability p(x)
and otherwise resampled from p with x removed.
"""

from __future__ import annotations

import torch

from fastspec.checks import check_finite_logits, vocab_size
from fastspec.runner import CachedModel
from fastspec.sampling import Sampler

__all__ = ["DraftModelProposer", "DraftVocabulary", "LookupThenDraftProposer", "PromptLookupProposer"]


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

    def __init__(self, model: torch.nn.Module, target_vocab: int, check_logits: bool = True):
        self.runner = CachedModel(model)
        self.vocab = DraftVocabulary(model, target_vocab, check_logits)
        self.steps = 0

    def sources(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> list[str]:
        """Where each row's next drafts come from (for `fastspec.adaptive`): the draft model, for every row."""
        return ["draft"] * tokens.shape[0]

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, num_tokens: int, sampler: Sampler
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """Draft `num_tokens` tokens after the buffer.

        Args:
            tokens: [R, S] right-aligned token buffer; mask: [R, S] its attention mask.
            num_tokens: K >= 1.
        Returns:
            draft_tokens [R, K] int64, draft_probs [R, K, V] fp32 (None for greedy drafts), None (all rows K).
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
        return drafts, None if probs[0] is None else torch.stack(probs, dim=1), None

    def realign(self, accepted_len: torch.Tensor, shift: torch.Tensor, shifted: bool) -> None:
        """Roll the draft cache back to the accepted prefix (see `CachedModel.realign`)."""
        self.runner.realign(accepted_len, shift, shifted)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows."""
        self.runner.select_rows(rows)

    def drop_leading(self, columns: int) -> None:
        """Drop the cache entries of the buffer's first `columns` columns (padding in every row)."""
        self.runner.drop_leading(columns)


class PromptLookupProposer:
    """Prompt lookup decoding: propose what followed the most recent earlier occurrence of the last n-gram.

    The search runs over the whole row (prompt and generated text) with tensor ops on the buffer's device:
    `unfold` builds every window, one comparison finds the matches, a max picks the most recent. It falls
    back to shorter n-grams (n-1, ..., 1) for rows without a match; rows with no match at all draft nothing.
    """

    def __init__(self, ngram: int):
        self.ngram = ngram

    def sources(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> list[str]:
        """Where each row's next drafts come from (for `fastspec.adaptive`): lookup, for every row."""
        return ["lookup"] * tokens.shape[0]

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, num_tokens: int, sampler: Sampler
    ) -> tuple[torch.Tensor, None, torch.Tensor]:
        """Draft up to `num_tokens` tokens per row from the row itself.

        Args:
            tokens: [R, S] right-aligned token buffer; mask: [R, S] its attention mask.
        Returns:
            draft_tokens [R, K] (entries past num_draft are arbitrary), None (one-hot q), num_draft [R] in [0, K].
        """
        drafts, num_draft, _ = lookup_ngram(tokens, mask, self.ngram, num_tokens)
        return drafts, None, num_draft

    def realign(self, accepted_len: torch.Tensor, shift: torch.Tensor, shifted: bool) -> None:
        """Stateless: nothing to roll back."""

    def select_rows(self, rows: torch.Tensor) -> None:
        """Stateless: nothing to drop."""

    def drop_leading(self, columns: int) -> None:
        """Stateless: nothing to drop."""


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
        self._routed = None  # (tokens, drafts [R, max_tokens], use_lookup [R]) of the last `sources` call

    def _lookup(self, tokens: torch.Tensor, mask: torch.Tensor, num_tokens: int):
        """Lookup drafts [R, num_tokens] and which rows use them [R] bool (the whole n-gram matched)."""
        looked_up, _, match_len = lookup_ngram(tokens, mask, self.ngram, num_tokens)
        return looked_up, match_len == self.ngram

    def sources(self, tokens: torch.Tensor, mask: torch.Tensor, max_tokens: int) -> list[str]:
        """Where each row's next drafts come from (for `fastspec.adaptive`): "lookup" or "draft". The lookup is
        kept for the `propose` call on the same buffer (drafts of K <= max_tokens are its first K columns)."""
        looked_up, use_lookup = self._lookup(tokens, mask, max_tokens)
        self._routed = (tokens, looked_up, use_lookup)
        return ["lookup" if used else "draft" for used in use_lookup.tolist()]

    def propose(
        self, tokens: torch.Tensor, mask: torch.Tensor, num_tokens: int, sampler: Sampler
    ) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """Draft `num_tokens` tokens per row (arguments as `DraftModelProposer.propose`).

        Returns:
            draft_tokens [R, K] int64, draft_probs [R, K, V] fp32 (None when every row's q is one-hot: greedy, or
            all rows looked up) and None (every row has K).
        """
        routed, self._routed = self._routed, None
        if routed is not None and routed[0] is tokens and routed[1].shape[1] >= num_tokens:
            looked_up, use_lookup = routed[1][:, :num_tokens], routed[2]
        else:
            looked_up, use_lookup = self._lookup(tokens, mask, num_tokens)
        if bool(use_lookup.all()):
            return looked_up, None, None
        drafted, probs, _ = self.draft.propose(tokens, mask, num_tokens, sampler)
        drafts = torch.where(use_lookup[:, None], looked_up, drafted)
        if probs is not None:
            one_hot = torch.nn.functional.one_hot(looked_up, probs.shape[-1]).to(probs.dtype)
            probs = torch.where(use_lookup[:, None, None], one_hot, probs)
        return drafts, probs, None

    def realign(self, accepted_len: torch.Tensor, shift: torch.Tensor, shifted: bool) -> None:
        """Roll the draft model's cache back (see `CachedModel.realign`)."""
        self.draft.realign(accepted_len, shift, shifted)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Drop finished rows."""
        self.draft.select_rows(rows)

    def drop_leading(self, columns: int) -> None:
        """Drop the draft model's cache entries of the buffer's first `columns` columns."""
        self.draft.drop_leading(columns)


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
