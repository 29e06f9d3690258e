"""HF's other drafters under HF's names, as fastspec drafters (issue 46 item 5): lossless like any draft.

- MTP (`use_mtp=True`, `fastspec.drafters.mtp`): tiny random DeepSeek-V3 and GLM-4.5 MoE targets (config classes only)
  with one MTP layer made to partly agree with the target: its decoder block is the target's last layer, its
  projection passes the next token's embedding through, and the target's first layer is silenced, so the MTP layer
  sees what the target's last layer sees (about half its drafts are accepted; acceptance > 0 and < 1 is asserted, so
  a drafter reading misaligned features or tokens would show). Greedy output equals `target.generate(do_sample=False)`
  at batch 1 and on a left-padded ragged batch, for chains and trees; the MTP layers saved in the checkpoint layout
  are read back by HF's `MtpModel.from_pretrained` and both HF's `generate(use_mtp=True)` and fastspec's
  `use_mtp=True` reproduce the target; sampled, the joint distribution of the first two tokens (the second drafted
  by the MTP layer) is the target's (chi-square). A target without MTP layers, or without a checkpoint holding
  them, is refused naming `use_mtp` and the model type.
- Early exit (`assistant_early_exit=N`, `fastspec.drafters.early_exit`): the target's first layer with its norm and
  lm_head drafts for a tiny Llama / Qwen2 / Gemma 2 (a window); greedy equal to HF at batch 1 and ragged, acceptance
  > 0; equal to HF's own `assistant_early_exit` output; N outside [1, L) refused by name.
"""

import copy
import os

import pytest
import torch
from conftest import left_padded_batch
from test_generate_sampling import N, chi_square_pvalue
from tiny_configs import tiny_causal_lm, tiny_config

import fastspec
from fastspec.drafters.early_exit import early_exit_model
from fastspec.drafters.mtp import MtpHead, load_mtp_model

MtpModel = pytest.importorskip("transformers.modeling_layers").__dict__.get("MtpModel")
needs_mtp = pytest.mark.skipif(MtpModel is None, reason="this transformers has no MtpModel (MTP layers)")
MTP_TYPES = ["deepseek_v3", "glm4_moe"]
PROMPT_LENGTHS = [9, 5, 12]
NEW = 24


def hf_greedy(target, ids, mask=None, new=NEW, **kwargs):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new, pad_token_id=0, **kwargs)


def silence_first_layer(target) -> None:
    """Zero the output projections of the target's first decoder layer: its last layer then reads the embeddings."""
    with torch.no_grad():
        for name, param in target.get_decoder().layers[0].named_parameters():
            if "o_proj" in name or "down_proj" in name:
                param.zero_()


def agreeing_mtp(target):
    """An `MtpModel` of `target` whose layer partly agrees with it (module docstring): block = the target's last
    layer, eh_proj = [I, 0] (the next token's embedding, the hidden state ignored), enorm scaled to the embeddings'
    RMS, post_norm = the target's final norm."""
    mtp = MtpModel(target, 1).float().eval()
    layer, decoder = mtp.layers[0], target.get_decoder()
    with torch.no_grad():
        layer.mtp_block.load_state_dict(decoder.layers[-1].state_dict())
        hidden = layer.eh_proj.weight.shape[0]
        layer.eh_proj.weight.zero_()
        layer.eh_proj.weight[:, :hidden] = torch.eye(hidden)
        layer.enorm.weight.fill_(decoder.embed_tokens.weight.pow(2).mean().sqrt())
        layer.post_norm.load_state_dict(decoder.norm.state_dict())
    return mtp


def mtp_target(model_type: str, vocab: int | None = None):
    """(target, its agreeing MtpModel): a tiny target with a silenced first layer (vocabulary `vocab` if given)."""
    if vocab is None:
        target = tiny_causal_lm(model_type)
    else:
        config = tiny_config(model_type)
        config.vocab_size = vocab
        torch.manual_seed(0)
        target = type(tiny_causal_lm(model_type))(config).float().eval()
        target.generation_config.eos_token_id = None
        target.generation_config.pad_token_id = 0
    silence_first_layer(target)
    return target, agreeing_mtp(target)


