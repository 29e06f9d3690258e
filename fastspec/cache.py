"""`DynamicKVCache`: a Hugging Face `DynamicCache` with crop, per-row realignment, row selection and compaction.

Every method edits each layer with one tensor op per stored tensor, never a Python loop over tokens
(`fastspec.static_cache.StaticKVCache` does the same in preallocated buffers). Rows that disagree on how many tokens
they accepted are realigned to the right (left padding grows), so every row's newest entry sits at the same column
and the cache keeps one length. What each layer holds (`fastspec.cache_kinds` builds one per decoder layer from the
model's config):
- attention (any kind) and the attention half of hybrid layers: keys / values [B, H, L, D], positions along dim 2;
- indexed attention (`DynamicIndexedLayer`): the same, plus the indexer's keys [B, L, D] (and, for some models,
  their position ids [P, B, L]);
- recurrent / conv state (`fastspec.state_cache.RecurrentStateLayer`): no positions; a realignment gives each row
  the state after its newest kept column, which only a contiguous keep can (a chain's: checked, a tree path is not);
- dummy layers: nothing.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

__all__ = ["DynamicKVCache", "FeatureStore", "right_align_index", "take_positions"]


class DynamicKVCache(DynamicCache):
    """A transformers DynamicCache (growing by concatenation) with the surgery `CachedModel` applies after a step.

    The same methods as `fastspec.static_cache.StaticKVCache`, so `CachedModel` edits either without asking which.

    Args:
        config: the model's config: one layer per decoder layer of the kind it needs (`fastspec.cache_kinds`);
            None, or a model whose layers are all attention, gets transformers' config-less layers (plain
            `DynamicLayer`s created as the model first writes them).
    """

    def __init__(self, config=None):
        super().__init__()
        layers = None
        if config is not None:
            from fastspec.cache_kinds import cache_layers

            layers = cache_layers(config)
        if layers is not None:
            self.layers = layers
            self.layer_class_to_replicate = None
        self._recurrent = [layer for layer in self.layers if hasattr(layer, "keep")]  # RecurrentStateLayer
        if self._recurrent:
            self.recording = self._recurrent[0].recording
            for layer in self._recurrent:
                layer.recording = self.recording

    @property
    def has_state(self) -> bool:
        """Whether some layer keeps recurrent / conv state (`fastspec.state_cache`)."""
        return bool(self._recurrent)

    def record_states(self, positions: int | None) -> None:
        """The next forward's recurrent layers keep the states after its last `positions` positions (None: all):
        the only ones a compaction may give a row back (`fastspec.state_cache`)."""
        if self._recurrent:
            self.recording.positions = positions

    def _live(self):
        return [layer for layer in self.layers if getattr(layer, "keys", None) is not None]

    def _indexed(self):
        return [layer for layer in self.layers if getattr(layer, "indexer_keys", None) is not None]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions cached (every layer that counts positions agrees; dummy layers count none, so the first
        layer that does answers for them)."""
        layers = self.layers[layer_idx:] + self.layers[:layer_idx]
        for layer in layers:
            if hasattr(layer, "get_seq_length"):
                return int(layer.get_seq_length())
        return 0

    def _slice_positions(self, positions: slice) -> None:
        for layer in self._live():
            layer.keys = layer.keys[:, :, positions]
            layer.values = layer.values[:, :, positions]
        for layer in self._indexed():
            layer.indexer_keys = layer.indexer_keys[:, positions]
            if layer.indexer_position_ids is not None:
                layer.indexer_position_ids = layer.indexer_position_ids[..., positions]

    def set_length(self, length: int) -> None:
        """Keep the first `length` positions of every layer (a crop; no copy: a view). Recurrent layers go back to
        the state after column length - 1."""
        for layer in self._recurrent:
            layer.keep(torch.full((_rows(layer),), length - 1), length)
        self._slice_positions(slice(None, length))

    def drop_leading(self, count: int) -> None:
        """Drop the first `count` positions of every layer (no copy: a view)."""
        for layer in self._recurrent:
            layer.drop_leading(count)
        self._slice_positions(slice(count, None))

    def gather_positions(self, index: torch.Tensor) -> None:
        """Replace every layer's positions with `index` [B, L'] (new position j of row b = old position index[b, j]).
        Recurrent layers take row b's state after column index[b, L' - 1]: RuntimeError unless each row's kept
        columns are the ones it fed, in order (its leading repeats of column index[b, 0] are left padding)."""
        for layer in self._live():
            layer.keys = take_positions(layer.keys, index)
            layer.values = take_positions(layer.values, index)
        for layer in self._indexed():
            keys, rows = layer.indexer_keys, index.to(layer.indexer_keys.device)
            layer.indexer_keys = keys.gather(1, rows[:, :, None].expand(-1, -1, keys.shape[-1]))
            if layer.indexer_position_ids is not None:
                ids = layer.indexer_position_ids
                layer.indexer_position_ids = ids.gather(-1, rows.to(ids.device)[None].expand(ids.shape[0], -1, -1))
        if self._recurrent:
            step = index[:, 1:] - index[:, :-1]
            contiguous = (step == 1) | ((step == 0) & (index[:, 1:] == index[:, :1]))
            if not bool(contiguous.all()):
                raise RuntimeError("recurrent state: a row keeps columns other than the ones it fed, in order")
            last = index[:, -1].cpu()
            for layer in self._recurrent:
                layer.keep(last, index.shape[1])

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` [R] (indices) of every layer."""
        for layer in self._live():
            rows = rows.to(layer.keys.device)
            layer.keys = layer.keys.index_select(0, rows)
            layer.values = layer.values.index_select(0, rows)
        for layer in self._indexed():
            layer.indexer_keys = layer.indexer_keys.index_select(0, rows.to(layer.indexer_keys.device))
            if layer.indexer_position_ids is not None:
                ids = layer.indexer_position_ids
                layer.indexer_position_ids = ids.index_select(1, rows.to(ids.device))
        for layer in self._recurrent:
            layer.select_rows(rows)


def _rows(layer) -> int:
    """Batch rows a recurrent layer holds (0 before its first forward)."""
    return layer.batch_size


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
