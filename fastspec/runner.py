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
from transformers import DynamicCache

from fastspec import cache as kv

__all__ = ["CachedModel", "KeptPositions"]


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


class CachedModel:
    """A model plus its DynamicCache, fed incrementally from the shared right-aligned token buffer."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = DynamicCache()  # plain layers: sliding-window layers could not be cropped
        self.cached = 0  # buffer columns [0, cached) are in the cache, for every row
        # transformers renamed `past_key_values` to `cache` (5.2x); the GPU image's 5.17 knows only the old name
        self.cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

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
        positions = (full_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -new.shape[1] :]
        out = self.model(
            input_ids=new,
            attention_mask=full_mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=num_logits,
            **{self.cache_arg: self.cache},
        )
        self.cached = kv.cache_length(self.cache)
        return out.logits[:, -num_logits:]

    @torch.no_grad()
    def forward_tree(self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Feed token-tree nodes after the cache; return logits [R, N, V] at every node.

        Args:
            tokens: [R, N] node tokens, fed after the `cached` columns.
            mask: [R, 1, N, cached + N] additive float mask in the model's dtype (`fastspec.kernels.tree_mask`);
                transformers hands a 4D mask to eager and SDPA attention as-is.
            position_ids: [R, N] real prefix length + depth (GPT-2's absolute positions and rotary ones alike).
        """
        out = self.model(
            input_ids=tokens,
            attention_mask=mask,
            position_ids=position_ids,
            use_cache=True,
            logits_to_keep=tokens.shape[1],
            **{self.cache_arg: self.cache},
        )
        self.cached = kv.cache_length(self.cache)  # tree entries count until `keep` compacts them
        return out.logits[:, -tokens.shape[1] :]

    def keep(self, kept: KeptPositions, shift: torch.Tensor, shifted: bool) -> None:
        """Compact after verification: each row keeps positions [0, prefix_len) and its accepted entries, moved right
        by `shift` [R] (the buffer's right-alignment). The new coverage is the smallest row's kept length plus shift.

        Contiguous entries (a chain's accepted drafts) beyond what this model has cached are not there yet and are
        fed at its next forward; when every shift is 0 (`shifted` False) that is a crop, else one gather per layer.
        """
        if kept.positions is None:
            valid = (kept.prefix_len + kept.num_kept).clamp(max=self.cached)
            self.cached = int((valid + shift).min())
            if shifted:
                kv.gather_positions(self.cache, kv.right_align_index(self.cached, shift))
            else:
                kv.crop(self.cache, self.cached)
            return
        prefix_len, positions = kept.prefix_len, kept.positions
        self.cached = int((prefix_len + kept.num_kept + shift).min())
        col = torch.arange(self.cached, device=shift.device)[None, :] - shift[:, None]  # unshifted column
        if positions.shape[1] == 0:
            positions = col.new_zeros(col.shape[0], 1)
        tail = positions.clamp_min(0).gather(1, (col - prefix_len).clamp(0, positions.shape[1] - 1))
        kv.gather_positions(self.cache, torch.where(col < prefix_len, col.clamp_min(0), tail))

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` [R'] of the cache."""
        kv.select_rows(self.cache, rows)

    def drop_leading(self, columns: int) -> None:
        """The buffer lost its first `columns` columns (padding in every row): drop their cache entries."""
        dropped = min(columns, self.cached)
        kv.drop_leading(self.cache, dropped)
        self.cached -= dropped
