"""Ready-made attention masks that honour each layer's own attention kind: full, sliding window, chunked.

transformers builds one mask per layer kind from a 2D padding mask (`masking_utils`: `create_causal_mask`,
`create_sliding_window_causal_mask`, `create_chunked_causal_mask`), but a 4D mask it takes as-is, for every layer
(glossary: docs/glossary.md). fastspec hands models a 4D mask wherever the 2D form cannot say what it needs: tree
nodes (a node sees its ancestors, not every earlier column) and the static cache (attention over the whole capacity,
stale entries masked). Those masks are built here per layer kind, from *positions*, not columns:
- full attention: the visibility as given (causal or tree, padding masked);
- sliding window W: also `q_pos - k_pos < W` (transformers' `sliding_window_overlay`, `kv_idx > q_idx - W`);
- chunked attention C: also `q_pos // C == k_pos // C` (`chunked_overlay`, which subtracts the row's left padding:
  the same as comparing positions).
Positions rather than columns: a tree node at column root + i sits at position prefix + depth, and a row's real
tokens sit left-padded; for a chain over a right-aligned buffer the two rules agree, which the tests check against
transformers' own masks.

A model with one kind takes one 4D mask; a model with several takes a dict keyed by `config.layer_types` where its
forward accepts one (Gemma 2/3, gpt-oss, Cohere 2, ...: "It may already have been prepared by e.g. `generate`");
`AttentionKinds.unsupported` says why any other model cannot take a ready-made mask (it is then refused by name
for trees and the static cache, `fastspec.support`).
"""

from __future__ import annotations

import inspect
import re

import torch

__all__ = ["ATTENTION_KINDS", "AttentionKinds"]

ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention")  # the kinds masks are built for


class AttentionKinds:
    """The attention kinds of a causal LM's layers and how its forward takes a ready-made 4D mask.

    Args:
        model: an HF causal LM.

    Attributes:
        layer_types: the kind of every decoder layer (`config.layer_types`, else inferred as transformers infers
            it: `sliding_window` set -> every layer sliding, `attention_chunk_size` set -> chunked, else full).
        kinds: the distinct kinds, in first-layer order.
        window, chunk: the sliding window and the chunk size (None where the model has no such layer).
        takes_dict: its forward takes a dict of masks keyed by layer kind.
        unsupported: why a ready-made mask cannot be right for this model (None when it can).
    """

    def __init__(self, model: torch.nn.Module):
        config = model.config.get_text_config()
        self.model_type = getattr(config, "model_type", type(model).__name__)
        layer_types = getattr(config, "layer_types", None)
        if layer_types is None:
            if getattr(config, "sliding_window", None) is not None:
                layer = "sliding_attention"
            elif getattr(config, "attention_chunk_size", None) is not None:
                layer = "chunked_attention"
            else:
                layer = "full_attention"
            layer_types = [layer] * config.num_hidden_layers
        self.layer_types = list(layer_types)
        self.kinds = list(dict.fromkeys(self.layer_types))
        self.window = getattr(config, "sliding_window", None) if "sliding_attention" in self.kinds else None
        self.chunk = getattr(config, "attention_chunk_size", None) if "chunked_attention" in self.kinds else None
        self.takes_dict = _forward_takes_mask_dict(model) if len(self.kinds) > 1 else False
        self.unsupported = self._why_unsupported()

    @property
    def plain(self) -> bool:
        """Every layer is full causal attention: the visibility is the mask, no positions needed."""
        return self.kinds == ["full_attention"]

    def _why_unsupported(self) -> str | None:
        other = [kind for kind in self.kinds if kind not in ATTENTION_KINDS]
        if other:
            return f"its layers of kind {', '.join(other)} take no ready-made attention mask fastspec can build"
        if "sliding_attention" in self.kinds and not isinstance(self.window, int):
            return "it has sliding-window layers but no integer `sliding_window` in its config"
        if "chunked_attention" in self.kinds and not isinstance(self.chunk, int):
            return "it has chunked-attention layers but no integer `attention_chunk_size` in its config"
        if len(self.kinds) > 1 and not self.takes_dict:
            return f"it mixes {' and '.join(self.kinds)} layers but its forward takes one mask for all of them"
        return None

    def masks(self, visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor | None, dtype: torch.dtype,
              length: int | None = None) -> torch.Tensor | dict[str, torch.Tensor]:  # fmt: skip
        """The additive 4D mask(s) to hand the model.

        Args:
            visible: [R, n, L] bool, which key columns each new position may see (causal or tree, padding masked).
            q_pos: [R, n] positions of the new tokens.
            k_pos: [R, L] positions of the key columns (any value where `visible` is False); None for a plain model.
            dtype: the model's float dtype.
            length: key columns of the mask (>= L; columns past L are masked: a static cache's capacity).

        Returns:
            [R, 1, n, length] additive mask (0 attend, dtype's min masked) for a model with one kind, else a dict
            {layer kind: that mask}.
        """
        if self.unsupported is not None:
            raise ValueError(f"{self.model_type}: a ready-made attention mask cannot be right: {self.unsupported}")
        masks = {kind: additive_mask(self._visible(kind, visible, q_pos, k_pos), dtype, length) for kind in self.kinds}
        return masks if self.takes_dict else masks[self.kinds[0]]

    def _visible(self, kind: str, visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor | None):
        if kind == "full_attention":
            return visible
        distance_ok = None
        if kind == "sliding_attention":
            distance_ok = q_pos[:, :, None] - k_pos[:, None, :] < self.window
        elif kind == "chunked_attention":
            distance_ok = q_pos[:, :, None] // self.chunk == k_pos[:, None, :] // self.chunk
        return visible & distance_ok


def additive_mask(visible: torch.Tensor, dtype: torch.dtype, length: int | None = None) -> torch.Tensor:
    """Additive 4D attention mask [R, 1, n, length] (0 = attend, dtype's min = masked) from `visible` [R, n, L]
    (L <= length, default L); positions >= L are masked (a `StaticKVCache` attends over its whole capacity)."""
    rows, new, seen = visible.shape
    allowed = torch.nn.functional.pad(visible, (0, (length or seen) - seen), value=False)
    mask = torch.zeros(rows, 1, new, length or seen, dtype=dtype, device=visible.device)
    return mask.masked_fill(~allowed[:, None], torch.finfo(dtype).min)


def _forward_takes_mask_dict(model: torch.nn.Module) -> bool:
    """Whether the model's decoder (the module that holds its decoder layers) accepts a dict of masks keyed by
    layer kind: transformers' models that do test `isinstance(attention_mask, dict)` before building their own.
    Asked once per model class (`_DICT_TAKERS`)."""
    if type(model) not in _DICT_TAKERS:
        _DICT_TAKERS[type(model)] = _decoder_takes_mask_dict(model)
    return _DICT_TAKERS[type(model)]


_DICT_TAKERS: dict[type, bool] = {}


def _decoder_takes_mask_dict(model: torch.nn.Module) -> bool:
    count = model.config.get_text_config().num_hidden_layers
    for module in model.modules():
        children = list(module.children())
        if any(isinstance(child, torch.nn.ModuleList) and len(child) == count for child in children):
            try:
                source = inspect.getsource(type(module).forward)
            except (OSError, TypeError):
                return False
            return re.search(r"isinstance\([^()]*attention_mask\s*,\s*dict\)", source) is not None
    return False
