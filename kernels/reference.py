"""Eager PyTorch reference of every fastspec kernel: the test oracle and the benchmark baseline.

Words (as in vLLM's rejection sampler):
- *draft tokens*: the K tokens the draft proposed for one row; a row may have fewer (`num_draft`).
- *accepted*: the leading draft tokens that survive verification.
- *recovered* token: sampled at the first rejected position from the residual norm(max(p - q, 0)).
- *bonus* token: sampled from p at position K when every draft token was accepted.

Chain speculative sampling: Leviathan et al. 2023 (arXiv 2211.17192), Chen et al. 2023 (arXiv 2302.01318).
Draft token x at position j is accepted when u_j * q_j(x) < p_j(x) (u_j uniform in (0, 1], strict, so a
token with p = 0 is never accepted), which accepts with probability min(1, p/q). Residual sampling uses the
exponential race: argmax_v r_v / E_v with E_v ~ Exp(1) draws v with probability r_v / sum(r), with no
normalising pass. A degenerate residual (p == q, sum r = 0) falls back to sampling p. Greedy rows
(temperature 0) compare the draft token with the target argmax, and emit the argmax.

Randomness is an input (`uniforms`, `noise`) so the Triton kernels and this reference agree token for token;
`seed` draws both with `draw_randomness`, the same function the kernel wrappers use.
"""

from __future__ import annotations

import torch

from fastspec.sampling import as_row_param, sampling_probs

__all__ = ["draw_randomness", "verify_chain"]


def draw_randomness(
    batch: int, num_draft: int, vocab: int, seed: int | torch.Generator | None, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw acceptance uniforms [B, K] in (0, 1] and residual noise [B, V] ~ Exp(1), both fp32 and > 0.

    Uniforms are drawn in float64 (float32 `rand` returns exactly 0 too often, pytorch#16706) as 1 - U[0, 1).
    `seed` may be an int, a `torch.Generator` (advanced in place) or None (the global generator).
    """
    gen = seed
    if isinstance(seed, int):
        gen = torch.Generator(device=device).manual_seed(seed)
    uniforms = 1.0 - torch.rand(batch, num_draft, dtype=torch.float64, device=device, generator=gen)
    noise = torch.empty(batch, vocab, dtype=torch.float64, device=device).exponential_(generator=gen)
    tiny = torch.finfo(torch.float32).tiny
    return uniforms.float(), noise.clamp_min(tiny).float()


def verify_chain(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    seed: int | torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of draft tokens against the target, eagerly.

    Memory traffic: reads B(K+1)V target logits and BKV draft probs, materialises the fp32 probabilities
    (B(K+1)V written and read again) and one residual row per request.

    Args:
        target_logits: [B, K+1, V] fp32/bf16/fp16, target logits at the K draft positions and the bonus position.
        draft_tokens: [B, K] int, proposed tokens; entries at positions >= num_draft are ignored.
        draft_probs: [B, K, V] probabilities the draft tokens were sampled from (after the same temperature,
            top-k and top-p), or None for a one-hot draft (greedy draft model, n-gram lookup).
        num_draft: [B] int, number of valid draft tokens per row (0..K); None means K for every row.
        temperature: float or [B]; 0 marks a greedy row (argmax comparison).
        top_k: int, [B] or None (<= 0 disables).
        top_p: float, [B] or None (1.0 disables).
        uniforms: [B, K] in (0, 1], acceptance coins.
        noise: [B, V] > 0, Exp(1) noise for the exponential race.
        seed: used to draw `uniforms` and `noise` when they are not given.

    Returns:
        out_tokens: [B, K+1] int64, the accepted draft tokens then the recovered or bonus token, padded with -1.
        num_accepted: [B] int64, number of accepted draft tokens (the row emits num_accepted + 1 tokens).

    Example:
        >>> logits = torch.randn(2, 4, 16); drafts = torch.randint(0, 16, (2, 3))
        >>> out, n = verify_chain(logits, drafts, temperature=0.0)
    """
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    device = target_logits.device
    if uniforms is None or noise is None:
        uniforms, noise = draw_randomness(batch, k, vocab, seed, device)
    temp = as_row_param(temperature, (batch,), device, torch.float32)
    greedy = temp <= 0  # [B]
    n = torch.full((batch,), k, device=device) if num_draft is None else num_draft.to(device).long()
    rows = torch.arange(batch, device=device)

    # read B(K+1)V logits; write and read B(K+1)V fp32 probabilities
    probs = sampling_probs(target_logits, temp, top_k, top_p)  # [B, K+1, V]
    target_argmax = target_logits.float().argmax(-1)  # [B, K+1]

    # accept/reject every position; a row's accepted count is its run of leading accepts
    positions = torch.arange(k, device=device)
    in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    valid = (positions[None, :] < n[:, None]) & in_range
    x = torch.where(in_range, draft_tokens, 0).long()  # [B, K]
    p_x = probs[:, :k].gather(-1, x[..., None])[..., 0]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.float().gather(-1, x[..., None])[..., 0]
    sampled_accept = (q_x > 0) & (uniforms * q_x < p_x)
    accept = torch.where(greedy[:, None], x == target_argmax[:, :k], sampled_accept) & valid
    num_accepted = torch.cumprod(accept.long(), dim=-1).sum(-1)  # [B]

    # recovered token (first rejection) or bonus token (all accepted), one row per request
    p_final = probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < n
    j_rej = num_accepted.clamp(max=max(k - 1, 0))
    if k == 0:
        q_final = torch.zeros_like(p_final)
    elif draft_probs is None:
        q_final = torch.nn.functional.one_hot(x[rows, j_rej], vocab).float()
    else:
        q_final = draft_probs[rows, j_rej].float()
    residual = torch.where(rejected[:, None], (p_final - q_final).clamp_min(0.0), p_final)
    degenerate = residual.sum(-1) <= 0  # p == q: resample p itself
    residual = torch.where(degenerate[:, None], p_final, residual)
    sampled_token = (residual / noise).argmax(-1)
    final_token = torch.where(greedy, target_argmax[rows, num_accepted], sampled_token)

    out = torch.full((batch, k + 1), -1, dtype=torch.long, device=device)
    out[:, :k] = torch.where(positions[None, :] < num_accepted[:, None], draft_tokens.long(), -1)
    out[rows, num_accepted] = final_token
    return out, num_accepted
