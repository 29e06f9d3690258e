"""EAGLE-style draft heads (fastspec.heads): save/load, binding checks (shared by every head: `DraftHeadBase`),
features of one or several target layers, cache and mask consistency."""

import copy
import json

import pytest
import torch
from conftest import tiny_model

from fastspec.heads import (
    DraftHead,
    DraftHeadConfig,
    Eagle3Config,
    Eagle3Head,
    default_head_dir,
    load_head,
    target_logits_and_features,
)
from fastspec.heads.common import cache_length

ATOL = 1e-5


@pytest.fixture(scope="module")
def target():
    model = tiny_model("llama")
    with torch.no_grad():  # a final norm with non-unit weights, so "after the final norm" is distinguishable
        model.model.norm.weight.copy_(torch.rand(model.config.hidden_size, generator=torch.Generator().manual_seed(3)))
    return model


def make_head(target, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(DraftHeadConfig.from_target_config(target.config)).bind(target).eval()
    with torch.no_grad():  # non-trivial norms too
        for name, param in head.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return head


def features_and_ids(target, batch: int = 2, length: int = 10, seed: int = 0):
    ids = torch.randint(3, target.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        out = target(ids)
        _, features = target_logits_and_features(target, input_ids=ids)
    return features, ids, out


def positions(batch: int, start: int, n: int) -> torch.Tensor:
    return torch.arange(start, start + n)[None].expand(batch, n)


def test_config_follows_target(target):
    cfg = DraftHeadConfig.from_target_config(target.config)
    assert (cfg.hidden_size, cfg.vocab_size, cfg.target_model_type) == (64, 256, "llama")
    assert cfg.num_attention_heads == target.config.num_attention_heads
    assert cfg.num_key_value_heads == target.config.num_key_value_heads


def test_save_load_roundtrip(target, tmp_path):
    head = make_head(target)
    feats, ids, _ = features_and_ids(target)
    n = ids.shape[1] - 1
    with torch.no_grad():
        want = head(feats[:, :n], ids[:, 1:], positions(2, 0, n), None, None)
    head.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    from safetensors.torch import load_file

    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert not any("embed" in k or "lm_head" in k for k in keys), keys  # shared with the target, never saved
    assert json.loads((tmp_path / "config.json").read_text())["target_model_type"] == "llama"
    loaded = DraftHead.from_pretrained(tmp_path, target=target)
    with torch.no_grad():
        got = loaded(feats[:, :n], ids[:, 1:], positions(2, 0, n), None, None)
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_unbound_and_not_a_head(target, tmp_path):
    head = DraftHead(DraftHeadConfig.from_target_config(target.config))
    feats, ids, _ = features_and_ids(target)
    with pytest.raises(ValueError, match="draft"):
        head(feats, ids, positions(2, 0, ids.shape[1]), None, None)
    target.save_pretrained(tmp_path)  # an ordinary HF model directory
    with pytest.raises(ValueError, match="draft"):
        DraftHead.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "other, what",
    [
        (lambda: tiny_model("llama", hidden=32), "hidden size"),
        (lambda: tiny_model("llama", vocab=128), "vocabulary"),
        (lambda: tiny_model("qwen2"), "qwen2"),
        (lambda: tiny_model("gpt2"), "gpt2"),
    ],
)
def test_bind_refuses_mismatched_target(target, other, what):
    head = DraftHead(DraftHeadConfig.from_target_config(target.config))
    with pytest.raises(ValueError, match="draft") as err:
        head.bind(other())
    assert what in str(err.value)
    assert not head.is_bound


def test_target_features_reproduce_logits(target):
    feats, ids, out = features_and_ids(target)
    assert feats.shape == (*ids.shape, target.config.hidden_size)
    torch.testing.assert_close(target.lm_head(feats), out.logits, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the features are the last hidden states transformers reports
        hidden = target(ids, output_hidden_states=True).hidden_states[-1]
        logits, _ = target_logits_and_features(target, 3, input_ids=ids)
    assert torch.equal(hidden, feats) and torch.equal(logits, out.logits[:, -3:])
    # the raw output of the last decoder layer is not the feature: it is that output after the final norm
    seen = []
    hook = target.model.layers[-1].register_forward_hook(
        lambda m, a, o: seen.append(o[0] if isinstance(o, tuple) else o)
    )
    try:
        with torch.no_grad():
            target(ids)
    finally:
        hook.remove()
    assert not torch.allclose(seen[0], feats, atol=1e-3)
    torch.testing.assert_close(target.model.norm(seen[0]), feats)


def several_layers_head(seed: int = 0):
    """A 4-layer target and an EAGLE-3 head reading three of its layers (hidden_states 0, 1 and 3), norms and fc moved
    off their initial values."""
    target = tiny_model("llama", layers=4, seed=seed)
    torch.manual_seed(seed)
    head = Eagle3Head.from_target(target, aux_layers=[0, 1, 3])
    with torch.no_grad():
        for name, param in head.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return target, head.eval()


def test_fused_features_are_the_named_hidden_states(target):
    ids = torch.randint(3, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = target(ids, output_hidden_states=True)
        logits, feats = target_logits_and_features(target, 2, [0, 1, -1], input_ids=ids)
    hidden = out.hidden_states
    size = target.config.hidden_size
    assert feats.shape == (2, 7, 3 * size)
    # 0 = the embeddings, 1 = the first decoder layer's output, -1 = the last hidden state (after the final norm)
    torch.testing.assert_close(feats[..., :size], target.model.embed_tokens(ids), rtol=0, atol=0)
    for block, state in enumerate((hidden[0], hidden[1], hidden[-1])):
        assert torch.equal(feats[..., block * size : (block + 1) * size], state)
    assert torch.equal(logits, out.logits[:, -2:])


def test_a_head_reading_several_layers_reads_every_one_of_them():
    """An EAGLE-3 head's first-step feature is ``fc`` of the named layers' states, and each of them counts."""
    target, head = several_layers_head()
    ids = torch.randint(3, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, feats = target_logits_and_features(target, 0, head.feature_layers, input_ids=ids)
        assert feats.shape == (2, 9, 3 * 64)
        torch.testing.assert_close(head.target_features(feats), head.fc(feats), rtol=0, atol=0)
        want = head(head.target_features(feats[:, :-1]), ids[:, 1:], positions(2, 0, 8))
        for block in range(3):  # change one layer's state: the head's output changes
            moved = feats.clone()
            moved[..., block * 64 : (block + 1) * 64] *= 1.5
            other = head(head.target_features(moved[:, :-1]), ids[:, 1:], positions(2, 0, 8))
            assert not torch.allclose(other[1], want[1], atol=1e-3), block


def test_a_head_reading_several_layers_save_load_roundtrip(tmp_path):
    target, head = several_layers_head(seed=1)
    ids = torch.randint(3, 256, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, feats = target_logits_and_features(target, 0, head.feature_layers, input_ids=ids)
        want = head(head.target_features(feats[:, :-1]), ids[:, 1:], positions(1, 0, 5))
    head.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["fastspec"]["feature_layers"] == [0, 1, 3]
    loaded = load_head(tmp_path, target)
    assert isinstance(loaded, Eagle3Head) and loaded.feature_layers == [0, 1, 3]
    with torch.no_grad():
        got = loaded(loaded.target_features(feats[:, :-1]), ids[:, 1:], positions(1, 0, 5))
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("layers", [[1], [-1, 1], [1, 1, -1], [-2, -1], [], [1, -1]])
def test_feature_layers_are_validated(target, layers):
    """fastspec's EAGLE-1 head reads the last hidden state alone; several layers are an EAGLE-3 head's."""
    with pytest.raises(ValueError, match="draft: DraftHeadConfig.feature_layers"):
        DraftHeadConfig.from_target_config(target.config, feature_layers=layers)


def test_feature_layers_past_the_target_are_refused(target):
    head = Eagle3Head(Eagle3Config.from_target_config(target.config, feature_layers=[0, 1, 2]))  # 2 layers: 0, 1
    with pytest.raises(ValueError, match="draft: EAGLE-3 head feature_layers") as err:
        head.bind(target)
    assert "hidden states 0..1" in str(err.value)
    assert not head.is_bound


def test_target_with_scaled_logits_is_refused(target):
    scaled = copy.deepcopy(target)
    forward = scaled.forward

    def soft_capped(*args, **kwargs):  # what Gemma 2's final_logit_softcapping does to the logits
        out = forward(*args, **kwargs)
        out.logits = 30.0 * torch.tanh(out.logits / 30.0)
        return out

    scaled.forward = soft_capped
    with pytest.raises(ValueError, match="draft.*lm_head") as err:
        make_head(target).bind(scaled)
    assert "soft-capped" in str(err.value)


def test_forward_shapes_and_cache_length(target):
    head = make_head(target)
    feats, ids, _ = features_and_ids(target)
    cache = head.new_cache()
    with torch.no_grad():
        hidden, logits = head(feats[:, :-1], ids[:, 1:], positions(2, 0, 9), None, cache)
    assert hidden.shape == (2, 9, 64) and logits.shape == (2, 9, 256)
    assert cache_length(cache) == 9
    torch.testing.assert_close(logits, target.lm_head(hidden))  # the hidden goes through the target's lm_head as is


def test_all_at_once_equals_one_by_one_with_cache(target):
    head = make_head(target)
    feats, ids, _ = features_and_ids(target, length=9)
    n = 8
    with torch.no_grad():
        h_all, l_all = head(feats[:, :n], ids[:, 1:], positions(2, 0, n), None, None)
        cache, chunks = head.new_cache(), []
        h0, l0 = head(feats[:, :3], ids[:, 1:4], positions(2, 0, 3), None, cache)  # a prefill chunk, then steps
        chunks.append((h0, l0))
        for p in range(3, n):
            chunks.append(head(feats[:, p : p + 1], ids[:, p + 1 : p + 2], positions(2, p, 1), None, cache))
    torch.testing.assert_close(torch.cat([h for h, _ in chunks], 1), h_all, rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(torch.cat([lg for _, lg in chunks], 1), l_all, rtol=1e-5, atol=ATOL)


def additive(allowed: torch.Tensor) -> torch.Tensor:
    return torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)


def test_left_padded_batch_with_4d_mask(target):
    head = make_head(target)
    feats, ids, _ = features_and_ids(target, length=9)
    n, pad = 8, 3
    f, x = feats[:, :n].clone(), ids[:, 1:].clone()
    # row 0 is a shorter sequence, left-padded by `pad` entries (garbage features and token 0)
    f[0, pad:], x[0, pad:] = feats[0, : n - pad], ids[0, 1 : n - pad + 1]
    f[0, :pad], x[0, :pad] = 7.0, 0
    valid = torch.ones(2, n, dtype=torch.bool)
    valid[0, :pad] = False
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    allowed = causal[None] & valid[:, None, :]
    allowed |= torch.eye(n, dtype=torch.bool)[None]  # pad queries see themselves: no fully masked rows
    pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
    cache = head.new_cache()
    with torch.no_grad():
        hidden, logits = head(f, x, pos, additive(allowed)[:, None], cache)
        # the next step: one new entry per row, keys = cache (n) + itself
        step_allowed = torch.cat([valid, torch.ones(2, 1, dtype=torch.bool)], 1)[:, None, None]
        new_f = torch.stack([feats[0, n - pad], feats[1, n]])[:, None]
        new_x = torch.tensor([[5], [6]])
        h_step, l_step = head(new_f, new_x, pos[:, -1:] + 1, additive(step_allowed), cache)
        ref_h, ref_l = head(feats[:1, : n - pad], ids[:1, 1 : n - pad + 1], positions(1, 0, n - pad), None, None)
        ref_cache = head.new_cache()
        head(feats[:1, : n - pad], ids[:1, 1 : n - pad + 1], positions(1, 0, n - pad), None, ref_cache)
        ref_sh, ref_sl = head(new_f[:1], new_x[:1], positions(1, n - pad, 1), None, ref_cache)
        full_h, _ = head(feats[1:, :n], ids[1:, 1:], positions(1, 0, n), None, None)
    torch.testing.assert_close(hidden[0, pad:], ref_h[0], rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(logits[0, pad:], ref_l[0], rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(hidden[1], full_h[0], rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(h_step[0], ref_sh[0], rtol=1e-5, atol=ATOL)
    torch.testing.assert_close(l_step[0], ref_sl[0], rtol=1e-5, atol=ATOL)


def test_mask_shape_checked(target):
    head = make_head(target)
    feats, ids, _ = features_and_ids(target)
    with pytest.raises(ValueError, match="attention_mask"):
        head(feats, ids, positions(2, 0, 10), torch.zeros(2, 1, 10, 11), None)


@pytest.mark.skipif(not (default_head_dir() / "model.safetensors").is_file(), reason="no shipped head")
def test_shipped_head_loads_and_fits_budget():
    """fastspec/pair/head fits 10 MB and is an EAGLE-3 head in the layout SGLang and vLLM read, fp32, on the shipped
    target's decoder-layer inputs {2, L // 2, L - 3}; `load_head` needs the target to read it."""
    from transformers import AutoModelForCausalLM

    from fastspec.pair import default_target_dir

    size = sum(f.stat().st_size for f in default_head_dir().iterdir())
    assert size <= 10_000_000
    config = json.loads((default_head_dir() / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["torch_dtype"] == "float32"
    with pytest.raises(ValueError, match="needs its target"):
        load_head()
    shipped = AutoModelForCausalLM.from_pretrained(default_target_dir()).eval()
    head = load_head(default_head_dir(), shipped)
    layers = shipped.config.num_hidden_layers
    assert isinstance(head, Eagle3Head) and head.feature_layers == [2, layers // 2, layers - 3] and head.is_bound
    assert head.config.hidden_size == shipped.config.hidden_size
