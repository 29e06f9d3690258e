"""`EarlyExitDrafter`: draft with the target's own first N decoder layers, its final norm and lm_head
(`generate(assistant_early_exit=N)`; HF's `EarlyExitCandidateGenerator`, LayerSkip: Elhoushi et al. 2024,
arXiv 2404.16710).

`early_exit_model(target, N)` builds that draft as an HF causal LM of the target's own class whose config has N layers
and whose modules *are* the target's (embedding, first N decoder layers, final norm, rotary embedding, lm_head: no
weight is copied), so it runs through transformers' own forward, masks and cache classes like any draft model.
`EarlyExitDrafter` is `fastspec.drafters.DraftModelDrafter` over it: chains and trees, its own N-layer KV cache kept
in step with the buffer (`fastspec.layout`). HF instead lowers `config.num_hidden_layers` of the target itself while
drafting; building a separate shallow model leaves the target's config untouched. The draft's cache is its own:
LayerSkip's sharing of the first N layers' keys and values with the target is not done here. A model trained for
early exit (LayerSkip checkpoints) drafts well; any other drafts poorly but stays lossless, since the target verifies
every draft.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from fastspec.drafters.base import DraftSetup
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.runner import decoder_layers

__all__ = ["EarlyExitDrafter", "early_exit_draft", "early_exit_model"]

# per-layer config lists that describe the decoder layers in order (cut to the first N with them)
_PER_LAYER_LISTS = ("layer_types", "mlp_layer_types", "block_types", "attn_type_list")


def _model_type(target: nn.Module) -> str:
    return getattr(target.config, "model_type", type(target).__name__)


def early_exit_model(target: nn.Module, num_layers: int) -> nn.Module:
    """The target's first `num_layers` decoder layers with its embedding, final norm and lm_head, as an HF causal LM of
    the target's class sharing every module with it (module docstring).

    ValueError naming `assistant_early_exit` and the model type when `num_layers` is not in [1, L) for a target of L
    layers, when the target is a composite (multimodal) model, or when its modules do not split into embedding,
    decoder layers and head."""
    name = "assistant_early_exit"
    if isinstance(num_layers, bool) or not isinstance(num_layers, int):
        raise ValueError(f"{name} must be a number of decoder layers, got {num_layers!r}")
    config = target.config
    if config.get_text_config() is not config:
        raise ValueError(f"{name}: the target ({_model_type(target)}) is a composite model; early exit drafts with a "
                         "text-only causal LM's first layers")  # fmt: skip
    total = config.num_hidden_layers
    if not 1 <= num_layers < total:
        raise ValueError(f"{name}={num_layers}: the target ({_model_type(target)}) has {total} decoder layers; early "
                         f"exit drafts with the first N, 1 <= N < {total}")  # fmt: skip
    try:
        layers = decoder_layers(target)
    except ValueError as error:
        raise ValueError(f"{name}: the target ({_model_type(target)}) has no list of decoder layers to exit "
                         "early from") from error  # fmt: skip
    shallow_config = copy.deepcopy(config)
    shallow_config.num_hidden_layers = num_layers
    for field in _PER_LAYER_LISTS:
        value = getattr(shallow_config, field, None)
        if isinstance(value, list) and len(value) == total:
            setattr(shallow_config, field, value[:num_layers])
    with torch.device("meta"):
        shallow = type(target)(shallow_config)
    base, shallow_base = target.base_model, shallow.base_model
    layers_name = next(n for n, child in base.named_children() if child is layers)
    for child_name, child in base.named_children():  # embedding, norm, rotary embedding: the target's own
        setattr(shallow_base, child_name, nn.ModuleList(layers[:num_layers]) if child is layers else child)
    for child_name, child in target.named_children():  # the lm_head (and anything else beside the base model)
        if child is not base:
            setattr(shallow, child_name, child)
    left = [n for n, t in [*shallow.named_parameters(), *shallow.named_buffers()] if t.device.type == "meta"]
    if left or len(getattr(shallow_base, layers_name)) != num_layers:
        raise ValueError(f"{name}: the target's ({_model_type(target)}) modules do not split into embedding, decoder "
                         f"layers and head (left unshared: {left[:4]})")  # fmt: skip
    shallow.generation_config = copy.deepcopy(target.generation_config)
    return shallow.eval() if not target.training else shallow


def early_exit_draft(target: nn.Module, num_layers: int) -> nn.Module:
    """The draft of `generate(assistant_early_exit=num_layers)`, passed on as `draft=`: `early_exit_model`, which
    `fastspec.drafters.build_drafter` drafts with as a draft model (`EarlyExitDrafter`'s drafting)."""
    return early_exit_model(target, num_layers)


class EarlyExitDrafter(DraftModelDrafter):
    """Drafts chains and trees with the target's first `num_layers` layers (`DraftModelDrafter` over
    `early_exit_model`).

    Args:
        target: the HF causal LM being decoded.
        num_layers: N, the decoder layers the draft runs (1 <= N < the target's).
        setup: the call's `DraftSetup`.
    """

    def __init__(self, target: nn.Module, num_layers: int, setup: DraftSetup):
        super().__init__(early_exit_model(target, num_layers), setup)
