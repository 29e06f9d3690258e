"""Hybrid and state-space targets and drafts (recurrent / conv state) and indexed attention decode losslessly.

Tiny random models built from transformers config classes (hidden 32-64, 2-4 layers, so both linear-attention /
SSM and attention layers appear; vocabulary 128; EOS off). Each draft is the target with gaussian noise on its
weights, so it accepts part of its drafts: rows of a ragged batch then accept different lengths, are realigned,
and each row must keep its own recurrent state (`fastspec.state_cache`): every greedy test asserts that a step
left rows with different kept columns (`kept_columns_differed`), and that output equals `target.generate`.
Covered: gated delta-net + attention (qwen3_next), short convolutions + attention (lfm2), Mamba-2 (mamba2), Mamba
(mamba: it takes the mask of the fed positions only), Mamba-2 hybrids (bamba, granitemoehybrid, nemotron_h with
MLP-only "dummy" layers, falcon_h1 with "hybrid" layers) and indexed sparse attention (deepseek_v32, indexer top-k
below the sequence length); also qwen3_5, falcon_mamba, jamba, zamba2 (hybrid layers), kimi_linear and
olmo_hybrid. Refusals: trees and the static cache with recurrent state, prompt lookup beside a
recurrent draft model in a batch, a model whose state lives outside transformers' cache API (MiniMax), and one that
computes no per-position states.
"""

import pytest
import torch
import transformers as tf
from conftest import hf_greedy, perturbed_copy
from test_head_generate import fitted_head

import fastspec
from fastspec import cache_kinds
from fastspec.cache import DynamicKVCache

# transformers without linear-attention cache layers (before 5.2x) has none of these models' caches
RecurrentStateLayer = pytest.importorskip("fastspec.state_cache").RecurrentStateLayer

VOCAB = 128
MAX_NEW = 20


def _common(**kwargs) -> dict:
    return dict(vocab_size=VOCAB, hidden_size=32, pad_token_id=0, bos_token_id=1, eos_token_id=2, **kwargs)


def _mamba2_block(prefix: str = "mamba_") -> dict:
    return {
        f"{prefix}n_heads": 4, f"{prefix}d_head": 16, f"{prefix}n_groups": 1, f"{prefix}d_state": 8,
        f"{prefix}d_conv": 4, f"{prefix}expand": 2, f"{prefix}chunk_size": 8,
    }  # fmt: skip


