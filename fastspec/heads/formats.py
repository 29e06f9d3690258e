"""Read draft-head directories in the formats the ecosystem publishes: `load_head(path, target)` detects the format
from ``config.json`` (and, where the config alone cannot tell, the weight keys) and returns a head on the target's
device and dtype, bound to it.

Formats (``config.json`` -> head class):
- fastspec's own (``model_type: fastspec_eagle_head``) -> `DraftHead` (`DraftHead.from_pretrained`, unchanged).
- EAGLE-3, official / SpecForge (``architectures`` ``LlamaForCausalLMEagle3`` or vLLM's ``Eagle3LlamaForCausalLM``;
  the EAGLE repository's ``LlamaForCausalLM`` with ``midlayer.*`` keys or an fc 3 x target hidden wide) ->
  `Eagle3Head`. Keys ``fc.*``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``.
- EAGLE-3, vLLM speculators (``architectures: ["Eagle3Speculator"]`` / ``speculators_model_type: "eagle3"``; the
  layer config nested in ``transformer_layer_config``, ``norm_before_residual`` True unless stated) ->
  `Eagle3Head`; keys ``layers.0.*`` instead of ``midlayer.*``.
- EAGLE-1 (a plain one-layer Llama config, ``fc`` 2H wide, ``layers.0.*`` without ``input_layernorm``, no final
  norm, no lm_head: the target's) -> `DraftHead` with ``input_layernorm`` False; ``bias`` (the fc bias) is True when
  absent, as the EAGLE repository reads it.
- Medusa (FasterDecoding ``medusa_lm_head.pt`` + ``{medusa_num_heads, medusa_num_layers}``, or vLLM's safetensors
  layout ``blocks.{i}.layers.{j}.*``, ``lm_heads.{i}.weight``, optional ``token_map``) -> `MedusaHead`.

Weights: ``model.safetensors``, ``pytorch_model.bin`` (``torch.load(weights_only=True)``), shards named by an
``*.index.json``, Medusa's own file names (`fastspec.heads.checkpoint`).

EAGLE-3 aux layers (which target states feed ``fc``), by the field that names them:
- ``eagle_config.eagle_aux_hidden_state_layer_ids`` (what SpecForge writes and SGLang reads): "output of layer j",
  i.e. ``hidden_states[j + 1]`` (SGLang adds 1);
- top-level ``eagle_aux_hidden_state_layer_ids`` (what vLLM and the speculators format read): used as given, the
  input of layer i, ``hidden_states[i]``;
- ``fastspec.feature_layers`` (what fastspec writes next to both): ``hidden_states`` indices, stated in the file;
- none: the default inputs of layers {2, L // 2, L - 3}, on which every engine agrees.
Each engine reads only its own field, so the field's location decides the convention. Files whose fields disagree,
ids outside the target's layers, or values that are not three integers are refused rather than guessed.

Every trap is a ValueError naming the file and the key or field: an unknown architecture; ``draft_vocab_size``
declared but no ``lm_head.weight``; hidden or vocabulary size not matching the target; ``d2t`` out of range, not
ascending, or inconsistent with ``t2d``; missing or unexpected keys; an ``embed_tokens.weight`` that differs from
the target's embedding (engines that use it lose acceptance; ``embed_tokens="ignore"`` reads the head with the
target's embedding anyway).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import torch

from fastspec.heads.checkpoint import CONFIG_NAME, Checkpoint, read_checkpoint, read_config
from fastspec.heads.common import rope_settings
from fastspec.heads.eagle1 import EAGLE1_LAYER_PREFIX, HEAD_MODEL_TYPE, DraftHead, DraftHeadConfig
from fastspec.heads.eagle3 import FASTSPEC_FEATURE_LAYERS_MEANING, Eagle3Config, Eagle3Head, default_aux_layers
from fastspec.heads.medusa import MedusaHead
from fastspec.pair import default_head_dir
from fastspec.runner import execution_device

__all__ = ["detect_format", "load_head", "resolve_aux_layers"]

EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURE = "Eagle3Speculator"
IGNORED_KEY = re.compile(r"(^|\.)rotary_emb\.inv_freq$")


def _text_config(target):
    config = target.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


class _Fields:
    """A config dict whose missing or ill-typed fields are ValueErrors naming the file and the field."""

    def __init__(self, data: dict, path: Path, prefix: str = ""):
        self.data, self.file, self.prefix = data, Path(path) / CONFIG_NAME, prefix

    def where(self, name: str) -> str:
        return f"{self.file} field {self.prefix + name!r}"

    def get(self, name: str, default=None, kind=None):
        value = self.data.get(name, default)
        if value is None and default is None:
            return None
        if kind is not None and not isinstance(value, kind) or isinstance(value, bool) and kind is int:
            raise ValueError(f"draft: {self.where(name)} must be {getattr(kind, '__name__', kind)}, got {value!r}")
        return value

    def need(self, name: str, kind=int):
        if self.data.get(name) is None:
            raise ValueError(f"draft: {self.where(name)} is missing")
        return self.get(name, kind=kind)


# ---------------------------------------------------------------------------------------------------- detection
def detect_format(data: dict, checkpoint: Checkpoint | None, path) -> str:
    """One of "fastspec", "eagle3", "eagle3-speculators", "eagle1", "medusa"; ValueError naming ``architectures``
    for anything else."""
    fields = _Fields(data, path)
    if data.get("model_type") == HEAD_MODEL_TYPE:
        return "fastspec"
    archs = data.get("architectures") or []
    if not isinstance(archs, list):
        raise ValueError(f"draft: {fields.where('architectures')} must be a list, got {archs!r}")
    kind = data.get("speculators_model_type")
    if SPECULATORS_ARCHITECTURE in archs or kind is not None:
        if kind not in (None, "eagle3"):
            raise ValueError(f"draft: {fields.where('speculators_model_type')}: {kind!r} heads are not supported "
                             f"(fastspec reads 'eagle3')")  # fmt: skip
        return "eagle3-speculators"
    if "medusa_num_heads" in data or data.get("model_type") == "medusa" or "MedusaModel" in archs:
        return "medusa"
    if any(a in EAGLE3_ARCHITECTURES for a in archs):
        return "eagle3"
    if "LlamaForCausalLM" in archs or (not archs and data.get("model_type") == "llama"):
        keys = set(checkpoint.tensors) if checkpoint is not None else set()
        if any(k.startswith("midlayer.") for k in keys):
            return "eagle3"
        fc = checkpoint.tensors.get("fc.weight") if checkpoint is not None else None
        if fc is not None and fc.dim() == 2:  # fc [H, 2H]: EAGLE-1; fc [H, 3 H_t]: EAGLE-3
            if fc.shape[1] == 2 * fc.shape[0]:
                return "eagle1"
            if fc.shape[1] == 3 * data.get("target_hidden_size", fc.shape[0]):
                return "eagle3"
        files = checkpoint.weight_files() if checkpoint is not None else "-"
        raise ValueError(
            f"draft: {fields.where('architectures')} is {archs!r} but the weights ({files}) "
            f"are neither an EAGLE-1 head (fc.weight [H, 2H], layers.0.*) nor an EAGLE-3 head (midlayer.*)"
        )
    raise ValueError(
        f"draft: {fields.where('architectures')}: unknown head architecture {archs!r} (model_type "
        f"{data.get('model_type')!r}); fastspec reads {HEAD_MODEL_TYPE}, {', '.join(EAGLE3_ARCHITECTURES)}, "
        f"{SPECULATORS_ARCHITECTURE}, EAGLE-1 LlamaForCausalLM heads and Medusa"
    )


# ---------------------------------------------------------------------------------------------------- shared checks
def _check_embedding(checkpoint: Checkpoint, key: str, target_weight: torch.Tensor, mode: str, role: str) -> None:
    """A copy of the target's `role` weight in the file: fine when equal (in the lower of the two precisions);
    ValueError naming the file and key when it differs, unless `mode` is "ignore"."""
    if mode == "ignore" or key not in checkpoint.tensors:
        return
    mine, theirs = checkpoint.tensors[key], target_weight.detach().cpu()
    if mine.shape == theirs.shape and (torch.equal(mine, theirs.to(mine.dtype)) or torch.equal(mine.to(theirs.dtype),
                                                                                                theirs)):  # fmt: skip
        return
    raise ValueError(
        f"draft: {checkpoint.where(key)} differs from the target's {role} (shape {list(mine.shape)} vs "
        f"{list(theirs.shape)}): the head shares the target's, and a head trained or saved with another one (e.g. a "
        f"random embed_tokens) loses acceptance; pass embed_tokens='ignore' to read it with the target's anyway"
    )


def _load_state(head: torch.nn.Module, checkpoint: Checkpoint, state: dict[str, torch.Tensor], source: dict) -> None:
    """``head.load_state_dict(state)`` with missing and unexpected keys as ValueErrors naming the file and the key
    (``source`` maps a head key to the file's key)."""
    expected = head.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        key = source.get(missing[0], missing[0])
        raise ValueError(f"draft: {checkpoint.path} has no key {key!r} (weights: {checkpoint.weight_files()})")
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        key = source.get(unexpected[0], unexpected[0])
        raise ValueError(f"draft: {checkpoint.where(key)} is not a weight of this head")
    for name, value in state.items():
        if value.shape != expected[name].shape:
            key = source.get(name, name)
            raise ValueError(f"draft: {checkpoint.where(key)} has shape {list(value.shape)}, the head's config "
                             f"makes it {list(expected[name].shape)}")  # fmt: skip
    head.load_state_dict({k: (v.float() if v.is_floating_point() else v) for k, v in state.items()}, strict=True)


def _check_sizes(fields: _Fields, target, hidden_field: str, hidden: int, vocab: int | None) -> None:
    tcfg = _text_config(target)
    if hidden != tcfg.hidden_size:
        raise ValueError(f"draft: {fields.where(hidden_field)} is {hidden}, the target's hidden size is "
                         f"{tcfg.hidden_size}")  # fmt: skip
    target_vocab = target.get_output_embeddings().weight.shape[0]
    if vocab is not None and vocab != target_vocab:
        raise ValueError(f"draft: {fields.where('vocab_size')} is {vocab}, the target's vocabulary size is "
                         f"{target_vocab}")  # fmt: skip


# ---------------------------------------------------------------------------------------------------- EAGLE-3
def resolve_aux_layers(data: dict, path, num_layers: int) -> tuple[list[int], str]:
    """``(hidden_states indices, the field they came from)`` of an EAGLE-3 config (module docstring: the field's
    location decides its convention). ValueError naming the file and fields for disagreeing or invalid ids."""
    fields = _Fields(data, path)
    eagle_config = data.get("eagle_config") or {}
    own = data.get("fastspec") if isinstance(data.get("fastspec"), dict) else {}
    found = []
    for name, ids, shift in (
        ("eagle_config.eagle_aux_hidden_state_layer_ids", eagle_config.get("eagle_aux_hidden_state_layer_ids"), 1),
        ("eagle_aux_hidden_state_layer_ids", data.get("eagle_aux_hidden_state_layer_ids"), 0),
        ("fastspec.feature_layers", own.get("feature_layers"), 0),
    ):
        if ids is None:
            continue
        if not isinstance(ids, list) or len(ids) != 3 or not all(isinstance(i, int) and not isinstance(i, bool)
                                                                 for i in ids):  # fmt: skip
            raise ValueError(f"draft: {fields.where(name)} must be three layer ids, got {ids!r}")
        found.append((name, [i + shift for i in ids]))
    if own.get("feature_layers") is not None and own.get("feature_layers_meaning") != FASTSPEC_FEATURE_LAYERS_MEANING:
        raise ValueError(f"draft: {fields.where('fastspec.feature_layers_meaning')} is "
                         f"{own.get('feature_layers_meaning')!r}; fastspec cannot tell what the ids mean")  # fmt: skip
    if not found:
        return default_aux_layers(num_layers), "default (inputs of layers 2, L // 2, L - 3)"
    if len({tuple(layers) for _, layers in found}) > 1:
        described = "; ".join(f"{name} -> hidden_states {layers}" for name, layers in found)
        raise ValueError(
            f"draft: {fields.file}: the aux layer fields disagree ({described}; SGLang reads eagle_config's ids as "
            f"'output of layer j' = hidden_states[j + 1], vLLM the top-level ids as given): refusing to guess"
        )
    name, layers = found[0]
    if len(set(layers)) != 3:
        raise ValueError(f"draft: {fields.where(name)} repeats a layer ({layers}): EAGLE-3 reads three distinct "
                         f"hidden_states indices (SGLang captures a repeated layer once)")  # fmt: skip
    if any(not 0 <= i < num_layers for i in layers):
        raise ValueError(
            f"draft: {fields.where(name)} names hidden_states {layers} (after its convention), outside the inputs of "
            f"the target's {num_layers} decoder layers [0, {num_layers})"
        )
    return layers, " and ".join(name for name, _ in found)


def _eagle3_config(data: dict, path, target, speculators: bool) -> Eagle3Config:
    top = _Fields(data, path)
    if speculators:
        layer_data = data.get("transformer_layer_config")
        if not isinstance(layer_data, dict):
            raise ValueError(f"draft: {top.where('transformer_layer_config')} is missing (speculators format)")
        layer = _Fields(layer_data, path, "transformer_layer_config.")
    else:
        layer = top
    if layer.get("num_hidden_layers", 1, int) != 1:
        raise ValueError(f"draft: {layer.where('num_hidden_layers')} is {layer.data['num_hidden_layers']}; fastspec "
                         f"reads one-layer EAGLE-3 heads")  # fmt: skip
    if data.get("tie_word_embeddings") or layer.data.get("tie_word_embeddings"):
        raise ValueError(f"draft: {top.where('tie_word_embeddings')} is true: SGLang then uses the embedding as the "
                         f"lm_head and vLLM does not; refusing an ambiguous head")  # fmt: skip
    eagle_config = data.get("eagle_config") or {}
    if eagle_config.get("use_aux_hidden_state", True) is False:
        raise ValueError(f"draft: {top.where('eagle_config.use_aux_hidden_state')} is false; fastspec reads EAGLE-3 "
                         f"heads that fuse three target layers")  # fmt: skip
    hidden = layer.need("hidden_size")
    vocab = layer.need("vocab_size")
    target_hidden = top.get("target_hidden_size", hidden, int)
    _check_sizes(top, target, "target_hidden_size" if "target_hidden_size" in data else "hidden_size", target_hidden,
                 None)  # fmt: skip
    _check_sizes(layer, target, "hidden_size", _text_config(target).hidden_size, vocab)
    draft_vocab = top.get("draft_vocab_size", vocab, int)
    layers, _ = resolve_aux_layers(data, path, _text_config(target).num_hidden_layers)
    theta, scaling = rope_settings(SimpleNamespace(**layer.data))
    heads = layer.need("num_attention_heads")
    extra = {k: data[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in data}
    return Eagle3Config(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads", heads, int),
        intermediate_size=layer.need("intermediate_size"),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=target_hidden,
        feature_layers=layers,
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6, (int, float))),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=layer.get("max_position_embeddings", 4096, int),
        head_dim=layer.get("head_dim", None, int),
        hidden_act=layer.get("hidden_act", "silu", str),
        attention_bias=bool(layer.get("attention_bias", False)),
        mlp_bias=bool(layer.get("mlp_bias", False)),
        bias=bool(top.get("bias", False)),
        norm_before_residual=bool(top.get("norm_before_residual", speculators)),
        target_model_type=(data.get("fastspec") or {}).get("target_model_type") if isinstance(data.get("fastspec"),
                                                                                                 dict) else None,
        extra=extra,
    )  # fmt: skip


