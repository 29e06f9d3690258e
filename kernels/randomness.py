"""The randomness a verification consumes: acceptance uniforms and residual noise, drawn the same way for all.

The Triton kernels and the eager reference take their randomness as inputs (`uniforms`, `noise`), so that they
agree token for token; given a `seed` instead, each of them draws both with `draw_randomness`, this one function.
"""

from __future__ import annotations

import torch

__all__ = ["draw_randomness"]


def draw_randomness(
    batch: int,
    num_draft: int,
    vocab: int,
    seed: int | torch.Generator | None,
    device: torch.device | str,
    uniforms: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw acceptance uniforms [B, K] in (0, 1] and residual noise [B, V] ~ Exp(1), both fp32 and > 0.

    Uniforms are drawn in float64 (float32 `rand` returns exactly 0 too often, pytorch#16706) as 1 - U[0, 1).
    `seed` may be an int, a `torch.Generator` (advanced in place) or None (the global generator). Given `uniforms`
    or `noise` are returned as they are: only what is missing is drawn (nothing when both are given).
    """
    if uniforms is not None and noise is not None:
        return uniforms, noise
    gen = seed
    if isinstance(seed, int):
        gen = torch.Generator(device=device).manual_seed(seed)
    drawn = 1.0 - torch.rand(batch, num_draft, dtype=torch.float64, device=device, generator=gen)
    drawn_noise = torch.empty(batch, vocab, dtype=torch.float64, device=device).exponential_(generator=gen)
    tiny = torch.finfo(torch.float32).tiny
    # fp32 would round values near 1 up to 1.0, which rejects a p == q draft: cap at the largest fp32 below 1
    drawn, drawn_noise = drawn.float().clamp_max(1.0 - 2.0**-24), drawn_noise.clamp_min(tiny).float()
    return drawn if uniforms is None else uniforms, drawn_noise if noise is None else noise