CONFIGS = {
    "qwen3_next": lambda: tf.Qwen3NextConfig(**_common(
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
        num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"], max_position_embeddings=256,
    )),
    "lfm2": lambda: tf.Lfm2Config(**_common(
        intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["conv", "full_attention", "conv"], conv_L_cache=3, block_multiple_of=16,
        max_position_embeddings=256,
    )),
    "mamba2": lambda: tf.Mamba2Config(**_common(
        num_heads=4, head_dim=16, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, n_groups=1,
        chunk_size=8, time_step_rank=4,
    )),
    "mamba": lambda: tf.MambaConfig(**_common(
        state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=4,
    )),
    "bamba": lambda: tf.BambaConfig(**_common(
        intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        attn_layer_indices=[1], max_position_embeddings=256, **_mamba2_block(),
    )),
    "granitemoehybrid": lambda: tf.GraniteMoeHybridConfig(**_common(
        intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["linear_attention", "full_attention", "linear_attention"], num_local_experts=4,
        num_experts_per_tok=2, shared_intermediate_size=32, max_position_embeddings=256, **_mamba2_block(),
    )),
    "nemotron_h": lambda: tf.NemotronHConfig(**_common(
        layers_block_type=["linear_attention", "full_attention", "mlp"], num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, intermediate_size=64, ssm_state_size=8, mamba_num_heads=4,
        mamba_head_dim=16, n_groups=1, conv_kernel=4, expand=2, chunk_size=8, max_position_embeddings=256,
        n_routed_experts=4, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32, num_experts_per_tok=2,
    )),
    "falcon_h1": lambda: tf.FalconH1Config(**_common(
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, mamba_d_ssm=32,
        mamba_n_heads=4, mamba_d_head=8, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
        mamba_chunk_size=8, max_position_embeddings=256,
    )),
    "qwen3_5": lambda: tf.Qwen3_5TextConfig(**_common(
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
        linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"], max_position_embeddings=256,
    )),
    "falcon_mamba": lambda: tf.FalconMambaConfig(**_common(
        state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, time_step_rank=4,
    )),
    "jamba": lambda: tf.JambaConfig(**_common(
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_experts=2,
        num_experts_per_tok=1, expert_layer_period=2, expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1,
        mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, max_position_embeddings=256,
    )),
    "zamba2": lambda: tf.Zamba2Config(**_common(
        num_hidden_layers=4, layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"],
        hybrid_layer_ids=[1, 3], mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=2,
        chunk_size=8, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4, adapter_rank=4,
        max_position_embeddings=256, mamba_headdim=32, attention_head_dim=16, attention_hidden_size=64,
        kv_channels=8, num_query_groups=4,
    )),
    "kimi_linear": lambda: tf.KimiLinearConfig(**_common(
        intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8, num_experts=4,
        num_experts_per_token=2, layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "dense"],
        linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4, head_dim=8, qk_head_dim=16,
    )),
    "olmo_hybrid": lambda: tf.OlmoHybridConfig(**_common(
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        layer_types=["linear_attention", "full_attention"], linear_num_key_heads=2, linear_num_value_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=16, linear_conv_kernel_dim=4, max_position_embeddings=256,
    )),
    # 8 indexer heads: with 2, many keys score exactly 0 after the ReLU and top-k breaks the ties by column, which
    # makes transformers' own batched and unbatched outputs differ
    "deepseek_v32": lambda: tf.DeepseekV32Config(**_common(
        intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4, kv_lora_rank=16, q_lora_rank=16,
        qk_rope_head_dim=8, v_head_dim=8, qk_nope_head_dim=8, n_group=1, topk_group=1, num_experts_per_tok=2,
        index_topk=6, index_head_dim=16, index_n_heads=8, head_dim=8, first_k_dense_replace=1,
        max_position_embeddings=256,
    )),
}  # fmt: skip
INIT = {"mamba": 1.0, "falcon_mamba": 1.0}  # weight std: their tiny logits are flat (one repeated token) at 0.2
RECURRENT = [name for name in CONFIGS if name != "deepseek_v32"]


