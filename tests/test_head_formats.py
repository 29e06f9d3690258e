"""Draft-head checkpoint formats (fastspec.heads.formats, eagle3, medusa): synthesized tiny checkpoints of every
format the ecosystem publishes (random weights, the real key names and shapes) load through `load_head`, decode
greedy-equal to HF generate, match an independent re-implementation of the published EAGLE-3 forward, round-trip
bit-exactly, and every trap of ../shared/notes/eagle3-formats.md is a ValueError naming the file and key or field.
"""

import json
import math

import pytest
import torch
from conftest import hf_greedy, left_padded_batch, tiny_model

import fastspec
from fastspec.heads import DraftHead, DraftHeadConfig, Eagle3Head, MedusaHead, load_head, target_logits_and_features

VOCAB, HIDDEN, LAYERS = 256, 64, 8  # 8 layers: EAGLE-3's default aux layers {2, L // 2, L - 3} = {2, 4, 5}
HEADS, KV_HEADS, INTER = 4, 2, 96  # the head uses grouped-query attention (2 key/value heads for 4 query heads)
HEAD_DIM = HIDDEN // HEADS
DEFAULT_LAYERS = [2, 4, 5]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab=VOCAB, hidden=HIDDEN, layers=LAYERS, init=0.5)


def kept_ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:n].sort().values


def eagle3_tensors(draft_vocab: int = VOCAB, seed: int = 0, layer_prefix: str = "midlayer.", kept=None) -> dict:
    """Random EAGLE-3 weights with the official key names and shapes (d2t / t2d from `kept`)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.1):
        return torch.randn(*shape, generator=gen) * scale

    def norm():
        return 1 + rand(HIDDEN, scale=0.2)

    p = layer_prefix
    tensors = {
        "fc.weight": rand(HIDDEN, 3 * HIDDEN, scale=0.05),
        p + "self_attn.q_proj.weight": rand(HEADS * HEAD_DIM, 2 * HIDDEN),
        p + "self_attn.k_proj.weight": rand(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        p + "self_attn.v_proj.weight": rand(KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        p + "self_attn.o_proj.weight": rand(HIDDEN, HEADS * HEAD_DIM),
        p + "mlp.gate_proj.weight": rand(INTER, HIDDEN),
        p + "mlp.up_proj.weight": rand(INTER, HIDDEN),
        p + "mlp.down_proj.weight": rand(HIDDEN, INTER),
        p + "input_layernorm.weight": norm(),
        p + "hidden_norm.weight": norm(),
        p + "post_attention_layernorm.weight": norm(),
        "norm.weight": norm(),
        "lm_head.weight": rand(draft_vocab, HIDDEN, scale=0.3),
    }
    kept = torch.arange(draft_vocab) if kept is None else kept
    tensors["d2t"] = kept - torch.arange(draft_vocab)
    tensors["t2d"] = torch.zeros(VOCAB, dtype=torch.bool)
    tensors["t2d"][kept] = True
    return tensors


def llama_fields(**extra) -> dict:
    fields = dict(
        model_type="llama", hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, num_hidden_layers=1, vocab_size=VOCAB, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=256, hidden_act="silu",
    )  # fmt: skip
    fields.update(extra)
    return fields


def official_config(draft_vocab: int = VOCAB, **extra) -> dict:
    return llama_fields(**{"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": draft_vocab, **extra})


def speculators_config(draft_vocab: int = VOCAB, **extra) -> dict:
    data = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "transformer_layer_config": llama_fields(architectures=["LlamaForCausalLM"]),
        "draft_vocab_size": draft_vocab, "target_hidden_size": HIDDEN,
        "speculators_config": {"proposal_methods": [], "verifier": {"name_or_path": "tiny"}},
    }  # fmt: skip
    data.update(extra)
    return data


def write(path, config: dict, tensors: dict, kind: str = "safetensors"):
    """A head directory: config.json and the weights as one safetensors file, a torch .bin, or two shards."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if kind == "safetensors":
        save_file(tensors, str(path / "model.safetensors"))
    elif kind == "bin":
        torch.save(tensors, str(path / "pytorch_model.bin"))
    elif kind == "sharded":
        keys = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
        for name, part in shards.items():
            save_file({k: tensors[k] for k in part}, str(path / name))
        index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        torch.save(tensors, str(path / kind))
    return path


