"""EAGLE-3 draft heads (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language Models via
Training-Time Test", arXiv 2503.01840), in the published architecture that SGLang and vLLM serve.

Architecture (module names are the checkpoint keys of the official / SpecForge layout):

- ``fc``: ``Linear(3 * H_t, H)`` (bias per config ``bias``, False for EAGLE-3) over ``cat(low, mid, high)``: three
  target hidden states, by default the *inputs* of decoder layers {2, L // 2, L - 3} (transformers'
  ``hidden_states[i]`` for those i: the residual stream, before any norm). Only the target's features go through
  ``fc`` (`Eagle3Head.target_features`); the head's own outputs are fed back as they are.
- ``midlayer``: one decoder layer whose attention reads ``x = cat(input_layernorm(embed(token)), hidden_norm(g))``
  (q/k/v input width 2H; head_dim, GQA and RoPE per config). Its residual is ``g`` itself (SGLang, SpecForge and the
  EAGLE repository, ``norm_before_residual`` False) or ``hidden_norm(g)`` (vLLM with ``norm_before_residual`` True,
  the default of the speculators format); then ``post_attention_layernorm`` and a SwiGLU MLP with a residual.
- ``norm`` and ``lm_head`` ``[draft_vocab, H]``: `Eagle3Head.step` returns ``(hidden, lm_head(norm(hidden)))``
  where ``hidden`` (the layer output *before* the final norm) is the feature of the next draft step.
- Reduced draft vocabulary: ``d2t`` int64 ``[draft_vocab]`` (target id = draft id + d2t[draft id]) and ``t2d`` bool
  ``[vocab]`` (target token kept); kept ids ascending, so ``nonzero(t2d) == arange(draft_vocab) + d2t``.
  `Eagle3Head.to_target_logits` scatters draft logits into a ``[..., vocab]`` tensor of -inf: q = 0 outside the
  kept tokens, and verification stays lossless (the residual distribution covers them).
- The token embedding is the target's (`Eagle3Head.bind` attaches it; never saved, so a head never carries a
  random ``embed_tokens``), read as a plain table lookup as the engines do. Only a head whose hidden size differs
  from the target's has its own ``embed_tokens`` (as SGLang keeps it then).

`Eagle3Head.save_pretrained` writes the official / SpecForge layout (``config.json`` with ``architectures:
["LlamaForCausalLMEagle3"]``, ``model.safetensors`` with ``fc.weight``, ``midlayer.*``, ``norm.weight``,
``lm_head.weight``, ``d2t``, ``t2d``); reading that layout and the others is `fastspec.heads.formats`. The aux
layers are written in both engines' conventions (`Eagle3Config.to_official_dict`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from fastspec.heads.base import DraftHeadBase
from fastspec.heads.checkpoint import write_checkpoint
from fastspec.heads.common import one_layer_llama_config, rope_settings
from fastspec.runner import execution_device

__all__ = ["Eagle3Config", "Eagle3Head", "default_aux_layers", "vocab_maps"]

OFFICIAL_ARCHITECTURE = "LlamaForCausalLMEagle3"
# what fastspec writes next to the engines' fields: the aux layers in transformers' hidden_states numbering
FASTSPEC_FEATURE_LAYERS_MEANING = "hidden_states indices: hidden_states[i] is the input of target decoder layer i"


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's default target states: the inputs of decoder layers {2, L // 2, L - 3} (``hidden_states`` indices),
    what the EAGLE repository, SGLang and vLLM read when a head names none. ValueError for targets too shallow."""
    layers = [2, num_layers // 2, num_layers - 3]
    if len(set(layers)) != 3 or any(not 0 <= i < num_layers for i in layers):
        raise ValueError(
            f"draft: EAGLE-3's default aux layers {layers} do not fit a target of {num_layers} decoder layers; "
            f"name three hidden_states indices in [0, {num_layers}) explicitly (aux_layers)"
        )
    return layers


def vocab_maps(kept: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d2t [N] int64, t2d [vocab_size] bool)`` of the kept target ids (sorted ascending here):
    ``d2t[i] = kept[i] - i``, ``t2d[j] = j in kept``. ValueError for duplicates or ids outside the vocabulary."""
    kept = torch.as_tensor(kept).long().flatten().cpu()
    unique = torch.unique(kept)  # sorted ascending
    if unique.numel() != kept.numel() or kept.numel() == 0:
        raise ValueError("draft_vocab_ids: expected distinct target ids (at least one)")
    if int(unique[0]) < 0 or int(unique[-1]) >= vocab_size:
        raise ValueError(
            f"draft_vocab_ids: ids must lie in [0, {vocab_size}), got [{int(unique[0])}, {int(unique[-1])}]"
        )
    d2t = unique - torch.arange(unique.numel())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[unique] = True
    return d2t, t2d


@dataclass
class Eagle3Config:
    """Shape of an EAGLE-3 head. ``vocab_size`` is the target's; ``feature_layers`` are ``hidden_states`` indices of
    the target (the inputs of decoder layers), low, mid, high."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    feature_layers: list[int]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    head_dim: int | None = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    bias: bool = False  # fc bias (EAGLE-3: False)
    norm_before_residual: bool = False
    target_model_type: str | None = None  # checked by bind when known
    extra: dict = field(default_factory=dict)  # other fields of a file read, kept as they were

    def __post_init__(self):
        layers = self.feature_layers
        if (not isinstance(layers, list | tuple) or len(layers) != 3 or len(set(layers)) != 3
                or not all(isinstance(i, int) and i >= 0 for i in layers)):  # fmt: skip
            raise ValueError(f"draft: EAGLE-3 feature_layers must be three distinct hidden_states indices >= 0 (SGLang "
                             f"captures a repeated layer once), got {layers!r}")  # fmt: skip
        self.feature_layers = list(layers)
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft: draft_vocab_size {self.draft_vocab_size} must lie in [1, vocab_size "
                             f"{self.vocab_size}]")  # fmt: skip

    @property
    def own_embedding(self) -> bool:
        """The head has its own ``embed_tokens`` (hidden size differs from the target's, as SGLang handles it)."""
        return self.hidden_size != self.target_hidden_size

    @classmethod
    def from_target_config(cls, config, feature_layers: list[int] | None = None, **overrides) -> Eagle3Config:
        """A head config shaped like the target's decoder layers, full draft vocabulary unless overridden."""
        config = config.get_text_config() if hasattr(config, "get_text_config") else config
        theta, scaling = rope_settings(config)
        act = getattr(config, "hidden_act", "silu")
        values = dict(
            hidden_size=config.hidden_size,
            num_attention_heads=config.num_attention_heads,
            num_key_value_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            intermediate_size=getattr(config, "intermediate_size", None) or 4 * config.hidden_size,
            vocab_size=config.vocab_size,
            draft_vocab_size=config.vocab_size,
            target_hidden_size=config.hidden_size,
            feature_layers=list(feature_layers) if feature_layers is not None
            else default_aux_layers(config.num_hidden_layers),
            rms_norm_eps=getattr(config, "rms_norm_eps", 1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=getattr(config, "max_position_embeddings", 4096),
            head_dim=getattr(config, "head_dim", None),
            hidden_act=act if act in ("silu", "gelu", "relu", "gelu_pytorch_tanh") else "silu",
            target_model_type=config.model_type,
        )  # fmt: skip
        values.update(overrides)
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Eagle3Config:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def to_official_dict(self, dtype: torch.dtype) -> dict:
        """``config.json`` of the official / SpecForge layout (what SGLang and vLLM load).

        Aux layers, written in every convention a reader uses, so no reader has to guess:
        ``eagle_config.eagle_aux_hidden_state_layer_ids`` (SGLang / SpecForge: "output of layer j", i.e. the
        ``hidden_states`` index minus 1; SGLang adds 1 back), top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM:
        used as given, the ``hidden_states`` index) and ``fastspec.feature_layers`` (``hidden_states`` indices,
        stated in ``fastspec.feature_layers_meaning``). SGLang ignores ``norm_before_residual`` (it always keeps
        the un-normed feature as the residual): heads written with it True serve correctly in vLLM only.
        """
        layers = list(self.feature_layers)
        data = {
            "architectures": [OFFICIAL_ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim or self.hidden_size // self.num_attention_heads,
            "num_hidden_layers": 1,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": self.hidden_act,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "bias": self.bias,
            "norm_before_residual": self.norm_before_residual,
            "tie_word_embeddings": False,
            "torch_dtype": str(dtype).removeprefix("torch."),
            "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]},
            "eagle_aux_hidden_state_layer_ids": layers,
            "fastspec": {
                "format_version": 1,
                "feature_layers": layers,
                "feature_layers_meaning": FASTSPEC_FEATURE_LAYERS_MEANING,
                "target_model_type": self.target_model_type,
            },
        }
        if self.rope_scaling:
            data["rope_scaling"] = dict(self.rope_scaling)
        for key, value in self.extra.items():
            data.setdefault(key, value)
        return data

    def llama_config(self):
        """The one-layer ``LlamaConfig`` the rotary embedding and MLP are built from."""
        return one_layer_llama_config(self, mlp_bias=self.mlp_bias)


class Eagle3Attention(nn.Module):
    """Self-attention over the head's one-layer KV cache with q/k/v reading 2H (embedding and feature); eager, with
    an additive 4D mask over every key the cache returns; GQA by repeating key/value heads."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        if heads % kv_heads:
            raise ValueError(f"draft: num_attention_heads {heads} must be a multiple of num_key_value_heads {kv_heads}")
        self.head_dim = config.head_dim or config.hidden_size // heads
        self.num_heads, self.num_kv_heads = heads, kv_heads
        width, bias = 2 * config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(width, heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(self, x, position_embeddings, attention_mask, cache):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

        rows, n, _ = x.shape
        q = self.q_proj(x).view(rows, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(rows, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(rows, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if cache is not None:
            k, v = cache.update(k, v, 0)  # the head's cache has one layer
        groups = self.num_heads // self.num_kv_heads
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim**-0.5
        if attention_mask is not None:
            scores = scores + attention_mask[:, :, :, : k.shape[-2]].to(scores.dtype)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(rows, n, self.num_heads * self.head_dim)
        return self.o_proj(out)


class Eagle3DecoderLayer(nn.Module):
    """EAGLE-3's ``midlayer``: attention over cat(input_layernorm(embedding), hidden_norm(feature)), MLP."""

    def __init__(self, config: Eagle3Config, llama_config):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        size, eps = config.hidden_size, config.rms_norm_eps
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = Eagle3Attention(config)
        self.mlp = LlamaMLP(llama_config)
        self.input_layernorm = LlamaRMSNorm(size, eps=eps)
        self.hidden_norm = LlamaRMSNorm(size, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(size, eps=eps)

    def forward(self, embeds, features, position_embeddings, attention_mask, cache):
        normed = self.hidden_norm(features)
        residual = normed if self.norm_before_residual else features
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = residual + self.self_attn(x, position_embeddings, attention_mask, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class Eagle3Head(DraftHeadBase):
    """An EAGLE-3 head (module docstring): ``fc``, ``midlayer``, ``norm``, ``lm_head`` over the draft vocabulary,
    ``d2t`` / ``t2d``; the target's embedding attached by :meth:`bind`."""

    kind = "EAGLE-3 head"

    def __init__(self, config: Eagle3Config | dict):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        if isinstance(config, dict):
            config = Eagle3Config.from_dict(config)
        self.config = config
        self._llama_config = config.llama_config()
        size = config.hidden_size
        self.fc = nn.Linear(3 * config.target_hidden_size, size, bias=config.bias)
        self.midlayer = Eagle3DecoderLayer(config, self._llama_config)
        self.norm = LlamaRMSNorm(size, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(size, config.draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(config.vocab_size, size) if config.own_embedding else None
        self.rotary_emb = LlamaRotaryEmbedding(config=self._llama_config)
        # the first draft_vocab_size target ids until set (`from_target`, or a checkpoint's d2t / t2d)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.arange(config.vocab_size) < config.draft_vocab_size)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(cls, target_model, draft_vocab_ids: torch.Tensor | None = None,
                    aux_layers: list[int] | None = None, **overrides) -> Eagle3Head:  # fmt: skip
        """A new head for ``target_model`` (bound to it, on its device and dtype): layers shaped like the target's,
        ``aux_layers`` (``hidden_states`` indices; default the inputs of layers {2, L // 2, L - 3}), and a draft
        vocabulary of the target ids ``draft_vocab_ids`` (sorted ascending here; None: the whole vocabulary).
        ``lm_head`` starts as the target's ``lm_head`` rows of the kept tokens (when shapes allow), the rest
        random. ``overrides`` are `Eagle3Config` fields."""
        tcfg = target_model.config.get_text_config() if hasattr(target_model.config, "get_text_config") \
            else target_model.config  # fmt: skip
        vocab = tcfg.vocab_size
        if draft_vocab_ids is not None:
            d2t, t2d = vocab_maps(draft_vocab_ids, vocab)
            overrides.setdefault("draft_vocab_size", d2t.numel())
        config = Eagle3Config.from_target_config(tcfg, feature_layers=aux_layers, **overrides)
        head = cls(config)
        with torch.no_grad():
            if draft_vocab_ids is not None:
                head.d2t.copy_(d2t)
                head.t2d.copy_(t2d)
            lm_head = target_model.get_output_embeddings()
            if lm_head is not None and lm_head.weight.shape == (vocab, config.hidden_size):
                ids = torch.arange(config.draft_vocab_size) + head.d2t
                head.lm_head.weight.copy_(lm_head.weight.detach().float().cpu()[ids])
        weight = target_model.get_input_embeddings().weight
        return head.to(device=execution_device(target_model), dtype=weight.dtype).bind(target_model)

    # ------------------------------------------------------------------ binding
    @property
    def feature_layers(self) -> list[int]:
        return self.config.feature_layers

    @property
    def target_hidden_size(self) -> int:
        return self.config.target_hidden_size

    # ------------------------------------------------------------------ save
    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write the official / SpecForge layout: ``config.json`` (`Eagle3Config.to_official_dict`) and
        ``model.safetensors`` with ``fc.*``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``
        (and ``embed_tokens.weight`` only for a head with its own embedding; never the target's). ``dtype`` casts
        the floating-point weights (default: as they are)."""
        state = {
            k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v) for k, v in self.state_dict().items()
        }
        weight_dtype = dtype or self.fc.weight.dtype
        write_checkpoint(path, self.config.to_official_dict(weight_dtype), state)

    # ------------------------------------------------------------------ features and step
    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        """``fc(cat(low, mid, high))``: the head's input feature [R, n, H] from the target's [R, n, 3 * H_t]."""
        return self.fc(features.to(self.fc.weight.dtype))

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings (a table lookup of the target's, or the head's own, embedding)."""
        weight = self.embed_tokens.weight if self.embed_tokens is not None else self._embed.weight
        return F.embedding(input_ids, weight).to(self.fc.weight.dtype)

    def step(self, features, input_ids, position_ids, attention_mask, cache):
        """`forward` without its checks and default mask: the step `fastspec.compiled` compiles. ``attention_mask``
        [R, 1, n, L] covers every key the cache returns (cached + n for a dynamic cache, the capacity of a
        `fastspec.static_cache.StaticKVCache`); None only for n = 1 with a dynamic cache."""
        dtype = self.fc.weight.dtype
        features = features.to(dtype)
        position_embeddings = self.rotary_emb(features, position_ids)
        if attention_mask is not None:
            attention_mask = attention_mask.to(dtype)
        hidden = self.midlayer(self.embed(input_ids), features, position_embeddings, attention_mask, cache)
        return hidden, self.lm_head(self.norm(hidden))

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., draft_vocab] over the target's vocabulary [..., vocab]: target id = draft id +
        d2t[draft id], -inf for tokens outside the draft vocabulary (identity for a full one: the kept ids are
        ascending, so draft_vocab == vocab means d2t == 0)."""
        vocab, draft = self.config.vocab_size, logits.shape[-1]
        if draft == vocab:
            return logits
        ids = torch.arange(draft, device=logits.device) + self.d2t
        out = logits.new_full((*logits.shape[:-1], vocab), float("-inf"))
        return out.index_copy(-1, ids, logits)
