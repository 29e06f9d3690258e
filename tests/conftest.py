"""Shared fixtures: tiny randomly initialised HF causal LMs of several architectures, built offline.

Triton kernels run through the interpreter on machines without CUDA: Triton reads TRITON_INTERPRET when it defines
a kernel, i.e. when a kernel module (`fastspec.kernels.verify_chain`, ...) is first imported, so it is set here,
before any test imports one.
"""

import copy
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# test models are tiny: intra-op threads cost more in synchronisation than they save (and CI has 2 cores)
torch.set_num_threads(1)

import pytest  # noqa: E402
from transformers import (  # noqa: E402
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

ARCHITECTURES = ("llama", "qwen2", "gpt2")


def tiny_model(arch: str, vocab: int = 256, hidden: int = 64, layers: int = 2, seed: int = 0, init: float = 0.2):
    """A tiny fp32 model in eval mode; `init` (weight std) is large so next-token logits are peaked, not tied."""
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, initializer_range=init,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
    elif arch == "qwen2":  # grouped-query attention: 4 query heads share 2 key/value heads
        config = Qwen2Config(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, initializer_range=init,
        )  # fmt: skip
        model = Qwen2ForCausalLM(config)
    elif arch == "gpt2":  # learned absolute positions: position ids must follow the left padding
        config = GPT2Config(
            vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=256, initializer_range=init,
            bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
        model = GPT2LMHeadModel(config)
    else:
        raise ValueError(arch)
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # tests that stop at EOS pass it explicitly
    return model.eval()


def perturbed_copy(model, scale: float, seed: int = 1):
    """A draft that agrees with `model` on some tokens and not others: its weights plus N(0, scale^2) noise."""
    draft = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * scale)
    return draft


class NullStreamer:
    """A streamer that takes what it is given (transformers' streamer interface: put, end)."""

    def put(self, value):
        pass

    def end(self):
        pass


def left_padded_batch(vocab: int, lengths: list[int], seed: int = 0):
    """Random prompts of the given lengths, left-padded with id 0: (input_ids [B, T], attention_mask [B, T])."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(3, vocab, (len(lengths), width), generator=gen)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, width - length :] = 1
    return ids.masked_fill(mask == 0, 0), mask


def hf_greedy(target, ids, mask=None, max_new_tokens=24, eos_token_id=None):
    """HF's own greedy decoding: the output every lossless greedy method must reproduce token for token."""
    return target.generate(
        ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
        pad_token_id=0,
    )  # fmt: skip


@pytest.fixture(scope="session", params=ARCHITECTURES)
def target_and_draft(request):
    """(arch, target, draft): a tiny target and a perturbed copy that accepts part of its drafts."""
    target = tiny_model(request.param)
    scale = {"llama": 0.005, "qwen2": 0.005, "gpt2": 0.02}[request.param]  # gives 30-70 % acceptance at K=1
    return request.param, target, perturbed_copy(target, scale)