def tiny(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = CONFIGS[name]()
    config.initializer_range = INIT.get(name, 0.2)
    model = tf.AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model.eval()


def noisy_copy(model: torch.nn.Module, scale: float = 0.02, seed: int = 1) -> torch.nn.Module:
    """The model plus N(0, scale^2) on every weight: a draft that agrees with it part of the time."""
    return perturbed_copy(model, scale, seed)


def ragged_batch(lengths=(10, 6, 2), seed: int = 0):
    """Left-padded prompts whose second half repeats their first (prompt lookup finds n-grams), one of 2 tokens
    (shorter than a convolution window)."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids, mask = torch.zeros(len(lengths), width, dtype=torch.long), torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        half = torch.randint(3, VOCAB, ((length + 1) // 2,), generator=gen)
        ids[row, width - length :] = torch.cat([half, half])[:length]
        mask[row, width - length :] = 1
    return ids, mask


@pytest.fixture(scope="module", params=list(CONFIGS))
def model_pair(request):
    """(name, target, draft, greedy reference of the ragged batch)."""
    target = tiny(request.param)
    ids, mask = ragged_batch()
    return request.param, target, noisy_copy(target), hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW)


@pytest.fixture
def kept_columns_differed(monkeypatch):
    """A list that records, per cache realignment, whether rows kept different newest columns (rows that accepted
    different lengths: each then needs its own recurrent state)."""
    seen = []
    original = DynamicKVCache.gather_positions

    def recording(self, index):
        seen.append(len(set(index[:, -1].tolist())) > 1)
        return original(self, index)

    monkeypatch.setattr(DynamicKVCache, "gather_positions", recording)
    return seen


def test_chain_with_draft_model_equals_hf(model_pair, kept_columns_differed):
    name, target, draft, reference = model_pair
    ids, mask = ragged_batch()
    out, stats = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=MAX_NEW,
                                   num_draft_tokens=3, return_stats=True)  # fmt: skip
    assert torch.equal(out, reference)
    assert 0 < stats.accepted < stats.drafted, "the draft should accept part of its drafts"
    assert any(kept_columns_differed), "no step left rows with different accepted lengths"


def test_prompt_lookup_equals_hf(model_pair):
    name, target, _, reference = model_pair
    ids, mask = ragged_batch()
    out, stats = fastspec.generate(target, ids, attention_mask=mask, max_new_tokens=MAX_NEW, prompt_lookup=2,
                                   num_draft_tokens=3, return_stats=True)  # fmt: skip
    assert torch.equal(out, reference)
    assert stats.drafted > 0


def test_autoregressive_equals_hf(model_pair):
    _, target, _, reference = model_pair
    ids, mask = ragged_batch()
    assert torch.equal(fastspec.generate(target, ids, attention_mask=mask, max_new_tokens=MAX_NEW), reference)


@pytest.mark.parametrize("k", [1, 5])
def test_chain_lengths_and_one_row(k, kept_columns_differed):
    """Other draft lengths on a hybrid, and one row (no realignment), each equal to HF."""
    target = tiny("qwen3_next")
    draft = noisy_copy(target)
    ids, mask = ragged_batch((9, 4, 7), seed=3)
    out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=MAX_NEW, num_draft_tokens=k)
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW))
    assert any(kept_columns_differed)
    row = ids[:1]
    assert torch.equal(fastspec.generate(target, row, draft=draft, max_new_tokens=MAX_NEW, num_draft_tokens=k),
                       hf_greedy(target, row, max_new_tokens=MAX_NEW))  # fmt: skip


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2"])
def test_eos_and_adaptive_draft_length(name, monkeypatch):
    """Rows that stop at EOS leave the batch (their states with them) while the others go on, with adaptive K."""
    target = tiny(name)
    ids, mask = ragged_batch((10, 6, 2, 8))
    free = hf_greedy(target, ids, mask, max_new_tokens=30)[:, ids.shape[1] :]
    eos = int(free[0, 12])
    reference = hf_greedy(target, ids, mask, max_new_tokens=30, eos_token_id=eos)
    selected = []
    original = RecurrentStateLayer.select_rows
    monkeypatch.setattr(RecurrentStateLayer, "select_rows", lambda self, rows: selected.append(rows.numel()) or
                        original(self, rows))  # fmt: skip
    for kwargs in (dict(num_draft_tokens="auto"), dict(num_draft_tokens=4)):
        out = fastspec.generate(target, ids, draft=noisy_copy(target), attention_mask=mask, max_new_tokens=30,
                                eos_token_id=eos, **kwargs)  # fmt: skip
        assert torch.equal(out, reference)
    assert selected, "no row finished before the others"


def test_hybrid_draft_for_an_attention_target_and_back():
    """A Mamba-2 draft for a Llama target and a Llama draft for a Mamba-2 target (vocabularies shared): lossless
    even when the draft agrees with nothing."""
    from conftest import tiny_model

    llama = tiny_model("llama", vocab=VOCAB, hidden=32)
    mamba2 = tiny("mamba2")
    ids, mask = ragged_batch()
    for target, draft in ((llama, mamba2), (mamba2, llama)):
        out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=12, num_draft_tokens=2)
        assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=12))


def test_prompt_lookup_then_recurrent_draft_one_row():
    """Prompt lookup beside a recurrent draft model is lossless for one row (no realignment)."""
    target = tiny("mamba2")
    ids, _ = ragged_batch((10,))
    out = fastspec.generate(target, ids, draft=noisy_copy(target), prompt_lookup=2, max_new_tokens=MAX_NEW)
    assert torch.equal(out, hf_greedy(target, ids, max_new_tokens=MAX_NEW))


@pytest.mark.parametrize("name", ["qwen3_next", "mamba2", "lfm2"])
def test_sampling_runs_and_repeats_with_a_seed(name):
    target = tiny(name)
    ids, mask = ragged_batch()
    kwargs = dict(draft=noisy_copy(target), attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=True,
                  temperature=0.8, top_k=20, seed=7)  # fmt: skip
    first = fastspec.generate(target, ids, **kwargs)
    assert first.shape == (3, ids.shape[1] + MAX_NEW)
    assert torch.equal(first, fastspec.generate(target, ids, **kwargs))


@pytest.mark.parametrize("name", ["qwen3_next", "bamba"])
def test_draft_head_on_a_hybrid_target(name, kept_columns_differed):
    """A draft head reads a hybrid target's features (captured in the same forward as its logits)."""
    target = tiny(name)
    ids, mask = ragged_batch()
    head = fitted_head(target, ids, mask, new_tokens=MAX_NEW, steps=60)  # features through the hybrid cache
    out, stats = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=MAX_NEW,
                                   num_draft_tokens=3, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=MAX_NEW))
    assert 0 < stats.accepted < stats.drafted
    assert any(kept_columns_differed)


