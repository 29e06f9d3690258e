"""fastspec computes a target's logits itself (`fastspec.runner.project`: on CPU in float32 as W @ h^T, which MKL runs
2-6x faster than h @ W^T for 2 to 5 rows) only where it checked that the model's logits are its lm_head of the last
hidden state (`logits_are_lm_head`); the product equals the lm_head's up to float rounding, anything else falls back
to the lm_head itself, and a soft-capping target keeps HF's forward and stays lossless."""

import pytest
import torch
from conftest import tiny_model
from transformers import Gemma2Config, Gemma2ForCausalLM

import fastspec
from fastspec.runner import logits_are_lm_head, project


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
@pytest.mark.parametrize("bias", [False, True])
def test_projection_equals_the_lm_head_up_to_rounding(rows, bias):
    torch.manual_seed(rows)
    lm_head = torch.nn.Linear(64, 1000, bias=bias)
    hidden = torch.randn(2, rows, 64)
    logits = project(lm_head, hidden)
    assert logits.shape == (2, rows, 1000) and logits.is_contiguous()
    torch.testing.assert_close(logits, lm_head(hidden), rtol=1e-5, atol=1e-5)


class _ScaledLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def test_projection_falls_back_to_the_lm_head_itself():
    """bf16, autocast, more rows than measured, or a module that is not a plain Linear: exactly lm_head(hidden)."""
    torch.manual_seed(0)
    lm_head = torch.nn.Linear(64, 1000)
    hidden = torch.randn(1, 3, 64)
    bf16 = torch.nn.Linear(64, 1000).bfloat16()
    assert torch.equal(project(bf16, hidden.bfloat16()), bf16(hidden.bfloat16()))
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(project(lm_head, hidden), lm_head(hidden))
    many = torch.randn(1, 300, 64)
    assert torch.equal(project(lm_head, many), lm_head(many))
    scaled = _ScaledLinear(64, 1000)
    assert torch.equal(project(scaled, hidden), scaled(hidden))


def _softcapped_gemma2():
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                          final_logit_softcapping=3.0, initializer_range=0.2)  # fmt: skip
    model = Gemma2ForCausalLM(config).eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def test_only_plain_lm_head_logits_are_computed_by_fastspec():
    assert logits_are_lm_head(tiny_model("llama")) and logits_are_lm_head(tiny_model("gpt2"))
    gemma2 = _softcapped_gemma2()
    assert not logits_are_lm_head(gemma2)
    ids = torch.tensor([[5, 9, 17, 3, 44]])
    expected = gemma2.generate(ids, do_sample=False, max_new_tokens=12)
    out = fastspec.generate(gemma2, ids, prompt_lookup=2, num_draft_tokens=3, max_new_tokens=12)
    assert torch.equal(out, expected)
