"""`DynamicKVCache`: a Hugging Face `DynamicCache` with crop, per-row realignment, row selection and compaction.

Every method edits the key/value tensors of each layer ([B, H, L, D]) with one tensor op per layer, never a
Python loop over tokens (`fastspec.static_cache.StaticKVCache` does the same in preallocated buffers). Rows
that disagree on how many tokens they accepted are realigned to the right (left padding grows), so every row's
newest entry sits at the same column and the cache keeps one length.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

__all__ = ["DynamicKVCache", "FeatureStore", "right_align_index", "take_positions"]


class DynamicKVCache(DynamicCache):
    """A transformers DynamicCache (growing by concatenation) with the surgery `CachedModel` applies after a step.

    The same methods as `fastspec.static_cache.StaticKVCache`, so `CachedModel` edits either without asking which.
    """

    def _live(self):
        return [layer for layer in self.layers if getattr(layer, "is_initialized", True) and layer.keys is not None]

    def _keep_positions(self, positions: slice) -> None:
        for layer in self._live():
            layer.keys = layer.keys[:, :, positions]
            layer.values = layer.values[:, :, positions]

    def set_length(self, length: int) -> None:
        """Keep the first `length` positions of every layer (a crop; no copy: a view)."""
        self._keep_positions(slice(None, length))

    def drop_leading(self, count: int) -> None:
        """Drop the first `count` positions of every layer (no copy: a view)."""
        self._keep_positions(slice(count, None))

    def gather_positions(self, index: torch.Tensor) -> None:
        """Replace every layer's positions with `index` [B, L'] (new position j of row b = old position index[b, j])."""
        for layer in self._live():
            layer.keys = take_positions(layer.keys, index)
            layer.values = take_positions(layer.values, index)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` [R] (indices) of every layer."""
        for layer in self._live():
            rows = rows.to(layer.keys.device)
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)


class FeatureStore:
    """Per-position vectors [R, L, H] of the buffer's columns (a target's features for a draft head), with the
    surgery of `DynamicKVCache` (positions along dim 1)."""

    def __init__(self):
        self.values: torch.Tensor | None = None

    def append(self, values: torch.Tensor) -> None:
        """Add the vectors [R, n, H] of n newly fed positions."""
        self.values = values if self.values is None else torch.cat([self.values, values], dim=1)

    def set_length(self, length: int) -> None:
        if self.values is not None:
            self.values = self.values[:, :length]

    def drop_leading(self, count: int) -> None:
        if self.values is not None:
            self.values = self.values[:, count:]

    def gather_positions(self, index: torch.Tensor) -> None:
        if self.values is not None:
            index = index.to(self.values.device)
            self.values = self.values.gather(1, index[:, :, None].expand(-1, -1, self.values.shape[-1]))

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.values is not None:
            self.values = self.values.index_select(0, rows.to(self.values.device))


def take_positions(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Key or value states [B, H, L, D] at positions `index` [B, L'] of each row: [B, H, L', D]."""
    index = index.to(states.device)  # a device-mapped model's layers may sit on other devices than the buffer
    return states.gather(2, index[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1]))


def right_align_index(length: int, shift: torch.Tensor) -> torch.Tensor:
    """Index [B, length] that moves row b right by shift[b] >= 0 (its first shift[b] columns repeat column 0).

    Used with `gather_positions` and `torch.gather` on tokens and attention masks; the repeated columns are
    masked out by the caller's attention mask.
    """
    cols = torch.arange(length, device=shift.device)
    return (cols[None, :] - shift[:, None]).clamp_min(0)