def _vocab_maps(checkpoint: Checkpoint, fields: _Fields, draft_vocab: int, vocab: int):
    """``(d2t, t2d)`` checked: draft id i maps to target id i + d2t[i] in [0, vocab), strictly ascending, and
    ``nonzero(t2d) == arange(draft_vocab) + d2t``; derived from one another when one is absent."""
    d2t, t2d = checkpoint.tensors.get("d2t"), checkpoint.tensors.get("t2d")
    base = torch.arange(draft_vocab)
    ids = None
    if d2t is not None:
        if d2t.is_floating_point() or d2t.dim() != 1 or d2t.numel() != draft_vocab:
            raise ValueError(f"draft: {checkpoint.where('d2t')} must be an integer vector of draft_vocab_size "
                             f"{draft_vocab} entries, got {d2t.dtype} {list(d2t.shape)}")  # fmt: skip
        ids = base + d2t.long()
        bad = ((ids < 0) | (ids >= vocab)).nonzero()
        if bad.numel():
            i = int(bad[0])
            raise ValueError(f"draft: {checkpoint.where('d2t')} is out of range: draft id {i} maps to target id "
                             f"{int(ids[i])}, outside [0, {vocab})")  # fmt: skip
        if draft_vocab > 1 and not bool((ids[1:] > ids[:-1]).all()):
            i = int((ids[1:] <= ids[:-1]).nonzero()[0])
            raise ValueError(f"draft: {checkpoint.where('d2t')} must map draft ids to ascending target ids, but draft "
                             f"ids {i} and {i + 1} map to {int(ids[i])} and {int(ids[i + 1])}")  # fmt: skip
    if t2d is not None:
        if t2d.dim() != 1 or t2d.numel() != vocab:
            raise ValueError(f"draft: {checkpoint.where('t2d')} must have vocab_size {vocab} entries, got "
                             f"{list(t2d.shape)}")  # fmt: skip
        kept = t2d.bool().nonzero().flatten()
        if ids is None:
            if kept.numel() != draft_vocab:
                raise ValueError(f"draft: {checkpoint.where('t2d')} keeps {kept.numel()} tokens, "
                                 f"{fields.where('draft_vocab_size')} is {draft_vocab}")  # fmt: skip
            ids = kept
        elif kept.numel() != draft_vocab or not torch.equal(kept, ids):
            raise ValueError(
                f"draft: {checkpoint.where('t2d')} is inconsistent with d2t: it keeps {kept.numel()} target ids, and "
                f"nonzero(t2d) must equal arange(draft_vocab_size) + d2t"
            )
    if ids is None:
        if draft_vocab != vocab:
            raise ValueError(f"draft: {checkpoint.path} has neither 'd2t' nor 't2d', but "
                             f"{fields.where('draft_vocab_size')} {draft_vocab} < vocab_size {vocab}")  # fmt: skip
        ids = base
    t2d_out = torch.zeros(vocab, dtype=torch.bool)
    t2d_out[ids] = True
    return ids - base, t2d_out


