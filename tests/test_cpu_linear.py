"""`fastspec.cpu_linear`: a few rows times a weight as ``W @ x^T`` equals ``F.linear`` up to rounding; the mode
routes only float32 CPU calls of at most `MAX_ROWS` rows outside autocast; a runner uses it only for models whose
weights stream from memory and where one timed pass measured it faster; decoding under it stays lossless."""

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_model

import fastspec
from fastspec import cpu_linear
from fastspec.cpu_linear import MAX_ROWS, linear_mode, transposed_linear


@pytest.mark.parametrize("shape", [(64,), (1, 64), (1, 2, 64), (3, 64), (2, 4, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_transposed_linear_equals_f_linear_up_to_rounding(shape, bias):
    torch.manual_seed(len(shape))
    layer = torch.nn.Linear(64, 300, bias=bias)
    x = torch.randn(*shape)
    out = transposed_linear(x, layer.weight, layer.bias)
    assert out.shape == (*shape[:-1], 300) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_the_mode_routes_only_small_float32_cpu_products(monkeypatch):
    routed = []
    real = cpu_linear.transposed_linear
    monkeypatch.setattr(cpu_linear, "transposed_linear", lambda *a: routed.append(a[0].shape) or real(*a))
    layer = torch.nn.Linear(64, 32)
    mode = cpu_linear._SmallRowLinear()
    with mode:
        layer(torch.randn(1, 2, 64))  # routed
        layer(torch.randn(MAX_ROWS + 1, 64))  # too many rows
        layer.to(torch.bfloat16)(torch.randn(2, 64, dtype=torch.bfloat16))  # bf16
        layer.float()
        with torch.autocast("cpu", torch.bfloat16):
            layer(torch.randn(2, 64))  # autocast decides the dtype
        torch.nn.functional.linear(input=torch.randn(3, 64), weight=layer.weight)  # keywords: routed
    assert routed == [(1, 2, 64), (3, 64)]


def test_small_models_and_unprofitable_machines_get_no_mode(monkeypatch):
    """The shipped-size models stay below the weight threshold (no calibration runs); a large model runs under the
    mode only if the calibration measured it at least `MIN_GAIN` faster."""
    calls = []
    monkeypatch.setattr(cpu_linear, "_calibrate", lambda weights: calls.append(len(weights)) or 1.0)
    assert linear_mode(tiny_model("llama")) is None and not calls
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 1)
    assert linear_mode(tiny_model("llama", seed=1)) is None and calls  # measured 1.0x: off
    monkeypatch.setattr(cpu_linear, "_calibrate", lambda weights: cpu_linear.MIN_GAIN)
    assert linear_mode(tiny_model("llama", seed=2)) is not None


def test_calibration_times_both_products_over_the_weights():
    weights = [torch.randn(32, 16), torch.randn(16, 32)]
    assert cpu_linear._calibrate(weights, repeats=1) > 0


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_decoding_under_the_mode_is_lossless(arch, monkeypatch):
    """Greedy speculative and plain decoding with the target's (and draft's) small-row products transposed: equal
    to HF greedy; sampling with a seed reproduces itself."""
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 1)
    monkeypatch.setattr(cpu_linear, "_calibrate", lambda weights: 2.0)
    routed = []
    real = cpu_linear.transposed_linear
    monkeypatch.setattr(cpu_linear, "transposed_linear", lambda *a: routed.append(1) or real(*a))
    target = tiny_model(arch, layers=2)
    draft = tiny_model(arch, layers=1, seed=3)
    ids = torch.tensor([[5, 9, 17, 3, 44, 8], [7, 7, 12, 30, 2, 9]])
    expected = target.generate(ids, do_sample=False, max_new_tokens=16, pad_token_id=0)
    assert torch.equal(fastspec.generate(target, ids, max_new_tokens=16), expected)
    assert torch.equal(fastspec.generate(target, ids, draft=draft, num_draft_tokens=3, max_new_tokens=16), expected)
    assert routed
    first = fastspec.generate(target, ids, draft=draft, do_sample=True, seed=4, max_new_tokens=16)
    assert torch.equal(first, fastspec.generate(target, ids, draft=draft, do_sample=True, seed=4, max_new_tokens=16))