# --------------------------------------------------------------------------------- independent EAGLE-3 reference
def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, positions, theta=10000.0):
    """Rotary embedding of x [R, heads, n, d] (half-split pairs, as Llama)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = positions[:, None, :, None].float() * inv  # [R, 1, n, d/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def reference_eagle3(t: dict, embed: torch.Tensor, aux: torch.Tensor, ids: torch.Tensor, norm_before_residual=False,
                     prefix="midlayer."):  # fmt: skip
    """The published EAGLE-3 forward over n positions, causal, no cache, written from the format description:
    g = fc(cat(low, mid, high)); x = cat(input_layernorm(embed(token)), hidden_norm(g)); residual g (or
    hidden_norm(g)); attention (2H-wide q/k/v, GQA, RoPE at positions 0..n-1); post_attention_layernorm; SwiGLU MLP;
    logits = lm_head(norm(out)). Returns (out, logits)."""
    w = {k.removeprefix(prefix): v for k, v in t.items()}
    rows, n = ids.shape
    g = aux @ t["fc.weight"].T
    normed = rms(g, w["hidden_norm.weight"])
    x = torch.cat([rms(embed[ids], w["input_layernorm.weight"]), normed], -1)
    q = (x @ w["self_attn.q_proj.weight"].T).view(rows, n, HEADS, HEAD_DIM).transpose(1, 2)
    k = (x @ w["self_attn.k_proj.weight"].T).view(rows, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v = (x @ w["self_attn.v_proj.weight"].T).view(rows, n, KV_HEADS, HEAD_DIM).transpose(1, 2)
    positions = torch.arange(n)[None].expand(rows, n)
    q, k = rope(q, positions), rope(k, positions)
    k, v = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD_DIM)
    scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(1, 2).reshape(rows, n, HEADS * HEAD_DIM) @ w["self_attn.o_proj.weight"].T
    h = (normed if norm_before_residual else g) + attn
    m = rms(h, w["post_attention_layernorm.weight"])
    out = (
        h
        + (torch.nn.functional.silu(m @ w["mlp.gate_proj.weight"].T) * (m @ w["mlp.up_proj.weight"].T))
        @ w["mlp.down_proj.weight"].T
    )
    return out, rms(out, t["norm.weight"]) @ t["lm_head.weight"].T


def aux_states(target, ids, layers=DEFAULT_LAYERS):
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i] for i in layers], dim=-1)


@pytest.mark.parametrize(
    "layout,kind",
    [("official", "safetensors"), ("official", "bin"), ("official", "sharded"), ("speculators", "safetensors"),
     ("eagle-repo", "bin")],
)  # fmt: skip
def test_eagle3_matches_reference_forward(target, tmp_path, layout, kind):
    kept = kept_ids(100)
    prefix = "layers.0." if layout == "speculators" else "midlayer."
    tensors = eagle3_tensors(100, kept=kept, layer_prefix=prefix)
    if layout == "official":
        config = official_config(100)
    elif layout == "speculators":
        config = speculators_config(100)  # norm_before_residual: True unless stated, in this format
    else:  # the EAGLE repository's own training config says LlamaForCausalLM; midlayer.* tells it is EAGLE-3
        config = llama_fields(architectures=["LlamaForCausalLM"], draft_vocab_size=100)
    head = load_head(write(tmp_path / "head", config, tensors, kind), target)
    assert isinstance(head, Eagle3Head) and head.feature_layers == DEFAULT_LAYERS
    assert head.config.norm_before_residual == (layout == "speculators")
    ids = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    aux = aux_states(target, ids)
    with torch.no_grad():
        hidden, logits = head(head.target_features(aux), ids, torch.arange(9)[None].expand(2, 9))
        embed = target.get_input_embeddings().weight
        nbr = layout == "speculators"
        want_hidden, want_logits = reference_eagle3(tensors, embed, aux, ids, norm_before_residual=nbr, prefix=prefix)
    torch.testing.assert_close(logits, want_logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden, want_hidden, atol=1e-5, rtol=0)


def test_reduced_vocab_to_target_logits(target, tmp_path):
    kept = kept_ids(40, seed=3)
    head = load_head(write(tmp_path / "h", official_config(40), eagle3_tensors(40, kept=kept)), target)
    logits = torch.randn(3, 5, 40)
    full = head.to_target_logits(logits)
    assert full.shape == (3, 5, VOCAB)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[kept] = False
    assert torch.isneginf(full[..., outside]).all() and torch.isfinite(full[..., kept]).all()
    assert torch.equal(full[..., kept], logits)
    assert torch.equal(head.t2d.nonzero().flatten(), kept)


@pytest.mark.parametrize("draft_vocab", [VOCAB, 120])
@pytest.mark.parametrize(
    "kwargs", [dict(), dict(static_cache=True), dict(tree="dynamic")], ids=["chain", "static", "tree"]
)
def test_eagle3_generate_greedy_equals_hf(target, tmp_path, draft_vocab, kwargs):
    """Lossless whatever the head predicts (features from the target's runner; see test_runner_features)."""
    kept = kept_ids(draft_vocab, seed=2)
    head = load_head(
        write(tmp_path / "h", official_config(draft_vocab), eagle3_tensors(draft_vocab, kept=kept)), target
    )
    ids, mask = left_padded_batch(VOCAB, [7, 4, 10])
    out = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=16, num_draft_tokens=3,
                            **kwargs)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=16))