def _read_eagle3(data: dict, checkpoint: Checkpoint, target, speculators: bool, embed_tokens: str) -> Eagle3Head:
    path = checkpoint.path
    fields = _Fields(data, path)
    config = _eagle3_config(data, path, target, speculators)
    tensors = {k: v for k, v in checkpoint.tensors.items() if not IGNORED_KEY.search(k)}
    layer_prefix = "midlayer." if any(k.startswith("midlayer.") for k in tensors) else "layers.0."
    if any(k.startswith("layers.") and not k.startswith("layers.0.") for k in tensors):
        extra_layer = next(k for k in tensors if k.startswith("layers.") and not k.startswith("layers.0."))
        raise ValueError(f"draft: {checkpoint.where(extra_layer)}: fastspec reads one-layer EAGLE-3 heads")
    if "lm_head.weight" not in tensors:
        if "draft_vocab_size" in data and data["draft_vocab_size"] is not None:
            raise ValueError(
                f"draft: {fields.where('draft_vocab_size')} declares a draft vocabulary of {config.draft_vocab_size} "
                f"but {path} has no 'lm_head.weight' (weights: {checkpoint.weight_files()}): its lm_head would be "
                f"random and accept nothing"
            )
        # no draft vocabulary declared and no lm_head: SGLang then reads the target's lm_head; so does fastspec
        tensors["lm_head.weight"] = target.get_output_embeddings().weight.detach().float().cpu().clone()
    state, source = {}, {}
    for key, value in tensors.items():
        if key == "embed_tokens.weight" and not config.own_embedding:
            _check_embedding(checkpoint, key, target.get_input_embeddings().weight, embed_tokens, "input embedding")
            continue
        if key in ("d2t", "t2d"):
            continue
        name = "midlayer." + key.removeprefix(layer_prefix) if key.startswith(layer_prefix) else key
        state[name], source[name] = value, key
    state["d2t"], state["t2d"] = _vocab_maps(checkpoint, fields, config.draft_vocab_size, config.vocab_size)
    head = Eagle3Head(config)
    _load_state(head, checkpoint, state, source)
    return head


