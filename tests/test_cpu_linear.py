"""`fastspec.cpu_linear`: a few rows times a weight as ``W @ x^T`` equals ``F.linear`` up to rounding; the mode
routes only float32 CPU calls of at most `MAX_ROWS` rows outside autocast; a runner uses it only for models whose
weights stream from memory and, in "auto", where one timed pass measured it faster (said in a log line); the switch
(`set_mode`, ``FASTSPEC_CPU_LINEAR``) turns it on or off without timing anything; the calibration leaves torch's
global random state alone; decoding under it stays lossless."""

import logging

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
    mode = cpu_linear.SmallRowLinear()
    with mode:
        layer(torch.randn(1, 2, 64))  # routed
        layer(torch.randn(MAX_ROWS + 1, 64))  # too many rows
        layer.to(torch.bfloat16)(torch.randn(2, 64, dtype=torch.bfloat16))  # bf16
        layer.float()
        with torch.autocast("cpu", torch.bfloat16):
            layer(torch.randn(2, 64))  # autocast decides the dtype
        torch.nn.functional.linear(input=torch.randn(3, 64), weight=layer.weight)  # keywords: routed
    assert routed == [(1, 2, 64), (3, 64)]


@pytest.fixture(autouse=True)
def auto_mode(monkeypatch):
    """Every test starts in "auto", whatever the environment says, and leaves no mode set."""
    monkeypatch.delenv(cpu_linear.ENVIRONMENT_VARIABLE, raising=False)
    yield
    cpu_linear.set_mode(None)


def test_small_models_and_unprofitable_machines_get_no_mode(monkeypatch, caplog):
    """The shipped-size models stay below the weight threshold (no calibration runs); a large model runs under the
    mode only if the calibration measured it at least `MIN_GAIN` faster, and a log line says what it decided."""
    calls = []
    monkeypatch.setattr(cpu_linear, "calibrate", lambda weights: calls.append(len(weights)) or 1.0)
    assert linear_mode(tiny_model("llama")) is None and not calls
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 1)
    with caplog.at_level(logging.INFO, logger="fastspec"):
        assert linear_mode(tiny_model("llama", seed=1)) is None and calls  # measured 1.0x: off
    assert "CPU linear mode off for this LlamaForCausalLM: W @ x^T measured 1.00x" in caplog.text
    monkeypatch.setattr(cpu_linear, "calibrate", lambda weights: cpu_linear.MIN_GAIN)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastspec"):
        model = tiny_model("llama", seed=2)
        assert linear_mode(model) is not None and linear_mode(model) is not None
    assert caplog.text.count("CPU linear mode on") == 1  # once per model and process


def test_the_switch_turns_the_mode_on_or_off_without_timing(monkeypatch):
    """`set_mode` and ``FASTSPEC_CPU_LINEAR``: "on" and "off" decide without calibrating (small models stay off), the
    Python switch wins over the environment, None goes back to it, and a bad value names the argument or variable."""
    monkeypatch.setattr(cpu_linear, "calibrate", lambda weights: pytest.fail("calibrated under a fixed mode"))
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 1)
    monkeypatch.setenv(cpu_linear.ENVIRONMENT_VARIABLE, "on")
    assert cpu_linear.mode() == "on" and linear_mode(tiny_model("llama", seed=3)) is not None
    cpu_linear.set_mode("off")
    assert cpu_linear.mode() == "off" and linear_mode(tiny_model("llama", seed=4)) is None
    cpu_linear.set_mode(None)
    monkeypatch.setenv(cpu_linear.ENVIRONMENT_VARIABLE, "OFF")
    assert cpu_linear.mode() == "off"
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 2**40)
    cpu_linear.set_mode("on")
    assert linear_mode(tiny_model("llama", seed=5)) is None  # below the weight threshold: never
    with pytest.raises(ValueError, match="mode: one of 'auto', 'on', 'off'"):
        cpu_linear.set_mode("fast")
    cpu_linear.set_mode(None)
    monkeypatch.setenv(cpu_linear.ENVIRONMENT_VARIABLE, "yes")
    with pytest.raises(ValueError, match="FASTSPEC_CPU_LINEAR='yes': expected auto, on or off"):
        cpu_linear.mode()


def test_calibration_times_both_products_over_the_weights():
    weights = [torch.randn(32, 16), torch.randn(16, 32)]
    assert cpu_linear.calibrate(weights, repeats=1) > 0


def test_the_first_call_leaves_the_global_generator_where_later_calls_do(monkeypatch):
    """The calibration inside a model's first `generate` call draws from a generator of its own: after
    `torch.manual_seed(123)` the first call leaves torch's global generator where every later call does."""
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 1)
    target = tiny_model("llama", seed=6)
    ids = torch.tensor([[5, 9, 17, 3]])
    after = []
    for _ in range(2):  # the first call calibrates, the second does not
        torch.manual_seed(123)
        fastspec.generate(target, ids, max_new_tokens=4)
        after.append(torch.rand(4))
    assert target in cpu_linear._DECISIONS  # it did calibrate
    assert torch.equal(after[0], after[1])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_decoding_under_the_mode_is_lossless(arch, monkeypatch):
    """Greedy speculative and plain decoding with the target's (and draft's) small-row products transposed: equal
    to HF greedy; sampling with a seed reproduces itself."""
    monkeypatch.setattr(cpu_linear, "MIN_WEIGHT_BYTES", 1)
    cpu_linear.set_mode("on")
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
