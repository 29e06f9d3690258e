"""Tiny randomly initialised causal LMs of every decoder-only model type transformers generates with, built offline.

`tiny_causal_lm(model_type)` builds a model from its config class alone (never a hub id): hidden size 64, 2-4 layers
(enough that every layer kind the architecture has appears: sliding and full attention, linear attention / SSM and
attention, dense and MoE MLPs), vocabulary 256, fp32, eval mode, attention windows shortened below prompt + output, EOS
off (every decode runs its full length). `partial_draft(target)` is a noisy copy of a target whose drafts are partly
accepted. `decoder_types()` lists the model types of transformers' causal-LM mapping that are swept, `SKIPPED` the rest
with the reason; `REPRESENTATIVES` is one model type per layer kind, the default share of the tests.
"""

from __future__ import annotations

import copy
import warnings

import torch
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

VOCAB = 256
HIDDEN = 64

# one model type per layer kind (fast to build and to decode)
REPRESENTATIVES = (
    "llama",  # plain causal attention, rotary positions
    "mistral",  # one sliding window on every layer
    "gemma2",  # sliding and full attention layers mixed
    "llama4_text",  # chunked attention and full attention layers
    "mpt",  # ALiBi position bias
    "bloom",  # ALiBi position bias, its own cache layout
    "qwen3_next",  # hybrid: gated delta-net linear attention and full attention
    "lfm2",  # hybrid: short convolutions and full attention
    "mamba",  # state-space model: no attention at all
    "deepseek_v32",  # indexed (sparse) attention with an indexer key cache
    "gpt2",  # learned absolute positions
    "openai-gpt",  # no cache at all: every step re-reads the whole sequence
)

_ENCODER_AS_DECODER = (
    "an encoder (bidirectional masked LM) that only decodes with is_decoder=True; not a causal-LM family"
)
_ENCODER_DECODER = "the decoder half of an encoder-decoder model; it generates conditioned on an encoder"
SKIPPED: dict[str, str] = {
    **dict.fromkeys(
        ["bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus", "plbart"],
        _ENCODER_DECODER,
    ),
    **dict.fromkeys(["prophetnet", "trocr", "whisper", "musicgen", "musicgen_melody"], _ENCODER_DECODER),
    **dict.fromkeys(
        ["bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie", "megatron-bert"],
        _ENCODER_AS_DECODER,
    ),
    **dict.fromkeys(
        ["rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer", "xlm-roberta", "xlm-roberta-xl", "xmod"],
        _ENCODER_AS_DECODER,
    ),
    "xlm": "a masked/translation LM (XLMWithLMHeadModel) without a causal generation cache",
    **dict.fromkeys(
        ["gemma3", "gemma3n", "gemma4", "gemma4_unified", "got_ocr2", "moss_transcribe_diarize"],
        "a vision/audio-language ForConditionalGeneration wrapper; its text decoder is swept under its own type",
    ),
    **dict.fromkeys(
        ["gemma4_assistant", "gemma4_unified_assistant"],
        "a drafter that runs on its target's hidden states and shared KV cache, not a standalone LM",
    ),
    **{
        wrapper: f"a multimodal config whose causal LM is the text model, swept as {text}"
        for wrapper, text in {
            "llama4": "llama4_text",
            "qwen3_5": "qwen3_5_text",
            "qwen3_5_moe": "qwen3_5_moe_text",
            "qwen4_exp": "qwen4_exp_text",
            "dots3_note": "dots3_note_text",
        }.items()
    },
}


def decoder_types() -> list[str]:
    """The model types of transformers' causal-LM mapping that the sweep builds (all but `SKIPPED`), sorted."""
    return sorted(t for t in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if t not in SKIPPED)