# ---------------------------------------------------------------------------------------------------- EAGLE-1
def _read_eagle1(data: dict, checkpoint: Checkpoint, target, embed_tokens: str) -> DraftHead:
    fields = _Fields(data, checkpoint.path)
    if fields.get("num_hidden_layers", 1, int) != 1:
        raise ValueError(f"draft: {fields.where('num_hidden_layers')} is {data['num_hidden_layers']}; fastspec "
                         f"reads one-layer EAGLE-1 heads")  # fmt: skip
    hidden = fields.need("hidden_size")
    _check_sizes(fields, target, "hidden_size", hidden, fields.need("vocab_size"))
    tensors = {k: v for k, v in checkpoint.tensors.items() if not IGNORED_KEY.search(k)}
    _check_embedding(checkpoint, "embed_tokens.weight", target.get_input_embeddings().weight, embed_tokens,
                     "input embedding")  # fmt: skip
    _check_embedding(checkpoint, "lm_head.weight", target.get_output_embeddings().weight, embed_tokens, "lm_head")
    tensors.pop("embed_tokens.weight", None)
    tensors.pop("lm_head.weight", None)
    theta, scaling = rope_settings(SimpleNamespace(**data))
    heads = fields.need("num_attention_heads")
    own = data.get("fastspec") if isinstance(data.get("fastspec"), dict) else {}
    config = DraftHeadConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=fields.get("num_key_value_heads", heads, int),
        intermediate_size=fields.need("intermediate_size"),
        vocab_size=fields.need("vocab_size"),
        rms_norm_eps=float(fields.get("rms_norm_eps", 1e-6, (int, float))),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=fields.get("max_position_embeddings", 4096, int),
        target_model_type=own.get("target_model_type") or _text_config(target).model_type,
        head_dim=fields.get("head_dim", None, int),
        hidden_act=fields.get("hidden_act", "silu", str),
        attention_bias=bool(fields.get("attention_bias", False)),
        fc_bias=bool(fields.get("bias", True)),  # the EAGLE repository's default
        input_layernorm=EAGLE1_LAYER_PREFIX + "input_layernorm.weight" in tensors,
    )
    state, source = {}, {}
    for key, value in tensors.items():
        name = "layer." + key.removeprefix(EAGLE1_LAYER_PREFIX) if key.startswith(EAGLE1_LAYER_PREFIX) else key
        state[name], source[name] = value, key
    if config.fc_bias and "fc.bias" not in state:
        raise ValueError(f"draft: {checkpoint.path} has no key 'fc.bias' but {fields.where('bias')} is "
                         f"{data.get('bias', 'absent (EAGLE-1 reads absent as true)')}")  # fmt: skip
    head = DraftHead(config)
    _load_state(head, checkpoint, state, source)
    return head