def save_with_mtp_layers(target, mtp, directory) -> None:
    """Save `target` with `mtp`'s layer as checkpoint layer L (the DeepSeek / GLM layout: `model.layers.{L}.*` with
    `enorm`, `hnorm`, `eh_proj`, `shared_head.norm`), point the target's config at it and its MTP key pattern at
    layer L (the real models' patterns name their own layer count, 61 / 46 / 92)."""
    from safetensors.torch import load_file, save_file

    layers = target.config.num_hidden_layers
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers + 1
    longer = type(target)(config)  # the MTP block saved as one more decoder layer, in the checkpoint's format
    longer.load_state_dict(target.state_dict(), strict=False)
    longer.get_decoder().layers[layers].load_state_dict(mtp.layers[0].mtp_block.state_dict())
    longer.save_pretrained(directory)
    path = os.path.join(directory, "model.safetensors")
    state = load_file(path)
    for part in ("enorm", "hnorm", "eh_proj"):
        for key, value in getattr(mtp.layers[0], part).state_dict().items():
            state[f"model.layers.{layers}.{part}.{key}"] = value.contiguous()
    state[f"model.layers.{layers}.shared_head.norm.weight"] = mtp.layers[0].post_norm.weight.detach().contiguous()
    save_file(state, path, metadata={"format": "pt"})
    target.config._name_or_path = str(directory)
    target.config.dtype = torch.float32  # as from_pretrained sets it (HF's MtpModel.from_pretrained reads it)
    target._keys_to_ignore_on_load_unexpected = {rf"model\.layers\.{layers}\..*"}


@pytest.fixture(scope="module", params=MTP_TYPES)
def mtp_case(request):
    if MtpModel is None:
        pytest.skip("this transformers has no MtpModel")
    target, mtp = mtp_target(request.param)
    return request.param, target, mtp


@needs_mtp
@pytest.mark.parametrize("rows", ["batch1", "ragged"])
def test_mtp_greedy_equals_target(mtp_case, rows):
    model_type, target, mtp = mtp_case
    lengths = PROMPT_LENGTHS[:1] if rows == "batch1" else PROMPT_LENGTHS
    ids, mask = left_padded_batch(256, lengths, seed=3)
    mask = None if rows == "batch1" else mask
    out, stats = fastspec.generate(target, ids, attention_mask=mask, draft=MtpHead(mtp), max_new_tokens=NEW,
                                   num_draft_tokens=3, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask))
    assert 0 < stats.accepted < stats.drafted  # accepted and rejected drafts both occur


@needs_mtp
@pytest.mark.parametrize("tree", ["dynamic", [[0], [1], [0, 0], [0, 1], [0, 0, 0]]], ids=["dynamic", "static"])
def test_mtp_tree_greedy_equals_target(mtp_case, tree):
    model_type, target, mtp = mtp_case
    ids, mask = left_padded_batch(256, PROMPT_LENGTHS, seed=4)
    out, stats = fastspec.generate(target, ids, attention_mask=mask, draft=MtpHead(mtp), max_new_tokens=NEW,
                                   num_draft_tokens=3, tree=tree, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask))
    assert stats.accepted > 0