# refusals, before any forward


@pytest.mark.parametrize("role", ["target", "draft"])
@pytest.mark.parametrize("name", ["qwen3_next", "mamba2"])
def test_tree_refused_with_recurrent_state(name, role):
    from conftest import tiny_model

    hybrid, llama = tiny(name), tiny_model("llama", vocab=VOCAB, hidden=32)
    target, draft = (hybrid, noisy_copy(hybrid)) if role == "target" else (llama, hybrid)
    ids, _ = ragged_batch((6,))
    with pytest.raises(ValueError, match=rf"tree.*{role} \({name}\)"):
        fastspec.generate(target, ids, draft=draft, tree="small", max_new_tokens=4)
    with pytest.raises(ValueError, match=rf"tree: the {role} \({name}\).*one state per branch"):
        cache_kinds.check_state_paths(target, draft, tree="small", static=False, prompt_lookup=None, rows=1)


@pytest.mark.parametrize("argument", ["static_cache", "compile"])
def test_static_cache_refused_with_recurrent_state(argument):
    target = tiny("lfm2")
    ids, _ = ragged_batch((6,))
    with pytest.raises(ValueError, match=r"(static_cache|compile).*target \(lfm2\)"):
        fastspec.generate(target, ids, max_new_tokens=4, **{argument: True})
    with pytest.raises(ValueError, match=rf"^{argument}: the target \(lfm2\).*static cache"):
        cache_kinds.check_state_paths(target, None, tree=None, static=True, prompt_lookup=None, rows=1,
                                      compiled=argument == "compile")  # fmt: skip


def test_static_cache_refused_with_indexed_attention():
    target = tiny("deepseek_v32")
    with pytest.raises(ValueError, match=r"^static_cache: the target \(deepseek_v32\).*indexer keys"):
        cache_kinds.check_state_paths(target, None, tree=None, static=True, prompt_lookup=None, rows=1)
    with pytest.raises(ValueError, match=r"(static_cache|compile).*target \(deepseek_v32\)"):
        fastspec.generate(target, ragged_batch((6,))[0], max_new_tokens=4, static_cache=True)


def test_prompt_lookup_beside_a_recurrent_draft_refused_in_a_batch():
    target = tiny("mamba2")
    ids, mask = ragged_batch()
    with pytest.raises(ValueError, match=r"^prompt_lookup: the draft \(mamba2\).*realigned"):
        fastspec.generate(target, ids, draft=noisy_copy(target), attention_mask=mask, prompt_lookup=2,
                          max_new_tokens=4)  # fmt: skip


def test_state_outside_the_cache_api_refused():
    """MiniMax keeps its linear-attention state in its own cache class: refused for every path."""
    config = tf.MiniMaxConfig(**_common(
        intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_local_experts=2, num_experts_per_tok=1, layer_types=["linear_attention", "full_attention"],
        max_position_embeddings=256,
    ))  # fmt: skip
    target = tf.AutoModelForCausalLM.from_config(config).eval()
    ids, _ = ragged_batch((6,))
    with pytest.raises(ValueError, match=r"^target: the target \(minimax\).*outside transformers' cache API"):
        fastspec.generate(target, ids, max_new_tokens=4)


def test_no_per_position_states_refused_for_speculation(monkeypatch):
    """A model whose mixers update their state without computing per-position states (Zamba's) may decode
    normally, but not speculatively: a rejected draft could not be rolled back."""
    target = tiny("mamba2")
    source = cache_kinds.modeling_source(target).replace("get_recurrent_states_to_keep", "")
    monkeypatch.setattr(cache_kinds, "modeling_source", lambda model: source)
    ids, _ = ragged_batch((6,))
    with pytest.raises(ValueError, match=r"^prompt_lookup: the target \(mamba2\).*no per-position states"):
        fastspec.generate(target, ids, prompt_lookup=2, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"^draft: the target \(mamba2\).*no per-position states"):
        fastspec.generate(target, ids, draft=tiny("mamba2", seed=1), max_new_tokens=4)
    assert torch.equal(fastspec.generate(target, ids, max_new_tokens=6), hf_greedy(target, ids, max_new_tokens=6))