# size fields, set where the config class has them and its default is not None (None: the feature is off)
_SIZES = {
    **dict.fromkeys(["vocab_size", "unpadded_vocab_size"], VOCAB),
    **dict.fromkeys(["hidden_size", "n_embd", "d_model", "n_embed", "dim", "embed_dim"], HIDDEN),
    **dict.fromkeys(["num_attention_heads", "n_head", "n_heads", "num_heads", "swa_num_attention_heads"], 4),
    **dict.fromkeys(["num_key_value_heads", "num_kv_heads", "multi_query_group_num", "swa_num_key_value_heads"], 2),
    **dict.fromkeys(["head_dim", "swa_head_dim"], 16),
    "rotary_dim": 8,
    **dict.fromkeys(
        ["hidden_size_global", "hidden_size_per_layer_input"], HIDDEN
    ),  # BLT; Gemma 3n / 4 per-layer inputs
    "vocab_size_per_layer_input": VOCAB,
    "encoder_hash_byte_group_vocab": VOCAB,
    **dict.fromkeys(["intermediate_size", "ffn_dim", "d_ff", "ffn_hidden_size", "n_inner"], 128),
    **dict.fromkeys(["max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"], 128),
    # mixture of experts: 4 experts, 2 per token, the first layer dense where the model has dense layers
    **dict.fromkeys(["num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"], 4),
    **dict.fromkeys(["num_experts_per_tok", "moe_k", "moe_topk", "num_experts_per_token"], 2),
    **dict.fromkeys(["moe_intermediate_size", "shared_expert_intermediate_size", "expert_ffn_hidden_size"], 32),
    **dict.fromkeys(["shared_experts_intermediate_size", "moe_shared_expert_intermediate_size"], 32),
    **dict.fromkeys(["n_group", "topk_group", "num_expert_group"], 1),
    **dict.fromkeys(["first_k_dense_replace", "num_dense_layers"], 1),
    # multi-head latent attention (DeepSeek-V2/V3 style): rotary part of 8, head 16
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "v_head_dim": 16,
    # indexed attention (DeepSeek-V3.2 style): 8 indexer heads, as with fewer the ReLU'd index scores of random
    # weights tie exactly at 0 and transformers' top-k picks among ties differently for a forward of several tokens
    # than one by one (its own greedy then differs from its full forward by logit gaps up to 8)
    "index_n_heads": 8,
    "index_num_heads": 2,  # Kolibri's indexer heads share a key head: at most its query heads
    "index_head_dim": 16,
    "index_topk": 4,
    # state-space / linear-attention layers: expand 2 x hidden 64 = 4 heads x 32
    **dict.fromkeys(["state_size", "ssm_state_size", "mamba_d_state"], 8),
    **dict.fromkeys(["mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "linear_num_heads"], 4),
    **dict.fromkeys(["mamba_d_head", "mamba_head_dim", "mamba_headdim"], 32),
    "linear_head_dim": 16,
    **dict.fromkeys(["linear_num_key_heads", "linear_num_value_heads"], 2),
    **dict.fromkeys(["linear_key_head_dim", "linear_value_head_dim"], 16),
    **dict.fromkeys(["n_groups", "mamba_n_groups", "mamba_ngroups"], 1),
    **dict.fromkeys(["time_step_rank", "mamba_dt_rank"], 8),
    "mamba_chunk_size": 8,
    # layer patterns given by a period: every second layer of the other kind
    **dict.fromkeys(
        ["attn_layer_period", "expert_layer_period", "sliding_window_pattern", "_sliding_window_pattern"], 2
    ),
    **dict.fromkeys(["global_attn_every_n_layers", "global_attention_every_n_layers", "no_rope_layer_interval"], 2),
    **dict.fromkeys(["attn_layer_offset", "expert_layer_offset"], 1),
    "initializer_range": 0.2,  # peaked next-token logits: greedy is rarely a near-tie
}
# attention windows, shortened to `window` (where the default has one)
_WINDOWS = (
    "sliding_window",
    "attention_chunk_size",
    "sliding_window_size",
    "attention_window_size",
    "window_size",
    "local_attention_window_len",
    "local_attention",
    "keep_window_size",
)
# per-layer lists that name each layer's kind; resized so every kind appears
_LAYER_LISTS = (
    "layer_types",
    "mlp_layer_types",
    "indexer_types",
    "no_rope_layers",
    "attention_layers",
    "attn_layers",
    "layers_block_type",
)

# model-specific fields the generic rules above do not cover: {model_type: {field: value}}
_SPECIAL: dict[str, dict] = {
    "lfm2": {"layer_types": ["conv", "full_attention"]},  # the default is all attention; LFM2 is mostly convolutions
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},  # the default has no attention
    "bamba": {"attn_layer_indices": [1]},
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    "llama4_text": {"moe_layers": [1]},
    "mamba2": {"head_dim": 32},  # expand 2 x hidden 64 = 4 heads x 32
    "falcon_h1": {"mamba_d_ssm": 128},
    "zaya": {"num_experts_per_tok": 1},
    "xlstm": {"qk_dim_factor": 1.0},  # transformers' recurrent step assumes key and value heads of one size
    "deepseek_v2": {"num_experts_per_tok": 2},  # the default routes to None experts per token
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1},
    "dots3_note_text": {"num_key_value_heads": 4, "head_dim": 16, "per_layer_config": {}},
    "gemma4_text": {"global_head_dim": 32},  # full-attention layers' head size (default 512)
    "gemma4_unified_text": {"global_head_dim": 32},
    "gemma3n_text": {  # the last two layers share the first two's key/value caches
        "num_hidden_layers": 4,
        "num_kv_shared_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "dory": {  # one input, two recurrent (looped), one output layer
        "num_hidden_layers": 4,
        "n_input_layers": 1,
        "n_recurrent_layers": 2,
        "n_output_layers": 1,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    },
    "zamba2": {"hybrid_layer_ids": [1]},
    "reformer": {"is_decoder": True, "axial_pos_shape": [8, 16], "axial_pos_embds_dim": [32, 32]},
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 16,
        "indexer_budget": 4,
        "indexer_compress_ratio": 2,
    },
    "dbrx": {
        "attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
    },
}

# size fields whose None default turns a feature off (dense instead of MoE, no query compression, full rotary)
_NONE_IS_OFF = {
    "n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts", "num_experts_per_tok", "moe_k",
    "moe_topk", "num_experts_per_token", "q_lora_rank", "rotary_dim", "first_k_dense_replace", "num_dense_layers",
}  # fmt: skip