@needs_mtp
def test_mtp_drafter_is_a_head_drafter_over_the_first_mtp_layer(mtp_case):
    """MtpHead is the MTP layer's own computation: its logits are MtpModel.forward's first draft's."""
    model_type, target, mtp = mtp_case
    ids = torch.randint(3, 256, (1, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = target(ids, output_hidden_states=True).hidden_states[-1]
        head = MtpHead(mtp).bind(target)
        _, logits = head.forward(hidden[:, :-1], ids[:, 1:], torch.arange(1, 10)[None])
        from transformers.cache_utils import MtpCache

        positions = torch.arange(1, 10)[None]  # HF's: the position of the token read, p + 1
        _, hf_logits, _ = mtp(
            ids[:, 1:], hidden[:, :-1], None, positions, MtpCache(config=target.config.get_mtp_config())
        )
    torch.testing.assert_close(logits[:, -1], hf_logits[:, 0])


@needs_mtp
def test_mtp_layers_from_the_checkpoint_match_hf_use_mtp(tmp_path):
    """The MTP layers saved in the checkpoint layout: HF's generate(use_mtp=True), fastspec's MtpDrafter over
    `load_mtp_model` and fastspec's use_mtp=True all reproduce the target's greedy output."""
    target, mtp = mtp_target("deepseek_v3")
    save_with_mtp_layers(target, mtp, tmp_path)
    loaded = load_mtp_model(target)
    for (name, ours), (loaded_name, theirs) in zip(
        mtp.layers.state_dict().items(), loaded.layers.state_dict().items(), strict=True
    ):
        assert name == loaded_name and torch.equal(ours, theirs)
    ids, _ = left_padded_batch(256, [10], seed=5)
    expected = hf_greedy(target, ids)
    assert torch.equal(hf_greedy(target, ids, use_mtp=True), expected)  # HF's MTP assisted generation (batch 1)
    out, stats = fastspec.generate(target, ids, draft=MtpHead(loaded), max_new_tokens=NEW, return_stats=True)
    assert torch.equal(out, expected) and stats.accepted > 0
    out, stats = fastspec.generate(target, ids, use_mtp=True, max_new_tokens=NEW, return_stats=True)
    assert torch.equal(out, expected) and stats.accepted > 0
    ids, mask = left_padded_batch(256, PROMPT_LENGTHS, seed=8)  # HF's MTP is batch 1 only; fastspec's is not
    for kwargs in ({}, {"tree": "dynamic"}, {"static_cache": True}, {"num_draft_tokens": "auto"}):
        out, stats = fastspec.generate(target, ids, attention_mask=mask, use_mtp=True, max_new_tokens=NEW,
                                       return_stats=True, **kwargs)  # fmt: skip
        assert torch.equal(out, hf_greedy(target, ids, mask)), kwargs
        assert stats.accepted > 0, kwargs
    with pytest.raises(ValueError, match="use_mtp.*not several"):
        fastspec.generate(target, ids, use_mtp=True, assistant_early_exit=1, max_new_tokens=4)


@needs_mtp
@pytest.mark.parametrize("tree", [None, "dynamic"])
def test_mtp_first_two_tokens_follow_target(tree):
    """Sampled: the second token is drafted by the MTP layer and verified; (t1, t2) follows the target exactly. (Row r
    draws from seed + r, so nearby seeds share almost every row's stream: one seed is one sample.)"""
    from test_generate_sampling import VOCAB, exact_two_token_distribution

    target, mtp = mtp_target("deepseek_v3", vocab=VOCAB)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = exact_two_token_distribution(target, prompt, 1.0, None, None)
    out, stats = fastspec.generate(target, prompt.expand(N, -1), draft=MtpHead(mtp), max_new_tokens=3,
                                   do_sample=True, num_draft_tokens=2, tree=tree, seed=10**6,
                                   return_stats=True)  # fmt: skip
    assert 0.05 < stats.acceptance_rate < 0.95  # drafts are accepted and rejected
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3


@needs_mtp
def test_mtp_refused_by_name(tmp_path):
    llama = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match=r"use_mtp.*llama.*no multi-token-prediction layers"):
        load_mtp_model(llama)
    with pytest.raises(ValueError, match=r"use_mtp.*llama.*no multi-token-prediction layers"):
        fastspec.generate(llama, torch.tensor([[3, 4, 5]]), use_mtp=True, max_new_tokens=4)
    target, _ = mtp_target("deepseek_v3")  # MTP layers configured, but no checkpoint holds their weights
    with pytest.raises(ValueError, match=r"use_mtp.*deepseek_v3.*not loaded from a checkpoint"):
        load_mtp_model(target)
    target.save_pretrained(tmp_path)  # a checkpoint without the MTP layers' weights
    target.config._name_or_path, target.config.dtype = str(tmp_path), torch.float32
    target._keys_to_ignore_on_load_unexpected = {r"model\.layers\.2\..*"}
    with pytest.raises(ValueError, match=r"use_mtp.*could not load the MTP layers.*deepseek_v3"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), use_mtp=True, max_new_tokens=4)
    other, other_mtp = mtp_target("glm4_moe")  # another target's MTP layers
    with pytest.raises(ValueError, match="draft"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), draft=MtpHead(other_mtp), max_new_tokens=4)


