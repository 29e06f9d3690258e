"""`CachedModel`: one HF causal LM, its KV cache, and how many columns of the shared token buffer it has seen.

The decoding loop keeps every active row right-aligned in one token buffer [R, S] with an attention mask
[R, S] (left padding). A model's cache covers the first `cached` columns of that buffer for every row, so a
forward feeds columns [cached, S) plus any extra (draft) tokens, with position ids derived from the mask
(cumsum - 1), which is what HF generate does for left-padded batches; absolute-position models (GPT-2) and
rotary ones (Llama, Qwen2, Mistral) are both correct because the cached keys already carry their positions.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import torch

from fastspec.cache import DynamicKVCache, FeatureStore, right_align_index
from fastspec.compiled import CompiledForward
from fastspec.heads import target_logits_and_features
from fastspec.static_cache import StaticKVCache

__all__ = [
    "BufferCache",
    "CachedModel",
    "KeptPositions",
    "additive_mask",
    "causal_visibility",
    "position_ids",
    "repeat_last",
]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position of every column of left-padded rows, mask [R, L] -> [R, L] (real tokens before it; padding 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def causal_visibility(mask: torch.Tensor, start: int) -> torch.Tensor:
    """[R, L - start, L] bool: new token i (column start + i) sees the real columns (mask [R, L]) up to itself."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    return mask.bool()[:, None, :] & (cols[None, :] <= cols[start:, None])[None]


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, length: int | None = None) -> torch.Tensor:
    """Additive 4D attention mask [R, 1, n, length] (0 = attend, dtype's min = masked) from `visible` [R, n, L]
    (L <= length, default L); positions >= L are masked (a `StaticKVCache` attends over its whole capacity)."""
    rows, new, seen = visible.shape
    allowed = torch.nn.functional.pad(visible, (0, (length or seen) - seen), value=False)
    mask = torch.zeros(rows, 1, new, length or seen, dtype=dtype, device=visible.device)
    return mask.masked_fill(~allowed[:, None], torch.finfo(dtype).min)


def repeat_last(x: torch.Tensor, count: int, dim: int = 1) -> torch.Tensor:
    """`x` with its last entry along `dim` repeated `count` more times: how a step of n new positions is padded to
    a compiled width (the copies are written past the live cache entries, masked, and overwritten later)."""
    last = x.narrow(dim, x.shape[dim] - 1, 1)
    return torch.cat([x, last.expand(*(count if d == dim else -1 for d in range(x.dim())))], dim=dim)


class KeptPositions(NamedTuple):
    """The cache entries each row keeps after a verification: positions [0, prefix_len), then its accepted ones.

    prefix_len: leading positions every row keeps (the buffer before the step's new entries).
    num_kept: [R] accepted entries each row keeps after the prefix.
    positions: [R, M] cache positions of those entries in path order (a tree's accepted nodes; padding ignored), or
        None when they are the contiguous positions prefix_len, prefix_len + 1, ... (a chain's accepted drafts).
    """

    prefix_len: int
    num_kept: torch.Tensor
    positions: torch.Tensor | None = None


