"""`StaticKVCache`: a preallocated KV cache whose crop, realignment, row selection and compaction are index updates.

Every layer holds keys and values in one buffer [B, H, C, D] allocated at the first forward (C = the call's
capacity: prompt + max_new_tokens + the widest step). A forward writes its new entries at positions
[length, length + n) with `index_copy_` and attention reads the whole buffer: the caller passes a 4D additive
mask over all C columns (`fastspec.runner.additive_mask`), so entries past `length`, stale or never written, are masked.
Nothing grows by concatenation, so memory is flat after the prefill, and a forward's shapes depend only on (rows,
new tokens), never on the context length: what `torch.compile` and CUDA graphs need. `length` lives in a
0-dim device tensor (a static address, as in HF's StaticCache), so moving it does not recompile anything.

Surgery (what `fastspec.cache` does to a DynamicCache by slicing and concatenation):
- crop: move `length` (stale entries are overwritten by the next forward);
- gather (per-row realignment, tree compaction): gather the first L' positions into place;
- select rows: move the kept rows to the front of the buffer; the live batch is a view of the first R rows;
- drop leading columns: shift the live positions left in place.
"""

from __future__ import annotations

import torch
from transformers import DynamicLayer
from transformers.cache_utils import Cache

from fastspec.cache import take_positions

__all__ = ["StaticKVCache"]


class StaticKVLayer(DynamicLayer):
    """One layer of `StaticKVCache` (a DynamicLayer subclass, so transformers treats it as a plain full-attention
    layer). `keys` / `values` are views [R, H, C, D] of the first R rows of the preallocated buffers."""

    is_compileable = True

    def __init__(self, capacity: int, length: torch.Tensor):
        super().__init__()
        self.capacity = capacity
        self.length = length  # 0-dim int64 tensor shared by every layer of the cache
        self.key_store = self.value_store = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, _ = key_states.shape
        self.key_store = key_states.new_zeros(batch, heads, self.capacity, key_states.shape[-1])
        self.value_store = value_states.new_zeros(batch, heads, self.capacity, value_states.shape[-1])
        self.keys, self.values = self.key_store, self.value_store
        self.device = key_states.device
        if self.device.type == "cuda":  # fixed addresses: CUDA graphs replay in place
            torch._dynamo.mark_static_address(self.key_store)
            torch._dynamo.mark_static_address(self.value_store)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write n new entries [R, H, n, D] at [length, length + n); return the whole buffers [R, H, C, D]."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        positions = torch.arange(key_states.shape[-2], device=key_states.device) + self.length
        self.keys.index_copy_(2, positions, key_states)
        self.values.index_copy_(2, positions, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return int(self.length) if self.is_initialized else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_max_length(self) -> int:
        return self.capacity


class StaticKVCache(Cache):
    """A transformers `Cache` of `StaticKVLayer`s with capacity C positions per row; `length` positions are live.

    Args:
        num_layers: the model's decoder layers; capacity: C.
    """

    def __init__(self, num_layers: int, capacity: int, device: torch.device | str = "cpu"):
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.host_length = 0  # the same, on the host (never read back from the device)
        self.capacity = capacity
        super().__init__(layers=[StaticKVLayer(capacity, self.length) for _ in range(num_layers)])

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.host_length

    def check_room(self, new: int) -> None:
        """RuntimeError unless a forward of `new` entries per row (padding included) fits after the live ones."""
        if self.host_length + new > self.capacity:
            raise RuntimeError(
                f"static KV cache: {self.host_length + new} positions exceed its capacity {self.capacity}"
            )

    def advance(self, new: int) -> None:
        """The forward just written `new` entries per row: they are live now."""
        self.set_length(self.host_length + new)

    def set_length(self, length: int) -> None:
        """Live positions [0, length) (a crop when shorter)."""
        if length > self.capacity:
            raise RuntimeError(f"StaticKVCache: {length} positions exceed the capacity of {self.capacity}")
        self.host_length = length
        self.length.fill_(length)

    def _live(self):
        return [layer for layer in self.layers if layer.is_initialized]

    def gather_positions(self, index: torch.Tensor) -> None:
        """Live positions become `index` [R, L'] (new position j of row b = old position index[b, j])."""
        length = index.shape[1]
        for layer in self._live():
            for states in (layer.keys, layer.values):
                states[:, :, :length].copy_(take_positions(states, index))
        self.set_length(length)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows `rows` [R'] (ascending): moved to the front, the live batch is the first R' rows."""
        for layer in self._live():
            layer.key_store[: rows.numel()] = layer.keys.index_select(0, rows)
            layer.value_store[: rows.numel()] = layer.values.index_select(0, rows)
            layer.keys, layer.values = layer.key_store[: rows.numel()], layer.value_store[: rows.numel()]

    def drop_leading(self, count: int) -> None:
        """Drop the first `count` live positions of every row (the rest move left)."""
        live = self.host_length
        for layer in self._live():
            for states in (layer.keys, layer.values):
                states[:, :, : live - count] = states[:, :, count:live].clone()
        self.set_length(live - count)