# ---------------------------------------------------------------------------------------------------- early exit
def early_exit_target(model_type: str):
    """A tiny target whose later layers are damped, so its first layer's exit partly agrees with it."""
    target = tiny_causal_lm(model_type)
    with torch.no_grad():
        for name, param in target.get_decoder().layers[1:].named_parameters():
            if "o_proj" in name or "down_proj" in name:
                param.mul_(0.3)
    return target


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "gemma2"])
@pytest.mark.parametrize("rows", ["batch1", "ragged"])
def test_early_exit_greedy_equals_target(model_type, rows):
    target = early_exit_target(model_type)
    lengths = PROMPT_LENGTHS[:1] if rows == "batch1" else PROMPT_LENGTHS
    ids, mask = left_padded_batch(256, lengths, seed=6)
    mask = None if rows == "batch1" else mask
    draft = early_exit_model(target, 1)
    assert draft.config.num_hidden_layers == 1 and target.config.num_hidden_layers == 2
    out, stats = fastspec.generate(target, ids, attention_mask=mask, draft=draft, max_new_tokens=NEW,
                                   return_stats=True)  # fmt: skip
    expected = hf_greedy(target, ids, mask)
    assert torch.equal(out, expected)
    assert 0 < stats.accepted < stats.drafted
    tree_out = fastspec.generate(target, ids, attention_mask=mask, draft=early_exit_model(target, 1),
                                 max_new_tokens=NEW, tree="dynamic", num_draft_tokens=3)  # fmt: skip
    assert torch.equal(tree_out, expected)


def test_early_exit_matches_hf_assistant_early_exit():
    target = early_exit_target("llama")
    ids, _ = left_padded_batch(256, [11], seed=7)
    expected = hf_greedy(target, ids)
    assert torch.equal(hf_greedy(target, ids, assistant_early_exit=1), expected)
    assert torch.equal(fastspec.generate(target, ids, assistant_early_exit=1, max_new_tokens=NEW), expected)


def test_early_exit_drafter_shares_the_targets_modules():
    target = early_exit_target("llama")
    draft = early_exit_model(target, 1)
    shared = {id(p) for p in target.parameters()}
    assert all(id(p) in shared for p in draft.parameters())
    assert draft.get_decoder().layers[0] is target.get_decoder().layers[0]
    assert draft.lm_head is target.lm_head and draft.get_decoder().norm is target.get_decoder().norm
    ids = torch.randint(3, 256, (1, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the draft's logits are the target's norm + lm_head of its first layer's output
        states = target(ids, output_hidden_states=True).hidden_states
        decoder = target.get_decoder()
        torch.testing.assert_close(draft(ids).logits, target.lm_head(decoder.norm(states[1])))


@pytest.mark.parametrize("layers", [0, 2, 5])
def test_early_exit_outside_the_target_refused_by_name(layers):
    target = tiny_causal_lm("llama")
    with pytest.raises(ValueError, match=rf"assistant_early_exit={layers}.*llama.*2 decoder layers"):
        early_exit_model(target, layers)