class BufferCache:
    """Stores that cover buffer columns [0, cached) of every row (a KV cache, the target's features), and the
    surgery `RowBatch` applies to all of them after a step: compaction, row selection, dropped leading columns.

    Every store has `set_length`, `gather_positions`, `select_rows` and `drop_leading` (`DynamicKVCache`,
    `StaticKVCache`, `FeatureStore`).
    """

    def __init__(self, stores: list):
        self.stores = stores
        self.cached = 0  # buffer columns [0, cached) are in every store, for every row

    def keep(self, kept: KeptPositions, shift: torch.Tensor, shifted: bool) -> None:
        """Compact after verification: each row keeps positions [0, prefix_len) and its accepted entries, moved right
        by `shift` [R] (the buffer's right-alignment). The new coverage is the smallest row's kept length plus shift.

        Contiguous entries (a chain's accepted drafts) beyond what is cached are not there yet and are fed at the
        next forward; when every shift is 0 (`shifted` False) that is a crop, else one gather per layer.
        """
        if kept.positions is None:
            valid = (kept.prefix_len + kept.num_kept).clamp(max=self.cached)
            self.cached = int((valid + shift).min())
            for store in self.stores:
                if shifted:
                    store.gather_positions(right_align_index(self.cached, shift))
                else:
                    store.set_length(self.cached)
            return
        prefix_len, positions = kept.prefix_len, kept.positions
        self.cached = int((prefix_len + kept.num_kept + shift).min())
        col = torch.arange(self.cached, device=shift.device)[None, :] - shift[:, None]  # unshifted column
        if positions.shape[1] == 0:
            positions = col.new_zeros(col.shape[0], 1)
        tail = positions.clamp_min(0).gather(1, (col - prefix_len).clamp(0, positions.shape[1] - 1))
        index = torch.where(col < prefix_len, col.clamp_min(0), tail)
        for store in self.stores:
            store.gather_positions(index)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` [R'] of every store."""
        for store in self.stores:
            store.select_rows(rows)

    def drop_leading(self, columns: int) -> None:
        """The buffer lost its first `columns` columns (padding in every row): drop their entries."""
        dropped = min(columns, self.cached)
        for store in self.stores:
            store.drop_leading(dropped)
        self.cached -= dropped


class CachedModel(BufferCache):
    """A model plus its KV cache, fed incrementally from the shared right-aligned token buffer.

    Args:
        model: HF causal LM.
        capacity: None for a growing `DynamicKVCache`; else positions per row of a preallocated `StaticKVCache`
            (module docstring of `fastspec.static_cache`), which every forward attends over in full.
        compile: name the model in log lines and compile its fixed-width steps over the static cache
            (`fastspec.compiled.CompiledForward`); None runs eagerly.
        features: None, or the hidden states a draft head reads (its `feature_layers`; [-1] = the last hidden
            state, the input of the lm_head; `fastspec.heads.target_logits_and_features`): keep them for each fed
            position in `self.features` (a `FeatureStore`) for the same columns as the cache.
    """

    def __init__(self, model: torch.nn.Module, capacity: int | None = None, compile: str | None = None,  # noqa: A002
                 features: list[int] | None = None):  # fmt: skip
        self.model = model
        self.capacity = capacity
        if capacity is None:
            self.cache = DynamicKVCache()  # plain layers: sliding-window layers could not be cropped
        else:
            num_layers = model.config.get_text_config().num_hidden_layers
            self.cache = StaticKVCache(num_layers, capacity, next(model.parameters()).device)
        self.features = None if features is None else FeatureStore()
        super().__init__([self.cache] if self.features is None else [self.cache, self.features])
        self.step = _logits_step(model) if features is None else _logits_and_features_step(model, features)
        # transformers renamed `past_key_values` to `cache` (5.2x); the GPU image's 5.17 knows only the old name
        called = model if features is None else model.base_model
        self.cache_arg = "cache" if "cache" in inspect.signature(called.forward).parameters else "past_key_values"
        key = "logits" if features is None else f"logits_and_features{tuple(features)}"
        self.compiled = None if compile is None else CompiledForward(model, compile, self.step, key)
        self.dtype = next(model.parameters()).dtype

    @torch.no_grad()
    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, extra: torch.Tensor | None = None, num_logits: int = 1
    ) -> torch.Tensor:
        """Feed the not-yet-cached part of buffer + `extra`; return logits [R, num_logits, V] of the last positions.

        Args:
            tokens: [R, S] right-aligned token buffer (pad columns hold any valid id).
            mask: [R, S] 1 for real tokens, 0 for left padding.
            extra: [R, E] tokens that follow the buffer (drafts), all real; those already cached are skipped.
            num_logits: how many trailing positions' logits to return.
        """
        full_mask = mask
        if extra is not None and extra.shape[1] > 0:
            tokens = torch.cat([tokens, extra], dim=1)
            full_mask = torch.cat([mask, torch.ones_like(extra, dtype=mask.dtype)], dim=1)
        new = tokens[:, self.cached :]
        positions = position_ids(full_mask)[:, self.cached :]
        if self.capacity is None:
            return self._run(new, full_mask, positions, num_logits)
        return self._run_static(new, causal_visibility(full_mask, self.cached), positions, num_logits)

    @torch.no_grad()
    def forward_tree(self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Feed token-tree nodes after the cache; return logits [R, N, V] at every node.

        Args:
            tokens: [R, N] node tokens, fed after the `cached` columns.
            mask: [R, 1, N, cached + N] additive float mask in the model's dtype (`fastspec.kernels.tree_mask`);
                transformers hands a 4D mask to eager and SDPA attention as-is.
            position_ids: [R, N] real prefix length + depth (GPT-2's absolute positions and rotary ones alike).
        """
        num = tokens.shape[1]
        if self.capacity is None:
            return self._run(tokens, mask, position_ids, num)
        return self._run_static(tokens, mask[:, 0] == 0, position_ids, num)

    def _run(self, new: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, num_logits: int) -> torch.Tensor:
        """One forward over the dynamic cache (the mask covers cache + new columns)."""
        logits, features = self.step(input_ids=new, attention_mask=mask, position_ids=positions, use_cache=True,
                                     num_logits=num_logits, **{self.cache_arg: self.cache})  # fmt: skip
        if self.features is not None:
            self.features.append(features)
        self.cached = self.cache.get_seq_length()  # tree entries count until `keep` compacts them
        return logits[:, -num_logits:]

    def _run_static(self, new: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor, num_logits: int):
        """One forward over the static cache: `visible` [R, n, cached + n] says which positions each new token
        attends to. A compiled forward (any but the prefill) pads n to its width (`CompiledForward.width`): the
        padded tokens are written past the live entries, masked, and overwritten by the next forward."""
        num = new.shape[1]
        compiled = self.compiled if self.cached > 0 else None  # the prefill (one shape per prompt) runs eagerly
        width = num if compiled is None else compiled.width(num)
        self.cache.check_room(width)
        if width > num:
            new = torch.nn.functional.pad(new, (0, width - num))
            positions, visible = repeat_last(positions, width - num), repeat_last(visible, width - num)
        mask = additive_mask(visible, self.dtype, self.capacity)
        # fresh inputs: a compiled graph guards on strides, and a slice of the buffer has the buffer's (even [R, 1])
        new = new.clone(memory_format=torch.contiguous_format)
        positions = positions.clone(memory_format=torch.contiguous_format)
        inputs = dict(input_ids=new, attention_mask=mask, position_ids=positions, use_cache=True, num_logits=width)
        inputs[self.cache_arg] = self.cache
        logits, features = self.step(**inputs) if compiled is None else compiled(inputs)
        if self.features is not None:
            self.features.append(features[:, :num])
        self.cache.advance(num)
        self.cached = self.cache.get_seq_length()
        return logits[:, num - num_logits : num]


def _logits_step(model: torch.nn.Module):
    """`step(num_logits, **inputs) -> (logits [R, num_logits, V], None)`: the model's forward."""

    def step(num_logits: int, **inputs):
        return model(**inputs, logits_to_keep=num_logits).logits, None

    return step


def _logits_and_features_step(model: torch.nn.Module, feature_layers: list[int]):
    """`step(num_logits, **inputs) -> (logits [R, num_logits, V], features [R, n, len(feature_layers) * H])` in one
    pass."""
    layers = tuple(feature_layers)

    def step(num_logits: int, **inputs):
        return target_logits_and_features(model, num_logits, layers, **inputs)

    return step