def test_runner_features_are_the_aux_hidden_states(target):
    """The target's runner keeps exactly hidden_states[i] for the head's feature_layers (no -1 among them)."""
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        _, features = target_logits_and_features(target, 0, DEFAULT_LAYERS, input_ids=ids)
    assert torch.equal(features, aux_states(target, ids))


def test_eagle3_from_target_and_roundtrip(target, tmp_path):
    kept = kept_ids(64, seed=5)
    head = Eagle3Head.from_target(target, kept, num_key_value_heads=2)
    assert head.feature_layers == DEFAULT_LAYERS and head.config.draft_vocab_size == 64
    assert torch.equal(head.d2t, kept - torch.arange(64)) and torch.equal(head.t2d.nonzero().flatten(), kept)
    assert torch.equal(head.lm_head.weight, target.lm_head.weight[kept])
    with torch.no_grad():
        for param in head.parameters():
            param.add_(torch.randn_like(param) * 0.05)  # norms away from 1
    head.save_pretrained(tmp_path / "h")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "h" / "model.safetensors"))
    assert "embed_tokens.weight" not in saved
    assert {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d", "midlayer.hidden_norm.weight"} <= set(saved)
    assert saved["t2d"].dtype == torch.bool and saved["d2t"].dtype == torch.int64
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 64
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # SGLang: output of layer j
    assert config["eagle_aux_hidden_state_layer_ids"] == DEFAULT_LAYERS  # vLLM: as given
    loaded = load_head(tmp_path / "h", target)
    assert loaded.state_dict().keys() == head.state_dict().keys()
    for key, value in head.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    ids = torch.randint(3, VOCAB, (2, 7), generator=torch.Generator().manual_seed(6))
    feats = head.target_features(aux_states(target, ids))
    with torch.no_grad():
        for a, b in zip(head(feats, ids, torch.arange(7)[None].expand(2, 7)),
                        loaded(feats, ids, torch.arange(7)[None].expand(2, 7)), strict=True):  # fmt: skip
            assert torch.equal(a, b)


def test_eagle3_cache_steps_equal_one_pass(target):
    head = Eagle3Head.from_target(target, kept_ids(50))
    ids = torch.randint(3, VOCAB, (2, 8), generator=torch.Generator().manual_seed(7))
    feats = head.target_features(aux_states(target, ids))
    pos = torch.arange(8)[None].expand(2, 8)
    with torch.no_grad():
        _, full = head(feats, ids, pos)
        cache = head.new_cache()
        _, first = head(feats[:, :5], ids[:, :5], pos[:, :5], None, cache)
        _, rest = head(feats[:, 5:], ids[:, 5:], pos[:, 5:], None, cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------------- aux layer conventions
@pytest.mark.parametrize(
    "fields,want",
    [
        (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}), [1, 3, 6]),  # SGLang: +1
        (dict(eagle_aux_hidden_state_layer_ids=[1, 3, 6]), [1, 3, 6]),  # vLLM: as given
        (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}, eagle_aux_hidden_state_layer_ids=[1, 3, 6]),
         [1, 3, 6]),  # both, agreeing
    ],
)  # fmt: skip
def test_aux_layer_conventions(target, tmp_path, fields, want):
    head = load_head(write(tmp_path / "h", official_config(**fields), eagle3_tensors()), target)
    assert head.feature_layers == want


