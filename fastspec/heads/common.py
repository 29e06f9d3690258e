"""What every draft head shares with its target and its drafter: the bind-time check of the target's logits, the
default causal mask of a head forward, the head's cache length, transformers' cache keyword and the RoPE settings
of a transformers config."""

from __future__ import annotations

import inspect

import torch

from fastspec.runner import execution_device, target_logits_and_features

__all__ = [
    "cache_length",
    "check_logits_are_lm_head_of_features",
    "default_step_mask",
    "kwarg_names",
    "rope_settings",
]


def kwarg_names(fn) -> set[str]:
    """The parameter names of `fn` (empty when it has no inspectable signature)."""
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def cache_length(cache) -> int:
    """Positions a head's one-layer KV cache holds (0 for None)."""
    if cache is None:
        return 0
    try:
        return int(cache.get_seq_length(0))
    except TypeError:
        return int(cache.get_seq_length())


def default_step_mask(attention_mask, n: int, past: int, dtype: torch.dtype, device) -> torch.Tensor | None:
    """A head forward's mask: ``attention_mask`` checked to be ``[R, 1, n, past + n]``, or for None a causal mask
    over the n new entries with every cached one visible (None for n = 1: nothing to mask)."""
    if attention_mask is None:
        if n == 1:
            return None
        full = torch.ones(n, past + n, dtype=torch.bool, device=device).tril(diagonal=past)
        mask = torch.zeros(full.shape, dtype=dtype, device=device)
        return mask.masked_fill(~full, torch.finfo(dtype).min)[None, None]
    if attention_mask.shape[-1] != past + n or attention_mask.shape[-2] != n:
        raise ValueError(
            f"attention_mask: expected [R, 1, {n}, {past + n}] (cache {past} + new {n}), "
            f"got {list(attention_mask.shape)}"
        )
    return attention_mask


def rope_settings(config) -> tuple[float, dict | None]:
    """``(rope_theta, rope_scaling or None)`` of a transformers config, old (``rope_theta``, ``rope_scaling``) or new
    (``rope_parameters``) style; the scaling dict without ``rope_theta``, None for plain RoPE."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        theta = float(params.get("rope_theta", getattr(config, "rope_theta", None) or 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(getattr(config, "rope_theta", None) or 10000.0)
        scaling = dict(getattr(config, "rope_scaling", None) or {})
    if scaling.get("rope_type", scaling.get("type", "default")) == "default":
        scaling = None
    return theta, scaling


@torch.no_grad()
def check_logits_are_lm_head_of_features(target, feature_layers: list[int]) -> None:
    """ValueError (naming ``draft``) unless ``target``'s logits are exactly ``lm_head`` of its base model's last
    hidden state (what `target_logits_and_features` computes, verification logits included): targets that scale or
    soft-cap their logits are refused rather than verified with logits that are not theirs. Runs the features'
    forward once eagerly (installing any hidden-state hooks before a step is compiled)."""
    if target.base_model is target:
        raise ValueError(f"draft: a draft head needs a causal LM with a base model and an lm_head, got "
                         f"{type(target).__name__}")  # fmt: skip
    lm_head = target.get_output_embeddings()
    ids = torch.arange(1, 5, device=execution_device(target))[None] % lm_head.weight.shape[0]
    expected = target(input_ids=ids, use_cache=False).logits
    logits, _ = target_logits_and_features(target, 0, feature_layers, input_ids=ids, use_cache=False)
    if logits.shape != expected.shape or not torch.equal(logits.float(), expected.float()):
        raise ValueError(
            f"draft: a draft head reads the target's last hidden state as the input of its lm_head, but this "
            f"{type(target).__name__}'s logits are not lm_head(base model output) (scaled or soft-capped logits?)"
        )


def one_layer_llama_config(config, **extra):
    """The one-layer ``LlamaConfig`` a head's decoder layer, rotary embedding and MLP are built from: the sizes of
    ``config`` (an EAGLE-1 or EAGLE-3 head config), its RoPE theta and scaling (written into transformers 5's
    ``rope_parameters`` too), and eager attention, which adds the 4D float mask as is on every version and device.
    ``extra``: more ``LlamaConfig`` fields (EAGLE-3's ``mlp_bias``)."""
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        hidden_act=config.hidden_act,
        attention_bias=config.attention_bias,
        rope_theta=config.rope_theta,
        **extra,
    )
    scaling = dict(config.rope_scaling or {})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    if scaling:
        kwargs["rope_scaling"] = scaling
    if config.head_dim is not None:
        kwargs["head_dim"] = config.head_dim
    cfg = LlamaConfig(**kwargs)
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict):
        rope.update({"rope_type": "default", **scaling, "rope_theta": config.rope_theta})
    cfg._attn_implementation = "eager"
    return cfg
