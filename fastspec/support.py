"""What fastspec can decode losslessly for a given model, decided before the first forward.

Every architecture transformers maps as a causal LM either decodes equal to its greedy output in a path (chain,
tree, prompt lookup, ragged batch, static cache, compiled steps) or is refused here, by argument, model type and
reason, before any forward: never a crash inside transformers, never a wrong token. The table of what passes and
what is refused per architecture is `bench/results/architectures.md` (`bench/architectures.py`).

Refused in every path (`whole_model_refusal`):
- a cache of the model's own class, not a transformers `Cache` (xLSTM), and the models of `REFUSED_MODELS`;
- a `sliding_window` in the config that transformers' cache applies (it keeps only the window when the config names
  no `layer_types`) while the model's masks attend to every position (Moshi): HF generate's output then depends on
  the cache, not on the model's forward, and no cache fastspec keeps can be both.
Refused for speculation (a draft or prompt lookup): the models of `NOT_CAUSAL_IN_A_FORWARD`, whose output at a
position depends on the tokens fed after it in the same forward; in a batch of several rows, the models of
`PADDING_VARIANT`, whose output changes with the amount of left padding that realigning rows adds.
Refused for trees and the static cache (`tree=`, `static_cache=True`, `compile=True`), which hand the model a
ready-made 4D mask (`mask_paths_refusal`):
- where no such mask can be right (`fastspec.masks.AttentionKinds.unsupported`: layers of several kinds behind a
  forward that takes one mask, or layer kinds fastspec builds no mask for);
- position-bias models (ALiBi: BLOOM, MPT, Falcon with `alibi`), whose bias is computed from columns or from a 2D
  mask, not from the tree depths and positions fastspec feeds;
- GPT-Neo, whose local layers cut their window by cache column inside the layer;
- the static cache for models that append copies of their cache layers in the forward (Dory's looped layers);
- models that take no KV cache (openai-gpt, RWKV, XLNet, Reformer), which read every fed token as one sequence.
  Chains and prompt lookup decode them correctly (the cache stays empty, so every step feeds the whole sequence),
  with a warning that says so once per model type; left-padded batches are refused for them (`attention_mask`):
  rows realigned by fastspec carry other padding than HF's, which such models read as tokens.
Recurrent / convolution state and indexed attention: `fastspec.cache_kinds.check_state_paths`, called from here.
"""

from __future__ import annotations

import functools
import inspect
import re
import warnings

import torch
from transformers.cache_utils import Cache

from fastspec.cache_kinds import check_state_paths, modeling_source
from fastspec.masks import AttentionKinds

__all__ = [
    "NOT_CAUSAL_IN_A_FORWARD",
    "PADDING_VARIANT",
    "REFUSED_MODELS",
    "check_architecture",
    "mask_paths_refusal",
    "model_type",
    "takes_cache",
    "whole_model_refusal",
]

REFUSED_MODELS = {
    "cpmant": "its cache counts the positions of the prompt segment it prepends itself, not the tokens fed, so "
    "fastspec's cache lengths and its disagree",
    "xlnet": "HF generate appends a masked dummy token and a permutation mask to predict each token "
    "(prepare_inputs_for_generation); fastspec feeds the sequence as it is",
}
NOT_CAUSAL_IN_A_FORWARD = {
    "doge": "its dynamic mask keeps each query's top keep_window_size keys by a score over every column fed, so a "
    "position's output depends on the drafts fed after it",
}


PADDING_VARIANT = {
    "git": "its output for a left-padded row changes with the amount of padding (HF's own batch output differs from "
    "the row decoded alone), and fastspec realigns rows that accept different numbers of drafts with more padding",
}