# --------------------------------------------------------------------------------- EAGLE-1
def eagle1_tensors(bias: bool, embed=None, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    p = "layers.0."
    tensors = {
        "fc.weight": torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * 0.05,
        p + "self_attn.q_proj.weight": torch.randn(HEADS * HEAD_DIM, HIDDEN, generator=gen) * 0.1,
        p + "self_attn.k_proj.weight": torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, generator=gen) * 0.1,
        p + "self_attn.v_proj.weight": torch.randn(KV_HEADS * HEAD_DIM, HIDDEN, generator=gen) * 0.1,
        p + "self_attn.o_proj.weight": torch.randn(HIDDEN, HEADS * HEAD_DIM, generator=gen) * 0.1,
        p + "mlp.gate_proj.weight": torch.randn(INTER, HIDDEN, generator=gen) * 0.1,
        p + "mlp.up_proj.weight": torch.randn(INTER, HIDDEN, generator=gen) * 0.1,
        p + "mlp.down_proj.weight": torch.randn(HIDDEN, INTER, generator=gen) * 0.1,
        p + "post_attention_layernorm.weight": 1 + torch.randn(HIDDEN, generator=gen) * 0.2,
    }
    if bias:
        tensors["fc.bias"] = torch.randn(HIDDEN, generator=gen) * 0.05
    if embed is not None:
        tensors["embed_tokens.weight"] = embed.detach().clone().half()  # a frozen copy, often half precision
    return tensors


@pytest.mark.parametrize("bias", [True, False])
def test_eagle1_loads_decodes_and_roundtrips(target, tmp_path, bias):
    config = llama_fields(architectures=["LlamaForCausalLM"])
    if not bias:
        config["bias"] = False  # absent means True (the EAGLE repository's default)
    tensors = eagle1_tensors(bias, embed=target.get_input_embeddings().weight.half().float())
    head = load_head(write(tmp_path / "h", config, tensors, "bin"), target)
    assert isinstance(head, DraftHead) and not head.config.input_layernorm and head.config.fc_bias == bias
    assert isinstance(head.layer.input_layernorm, torch.nn.Identity) and head.feature_layers == [-1]
    # the EAGLE-1 forward: fc(cat(embed, f)) -> layer without input norm -> the target's lm_head (no final norm)
    ids = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    _, feats = target_logits_and_features(target, input_ids=ids)
    with torch.no_grad():
        hidden, logits = head(feats, ids, torch.arange(6)[None])
        x = torch.cat([target.get_input_embeddings()(ids), feats], -1) @ tensors["fc.weight"].T
        if bias:
            x = x + tensors["fc.bias"]
        causal = torch.full((6, 6), float("-inf")).triu(1)[None, None]
        attn = head.layer.self_attn(x, position_embeddings=head.rotary_emb(x, torch.arange(6)[None]),
                                    attention_mask=causal)[0]  # fmt: skip
        h = x + attn
        want = h + head.layer.mlp(head.layer.post_attention_layernorm(h))
    torch.testing.assert_close(hidden, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(logits, target.lm_head(want), atol=1e-5, rtol=0)
    ids, mask = left_padded_batch(VOCAB, [6, 9])
    out = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=12, num_draft_tokens=3)
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=12))
    head.save_pretrained(tmp_path / "again", format="eagle1")
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["bias"] is bias and saved["architectures"] == ["LlamaForCausalLM"]
    again = load_head(tmp_path / "again", target)
    for key, value in head.state_dict().items():
        assert torch.equal(value, again.state_dict()[key]), key


def test_eagle1_layout_refuses_heads_it_cannot_express(target, tmp_path):
    head = DraftHead(DraftHeadConfig.from_target_config(target.config))  # has an input_layernorm
    with pytest.raises(ValueError, match="input_layernorm"):
        head.save_pretrained(tmp_path, format="eagle1")


