"""EAGLE-style draft heads: a draft that reads the target's own features instead of running a separate model.

An EAGLE-1 head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
arXiv 2401.15077) is one decoder layer that autoregresses at the *feature* level. Its input at position ``p`` is
``fc(cat(embed(token[p + 1]), feature[p]))`` where ``feature[p]`` is the target's last hidden state at ``p`` (the
input of the target's ``lm_head``, after the final norm), and its output is a prediction of ``feature[p + 1]``.
The target's own ``lm_head`` turns that prediction into logits for ``token[p + 2]``, and the next draft step feeds
the predicted feature back in as its input feature. The embedding and ``lm_head`` are the target's, shared and
frozen: :meth:`DraftHead.bind` attaches them, and they are never saved with the head.

EAGLE-3 (Li et al. 2025, arXiv 2503.01840) feeds the first draft step a fusion of low, middle and high target
layers instead of the last hidden state alone: ``DraftHeadConfig.feature_layers`` names them (the last hidden state
always last), the target's forward returns them concatenated, and ``DraftHead.fuse`` maps them to one feature.
Later draft steps read the head's own predicted feature, as in EAGLE-1.

A head is saved as a directory with ``config.json`` and ``model.safetensors`` (head weights only), see
:meth:`DraftHead.save_pretrained` / :meth:`DraftHead.from_pretrained`; ``save_pretrained(path, format="eagle1")``
writes the EAGLE-1 layout instead (the EAGLE repository's, which vLLM reads too): a plain one-layer Llama
``config.json`` with ``bias`` (the fc bias; readers take it as True when absent, so it is always written),
``fc.weight`` [H, 2H] (+ ``fc.bias``) and ``layers.0.*`` with no ``input_layernorm`` (``DraftHeadConfig
.input_layernorm`` False: EAGLE-1's first layer has none). `fastspec.heads.formats` reads that layout back into a
`DraftHead`. ``fastspec train-head --kind eagle1`` trains one (the head shipped for the shipped target,
``fastspec/pair/head``, is an EAGLE-3 head: `fastspec.heads.eagle3`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from torch import nn

from fastspec.heads.base import DraftHeadBase
from fastspec.heads.checkpoint import write_checkpoint
from fastspec.heads.common import (
    cache_length,
    check_logits_are_lm_head_of_features,
    kwarg_names,
    one_layer_llama_config,
)
from fastspec.runner import execution_device, target_logits_and_features

HEAD_MODEL_TYPE = "fastspec_eagle_head"
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


@dataclass
class DraftHeadConfig:
    """Shape of a draft head; sizes must match its target (hidden size, vocabulary, architecture)."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    target_model_type: str = "llama"
    head_dim: int | None = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    fc_bias: bool = True
    model_type: str = HEAD_MODEL_TYPE
    head_version: int = 1  # format of the saved head: later fields have defaults that keep older heads as they were
    # the target hidden states the head reads (`target_logits_and_features`): [-1] is EAGLE-1 (the last hidden
    # state); more entries are fused by `DraftHead.fuse` as in EAGLE-3 (low, middle and high layers); -1 comes last
    feature_layers: list[int] = field(default_factory=lambda: [-1])
    # False: the decoder layer has no input_layernorm (identity), as the first layer of EAGLE-1 heads
    input_layernorm: bool = True
    rope_scaling: dict | None = None  # transformers' rope_scaling (e.g. llama3) or None for plain RoPE

    def __post_init__(self):
        layers = self.feature_layers
        if (
            not isinstance(layers, list | tuple)
            or not layers
            or layers[-1] != -1
            or not all(isinstance(i, int) and i >= 0 for i in layers[:-1])
            or len(set(layers)) != len(layers)
        ):
            raise ValueError(
                f"draft: DraftHeadConfig.feature_layers must be distinct hidden-state indices >= 0 followed by -1 "
                f"(the last hidden state, which the head predicts), got {layers!r}"
            )  # fmt: skip
        self.feature_layers = list(layers)

    @classmethod
    def from_target_config(cls, config, **overrides) -> DraftHeadConfig:
        """A head config with the target's sizes (one decoder layer shaped like the target's layers)."""
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)) if isinstance(rope, dict) else 10000.0
        values = dict(
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            intermediate_size=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
            vocab_size=config.vocab_size,
            rms_norm_eps=getattr(config, "rms_norm_eps", 1e-6),
            rope_theta=float(theta),
            max_position_embeddings=getattr(config, "max_position_embeddings", 4096),
            target_model_type=config.model_type,
            head_dim=getattr(config, "head_dim", None),
        )
        values.update(overrides)
        return cls(**values)

    @classmethod
    def from_dict(cls, data: dict) -> DraftHeadConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_dict(self) -> dict:
        return asdict(self)

    def llama_config(self):
        """The one-layer ``LlamaConfig`` the head's decoder layer and rotary embedding are built from."""
        return one_layer_llama_config(self)


