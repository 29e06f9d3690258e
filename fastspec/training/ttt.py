"""Training-time test (EAGLE-3, Li et al. 2025, arXiv 2503.01840): the head unrolled on its own outputs, and its loss.

**Unrolling.** A batch is R token rows [R, L] with the frozen target's features [R, L, F] and logits [R, L, V].
Unrolled step s (1-based) has n = L - s entries; entry i reads a feature (step 1: the target's features of position i
through ``head.target_features``; step s > 1: the head's own step s - 1 output of entry i, the pre-norm hidden it
feeds back when drafting) and the data token i + s, sits at rotary position i + s - 1, and predicts token i + s + 1,
whose teacher is the target's logits at position i + s. All steps share one KV cache; a query of entry i attends to
the step-1 keys of entries <= i (the prefix of real target features) and, of every later step including its own,
only to the key of its own entry i: the diagonal that makes each entry see exactly what a draft of depth s sees at
inference. This is the EAGLE repository's eagle/traineagle3 scheme, written here as one additive 4D mask over the
head's ordinary cache (``ttt_mask``), so any head with the `fastspec.heads.DraftHeadBase` ``step`` trains unchanged.

**Loss** (``eagle3_loss``): per step, the cross-entropy of the head's distribution over its draft vocabulary against
the target's probabilities restricted to the kept tokens and renormalised (softmax of the target logits at the kept
ids), counted at positions where the target's argmax is a kept token, summed and divided by the number of loss
positions (``loss_mask``, the answer positions); steps weighted ``decay ** (s - 1)`` (0.8 in EAGLE-3) and summed.
EAGLE-1 heads (full vocabulary, the target's lm_head) add the smooth-L1 regression of the next position's last hidden
state (``eagle1_loss``); ``feature_regression`` is that term alone, which an EAGLE-3 run may add as well (the head's
format does not change: it is a training signal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["StepStats", "eagle1_loss", "eagle3_loss", "feature_regression", "ttt_mask", "unroll"]


def ttt_mask(widths: list[int], n: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """Additive mask [1, 1, n, sum(widths) + n] of unrolled step len(widths) + 1 over a cache holding the earlier
    steps (``widths`` entries each) followed by the step's own n entries.

    Entry i of every step belongs to base position i. A query of entry i sees the step-1 keys of entries <= i and, of
    each later step (its own included), only entry i. With ``widths == []`` it is the causal mask of step 1.
    """
    rows = torch.arange(n, device=device)[:, None]
    cols = []
    for s, width in enumerate([*widths, n]):
        j = torch.arange(width, device=device)[None, :]
        cols.append(j <= rows if s == 0 else j == rows)
    allowed = torch.cat(cols, dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def new_training_cache():
    """An empty growing KV cache for the head's one layer (concatenation only: gradients flow through it)."""
    from fastspec.cache import DynamicKVCache

    return DynamicKVCache()


def unroll(head, features: torch.Tensor, input_ids: torch.Tensor, steps: int, noise: float = 0.0):
    """Run ``head`` ``steps`` unrolled steps over rows ``input_ids`` [R, L] with the target's ``features`` [R, L, F]
    (module docstring). Returns ``[(hidden [R, L - s, H], logits [R, L - s, V_draft]) for s in 1..steps]``.

    ``noise`` > 0 adds U(-noise/2, noise/2) to the target features (EAGLE-1's augmentation)."""
    rows, length = input_ids.shape
    if not 1 <= steps < length:
        raise ValueError(f"unroll: steps must be in [1, {length - 1}] for rows of {length} tokens, got {steps}")
    cache, outs, widths = new_training_cache(), [], []
    feats = features[:, : length - 1]
    if noise > 0:
        feats = feats + (torch.rand_like(feats) - 0.5) * noise
    feats = head.target_features(feats)
    for s in range(1, steps + 1):
        n = length - s
        if s > 1:
            feats = outs[-1][0][:, :n]
        pos = torch.arange(s - 1, s - 1 + n, device=input_ids.device)[None].expand(rows, n)
        mask = ttt_mask(widths, n, feats.dtype, input_ids.device).expand(rows, 1, n, sum(widths) + n)
        hidden, logits = head.step(feats, input_ids[:, s : s + n], pos, mask, cache)
        outs.append((hidden, logits))
        widths.append(n)
    return outs


class StepStats(list):
    """Per unrolled step: dicts with ``loss`` (float), ``agree`` (head top-1 == target top-1 over the loss positions)
    and ``kept`` (share of loss positions whose target argmax is a kept token)."""