# the recurrent layer's own guards: never a state it did not keep


def _fed_layer(positions: int, states_computed: int) -> RecurrentStateLayer:
    """A layer after one forward of `positions` positions (2 rows) whose model computed the last
    `states_computed` states."""
    layer = RecurrentStateLayer()
    layer.update_conv_state(torch.randn(2, 3, positions), conv_kernel_size=4)
    states = [torch.full((2, 5), float(p)) for p in range(positions - states_computed, positions)]
    layer.update_recurrent_state(states if states_computed > 1 else states[0])
    return layer


def test_recurrent_layer_keeps_each_rows_state_and_conv_window():
    layer = _fed_layer(6, 6)
    conv_inputs = layer.tapes[0][..., 4:].clone()  # [2, 3, 6]: the inputs of positions 0..5
    layer.keep(torch.tensor([5, 3]), 6)  # row 1 kept 4 columns, realigned right by 2
    assert torch.equal(layer.recurrent_states[0][:, 0], torch.tensor([5.0, 3.0]))
    assert torch.equal(layer.conv_states[0][0], conv_inputs[0, :, 2:6])  # window of the last 4 inputs
    assert torch.equal(layer.conv_states[0][1], conv_inputs[1, :, 0:4])
    assert layer.get_seq_length() == 6


def test_recurrent_layer_refuses_states_it_did_not_keep():
    layer = _fed_layer(6, 1)  # a model that computed only the last state
    with pytest.raises(RuntimeError, match="no per-position state"):
        layer.keep(torch.tensor([5, 4]), 6)
    layer = _fed_layer(6, 6)
    layer.keep(torch.tensor([5, 5]), 6)
    with pytest.raises(RuntimeError, match="cannot be rolled back past"):
        layer.keep(torch.tensor([5, 3]), 6)


def test_a_tree_path_is_refused_by_the_cache():
    """Gathering columns other than the ones a row fed, in order (a tree's accepted path), raises."""
    config = CONFIGS["mamba2"]()
    cache = DynamicKVCache(config)
    for layer in cache.layers:
        layer.update_conv_state(torch.randn(1, 3, 6), conv_kernel_size=4)
        layer.update_recurrent_state([torch.randn(1, 5) for _ in range(6)])
    with pytest.raises(RuntimeError, match="other than the ones it fed"):
        cache.gather_positions(torch.tensor([[0, 1, 2, 4]]))
    cache.gather_positions(torch.tensor([[0, 0, 1, 2]]))  # a chain realigned right by one: fine
    assert cache.get_seq_length() == 4


# (weight std, draft noise): large weights, so the recurrent state weighs on the next token (at std 0.5 a state one
# token off moves qwen3_next's two-token distribution by 0.01 in total variation, which the test would not see)
@pytest.mark.parametrize("name, init, noise", [("qwen3_next", 1.0, 0.1), ("lfm2", 0.5, 0.25)])
def test_sampled_first_two_tokens_follow_target(name, init, noise):
    """Speculative sampling on a recurrent target (V = 8, 20,000 rows of one prompt, K = 2): the joint distribution
    of the first two tokens matches the target's exactly (chi-square, as tests/test_generate_sampling.py). A row
    whose first draft is rejected draws its second token after rolling its state back to the root (a state or conv
    window one column off fails this test). Mamba-2's reference scan would take 20 s for 20,000 rows."""
    from test_generate_sampling import N, chi_square_pvalue, exact_two_token_distribution

    torch.manual_seed(0)
    config = CONFIGS[name]()
    config.vocab_size, config.initializer_range = 8, init
    target = tf.AutoModelForCausalLM.from_config(config).eval()
    target.generation_config.eos_token_id = None
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = exact_two_token_distribution(target, prompt, 1.0, None, None)
    out, stats = fastspec.generate(
        target, prompt.expand(N, -1), draft=noisy_copy(target, noise), max_new_tokens=3, do_sample=True,
        num_draft_tokens=2, pad_token_id=0, seed=11, return_stats=True,
    )  # fmt: skip
    assert 0.1 < stats.acceptance_rate < 0.95
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3