def check_architecture(target: torch.nn.Module, draft, *, tree, static: bool, compiled: bool = False,
                       prompt_lookup: int | None = None, rows: int = 1, padded: bool = False) -> None:  # fmt: skip
    """Raise ValueError naming the argument, the model type and the reason when `target` or a draft model cannot
    decode losslessly in the path asked for (module docstring); warn once per model type when one takes no KV cache
    (it decodes correctly, re-fed in full every step). A draft head or a fastspec `Drafter` runs fastspec's own
    layers, which take any mask.

    Args:
        target, draft: the generate call's (`draft` any of its kinds, or None).
        tree: the call's `tree` (None: chains); static: a static cache; compiled: `compile=True`.
        prompt_lookup: the n-gram size or None; rows: the batch's rows; padded: some row is left-padded.
    """
    models = [("target", target)]
    if isinstance(draft, torch.nn.Module) and hasattr(draft, "generation_config"):
        models.append(("draft", draft))
    speculating = draft is not None or prompt_lookup is not None
    for role, model in models:
        name = model_type(model)
        reason = whole_model_refusal(model)
        if reason is not None:
            raise ValueError(f"{role if role == 'draft' else 'target'}: {name} cannot be decoded by fastspec: {reason}")
        argument = "draft" if draft is not None else "prompt_lookup"
        if speculating and rows > 1 and name in PADDING_VARIANT:
            raise ValueError(f"{argument}: {name} cannot be speculated on in a batch of {rows} rows: "
                             f"{PADDING_VARIANT[name]}; decode its rows one at a time")  # fmt: skip
        if speculating and name in NOT_CAUSAL_IN_A_FORWARD:
            raise ValueError(f"{argument}: {name} cannot be speculated on: {NOT_CAUSAL_IN_A_FORWARD[name]}")
    check_state_paths(target, draft, tree=tree, static=static, prompt_lookup=prompt_lookup, rows=rows,
                      compiled=compiled)  # fmt: skip
    argument = "tree" if tree is not None else ("compile" if compiled else "static_cache") if static else None
    for role, model in models:
        reason = mask_paths_refusal(model, static) if argument is not None else None
        if reason is not None:
            raise ValueError(f"{argument}: the {role} ({model_type(model)}) cannot take it: {reason}")
        if not takes_cache(model):
            if padded:
                raise ValueError(
                    f"attention_mask: the {role} ({model_type(model)}) takes no KV cache and reads left padding as "
                    "tokens; fastspec realigns rows with other padding than HF's, so decode its rows one at a time"
                )
            if model_type(model) not in _WARNED:
                _WARNED.add(model_type(model))
                warnings.warn(
                    f"{model_type(model)} takes no KV cache: fastspec feeds it the whole sequence at every step, so "
                    "a step costs a forward over the full context (correct, but slower than with a cache)",
                    stacklevel=3,
                )


def whole_model_refusal(model: torch.nn.Module) -> str | None:
    """Why fastspec cannot decode `model` in any path (module docstring), or None."""
    name = model_type(model)
    if name in REFUSED_MODELS:
        return REFUSED_MODELS[name]
    cache_class = _cache_annotation(type(model))
    if cache_class is not None:
        return f"its cache is its own {cache_class.__name__}, not a transformers Cache fastspec can roll back"
    config = model.config.get_text_config()
    source = modeling_source(model)
    windowed = any(call in source for call in ("sliding_window_causal_mask", "sliding_window_overlay"))
    if getattr(config, "layer_types", None) is None and getattr(config, "sliding_window", None) and not windowed:
        return (
            "its config's sliding_window makes transformers' cache keep only the window while its masks attend to "
            "every position, so HF generate's output depends on that cache, not on the model's forward"
        )
    return None


_WARNED: set[str] = set()  # model types whose missing cache was warned about


def takes_cache(model: torch.nn.Module) -> bool:
    """Whether the model's forward takes a transformers KV cache (`cache` or `past_key_values`). Models that keep
    state their own way (RWKV's `state`, XLNet's `mems`, Reformer's buckets) or none (openai-gpt) do not."""
    return _forward_takes_cache(type(model))


@functools.cache
def _cache_annotation(model_class: type) -> type | None:
    """The class a model's forward annotates its cache argument with, when it is not a transformers Cache."""
    parameters = inspect.signature(model_class.forward).parameters
    parameter = parameters.get("cache") or parameters.get("past_key_values")
    if parameter is None:
        return None
    annotation = parameter.annotation
    for candidate in getattr(annotation, "__args__", (annotation,)):
        if isinstance(candidate, type) and candidate is not type(None):
            return None if issubclass(candidate, Cache) else candidate
    return None


@functools.cache
def _forward_takes_cache(model_class: type) -> bool:
    parameters = inspect.signature(model_class.forward).parameters
    return "cache" in parameters or "past_key_values" in parameters


def mask_paths_refusal(model: torch.nn.Module, static: bool = False) -> str | None:
    """Why `model` cannot decode under a ready-made 4D mask (trees, the static cache: `static`), or None when it
    can."""
    config = model.config.get_text_config()
    if static and re.search(r"cache\.layers\s*(\+=|\.append|\.extend)", modeling_source(model)):
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
