"""KV-cache surgery on Hugging Face `DynamicCache` objects: crop, per-row realignment, row selection, compaction.

Every function edits the key/value tensors of each layer ([B, H, L, D]) with one tensor op per layer, never a
Python loop over tokens. Rows that disagree on how many tokens they accepted are realigned to the right
(left padding grows), so every row's newest entry sits at the same column and the cache keeps one length.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

__all__ = [
    "cache_length",
    "check_cache",
    "crop",
    "drop_leading",
    "gather_positions",
    "right_align_index",
    "select_rows",
]


def check_cache(cache) -> None:
    """Raise TypeError unless `cache` is a DynamicCache whose layers fastspec can edit (no sliding window)."""
    if not isinstance(cache, DynamicCache):
        raise TypeError(f"past_key_values: fastspec edits DynamicCache objects, got {type(cache).__name__}")
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise TypeError("past_key_values: sliding-window cache layers cannot be cropped losslessly")


def cache_length(cache) -> int:
    """Number of positions held (the same for every layer and row)."""
    return cache.get_seq_length()


def _layers(cache):
    return [layer for layer in cache.layers if getattr(layer, "is_initialized", True) and layer.keys is not None]


def _keep_positions(cache, positions: slice) -> None:
    """Keep `positions` of every layer (no copy: a view)."""
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, positions]
        layer.values = layer.values[:, :, positions]


def crop(cache, length: int) -> None:
    """Keep the first `length` positions of every layer (no copy: a view)."""
    _keep_positions(cache, slice(None, length))


def drop_leading(cache, count: int) -> None:
    """Drop the first `count` positions of every layer (no copy: a view)."""
    _keep_positions(cache, slice(count, None))


def gather_positions(cache, index: torch.Tensor) -> None:
    """Replace every layer's positions with `index` [B, L'] (new position j of row b = old position index[b, j])."""

    def take(states: torch.Tensor) -> torch.Tensor:
        return states.gather(2, index[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1]))

    for layer in _layers(cache):
        layer.keys = take(layer.keys)
        layer.values = take(layer.values)


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only batch rows `rows` [R] (indices) of every layer."""
    for layer in _layers(cache):
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)


def right_align_index(length: int, shift: torch.Tensor) -> torch.Tensor:
    """Index [B, length] that moves row b right by shift[b] >= 0 (its first shift[b] columns repeat column 0).

    Used with `gather_positions` and `torch.gather` on tokens and attention masks; the repeated columns are
    masked out by the caller's attention mask.
    """
    cols = torch.arange(length, device=shift.device)
    return (cols[None, :] - shift[:, None]).clamp_min(0)