def eagle3_loss(
    outs,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor,
    kept: torch.Tensor | None,
    decay: float = 0.8,
) -> tuple[torch.Tensor, StepStats]:
    """The EAGLE-3 loss of ``unroll``'s outputs (module docstring).

    Args:
        outs: ``[(hidden, logits [R, n_s, V_draft])]`` per unrolled step, ``n_s = L - s``.
        target_logits: [R, L, V] the frozen target's logits of the rows (position p predicts token p + 1).
        loss_mask: [R, L] 1 at the positions p whose prediction is trained (answer tokens), else 0.
        kept: int64 [V_draft] the target ids of the draft vocabulary (sorted ascending), or None for the full one.
        decay: weight factor per later step.

    Returns ``(loss, stats)``.
    """
    total, stats = 0.0, StepStats()
    vocab = target_logits.shape[-1]
    if kept is None:
        kept = torch.arange(vocab, device=target_logits.device)
    t2d = torch.zeros(vocab, dtype=torch.bool, device=target_logits.device)
    t2d[kept] = True
    with torch.no_grad():  # the teacher once for every step: step s reads positions [s, s + n) of the same rows
        # in the logits' own dtype until the kept columns are taken: a cast to fp32 is exact, so argmax and softmax
        # equal an fp32 copy's, without copying all V columns (bf16 training: [8, 330, 49152], ~0.6 s a step)
        top = target_logits.argmax(-1)
        teacher = target_logits if len(kept) == vocab else target_logits[..., kept]
        probs_all = F.softmax(teacher.float(), dim=-1)
        kept_top = t2d[top].float()
    for s, (_, logits) in enumerate(outs, start=1):
        n = logits.shape[1]
        mask = loss_mask[:, s : s + n].float()
        valid = mask * kept_top[:, s : s + n]
        ce = -(probs_all[:, s : s + n] * F.log_softmax(logits.float(), dim=-1)).sum(-1)
        count = mask.sum().clamp_min(1.0)
        step_loss = (ce * valid).sum() / count
        total = total + decay ** (s - 1) * step_loss
        with torch.no_grad():
            agree = ((kept[logits.argmax(-1)] == top[:, s : s + n]).float() * mask).sum() / count
            stats.append({"loss": step_loss.item(), "agree": float(agree), "kept": float(valid.sum() / count)})
    return total, stats


def feature_regression(
    outs, last_hidden: torch.Tensor, loss_mask: torch.Tensor, decay: float = 0.8, stats: StepStats | None = None
) -> tuple[torch.Tensor, list[float]]:
    """EAGLE-1's regression over the unrolled steps: per step, the smooth-L1 between the head's hidden [R, n_s, H]
    and the target's last hidden state ``last_hidden`` [R, L, H] of the position it stands for (the state after the
    target's final norm at position i + s for entry i of step s), averaged over H and over the loss positions
    (``loss_mask`` [R, L]), weighted ``decay ** (s - 1)`` and summed. Returns ``(loss, per-step values)``; with
    ``stats`` (the cross-entropy's, one dict per step) each step's value is also recorded there as ``reg``."""
    total, values = 0.0, []
    for s, (hidden, _) in enumerate(outs, start=1):
        n = hidden.shape[1]
        mask = loss_mask[:, s : s + n].float()
        reg = F.smooth_l1_loss(hidden.float(), last_hidden[:, s : s + n].float(), reduction="none").mean(-1)
        step_reg = (reg * mask).sum() / mask.sum().clamp_min(1.0)
        total = total + decay ** (s - 1) * step_reg
        values.append(step_reg.item())
        if stats is not None:
            stats[s - 1]["reg"] = values[-1]
    return total, values


def eagle1_loss(
    outs,
    target_logits: torch.Tensor,
    last_hidden: torch.Tensor,
    loss_mask: torch.Tensor,
    decay: float = 0.8,
    ce_weight: float = 1.0,
) -> tuple[torch.Tensor, StepStats]:
    """EAGLE-1's loss over the unrolled steps: ``feature_regression`` (the head's hidden against the target's last
    hidden state [R, L, H] of the next position, the feature it predicts) plus ``ce_weight`` times the
    full-vocabulary cross-entropy against the target's distribution, per step over the loss positions, weighted
    ``decay ** (s - 1)``. (EAGLE-1 weights the cross-entropy 0.1; 1.0 accepted more on the shipped target,
    docs/training.md.)"""
    ce_total, stats = eagle3_loss(outs, target_logits, loss_mask, None, decay)
    reg_total, _ = feature_regression(outs, last_hidden, loss_mask, decay, stats)
    return ce_weight * ce_total + reg_total, stats