def _kinds_cycle(values: list, n: int) -> list:
    """`n` entries cycling through the distinct values of `values` in first-appearance order."""
    kinds = list(dict.fromkeys(values))
    return [kinds[i % len(kinds)] for i in range(n)]


def _default_config(model_type: str) -> PretrainedConfig:
    """The default config the causal-LM class of `model_type` takes (a composite config's text config where the
    causal LM is its text model)."""
    default = AutoConfig.for_model(model_type)
    config_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(default)].config_class
    text = getattr(default, "text_config", None)
    return text if text is not None and config_class is type(text) else default


def _fields(config: PretrainedConfig) -> dict:
    """A config's fields and values (attribute values where readable: per-layer lists as the model reads them)."""
    fields = config.to_dict()
    for name in fields:
        try:
            fields[name] = getattr(config, name)
        except Exception:  # a per-layer attribute with no global value: keep the serialised one
            pass
    return fields


def _tiny_kwargs(model_type: str, default: PretrainedConfig, window: int) -> dict:
    """The config arguments that make `default` tiny (see `tiny_config`)."""
    fields = _fields(default)
    kwargs = {k: v for k, v in _SIZES.items() if k in fields and (fields[k] is not None or k not in _NONE_IS_OFF)}
    if "kv_lora_rank" in kwargs:  # latent attention: one key/value per query head, head_dim is the rotary part
        kwargs |= {"num_key_value_heads": kwargs["num_attention_heads"], "head_dim": kwargs["qk_rope_head_dim"]}
    kwargs |= {k: window for k in _WINDOWS if type(fields.get(k)) is int}
    n_default = next((fields[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if fields.get(k)), None)
    lists = {k: fields[k] for k in _LAYER_LISTS if isinstance(fields.get(k), list) and len(fields[k]) == n_default}
    layers = min(4, max([2] + [len(set(map(str, v))) for v in lists.values()]))
    kwargs |= {k: layers for k in ("num_hidden_layers", "n_layer", "n_layers", "num_layers") if k in fields}
    kwargs |= {k: _kinds_cycle(v, layers) for k, v in lists.items()}
    # untied output head: with tied embeddings a random model mostly predicts its input token again
    kwargs |= {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": None, "tie_word_embeddings": False}
    kwargs |= {"use_cache": True}  # some defaults (MPT) turn the cache off; the sweep is about decoding with it
    for name, sub in fields.items():  # sub-configs (a multimodal model's text model, BLT's patcher...): tiny too
        if isinstance(sub, PretrainedConfig):
            kwargs[name] = type(sub)(**_tiny_kwargs(sub.model_type, sub, window))
    return kwargs | _SPECIAL.get(model_type, {})


def tiny_config(model_type: str, *, window: int = 8) -> PretrainedConfig:
    """The tiny config of `model_type`: the sizes above, every layer kind present, `window`-token windows, no EOS."""
    if model_type in SKIPPED:
        raise ValueError(f"{model_type} is not swept: {SKIPPED[model_type]}")
    default = _default_config(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return type(default)(**_tiny_kwargs(model_type, default, window))


def tiny_causal_lm(model_type: str, *, window: int = 8, seed: int = 0) -> torch.nn.Module:
    """A tiny fp32 causal LM of `model_type` in eval mode, random weights from `seed`; EOS off, pad id 0."""
    config = tiny_config(model_type, window=window)
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.for_model(model_type))](config)
    model = model.float().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _noisy_copy(model: torch.nn.Module, relative: float, seed: int) -> torch.nn.Module:
    """`model` with N(0, (relative * mean |w|)^2) noise added to every floating-point weight."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            if param.is_floating_point():
                scale = relative * param.abs().mean().clamp(min=1e-3)
                param.add_(torch.randn(param.shape, generator=gen) * scale)
    return draft


def _greedy_continuation(model: torch.nn.Module, ids: torch.Tensor, steps: int) -> torch.Tensor:
    """`ids` [1, T] and `steps` greedy tokens of `model`, each from a full forward without cache: [1, T + steps]."""
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids


def partial_draft(target: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """A draft that shares the target's weights up to noise, scaled so that its greedy next token agrees with the
    target's on at most 70 % of the target's own greedy continuation (teacher-forced): drafts are partly accepted.

    The noise grows geometrically from 1 % of each weight's mean magnitude until the agreement on 24 greedy tokens after
    a random 12-token prompt falls to 70 % or less; that draft is returned.
    """
    vocab = min(target.config.get_text_config().vocab_size, VOCAB)
    prompt = torch.randint(3, vocab, (1, 12), generator=torch.Generator().manual_seed(seed))
    ids = _greedy_continuation(target, prompt, 24)  # [1, 36]
    relative = 0.01
    while True:
        draft = _noisy_copy(target, relative, seed)
        with torch.no_grad():
            agreement = (draft(ids).logits[:, 11:-1].argmax(-1) == ids[:, 12:]).float().mean().item()
        if agreement <= 0.7 or relative > 4:
            return draft
        relative *= 1.5
