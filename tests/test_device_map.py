"""Device-mapped targets (`from_pretrained(..., device_map=..., offload_folder=...)`, accelerate): part of the target
offloaded to CPU and disk (its weights on the meta device, loaded by accelerate's hooks for each forward). Inputs,
caches, the draft model or head and the verifier each go where they compute (`fastspec.runner.execution_device`);
output equals HF generate on the same offloaded model, and sampling with a seed equals the un-offloaded model's."""

import pytest
import torch
from conftest import hf_greedy, left_padded_batch, perturbed_copy, tiny_model
from transformers import AutoModelForCausalLM

import fastspec
from fastspec.heads import DraftHead, DraftHeadConfig

pytest.importorskip("accelerate", reason="device maps need accelerate")

DEVICE_MAP = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.norm": "cpu",
              "model.rotary_emb": "cpu", "lm_head": "disk"}  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("offload")
    target = tiny_model("llama", init=0.5)
    target.save_pretrained(root / "target")
    offloaded = AutoModelForCausalLM.from_pretrained(root / "target", device_map=DEVICE_MAP,
                                                     offload_folder=str(root / "offload")).eval()  # fmt: skip
    assert offloaded.lm_head.weight.device.type == "meta"  # the test means what it says
    offloaded.generation_config.pad_token_id = 0
    offloaded.generation_config.eos_token_id = None
    torch.manual_seed(0)
    head = DraftHead(DraftHeadConfig.from_target_config(target.config)).eval()
    return target, offloaded, perturbed_copy(target, 0.05), head


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_draft_tokens=3), dict(static_cache=True), dict(tree="dynamic"), dict(prompt_lookup=2, draft=None),
     dict(draft="head"), dict(draft="head", tree="dynamic", num_draft_tokens=3)],
    ids=["chain", "static", "dynamic_tree", "lookup", "head", "head_tree"],
)  # fmt: skip
def test_offloaded_target_greedy_equals_hf(models, kwargs):
    target, offloaded, draft, head = models
    kwargs = dict(kwargs)
    kwargs["draft"] = {"head": head, None: None}.get(kwargs.get("draft", draft), draft)
    ids, mask = left_padded_batch(256, [9, 5])
    out = fastspec.generate(offloaded, ids, attention_mask=mask, max_new_tokens=16, **kwargs)
    assert torch.equal(out, hf_greedy(offloaded, ids, mask, max_new_tokens=16))
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=16))


def test_offloading_changes_no_sampled_token(models):
    target, offloaded, draft, _ = models
    ids, mask = left_padded_batch(256, [9, 5])
    kwargs = dict(attention_mask=mask, draft=draft, do_sample=True, temperature=0.8, seed=4, max_new_tokens=16)
    assert torch.equal(fastspec.generate(offloaded, ids, **kwargs), fastspec.generate(target, ids, **kwargs))
