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

Buffers come from a `KVBufferPool` (`StaticKVCache.pooled`, what the runners use): a cache leases its buffers for
its lifetime and they go back to the pool when it is garbage-collected, so the next `generate` call with the same
shapes decodes in the same memory. On CUDA that keeps the addresses the compiled steps' CUDA graphs were recorded
with (a new address re-records the graph). A buffer is leased to one live cache at a time (the target's and the
draft's caches of one call, or a call running inside another, never share one) and is zeroed when leased again.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

import torch
from transformers import DynamicLayer
from transformers.cache_utils import Cache

from fastspec.cache import take_positions

__all__ = ["CACHE_POOL", "KVBufferPool", "StaticKVCache"]


class KVBufferPool:
    """Reusable KV buffers keyed by (shape, dtype, device), leased to one owner at a time.

    `take` hands out a free buffer of the key (zeroed) or allocates one; the buffer comes back when its owner is
    garbage-collected (the owner never gives it back by hand, so a buffer a live cache still uses cannot be leased
    twice). Free buffers of the `max_keys` most recently used keys are kept; `clear()` drops every free buffer.
    `allocations` counts the buffers allocated so far.

    Args:
        max_keys: keys whose free buffers are kept (one key per distinct layer shape: a target and its draft model
            are two).
    """

    def __init__(self, max_keys: int = 8):
        self.max_keys = max_keys
        self.allocations = 0
        self._free: OrderedDict[tuple, list[torch.Tensor]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, owner: object) -> torch.Tensor:
        """A zeroed buffer of `shape`, `dtype` on `device`, leased to `owner` until it is garbage-collected."""
        key = (tuple(shape), dtype, torch.device(device))
        with self._lock:
            free = self._free.get(key)
            buffer = free.pop() if free else None
        if buffer is None:
            buffer = torch.zeros(shape, dtype=dtype, device=device)
            self.allocations += 1
        else:
            buffer.zero_()
        weakref.finalize(owner, self._give_back, key, buffer).atexit = False
        return buffer

    def _give_back(self, key: tuple, buffer: torch.Tensor) -> None:
        with self._lock:
            self._free.setdefault(key, []).append(buffer)
            self._free.move_to_end(key)
            while len(self._free) > self.max_keys:
                self._free.popitem(last=False)

    def free_buffers(self) -> int:
        """Buffers waiting in the pool."""
        with self._lock:
            return sum(len(free) for free in self._free.values())

    def clear(self) -> None:
        """Drop every free buffer (leased ones come back later, as usual)."""
        with self._lock:
            self._free.clear()


CACHE_POOL = KVBufferPool()  # the runners' caches (`StaticKVCache.pooled`)


class StaticKVLayer(DynamicLayer):
    """One layer of `StaticKVCache` (a DynamicLayer subclass, so transformers treats it as a plain full-attention
    layer). `keys` / `values` are views [R, H, C, D] of the first R rows of the preallocated buffers."""

    is_compileable = True

    def __init__(self, capacity: int, length: torch.Tensor, pool: KVBufferPool | None = None):
        super().__init__()
        self.capacity = capacity
        self.length = length  # 0-dim int64 tensor shared by every layer of the cache
        self.pool = pool
        self.key_store = self.value_store = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, _ = key_states.shape
        self.device = key_states.device

        def store(states: torch.Tensor) -> torch.Tensor:  # leased to this layer while it lives, with a pool
            shape = (batch, heads, self.capacity, states.shape[-1])
            if self.pool is None:
                return states.new_zeros(shape)
            return self.pool.take(shape, states.dtype, self.device, self)

        self.key_store, self.value_store = store(key_states), store(value_states)
        self._bind(batch)
        self.is_initialized = True

    def _bind(self, rows: int) -> None:
        """keys / values: the first `rows` rows of the stores. On CUDA marked static (a fixed address for every
        row count: a captured graph writes into them in place, and a view not marked static would be copied)."""
        self.keys, self.values = self.key_store[:rows], self.value_store[:rows]
        if self.device.type == "cuda":
            for states in (self.key_store, self.value_store, self.keys, self.values):
                torch._dynamo.mark_static_address(states)

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
        pool: where the layers lease their buffers (module docstring); None allocates them for this cache alone.
    """

    def __init__(self, num_layers: int, capacity: int, device: torch.device | str = "cpu",
                 pool: KVBufferPool | None = None):  # fmt: skip
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.host_length = 0  # the same, on the host (never read back from the device)
        self.capacity = capacity
        super().__init__(layers=[StaticKVLayer(capacity, self.length, pool) for _ in range(num_layers)])

    @classmethod
    def pooled(cls, num_layers: int, capacity: int, device: torch.device | str = "cpu") -> StaticKVCache:
        """A cache whose buffers come from the process's `CACHE_POOL`: repeated calls reuse the same memory."""
        return cls(num_layers, capacity, device, CACHE_POOL)

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
            layer._bind(rows.numel())

    def drop_leading(self, count: int) -> None:
        """Drop the first `count` live positions of every row (the rest move left)."""
        live = self.host_length
        for layer in self._live():
            for states in (layer.keys, layer.values):
                states[:, :, : live - count] = states[:, :, count:live].clone()
        self.set_length(live - count)
