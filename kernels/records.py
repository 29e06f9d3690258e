"""Result records shared by the Triton kernels and their eager reference (`fastspec.kernels.reference`)."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["TreeMask"]


class TreeMask(NamedTuple):
    """Tree-attention inputs for N tree nodes after a prefix of P columns (see `tree_mask`)."""

    bits: torch.Tensor  # [B, N, ceil(N/32)] int32: bit j % 32 of word j // 32 of row i set iff j is i or an ancestor
    mask: torch.Tensor  # [B, 1, N, P+N] additive: 0 where node i may attend, finfo(dtype).min elsewhere
    depth: torch.Tensor  # [B, N] int64, 0 for the root (and for padded nodes)
    position_ids: torch.Tensor  # [B, N] int64, real prefix length + depth
