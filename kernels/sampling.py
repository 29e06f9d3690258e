"""The sampling transform (temperature, top-k, top-p, min-p) shared by the draft, the target, the reference and both
kernels.

Speculative sampling is lossless only if the draft distribution q and the target distribution p are
computed with exactly the same transform (Leviathan et al. 2023, arXiv 2211.17192): temperature first,
then top-k, then top-p, then min-p, each on the previous one's output (the order of transformers' warpers). This
module is that transform, written once; the Triton kernels implement the same semantics
(`fastspec.kernels.sampling_filters`) and are tested token for token against it.

Tie semantics (chosen so a kernel can implement them with a threshold search instead of a sort):
- top-k keeps every token whose logit is >= the k-th largest logit (ties at the boundary are kept);
- top-p keeps token v when the probability mass of tokens strictly more probable than v is < top_p
  (so the most probable token is always kept, and tied tokens are kept or dropped together);
- min-p keeps token v when p(v) >= min_p * max p, computed in logit space as z_v >= z_max + log(min_p) with
  z = logits / temperature, one fp32 addition, so a kernel's keep decision is the reference's bit for bit
  (`min_p_log`: the fp32 log(min_p) both use). transformers' `MinPLogitsWarper` compares softmax probabilities;
  the two agree except within float rounding of the boundary. min_p = 0 keeps every token.

Shapes: logits [..., V]; per-row parameters are floats, ints, None or tensors broadcastable to [...].
"""

from __future__ import annotations

import math

import torch

__all__ = ["as_row_param", "min_p_log", "sampling_probs", "transform_logits"]


def as_row_param(
    value: float | int | torch.Tensor | None, lead: tuple[int, ...], device: torch.device, dtype: torch.dtype
) -> torch.Tensor | None:
    """Broadcast a sampling parameter to a flat tensor [prod(lead)] (None stays None).

    `value` is a scalar or a tensor whose shape is a prefix of `lead` (e.g. per batch row [B] for logits
    [B, K, V], where lead = (B, K)).
    """
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return torch.full(lead, value, device=device, dtype=dtype).reshape(-1)
    value = value.to(device=device, dtype=dtype)
    value = value.reshape(value.shape + (1,) * (len(lead) - value.dim()))
    return value.expand(lead).reshape(-1)


def min_p_log(min_p: float | torch.Tensor) -> float | torch.Tensor:
    """log(min_p) as the fp32 value the min-p filter adds to the row max (a Python float holding an fp32 value, or an
    fp32 tensor of per-row values); -inf for min_p = 0. The reference and the kernels both take it from here."""
    if isinstance(min_p, torch.Tensor):
        return torch.log(min_p.double()).float()
    return float(torch.tensor(math.log(min_p) if min_p > 0 else float("-inf"), dtype=torch.float32))


def transform_logits(
    logits: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Apply temperature, top-k, top-p and min-p to logits [..., V]; returns fp32 logits with removed tokens at -inf.

    `temperature` may be a tensor [...] of per-row values; rows with temperature 0 (greedy) are left
    untempered here (their callers use argmax). `top_k` <= 0 or >= V, `top_p` >= 1 and `min_p` None or 0 disable
    the filter.
    """
    lead = tuple(logits.shape[:-1])
    x = logits.float().reshape(-1, logits.shape[-1])
    vocab = x.shape[-1]
    temp = as_row_param(temperature, lead, x.device, torch.float32)
    temp = torch.where(temp > 0, temp, torch.ones_like(temp))
    x = x / temp[:, None]
    if top_k is not None:
        k = as_row_param(top_k, lead, x.device, torch.long)
        k = torch.where((k <= 0) | (k > vocab), torch.full_like(k, vocab), k)
        kth = torch.sort(x, dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        x = x.masked_fill(x < kth, float("-inf"))
    if top_p is not None:
        p_lim = as_row_param(top_p, lead, x.device, torch.float32)
        probs = torch.softmax(x, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # mass of tokens strictly more probable than each token: exclusive cumsum over ties-grouped order
        cum_excl = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        # tokens tied with a more-probable-ranked token share the smallest exclusive mass of their tie group
        first_of_tie = torch.ones_like(sorted_probs, dtype=torch.bool)
        first_of_tie[:, 1:] = sorted_probs[:, 1:] != sorted_probs[:, :-1]
        group = torch.cumsum(first_of_tie.long(), dim=-1) - 1
        group_start = torch.zeros_like(cum_excl).scatter_reduce(1, group, cum_excl, "amin", include_self=False)
        # top_p >= 1 keeps everything (an fp32 cumsum can reach 1 before the tail and would drop it)
        keep_sorted = (group_start.gather(1, group) < p_lim[:, None]) | (p_lim[:, None] >= 1.0)
        keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
        x = x.masked_fill(~keep, float("-inf"))
    if min_p is not None:
        # p_v >= min_p * max p  <=>  z_v >= z_max + log(min_p): top-k and top-p keep the row max
        log_min_p = as_row_param(min_p_log(min_p), lead, x.device, torch.float32)
        x = x.masked_fill(x < (x.amax(-1) + log_min_p)[:, None], float("-inf"))
    return x.reshape(*lead, vocab)


def sampling_probs(
    logits: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    min_p: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Probabilities [..., V] (fp32) after `transform_logits`; greedy rows (temperature 0) become one-hot argmax."""
    x = transform_logits(logits, temperature, top_k, top_p, min_p)
    probs = torch.softmax(x, dim=-1)
    rows = probs.reshape(-1, probs.shape[-1])
    temp = as_row_param(temperature, tuple(probs.shape[:-1]), probs.device, torch.float32)
    if bool((temp <= 0).any()):
        greedy = torch.nn.functional.one_hot(rows.argmax(-1), rows.shape[-1]).float()
        rows = torch.where((temp <= 0)[:, None], greedy, rows)
    return rows.reshape(probs.shape)
