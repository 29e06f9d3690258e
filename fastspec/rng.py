"""Counter-based randomness per row: the same seed gives the same output whatever the batch composition.

Every random number is a hash of (row seed, stream, the row's own token counter, index), like Philox in
vLLM's kernels, instead of a draw from a shared generator whose state depends on the other rows. The hash
is SplitMix64's finaliser in wrapping int64 tensor arithmetic, so it runs unchanged on CPU and CUDA with no
host round trip. Uniforms are float64 ((h >> 11) + 1) / 2^53 in (0, 1] (never 0: strict comparisons stay
sound) cast to fp32 and capped at 1 - 2^-24 (so p == q always accepts); exponential noise is -log of the
float64 uniform, clamped to the smallest normal fp32.
"""

from __future__ import annotations

import torch

__all__ = ["ACCEPT", "DRAFT", "RESIDUAL", "RowRandom"]

# streams: disjoint salts for the acceptance coins, the residual noise and draft sampling
ACCEPT, RESIDUAL, DRAFT = 1, 2, 3

_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)  # constants as signed int64
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64: a bijective avalanche hash of int64."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    return z ^ _shr(z, 31)


class RowRandom:
    """Random numbers for the active rows of a batch, keyed by each row's seed and token counter.

    Args:
        seeds: [B] int64 per-row seeds (on the decoding device).
    """

    def __init__(self, seeds: torch.Tensor):
        self.seeds = seeds.long()

    def _uniform64(self, rows: torch.Tensor, counter: torch.Tensor, stream: int, width: int) -> torch.Tensor:
        key = _mix(_mix(self.seeds[rows] ^ stream) + counter.long())  # [R]
        index = torch.arange(width, device=key.device)
        bits = _mix(key[:, None] + _mix(index)[None, :])
        return (_shr(bits, 11) + 1).double() * 2.0**-53

    def uniform(self, rows: torch.Tensor, counter: torch.Tensor, stream: int, width: int) -> torch.Tensor:
        """Uniforms [R, width] fp32 in (0, 1) for original rows `rows` [R] at per-row counters `counter` [R]."""
        # fp32 rounds values near 1 up to 1.0, which would reject a p == q draft: cap below 1
        return self._uniform64(rows, counter, stream, width).float().clamp_max(1.0 - 2.0**-24)

    def exponential(self, rows: torch.Tensor, counter: torch.Tensor, stream: int, width: int) -> torch.Tensor:
        """Exp(1) noise [R, width] fp32, > 0."""
        noise = -torch.log(self._uniform64(rows, counter, stream, width))
        return noise.clamp_min(torch.finfo(torch.float32).tiny).float()
