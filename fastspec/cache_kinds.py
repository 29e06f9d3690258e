"""The cache layer each decoder layer of a model needs, and the decoding paths its kinds allow.

transformers names every decoder layer's cache kind (`transformers.cache_utils.get_layer_types_and_kwargs`, from
`config.layer_types`): attention ("full_attention", "sliding_attention", "chunked_attention"), indexed sparse
attention ("indexed_attention": keys, values and the indexer's keys), recurrent / convolution state
("linear_attention", "conv"), both ("hybrid", "hybrid_sliding"), and "dummy" (no cache: KV-sharing consumers, MLP-only
layers). fastspec builds one layer per kind (`cache_layers`) that its surgery can crop, realign per row, select rows
of and drop leading columns from (`fastspec.cache.DynamicKVCache`):
- attention of every kind: a plain `DynamicLayer` holding every position (windows are the masks' business: fastspec
  gathers positions, which a window cache that forgets them could not give back);
- indexed attention: transformers' `DynamicIndexedLayer`;
- recurrent / conv state: `fastspec.state_cache.RecurrentStateLayer` (per-position states, rolled back per row), and
  `RecurrentAttentionLayer` for the hybrid kinds;
- dummy: transformers' `DummyLayer`.

`check_state_paths` refuses, before decoding, by argument, model type and reason, the paths a model's state cannot
follow (`state_refusal`): a token tree (one state per branch would be needed), the static cache and compiled steps
(states are kept per position in growing lists), prompt lookup beside a recurrent draft model in a batch (a row that
drafted by lookup leaves the draft model's state ahead of the columns it must re-read), speculation with a model
whose mixers compute no per-position states in a multi-position forward, and a model whose linear-attention layers
keep their state outside transformers' cache API; and the static cache for indexed attention (its indexer keys).
"""

from __future__ import annotations

import functools
import inspect
import sys

import torch
from transformers.cache_utils import DynamicLayer

from fastspec.masks import ATTENTION_KINDS

__all__ = [
    "STATE_KINDS",
    "cache_layers",
    "check_state_paths",
    "layer_kinds",
    "modeling_source",
    "state_refusal",
    "takes_fed_mask",
]

STATE_KINDS = ("linear_attention", "conv", "hybrid", "hybrid_sliding")  # kinds with recurrent / conv state


def layer_kinds(config) -> list[str]:
    """The cache kind of every decoder layer of a model `config` (its decoder's), as transformers names them."""
    config = config.get_text_config(decoder=True)
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs
    except ImportError:  # older transformers: config.layer_types, else one attention kind for every layer
        kinds = getattr(config, "layer_types", None)
        return list(kinds) if kinds is not None else ["full_attention"] * config.num_hidden_layers
    return list(get_layer_types_and_kwargs(config)[0])


def cache_layers(config) -> list | None:
    """One fastspec cache layer per decoder layer of `config` (module docstring), or None when every layer is
    attention (fastspec's plain cache then creates its layers as transformers' config-less `DynamicCache` does).
    ValueError naming the model type for a kind fastspec cannot roll back."""
    kinds = layer_kinds(config)
    if all(kind in ATTENTION_KINDS for kind in kinds):
        return None
    from transformers.cache_utils import DummyLayer, DynamicIndexedLayer, get_layer_types_and_kwargs

    from fastspec.state_cache import RecurrentAttentionLayer, RecurrentStateLayer

    per_layer = get_layer_types_and_kwargs(config.get_text_config(decoder=True))[1]
    layers = []
    for kind, kwargs in zip(kinds, per_layer, strict=True):
        states = kwargs.get("number_of_states", 1)
        if kind in ATTENTION_KINDS:
            layers.append(DynamicLayer())
        elif kind == "indexed_attention":
            layers.append(DynamicIndexedLayer())
        elif kind in ("linear_attention", "conv"):
            layers.append(RecurrentStateLayer(number_of_states=states))
        elif kind in ("hybrid", "hybrid_sliding"):
            layers.append(RecurrentAttentionLayer(number_of_states=states))
        elif kind == "dummy":
            layers.append(DummyLayer())
        else:
            raise ValueError(
                f"{_model_type(config)}: its cache layers of kind {kind!r} cannot be cropped or realigned per row by "
                "fastspec, so a rejected draft could not be rolled back"
            )
    return layers


def _model_type(config) -> str:
    return getattr(config.get_text_config(decoder=True), "model_type", None) or type(config).__name__