# ---------------------------------------------------------------------------------------------------- Medusa
_FASTER_DECODING_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.)?(weight|bias)$")


def _read_medusa(data: dict, checkpoint: Checkpoint, target) -> MedusaHead:
    fields = _Fields(data, checkpoint.path)
    num_heads = data.get("medusa_num_heads", data.get("num_heads"))
    num_layers = data.get("medusa_num_layers", data.get("num_hidden_layers", 1))
    for name, value in (("medusa_num_heads", num_heads), ("medusa_num_layers", num_layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if "heads" in name else 0):
            raise ValueError(f"draft: {fields.where(name)} (or vLLM's name) must be a count, got {value!r}")
    state, source = {}, {}
    for key, value in checkpoint.tensors.items():
        name = key.removeprefix("medusa_heads.")
        match = _FASTER_DECODING_KEY.match(name)
        if match:  # FasterDecoding: {head}.{layer}.linear.{weight,bias}, {head}.{num_layers}.weight = vocab proj.
            head_i, layer_j, linear, kind = match.groups()
            if linear:
                name = f"blocks.{head_i}.layers.{layer_j}.{kind}"
            elif int(layer_j) == num_layers and kind == "weight":
                name = f"lm_heads.{head_i}.weight"
        elif name == "lm_head.weight" and data.get("original_lm_head"):
            name = "lm_heads.0.weight"
        state[name], source[name] = value, key
    if data.get("original_lm_head") and "lm_heads.0.weight" in state:  # vLLM: one projection shared by all heads
        for i in range(1, num_heads):
            state.setdefault(f"lm_heads.{i}.weight", state["lm_heads.0.weight"])
    proj = state.get("lm_heads.0.weight")
    if proj is None:
        raise ValueError(f"draft: {checkpoint.path} has no vocabulary projection of Medusa head 0 "
                         f"('0.{num_layers}.weight' or 'lm_heads.0.weight')")  # fmt: skip
    token_map = state.pop("token_map", None)
    hidden = proj.shape[1]
    _check_sizes(fields, target, "hidden_size", data.get("hidden_size", hidden), data.get("vocab_size"))
    vocab = target.get_output_embeddings().weight.shape[0]
    if token_map is not None:
        if token_map.dim() != 1 or ((token_map < 0) | (token_map >= vocab)).any():
            raise ValueError(f"draft: {checkpoint.where(source.get('token_map', 'token_map'))} must hold target ids in "
                             f"[0, {vocab})")  # fmt: skip
        state["token_map"] = token_map.long()
    bias = any(k.startswith("blocks.") and k.endswith(".bias") for k in state)
    head = MedusaHead(hidden, vocab, num_heads, num_layers, bias=bias, token_map=token_map)
    _load_state(head, checkpoint, state, source)
    return head


# ---------------------------------------------------------------------------------------------------- entry point
def load_head(path=None, target=None, dtype: torch.dtype | None = None, *, embed_tokens: str = "check"):
    """Load the draft head in directory ``path`` (default: the head shipped for the shipped target) in any format
    of the module docstring, bound to ``target`` (a `DraftHead` or `Eagle3Head`) or ready for it (a `MedusaHead`),
    on the target's device and dtype (or ``dtype``), in eval mode.

    ``target`` may be None only for fastspec's own format; every other format is checked against its target.
    ``embed_tokens``: "check" (default) refuses a head file whose ``embed_tokens.weight`` (or, for EAGLE-1,
    ``lm_head.weight``) differs from the target's; "ignore" reads it with the target's anyway.
    """
    if embed_tokens not in ("check", "ignore"):
        raise ValueError(f"embed_tokens: expected 'check' or 'ignore', got {embed_tokens!r}")
    path = Path(path) if path is not None else default_head_dir()
    data = read_config(path)
    if data.get("model_type") == HEAD_MODEL_TYPE:
        return DraftHead.from_pretrained(path, target=target, dtype=dtype)
    if target is None:
        raise ValueError(f"target: reading the head at {path} needs its target model (sizes and layers are checked)")
    checkpoint = read_checkpoint(path)
    fmt = detect_format(data, checkpoint, path)
    if fmt in ("eagle3", "eagle3-speculators"):
        head = _read_eagle3(data, checkpoint, target, fmt == "eagle3-speculators", embed_tokens)
    elif fmt == "eagle1":
        head = _read_eagle1(data, checkpoint, target, embed_tokens)
    else:
        head = _read_medusa(data, checkpoint, target)
    lm_head = target.get_output_embeddings()  # the head computes where the target's lm_head does
    head.to(device=execution_device(lm_head), dtype=dtype or lm_head.weight.dtype)
    if not isinstance(head, MedusaHead):
        head.bind(target)
    return head.eval()
