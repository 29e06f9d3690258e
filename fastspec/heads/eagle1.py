"""EAGLE-style draft heads: a draft that reads the target's own features instead of running a separate model.

An EAGLE-1 head (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
arXiv 2401.15077) is one decoder layer that autoregresses at the *feature* level. Its input at position ``p`` is
``fc(cat(embed(token[p + 1]), feature[p]))`` where ``feature[p]`` is the target's last hidden state at ``p`` (the
input of the target's ``lm_head``, after the final norm), and its output is a prediction of ``feature[p + 1]``.
The target's own ``lm_head`` turns that prediction into logits for ``token[p + 2]``, and the next draft step feeds
the predicted feature back in as its input feature. The embedding and ``lm_head`` are the target's, shared and
frozen: :meth:`DraftHead.bind` attaches them, and they are never saved with the head. A head that reads several
target layers (EAGLE-3, Li et al. 2025, arXiv 2503.01840) is `fastspec.heads.eagle3.Eagle3Head`.

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
from fastspec.heads.common import kwarg_names, one_layer_llama_config
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
    # the target hidden states the head reads (`target_logits_and_features`): [-1], the last hidden state (EAGLE-1);
    # a head reading several layers is an EAGLE-3 head (`fastspec.heads.eagle3`)
    feature_layers: list[int] = field(default_factory=lambda: [-1])
    # False: the decoder layer has no input_layernorm (identity), as the first layer of EAGLE-1 heads
    input_layernorm: bool = True
    rope_scaling: dict | None = None  # transformers' rope_scaling (e.g. llama3) or None for plain RoPE

    def __post_init__(self):
        if not isinstance(self.feature_layers, list | tuple) or list(self.feature_layers) != [-1]:
            raise ValueError(
                f"draft: DraftHeadConfig.feature_layers must be [-1] (the last hidden state: an EAGLE-1 head reads "
                f"it alone; a head reading several target layers is an Eagle3Head), got {self.feature_layers!r}"
            )
        self.feature_layers = [-1]

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
    The target's input embedding and ``lm_head`` are attached by :meth:`bind` (shared, frozen, never saved).
    """

    kind = "draft head"

    def __init__(self, config: DraftHeadConfig | dict):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        if isinstance(config, dict):
            config = DraftHeadConfig.from_dict(config)
        self.config = config
        self._llama_config = config.llama_config()
        self.fc = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=config.fc_bias)
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
        self.target_model_type = config.target_model_type

    # ------------------------------------------------------------------ binding
    @property
    def feature_layers(self) -> list[int]:
        return self.config.feature_layers

    @property
    def target_hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def embed_tokens(self):
        return self._embed

    @property
    def lm_head(self):
        return self._target_lm_head

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
        "eagle1" (the EAGLE-1 layout, module docstring; ValueError for a head it cannot express: one whose layer has an
        input_layernorm)."""
        state = {k: v.detach().to(dtype or v.dtype) for k, v in self.state_dict().items()}
        if format == "fastspec":
            write_checkpoint(path, self.config.to_dict(), state, WEIGHTS_NAME)
        elif format == "eagle1":
            write_checkpoint(path, eagle1_config_dict(self.config, dtype or self.fc.weight.dtype),
                             {to_eagle1_key(k): v for k, v in state.items()}, WEIGHTS_NAME)  # fmt: skip
        else:
            raise ValueError(f"format: expected 'fastspec' or 'eagle1', got {format!r}")

    # ------------------------------------------------------------------ features and step
    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        """The head's input feature [R, n, H] from the target's [R, n, H]: the last hidden state, as it is."""
        return features

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
        logits = self._target_lm_head(hidden.to(self._target_lm_head.weight.dtype))
        return hidden, logits


EAGLE1_LAYER_PREFIX = "layers.0."  # the EAGLE-1 layout's name of `DraftHead.layer`


def to_eagle1_key(key: str) -> str:
    """A `DraftHead` state key in the EAGLE-1 layout (``layer.*`` -> ``layers.0.*``)."""
    return EAGLE1_LAYER_PREFIX + key.removeprefix("layer.") if key.startswith("layer.") else key


def eagle1_config_dict(config: DraftHeadConfig, dtype: torch.dtype) -> dict:
    """``config.json`` of the EAGLE-1 layout: a one-layer Llama config with ``bias`` (the fc bias) always written;
    ValueError for a config that layout cannot express."""
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