def test_fastspec_format_directories_still_load(target, tmp_path):
    """Heads saved in fastspec's own format (``model_type: fastspec_eagle_head``, the shipped head before it became
    EAGLE-3) load through `load_head`, with or without their target."""
    head = DraftHead(DraftHeadConfig.from_target_config(target.config))
    head.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "fastspec_eagle_head"
    for bound_to in (target, None):
        again = load_head(tmp_path, bound_to)
        assert isinstance(again, DraftHead) and again.is_bound == (bound_to is not None)
        for key, value in head.state_dict().items():
            assert torch.equal(value, again.state_dict()[key]), key


# --------------------------------------------------------------------------------- Medusa
def medusa_reference(tensors: dict, x: torch.Tensor, num_heads: int, num_layers: int) -> torch.Tensor:
    out = []
    for i in range(num_heads):
        h = x
        for j in range(num_layers):
            h = h + torch.nn.functional.silu(h @ tensors[f"{i}.{j}.linear.weight"].T + tensors[f"{i}.{j}.linear.bias"])
        out.append(h @ tensors[f"{i}.{num_layers}.weight"].T)
    return torch.stack(out, dim=-2)


def test_medusa_faster_decoding_and_vllm_layouts(target, tmp_path):
    heads, layers = 3, 2
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"{i}.{j}.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=gen) * 0.1
            tensors[f"{i}.{j}.linear.bias"] = torch.randn(HIDDEN, generator=gen) * 0.1
        tensors[f"{i}.{layers}.weight"] = torch.randn(VOCAB, HIDDEN, generator=gen) * 0.1
    config = {"medusa_num_heads": heads, "medusa_num_layers": layers, "base_model_name_or_path": "tiny"}
    head = load_head(write(tmp_path / "fd", config, tensors, "medusa_lm_head.pt"), target)
    assert isinstance(head, MedusaHead)
    x = torch.randn(5, HIDDEN, generator=gen)
    with torch.no_grad():
        logits = head(x)
    assert logits.shape == (5, heads, VOCAB)
    torch.testing.assert_close(logits, medusa_reference(tensors, x, heads, layers), atol=1e-5, rtol=0)
    head.save_pretrained(tmp_path / "vllm")  # vLLM's layout: blocks.{i}.layers.{j}.*, lm_heads.{i}.weight
    from safetensors.torch import load_file

    assert "blocks.2.layers.1.bias" in load_file(str(tmp_path / "vllm" / "model.safetensors"))
    again = load_head(tmp_path / "vllm", target)
    with torch.no_grad():
        assert torch.equal(again(x), logits)


def test_medusa_token_map(target, tmp_path):
    kept = kept_ids(30)
    head = MedusaHead(HIDDEN, VOCAB, num_heads=2, num_layers=1, bias=False, token_map=kept)
    head.save_pretrained(tmp_path / "h")
    loaded = load_head(tmp_path / "h", target)
    with torch.no_grad():
        logits = loaded(torch.randn(4, HIDDEN))
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[kept] = False
    assert logits.shape == (4, 2, VOCAB) and torch.isneginf(logits[..., outside]).all()
    assert torch.isfinite(logits[..., kept]).all()


# --------------------------------------------------------------------------------- every trap is a loud error
def _remove(tensors, key):
    tensors = dict(tensors)
    del tensors[key]
    return tensors


def _bad_d2t(tensors, value):
    tensors = dict(tensors)
    tensors["d2t"] = tensors["d2t"].clone()
    tensors["d2t"][-1] = value
    return tensors


def _shift_last(tensors):
    """d2t's last draft id moved to another target id (still ascending, in range), t2d left as it was."""
    assert int(tensors["d2t"][-1]) + 99 < VOCAB - 1
    return _bad_d2t(tensors, int(tensors["d2t"][-1]) + 1)


