"""Static KV cache and compiled steps (`static_cache=True`, `compile=True`).

- With the preallocated cache (eager), greedy output equals `target.generate(do_sample=False)` for every drafting
  mode (normal, chain, adaptive K, prompt lookup, lookup then draft, static and dynamic trees), on ragged batches
  of three architectures: crop, right-alignment, row selection and tree compaction are index updates there.
- The buffers are allocated once per layer and model and never replaced (memory flat after the prefill).
- `compile=True` gives the eager path's greedy output, logs each shape it compiles once, reuses it in a second
  call, and falls back to eager decoding with a warning when torch.compile fails.
- A compiled shape is (rows, width, cache capacity), and capacities are rounded to multiples of 256, so calls whose
  prompts differ a little in length share graphs (a new capacity used to recompile every step shape silently).
"""

import logging

import pytest
import torch
from conftest import ARCHITECTURES, hf_greedy, left_padded_batch, perturbed_copy, tiny_model

import fastspec
from fastspec import compiled as compiled_module
from fastspec.static_cache import StaticKVCache, StaticKVLayer

MODES = {
    "normal": dict(),
    "chain": dict(num_draft_tokens=3),
    "auto": dict(num_draft_tokens="auto"),
    "lookup": dict(prompt_lookup=2, draft=None),
    "lookup_then_draft": dict(prompt_lookup=2),
    "tree": dict(tree="small"),
    "dynamic_tree": dict(tree="dynamic", num_draft_tokens=3),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("mode", list(MODES))
def test_static_cache_greedy_equals_hf(arch, mode):
    target = tiny_model(arch)
    kwargs = {"draft": None if mode == "normal" else perturbed_copy(target, 0.02), **MODES[mode]}
    ids, mask = left_padded_batch(256, [9, 5, 12])
    out = fastspec.generate(target, ids, attention_mask=mask, max_new_tokens=20, eos_token_id=None,
                            static_cache=True, **kwargs)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=20))


def test_static_cache_allocates_once_and_never_grows(monkeypatch):
    allocations = []
    original = StaticKVLayer.lazy_initialization

    def recording(self, keys, values):
        original(self, keys, values)
        allocations.append((self, self.key_store.data_ptr(), self.key_store.shape))

    monkeypatch.setattr(StaticKVLayer, "lazy_initialization", recording)
    target = tiny_model("llama")
    ids, mask = left_padded_batch(256, [6, 10])
    fastspec.generate(target, ids, draft=perturbed_copy(target, 0.02), attention_mask=mask, max_new_tokens=40,
                      eos_token_id=None, static_cache=True)  # fmt: skip
    assert len(allocations) == 2 * 2  # two layers, target and draft: once each
    for layer, pointer, shape in allocations:
        assert layer.key_store.data_ptr() == pointer and layer.key_store.shape == shape  # same buffer at the end
        # prompt + new tokens + padded-step slack, rounded to the capacity step
        assert shape[2] == compiled_module.static_capacity(10 + 40 + 2 * compiled_module.WIDTHS[-1]) == 256


def test_compile_needs_the_static_cache():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="static_cache"):
        fastspec.generate(target, torch.tensor([[3, 4]]), compile=True, static_cache=False, max_new_tokens=2)


@pytest.mark.slow
def test_compiled_greedy_equals_eager_and_compiles_each_shape_once(caplog):
    target = tiny_model("llama", layers=1)
    draft = perturbed_copy(target, 0.02)
    ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(0))
    kwargs = dict(draft=draft, max_new_tokens=16, num_draft_tokens=4, eos_token_id=None)
    eager = fastspec.generate(target, ids, **kwargs)
    with caplog.at_level(logging.WARNING, logger="fastspec"):
        first = fastspec.generate(target, ids, compile=True, **kwargs)
    compiles = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert torch.equal(first, eager) and compiles  # the target's 5-token step among them
    assert any("target's 5-token step" in message for message in compiles)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastspec"):
        second = fastspec.generate(target, ids, compile=True, **kwargs)
    assert torch.equal(second, eager)
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]  # shapes of the first call reused


def test_failed_compile_falls_back_to_eager_with_a_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(compiled_module.torch, "compile", lambda model, **kwargs: broken)
    target = tiny_model("qwen2")
    ids, mask = left_padded_batch(256, [6, 9])
    kwargs = dict(draft=perturbed_copy(target, 0.02), attention_mask=mask, max_new_tokens=12, eos_token_id=None)
    with pytest.warns(RuntimeWarning, match="decoding eagerly"):
        out = fastspec.generate(target, ids, compile=True, **kwargs)
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=12))


def test_compiled_shapes_include_the_capacity_which_is_rounded(monkeypatch, caplog):
    assert [compiled_module.static_capacity(n) for n in (1, 256, 257, 418, 513)] == [256, 256, 512, 512, 768]
    monkeypatch.setattr(compiled_module.torch, "compile", lambda fn, **kwargs: fn)  # no compiler needed
    model = tiny_model("llama")
    calls = []
    step = compiled_module.CompiledForward(model, "test model", lambda **inputs: calls.append(inputs), "test_step")

    def call(width, capacity):
        caplog.clear()
        step(
            {"input_ids": torch.zeros(1, width, dtype=torch.long), "attention_mask": torch.zeros(1, 1, width, capacity)}
        )
        return [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="fastspec"):
        assert call(5, 512) == [
            "fastspec: compiling the test model's 5-token step for 1 rows over 512 cache positions (once per shape "
            "and process)"
        ]
        assert call(5, 512) == []  # reused
        assert len(call(5, 768)) == 1  # another capacity is another graph, and says so
        assert call(4, 512) == []  # not a bucket width: eager, nothing compiled
    assert len(calls) == 4


def test_a_step_that_does_not_fit_the_static_cache_is_refused_before_it_writes():
    cache = StaticKVCache(1, 8)
    cache.set_length(6)
    cache.check_room(2)  # fits exactly
    with pytest.raises(RuntimeError, match="9 positions exceed its capacity 8"):
        cache.check_room(3)
