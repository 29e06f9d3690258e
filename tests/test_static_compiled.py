"""Static KV cache and compiled steps (`static_cache=True`, `compile=True`).

- With the preallocated cache (eager), greedy output equals `target.generate(do_sample=False)` for every drafting
  mode (normal, chain, adaptive K, prompt lookup, lookup then draft, static and dynamic trees), on ragged batches
  of three architectures: crop, right-alignment, row selection and tree compaction are index updates there.
- The buffers are allocated once per layer and model and never replaced (memory flat after the prefill).
- `compile=True` gives the eager path's greedy output, logs each shape it compiles once, reuses it in a second
  call, and falls back to eager decoding with a warning when torch.compile fails.
- A compiled shape is (rows, width, cache capacity), and capacities are rounded to multiples of 256, so calls whose
  prompts differ a little in length share graphs (a new capacity used to recompile every step shape silently).
- The buffers come from a pool: a second call of the same shapes allocates none and decodes in the same memory (on
  CUDA: the addresses its graphs were recorded with), the target's and the draft's caches never share a buffer, nor
  does a call running inside another (from its streamer), and a reused buffer starts zeroed.
"""

import logging

import pytest
import torch
from conftest import ARCHITECTURES, hf_greedy, left_padded_batch, perturbed_copy, tiny_model

import fastspec
from fastspec import compiled as compiled_module
from fastspec.static_cache import CACHE_POOL, KVBufferPool, StaticKVCache, StaticKVLayer

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


def _recording_stores(monkeypatch) -> list[set[int]]:
    """Every cache layer's store addresses, one set per `generate` call (append a set before each call)."""
    calls: list[set[int]] = []
    original = StaticKVLayer.lazy_initialization

    def recording(self, keys, values):
        original(self, keys, values)
        calls[-1].update((self.key_store.data_ptr(), self.value_store.data_ptr()))

    monkeypatch.setattr(StaticKVLayer, "lazy_initialization", recording)
    return calls


def test_a_second_call_of_the_same_shapes_reuses_every_cache_buffer(monkeypatch):
    calls = _recording_stores(monkeypatch)
    target = tiny_model("llama")  # the draft has the target's shapes: its buffers have the target's pool key
    ids, mask = left_padded_batch(256, [6, 10])
    kwargs = dict(draft=perturbed_copy(target, 0.02), attention_mask=mask, max_new_tokens=30, eos_token_id=None,
                  static_cache=True, num_draft_tokens=3)  # fmt: skip
    CACHE_POOL.clear()
    outputs, allocated = [], []
    for _ in range(2):
        calls.append(set())
        before = CACHE_POOL.allocations
        outputs.append(fastspec.generate(target, ids, **kwargs))
        allocated.append(CACHE_POOL.allocations - before)
    assert allocated == [8, 0]  # 2 layers x keys and values x target and draft, then none
    assert len(calls[0]) == 8 and calls[1] == calls[0]  # 8 distinct buffers, the same ones again
    expected = hf_greedy(target, ids, mask, max_new_tokens=30)
    assert torch.equal(outputs[0], expected) and torch.equal(outputs[1], expected)


def test_a_call_inside_a_running_call_gets_its_own_cache_buffers(monkeypatch):
    calls = _recording_stores(monkeypatch)
    target = tiny_model("qwen2")
    ids = torch.randint(3, 256, (1, 7), generator=torch.Generator().manual_seed(1))
    kwargs = dict(draft=perturbed_copy(target, 0.02), max_new_tokens=16, eos_token_id=None, static_cache=True)
    inner = []

    class CallsGenerate:  # a streamer that decodes another prompt while the outer call's caches are live
        def put(self, value):
            if not inner:
                calls.append(set())
                inner.append(fastspec.generate(target, ids.flip(1), **kwargs))

        def end(self):
            pass

    CACHE_POOL.clear()
    calls.append(set())
    outer = fastspec.generate(target, ids, streamer=CallsGenerate(), **kwargs)
    assert len(calls) == 2 and not calls[0] & calls[1]  # no buffer of the running call was leased again
    assert torch.equal(outer, hf_greedy(target, ids, max_new_tokens=16))
    assert torch.equal(inner[0], hf_greedy(target, ids.flip(1), max_new_tokens=16))
    calls.append(set())
    before = CACHE_POOL.allocations
    fastspec.generate(target, ids, **kwargs)
    assert CACHE_POOL.allocations == before and calls[2] <= calls[0] | calls[1]  # both sets are free again


def test_the_pool_leases_a_buffer_to_one_owner_zeroes_it_and_keeps_recent_shapes():
    class Owner:
        pass

    pool = KVBufferPool(max_keys=2)
    first, second = Owner(), Owner()
    a = pool.take((2, 3), torch.float32, torch.device("cpu"), first)
    b = pool.take((2, 3), torch.float32, torch.device("cpu"), second)
    assert a.data_ptr() != b.data_ptr() and pool.allocations == 2  # both owners live: two buffers
    a.fill_(7.0)
    del first
    c = pool.take((2, 3), torch.float32, torch.device("cpu"), Owner())  # its owner is gone at once: back in the pool
    assert c.data_ptr() == a.data_ptr() and not c.any() and pool.allocations == 2
    for shape in ((1,), (2,), (3,)):
        pool.take(shape, torch.float32, torch.device("cpu"), Owner())
    assert pool.free_buffers() == 2  # the two most recent shapes are kept
    pool.clear()
    assert pool.free_buffers() == 0