TRAPS = [
    ("no_lm_head", official_config(100), lambda: _remove(eagle3_tensors(100, kept=kept_ids(100)), "lm_head.weight"),
     r"field 'draft_vocab_size' declares a draft vocabulary of 100 but .* has no 'lm_head.weight'"),
    ("hidden", official_config(target_hidden_size=2 * HIDDEN), eagle3_tensors,
     r"config.json field 'target_hidden_size' is 128, the target's hidden size is 64"),
    ("vocab", official_config(vocab_size=VOCAB + 1), eagle3_tensors,
     r"config.json field 'vocab_size' is 257, the target's vocabulary size is 256"),
    ("d2t_range", official_config(100), lambda: _bad_d2t(eagle3_tensors(100, kept=kept_ids(100)), 10**6),
     r"model.safetensors key 'd2t' is out of range: draft id 99 maps to target id"),
    ("d2t_t2d", official_config(100), lambda: _shift_last(eagle3_tensors(100, kept=kept_ids(100))),
     r"key 't2d' is inconsistent with d2t"),
    ("arch", official_config(architectures=["MysteryForCausalLM"]), eagle3_tensors,
     r"config.json field 'architectures': unknown head architecture \['MysteryForCausalLM'\]"),
    ("aux_disagree", official_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 4]},
                                     eagle_aux_hidden_state_layer_ids=[1, 3, 4]), eagle3_tensors,
     r"the aux layer fields disagree .*refusing to guess"),
    ("aux_range", official_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 7]}), eagle3_tensors,
     r"field 'eagle_config.eagle_aux_hidden_state_layer_ids' names hidden_states \[2, 4, 8\]"),
    ("random_embed", official_config(), lambda: {**eagle3_tensors(), "embed_tokens.weight": torch.randn(VOCAB, HIDDEN)},
     r"key 'embed_tokens.weight' differs from the target's input embedding"),
    ("missing_key", official_config(), lambda: _remove(eagle3_tensors(), "midlayer.hidden_norm.weight"),
     r"has no key 'midlayer.hidden_norm.weight'"),
    ("fc_width", official_config(), lambda: {**eagle3_tensors(), "fc.weight": torch.randn(HIDDEN, 2 * HIDDEN)},
     r"key 'fc.weight' has shape \[64, 128\], the head's config makes it \[64, 192\]"),
    ("tied", official_config(tie_word_embeddings=True), eagle3_tensors, r"field 'tie_word_embeddings' is true"),
    ("aux_repeated", official_config(eagle_aux_hidden_state_layer_ids=[2, 4, 4]), eagle3_tensors,
     r"field 'eagle_aux_hidden_state_layer_ids' repeats a layer"),
]  # fmt: skip


@pytest.mark.parametrize("name,config,make,message", TRAPS, ids=[t[0] for t in TRAPS])
def test_eagle3_traps(target, tmp_path, name, config, make, message):
    tensors = make()
    assert tensors is not None
    with pytest.raises(ValueError, match=message):
        load_head(write(tmp_path / "h", config, tensors), target)


def test_eagle1_traps(target, tmp_path):
    config = llama_fields(architectures=["LlamaForCausalLM"])  # bias absent: True, but the file has no fc.bias
    with pytest.raises(ValueError, match=r"has no key 'fc.bias' but .*field 'bias'"):
        load_head(write(tmp_path / "a", config, eagle1_tensors(bias=False)), target)
    config = llama_fields(architectures=["LlamaForCausalLM"], hidden_size=2 * HIDDEN)
    with pytest.raises(ValueError, match=r"field 'hidden_size' is 128, the target's hidden size is 64"):
        load_head(write(tmp_path / "b", config, eagle1_tensors(bias=True)), target)
    config = llama_fields(architectures=["LlamaForCausalLM"])
    bad = {**eagle1_tensors(bias=True), "embed_tokens.weight": torch.randn(VOCAB, HIDDEN)}
    with pytest.raises(ValueError, match=r"key 'embed_tokens.weight' differs"):
        load_head(write(tmp_path / "c", config, bad), target)
    assert isinstance(load_head(tmp_path / "c", target, embed_tokens="ignore"), DraftHead)


def test_format_and_file_errors(target, tmp_path):
    with pytest.raises(ValueError, match="no head config"):
        load_head(tmp_path / "nothing", target)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(official_config()))
    with pytest.raises(ValueError, match=r"expected one weights file .* found none"):
        load_head(tmp_path / "empty", target)
    with pytest.raises(ValueError, match="target"):
        load_head(write(tmp_path / "h", official_config(), eagle3_tensors()), None)
    with pytest.raises(ValueError, match=r"speculators_model_type.*'eagle'"):
        load_head(write(tmp_path / "s", speculators_config(speculators_model_type="eagle"), eagle3_tensors()), target)
