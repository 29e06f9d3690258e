"""Target features for draft heads come from forward pre-hooks on the decoder layers (`fastspec.runner`), not from
`output_hidden_states=True`: tested equal to transformers' `hidden_states[i]` on six architectures, eagerly, over the
static cache, and compiled."""

import pytest
import torch
from conftest import tiny_model
from transformers import (
    GemmaConfig,
    GemmaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)

from fastspec.runner import CachedModel, decoder_layers, target_logits_and_features

ARCHS = ("llama", "qwen2", "gpt2", "mistral", "phi3", "gemma")


def _model(arch: str):
    if arch in ("llama", "qwen2", "gpt2"):
        return tiny_model(arch, layers=4)
    torch.manual_seed(0)
    sizes = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.2)  # fmt: skip
    if arch == "mistral":
        model = MistralForCausalLM(MistralConfig(**sizes))
    elif arch == "phi3":
        model = Phi3ForCausalLM(Phi3Config(**sizes, pad_token_id=0))
    else:
        model = GemmaForCausalLM(GemmaConfig(**sizes, head_dim=16))
    return model.eval()


@pytest.mark.parametrize("arch", ARCHS)
def test_hooked_features_equal_hidden_states(arch):
    model = _model(arch)
    ids = torch.randint(1, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    layers = [0, 2, 3, -1]
    with torch.no_grad():
        expected = model(ids, output_hidden_states=True)
        logits, features = target_logits_and_features(model, 0, layers, input_ids=ids)
    states = [expected.hidden_states[i] for i in layers]
    assert torch.equal(features, torch.cat(states, dim=-1))
    assert torch.equal(logits, expected.logits)
    assert len(decoder_layers(model)) == 4


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma"])
@pytest.mark.parametrize("mode", ["static", "compiled"])
def test_features_kept_by_the_runner_over_a_static_cache(arch, mode):
    """Prefill then one-token steps over the static cache (compiled: padded widths through torch.compile) keep, per
    column, the states a full forward of the whole sequence gives (no EAGLE-3 -1: the three layer inputs alone)."""
    model = _model(arch)
    ids = torch.randint(1, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    layers = [1, 2, 3]
    runner = CachedModel(model, capacity=256, compile="target" if mode == "compiled" else None)
    runner.keep_features(layers)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        runner.forward(ids[:, :8], mask[:, :8])
        for end in range(9, 13):
            runner.forward(ids[:, :end], mask[:, :end])
        expected = model(ids, output_hidden_states=True).hidden_states
    want = torch.cat([expected[i] for i in layers], dim=-1)
    assert runner.features.values.shape == want.shape
    # other attention shapes than the reference forward: rounding only
    torch.testing.assert_close(runner.features.values, want, atol=1e-4, rtol=1e-4)
