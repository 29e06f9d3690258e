"""What fastspec can decode losslessly for a given model, decided before the first forward.

Every architecture transformers maps as a causal LM either decodes equal to its greedy output in a path (chain,
tree, prompt lookup, ragged batch, static cache, compiled steps) or is refused here, by model type and reason,
before any forward: never a crash inside transformers, never a wrong token. The table of what passes and what is
refused per architecture is `bench/results/architectures.md` (`bench/architectures.py`).

Refused:
- trees and the static cache (`tree=`, `static_cache=True`, `compile=True`), which hand the model a ready-made 4D
  mask, where no such mask can be right (`fastspec.masks.AttentionKinds.unsupported`: layers of several kinds
  behind a forward that takes one mask, or layer kinds fastspec builds no mask for);
- the same paths for position-bias models (ALiBi: BLOOM, MPT, Falcon with `alibi`), whose bias is computed from
  columns or from a 2D mask, not from the tree depths and positions fastspec feeds;
- the static cache for models that append copies of their cache layers in the forward (Dory's looped layers);
- the same paths for GPT-Neo, whose local layers cut their window by cache column inside the layer;
- the same paths for models that take no KV cache (openai-gpt, RWKV, XLNet, Reformer): they read every fed token
  as one sequence. Chains and prompt lookup decode them correctly (the cache stays empty, so every step feeds the
  whole sequence), with a warning that says so once per model type.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import warnings

import torch

from fastspec.masks import AttentionKinds

__all__ = ["check_architecture", "mask_paths_refusal", "model_type", "takes_cache"]


def check_architecture(target: torch.nn.Module, draft, *, tree, static: bool) -> None:
    """Raise ValueError naming the argument, the model type and the reason when `target` or a draft model cannot
    decode losslessly in the path asked for (`tree` not None, or a static cache); warn once per model type when one
    takes no KV cache (it decodes correctly, re-fed in full every step). A draft head or a fastspec `Drafter` runs
    fastspec's own layers, which take any mask."""
    argument = "tree" if tree is not None else "static_cache" if static else None
    models = [("target", target)]
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "generation_config"):
        models.append(("draft", draft))
    for role, model in models:
        reason = mask_paths_refusal(model, static) if argument is not None else None
        if reason is not None:
            raise ValueError(f"{argument}: the {role} ({model_type(model)}) cannot take it: {reason}")
        if not takes_cache(model) and model_type(model) not in _WARNED:
            _WARNED.add(model_type(model))
            warnings.warn(
                f"{model_type(model)} takes no KV cache: fastspec feeds it the whole sequence at every step, so a "
                "step costs a forward over the full context (correct, but slower than with a cache)",
                stacklevel=3,
            )


_WARNED: set[str] = set()  # model types whose missing cache was warned about


def takes_cache(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes a transformers KV cache (`cache` or `past_key_values`). Models that keep
    state their own way (RWKV's `state`, XLNet's `mems`, Reformer's buckets) or none (openai-gpt) do not."""
    return _forward_takes_cache(type(model))


@functools.cache
def _modeling_source(module: str) -> str:
    """The source of the module that defines a model class ('' when unreadable)."""
    try:
        return inspect.getsource(sys.modules[module])
    except (OSError, TypeError, KeyError):
        return ""


@functools.cache
def _forward_takes_cache(model_class: type) -> bool:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" in parameters or "past_key_values" in parameters


def mask_paths_refusal(model: torch.nn.Module, static: bool = False) -> str | None:
    """Why `model` cannot decode under a ready-made 4D mask (trees, the static cache: `static`), or None when it
    can."""
    config = model.config.get_text_config()
    if static and re.search(r"cache\.layers\s*(\+=|\.append|\.extend)", _modeling_source(type(model).__module__)):
        return "it appends copies of its cache layers during the forward (looped layers), which fastspec's static " \
               "cache layers cannot be copied into"  # fmt: skip
    if getattr(config, "alibi", False) or model_type(model) in ("bloom", "mpt"):
        return "its ALiBi position bias follows the cache columns, not the positions of tree nodes and static slots"
    if "local" in (getattr(config, "attention_layers", None) or ()):  # GPT-Neo
        return "its local attention layers cut their window from cache columns inside the layer, not from the mask"
    if not takes_cache(model):
        return "it takes no KV cache, so tree nodes and static slots would be read as one sequence"
    return AttentionKinds(model).unsupported


def model_type(model: torch.nn.Module) -> str:
    """The model's `model_type` (its text config's for a composite model)."""
    return getattr(model.config.get_text_config(), "model_type", None) or type(model).__name__