class DraftHead(DraftHeadBase):
    """EAGLE-style draft head: one decoder layer over (target feature, embedding of the next token).

    Parameters are ``fc`` (``Linear(2H, H)`` on ``cat(embed(input_ids), features)``, as in EAGLE-1) and one
    ``LlamaDecoderLayer`` shaped like the target's layers; the rotary embedding follows the target's ``rope_theta``.
    A head that reads several target layers (``config.feature_layers``, EAGLE-3's fusion, Li et al. 2025,
    arXiv 2503.01840) also has ``fuse`` (``Linear(len(feature_layers) * H, H)``), which :meth:`target_features`
    applies to the target's features; the head's own predicted features (drafting past the first token) are H wide
    already. The target's input embedding and ``lm_head`` are attached by :meth:`bind` (shared, frozen, never
    saved).
    """

    def __init__(self, config: DraftHeadConfig | dict):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        if isinstance(config, dict):
            config = DraftHeadConfig.from_dict(config)
        self.config = config
        self._llama_config = config.llama_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
        width = len(config.feature_layers) * config.hidden_size
        # EAGLE-3's fusion of several target layers into one feature; starts as the pick of the last hidden state,
        # so a fused head begins where an EAGLE-1 head does
        self.fuse = None if width == config.hidden_size else nn.Linear(width, config.hidden_size, bias=False)
        self.layer = LlamaDecoderLayer(self._llama_config, layer_idx=0)
        if not config.input_layernorm:
            self.layer.input_layernorm = nn.Identity()
        self.rotary_emb = LlamaRotaryEmbedding(config=self._llama_config)
        names = kwarg_names(self.layer.forward)
        self._cache_kwarg = "past_key_values" if "past_key_values" in names and "cache" not in names else "cache"
        std = getattr(self._llama_config, "initializer_range", 0.02)
        for module in (self.fc, *self.layer.modules()):
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.fuse is not None:
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, -config.hidden_size :].copy_(torch.eye(config.hidden_size))
        # not submodules: shared with the target, so they are not in parameters(), state_dict() or save_pretrained()
        object.__setattr__(self, "_embed", None)
        object.__setattr__(self, "_lm_head", None)
        self.target_model_type = config.target_model_type

    # ------------------------------------------------------------------ binding
    @property
    def feature_layers(self) -> list[int]:
        return self.config.feature_layers

    @property
    def is_bound(self) -> bool:
        return self._lm_head is not None

    @property
    def embed_tokens(self):
        return self._embed

    @property
    def lm_head(self):
        return self._lm_head

    def bind(self, target) -> DraftHead:
        """Attach ``target``'s input embedding and ``lm_head``; ValueError (naming ``draft``) if they do not fit."""
        cfg = self.config
        tcfg = getattr(target, "config", None)
        if tcfg is None or not hasattr(target, "get_input_embeddings"):
            raise ValueError(f"draft: a draft head needs a Hugging Face causal LM target, got {type(target).__name__}")
        model_type = getattr(tcfg, "model_type", None)
        if model_type != cfg.target_model_type:
            raise ValueError(
                f"draft: this draft head was trained for a {cfg.target_model_type!r} target, "
                f"but the target is {model_type!r}"
            )
        hidden = getattr(tcfg, "hidden_size", None)
        if hidden != cfg.hidden_size:
            raise ValueError(f"draft: draft head hidden size {cfg.hidden_size} != target hidden size {hidden}")
        embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        if lm_head is None:
            raise ValueError("draft: the target has no lm_head (output embeddings) for the draft head to share")
        vocab_sizes = {getattr(tcfg, "vocab_size", None), embed.weight.shape[0], lm_head.weight.shape[0]}
        if vocab_sizes != {cfg.vocab_size}:
            raise ValueError(
                f"draft: draft head vocabulary size {cfg.vocab_size} != target vocabulary size "
                f"{sorted(v for v in vocab_sizes if v is not None)}"
            )
        if embed.weight.shape[1] != cfg.hidden_size or lm_head.weight.shape[1] != cfg.hidden_size:
            raise ValueError("draft: the target's embedding / lm_head width does not match the draft head hidden size")
        num_states = getattr(tcfg, "num_hidden_layers", None)
        if num_states is not None and any(i >= num_states for i in cfg.feature_layers[:-1]):
            raise ValueError(
                f"draft: draft head feature_layers {cfg.feature_layers} must index the target's hidden states "
                f"0..{num_states - 1} (0 = embeddings, i = output of decoder layer i - 1) before -1 (the last one)"
            )
        if embed is self._embed and lm_head is self._lm_head:
            return self  # bound to this target already (`fastspec.generate` binds on every call)
        check_logits_are_lm_head_of_features(target, cfg.feature_layers)
        object.__setattr__(self, "_embed", embed)
        object.__setattr__(self, "_lm_head", lm_head)
        return self

    # ------------------------------------------------------------------ save / load
    @classmethod
    def from_pretrained(cls, path, target=None, dtype: torch.dtype | None = None) -> DraftHead:
        """Load a head directory (``config.json`` + ``model.safetensors``); bind it to ``target`` if given.

        With a target, the head is moved to the target's device and (unless ``dtype`` is given) the dtype of its
        ``lm_head`` weight; it is returned in eval mode.
        """
        from safetensors.torch import load_file

        path = Path(path)
        cfg_path = path / CONFIG_NAME
        if not cfg_path.is_file():
            raise FileNotFoundError(f"draft: no draft head config at {cfg_path}")
        data = json.loads(cfg_path.read_text())
        if data.get("model_type") != HEAD_MODEL_TYPE:
            raise ValueError(f"draft: {path} is not a fastspec draft head (model_type {data.get('model_type')!r})")
        head = cls(DraftHeadConfig.from_dict(data))
        state = load_file(str(path / WEIGHTS_NAME))
        head.load_state_dict({k: v.float() for k, v in state.items()}, strict=True)
        if target is not None:
            head.bind(target)
            lm_head = target.get_output_embeddings()  # the head computes where the target's lm_head does
            head.to(device=execution_device(lm_head), dtype=dtype or lm_head.weight.dtype)
        elif dtype is not None:
            head.to(dtype)
        return head.eval()

    def save_pretrained(self, path, dtype: torch.dtype | None = None, format: str = "fastspec") -> None:  # noqa: A002
        """Write ``config.json`` and ``model.safetensors`` (head weights only: no embedding, no lm_head).

        ``format``: "fastspec" (default; ``model_type: fastspec_eagle_head``, read by :meth:`from_pretrained`) or
        "eagle1" (the EAGLE-1 layout, module docstring; ValueError for heads it cannot express: a fused head, or one
        whose layer has an input_layernorm)."""
        state = {k: v.detach().to(dtype or v.dtype) for k, v in self.state_dict().items()}
        if format == "fastspec":
            write_checkpoint(path, self.config.to_dict(), state, WEIGHTS_NAME)
        elif format == "eagle1":
            write_checkpoint(path, eagle1_config_dict(self.config, dtype or self.fc.weight.dtype),
                             {to_eagle1_key(k): v for k, v in state.items()}, WEIGHTS_NAME)  # fmt: skip
        else:
            raise ValueError(f"format: expected 'fastspec' or 'eagle1', got {format!r}")

    # ------------------------------------------------------------------ features and forward
    def new_cache(self):
        """An empty KV cache for the head's single decoder layer (a transformers ``DynamicCache``)."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._llama_config)
        except TypeError:  # older signatures
            return DynamicCache()

    @staticmethod
    def _cache_len(cache) -> int:
        return cache_length(cache)

    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        """The head's input feature [R, n, H] from the target's features [R, n, len(feature_layers) * H]
        (`target_logits_and_features`): themselves for an EAGLE-1 head, else ``fuse`` of the states with every
        intermediate one RMS-normalized (they are the residual stream, before any norm: about 8x the scale of the
        last hidden state in the shipped target)."""
        if self.fuse is None:
            return features
        size, eps = self.config.hidden_size, self.config.rms_norm_eps
        *inner, last = features.to(self.fuse.weight.dtype).split(size, dim=-1)
        return self.fuse(torch.cat([*(nn.functional.rms_norm(x, (size,), eps=eps) for x in inner), last], dim=-1))

    def forward(self, features, input_ids, position_ids, attention_mask=None, cache=None):
        """One head step over ``n`` positions at once.

        ``features`` ``[R, n, H]``: the feature of position ``p`` (the target's through :meth:`target_features`, or
        the head's own previous output when drafting); ``input_ids`` ``[R, n]``: the token at position ``p + 1``;
        ``position_ids`` ``[R, n]``: the rotary position of each entry (use ``p``; RoPE is relative, so a constant
        offset changes nothing but rounding); ``attention_mask``: additive float 4D mask ``[R, 1, n, cache_len + n]``
        (0 = attend, large negative = masked) over the cache entries followed by the new ones, or None for plain
        causal attention with no padding; ``cache``: a ``DynamicCache`` the head's layer appends its keys and values
        to (or None).

        Returns ``(hidden [R, n, H], logits [R, n, V])``: the predicted feature of position ``p + 1`` and
        ``lm_head(hidden)``, the logits of the token at ``p + 2``.
        """
        if not self.is_bound:
            raise ValueError("draft: the draft head is not bound to a target; call head.bind(target) first")
        n = input_ids.shape[1]
        past = cache_length(cache)
        if attention_mask is None:
            if n > 1:  # causal over the new entries, everything in the cache visible (bottom-right aligned)
                full = torch.ones(n, past + n, dtype=torch.bool, device=input_ids.device).tril(diagonal=past)
                dtype = self.fc.weight.dtype
                attention_mask = torch.zeros(full.shape, dtype=dtype, device=input_ids.device)
                attention_mask = attention_mask.masked_fill(~full, torch.finfo(dtype).min)[None, None]
        elif attention_mask.shape[-1] != past + n or attention_mask.shape[-2] != n:
            raise ValueError(
                f"attention_mask: expected [R, 1, {n}, {past + n}] (cache {past} + new {n}), "
                f"got {list(attention_mask.shape)}"
            )
        return self.step(features, input_ids, position_ids, attention_mask, cache)

    def step(self, features, input_ids, position_ids, attention_mask, cache):
        """`forward` without its checks and default mask: the step `fastspec.compiled` compiles.

        ``attention_mask`` is an additive 4D mask ``[R, 1, n, L]`` over every key the cache's layer returns: L is
        cache length + n for a ``DynamicCache``, the capacity for a ``fastspec.static_cache.StaticKVCache`` (whose
        length is a device tensor, so nothing here depends on the context length); None only for n = 1 with a
        dynamic cache (or no cache). Returns ``(hidden [R, n, H], logits [R, n, V])`` as `forward`.
        """
        weight = self.fc.weight
        emb = self._embed(input_ids).to(weight.dtype)
        x = self.fc(torch.cat([emb, features.to(weight.dtype)], dim=-1))
        if attention_mask is not None:
            attention_mask = attention_mask.to(x.dtype)
        position_embeddings = self.rotary_emb(x, position_ids)
        kwargs = {
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            self._cache_kwarg: cache,
            "use_cache": cache is not None,
            "position_embeddings": position_embeddings,
        }
        out = self.layer(x, **kwargs)
        hidden = out[0] if isinstance(out, tuple) else out
        logits = self._lm_head(hidden.to(self._lm_head.weight.dtype))
        return hidden, logits


EAGLE1_LAYER_PREFIX = "layers.0."  # the EAGLE-1 layout's name of `DraftHead.layer`


def to_eagle1_key(key: str) -> str:
    """A `DraftHead` state key in the EAGLE-1 layout (``layer.*`` -> ``layers.0.*``)."""
    return EAGLE1_LAYER_PREFIX + key.removeprefix("layer.") if key.startswith("layer.") else key


def eagle1_config_dict(config: DraftHeadConfig, dtype: torch.dtype) -> dict:
    """``config.json`` of the EAGLE-1 layout: a one-layer Llama config with ``bias`` (the fc bias) always written;
    ValueError for a config that layout cannot express."""
    if config.feature_layers != [-1]:
        raise ValueError(f"format: the EAGLE-1 layout reads only the target's last hidden state, this head reads "
                         f"feature_layers {config.feature_layers} (save it as 'fastspec')")  # fmt: skip
    if config.input_layernorm:
        raise ValueError("format: the EAGLE-1 layout has no input_layernorm in layer 0, this head has one "
                         "(DraftHeadConfig.input_layernorm; save it as 'fastspec')")  # fmt: skip
    data = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim or config.hidden_size // config.num_attention_heads,
        "num_hidden_layers": 1,
        "vocab_size": config.vocab_size,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": config.max_position_embeddings,
        "hidden_act": config.hidden_act,
        "attention_bias": config.attention_bias,
        "bias": config.fc_bias,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
        "fastspec": {"format_version": 1, "target_model_type": config.target_model_type},
    }
    if config.rope_scaling:
        data["rope_scaling"] = dict(config.rope_scaling)
    return data


__all__ = [
    "DraftHead",
    "DraftHeadConfig",
    "eagle1_config_dict",
    "target_logits_and_features",
    "to_eagle1_key",
]