def modeling_source(model: torch.nn.Module) -> str:
    """The source of the module that defines `model`'s class (its modeling file), '' when unreadable."""
    return _module_source(type(model).__module__)


@functools.lru_cache(maxsize=64)
def _module_source(name: str) -> str:
    try:
        return inspect.getsource(sys.modules[name])
    except (OSError, TypeError, KeyError):
        return ""


def state_refusal(model: torch.nn.Module) -> tuple[str, bool] | None:
    """Why `model`'s recurrent / conv state cannot be rolled back (None when it can, or it has none), and whether
    that rules out fastspec altogether (True: fastspec's cache cannot even hold the state) or only speculation."""
    if not _has_state(model):
        return None
    try:
        import fastspec.state_cache  # noqa: F401  (needs transformers' LinearAttentionLayer, 5.2x)
    except ImportError:
        return "this transformers version has no linear-attention cache layers (LinearAttentionLayer)", True
    source = modeling_source(model)
    if "update_conv_state" not in source and "update_recurrent_state" not in source:
        return "its linear-attention layers keep their state outside transformers' cache API, out of fastspec's", True
    if "update_recurrent_state" in source and "get_recurrent_states_to_keep" not in source:
        reason = "its recurrent layers compute no per-position states in a multi-token forward: no rejected draft"
        return f"{reason} can be rolled back", False
    return None


def takes_fed_mask(model: torch.nn.Module) -> bool:
    """Whether `model` keeps recurrent state and its forward applies a 2D padding mask to the fed positions as given,
    without transformers' masking utilities (Mamba, FalconMamba): it must then get the mask of the fed columns only,
    where every other model takes the mask of cache + fed columns."""
    if not _has_state(model):
        return False
    source = modeling_source(model)
    return not any(name in source for name in ("create_recurrent_attention_mask", "create_causal_mask"))


def _has_state(model: torch.nn.Module) -> bool:
    return any(kind in STATE_KINDS for kind in layer_kinds(model.config))


def check_state_paths(target: torch.nn.Module, draft, *, tree, static: bool, prompt_lookup: int | None,
                      rows: int, compiled: bool = False) -> None:  # fmt: skip
    """ValueError naming the argument, the role and model type, and the reason, when `target` or a draft model
    (an HF model as `draft`) keeps recurrent / conv state that the path asked for cannot follow (module docstring),
    or asks a static cache of a model with indexed attention (fastspec's static cache holds keys and values only).

    Args:
        target, draft: the generate call's (a draft that is not an HF causal LM is not checked: heads keep only
            attention caches, a `Drafter` brings its own).
        tree: the call's `tree` (None: chains).
        static: a static cache (`static_cache=True`, or `compile=True`, which `compiled` True names).
        prompt_lookup: the call's n-gram size or None; rows: the batch's rows.
    """
    models = [("target", target)]
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "generation_config") and hasattr(draft, "config"):
        models.append(("draft", draft))
    for role, model in models:
        if static and "indexed_attention" in layer_kinds(model.config):
            raise ValueError(
                f"{'compile' if compiled else 'static_cache'}: the {role} ({_model_type(model.config)}) has indexed "
                "sparse attention layers, whose indexer keys the static cache does not hold; decode with the dynamic "
                "cache"
            )
        if not _has_state(model):
            continue
        kind = f"the {role} ({_model_type(model.config)}) keeps recurrent / convolution state"
        refusal = state_refusal(model)
        if refusal is not None:
            reason, always = refusal
            if always or role == "draft":
                raise ValueError(f"{role if always else 'draft'}: {kind}, and {reason}")
            if draft is not None or prompt_lookup is not None:
                raise ValueError(f"{'draft' if draft is not None else 'prompt_lookup'}: {kind}, and {reason}")
        if tree is not None:
            raise ValueError(
                f"tree: {kind}: a token tree would need one state per branch, which a recurrent layer does not "
                "keep; pass tree=None (chains, prompt lookup and batches decode losslessly)"
            )
        if static:
            argument = "compile" if compiled else "static_cache"
            raise ValueError(
                f"{argument}: {kind}: fastspec keeps its per-position states for rollback in growing lists, which "
                "the static cache and compiled steps do not have; decode with the dynamic cache"
            )
        if role == "draft" and prompt_lookup is not None and rows > 1:
            raise ValueError(
                f"prompt_lookup: {kind}: in a batch, rows that draft by lookup leave the draft model's state ahead "
                "of the columns it must re-read after the rows are realigned, and it cannot be rolled back there; "
                "use prompt lookup or the draft model, or one row"
            )
