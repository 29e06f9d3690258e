"""Sliding-window and chunked attention in every path that hands a model a ready-made 4D mask (`fastspec.masks`).

Trees and the static cache used to apply one full-attention mask to every layer: once prompt plus output passed
the window, tokens differed from the target's greedy output (issue 44). Here windows are shorter than the prompt,
so every step depends on the window:
- the masks equal transformers' own (`create_sliding_window_causal_mask`, `create_chunked_causal_mask`) for a
  left-padded prefill, where both are defined;
- greedy output equals `target.generate` for trees (static and dynamic), the static cache and ragged batches on a
  model whose every layer is windowed (Mistral: one 4D mask), models that mix windowed and full layers (Gemma 2,
  gpt-oss, Llama 4's chunks: a dict of masks keyed by layer kind) and a Qwen2 with sliding layers;
- a model whose forward takes one mask for layers of several kinds is refused by name before decoding.
"""

import pytest
import torch
import transformers as tf
from transformers.masking_utils import create_chunked_causal_mask, create_sliding_window_causal_mask

import fastspec
from fastspec.masks import AttentionKinds
from fastspec.runner import causal_visibility, position_ids
from tests.conftest import left_padded_batch, perturbed_copy

WINDOW = 6  # shorter than every prompt below
COMMON = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2,
)  # fmt: skip


def windowed_model(arch: str, seed: int = 0):
    """A tiny fp32 model whose attention windows (or chunks) are WINDOW tokens, EOS off."""
    torch.manual_seed(seed)
    if arch == "mistral":  # every layer sliding: one 4D mask
        model = tf.MistralForCausalLM(tf.MistralConfig(**COMMON, sliding_window=WINDOW))
    elif arch == "gemma2":  # sliding and full layers, softcapping: a dict of masks
        config = tf.Gemma2Config(**COMMON, head_dim=16, sliding_window=WINDOW)
        model = tf.Gemma2ForCausalLM(config)
    elif arch == "gpt_oss":  # sliding and full layers, attention sinks, experts
        config = tf.GptOssConfig(**COMMON, head_dim=16, sliding_window=WINDOW, num_local_experts=4)
        model = tf.GptOssForCausalLM(config)
    elif arch == "llama4_text":  # chunked and full (no-rope) layers
        config = tf.Llama4TextConfig(
            **COMMON, head_dim=16, attention_chunk_size=WINDOW, intermediate_size_mlp=128, num_local_experts=2
        )
        model = tf.Llama4ForCausalLM(config)
    elif arch == "qwen2":  # full layers below max_window_layers, sliding above
        config = tf.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)
        model = tf.Qwen2ForCausalLM(config)
    else:
        raise ValueError(arch)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.mark.parametrize("arch", ["mistral", "llama4_text"])
def test_masks_equal_transformers_own_for_a_left_padded_prefill(arch):
    """Position-based window and chunk rules = transformers' column-based ones over a left-padded buffer."""
    model = windowed_model(arch)
    kinds = AttentionKinds(model)
    ids, mask = left_padded_batch(128, [15, 9, 4], seed=1)
    create = create_sliding_window_causal_mask if arch == "mistral" else create_chunked_causal_mask
    kind = "sliding_attention" if arch == "mistral" else "chunked_attention"
    pos = position_ids(mask)
    config = model.config.get_text_config()
    config._attn_implementation = "eager"  # a materialised additive mask, as fastspec hands models
    theirs = create(config, torch.zeros(*ids.shape, 64), mask, None, position_ids=pos)
    ours = kinds.masks(causal_visibility(mask, 0), pos, pos, torch.float32)
    ours = ours[kind] if isinstance(ours, dict) else ours
    real = mask.bool()  # rows of padded queries differ (transformers keeps them from being all-masked)
    assert torch.equal((ours[:, 0] == 0)[real], (theirs[:, 0] == 0)[real])


CASES = {
    "tree": dict(tree="small"),
    "dynamic_tree": dict(tree="dynamic"),
    "static": dict(static_cache=True),
    "static_tree": dict(static_cache=True, tree="small"),
}


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gpt_oss", "llama4_text", "qwen2"])
@pytest.mark.parametrize("case", list(CASES))
def test_windowed_models_decode_greedy_equal_past_the_window(arch, case):
    target = windowed_model(arch)
    draft = perturbed_copy(target, 0.05)
    ids = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    expected = target.generate(ids, max_new_tokens=20, do_sample=False)
    out, stats = fastspec.generate(target, ids, draft=draft, max_new_tokens=20, return_stats=True, **CASES[case])
    assert torch.equal(out, expected)
    assert stats.accepted > 0  # the draft's tokens were used, so the tree / chain masks were exercised


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "llama4_text"])
@pytest.mark.parametrize("case", ["tree", "static"])
def test_windowed_ragged_batches_decode_greedy_equal(arch, case):
    """Rows of different lengths accept different numbers of drafts: positions, not columns, set the window."""
    target = windowed_model(arch)
    draft = perturbed_copy(target, 0.05)
    ids, mask = left_padded_batch(128, [13, 7, 10], seed=3)
    expected = target.generate(ids, attention_mask=mask, max_new_tokens=20, do_sample=False)
    out = fastspec.generate(target, ids, attention_mask=mask, draft=draft, max_new_tokens=20, **CASES[case])
    assert torch.equal(out, expected)


def test_mixed_kinds_without_a_mask_dict_are_refused_by_name_before_decoding():
    """Mistral's forward takes one mask for every layer: layer kinds it mixes cannot each get their own."""
    target = windowed_model("mistral")
    target.config.layer_types = ["sliding_attention", "full_attention"]
    calls = []
    target.register_forward_pre_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match="mistral.*takes one mask"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), tree="small", draft=target, max_new_tokens=4)
    assert not calls  # refused before the first forward
    assert fastspec.generate(target, torch.tensor([[3, 4, 5]]), max_new_tokens=4).shape == (1, 7)  # chains decode
