"""Loop overhead on randomly initialised models: HF generate vs fastspec autoregressive vs fastspec chain.

Random models agree with nothing, so speculation accepts little here: this measures the driver's own cost
(normal decoding through fastspec's loop vs HF's) and what speculation costs when it does not pay off. The
draft is a perturbed copy of the target (same weights + noise) so that it accepts part of the time.
Medians of --repeats interleaved runs after one warm-up, batch 1, greedy.

    python bench/random_pair.py
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import fastspec


def build(arch: str, layers: int, hidden: int) -> torch.nn.Module:
    """A random model with peaked logits (init std 0.2), no EOS."""
    torch.manual_seed(0)
    kwargs = dict(
        vocab_size=4096, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.2,
    )  # fmt: skip
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
    model = model_cls(config_cls(**kwargs)).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _methods(target, draft, ids, new: int, k: int) -> dict:
    """name -> fn() returning (sequences, SpecStats | None)."""
    return {
        "hf_generate": lambda: (target.generate(ids, do_sample=False, max_new_tokens=new), None),
        "fastspec_autoregressive": lambda: fastspec.autoregressive_generate(
            target, ids, max_new_tokens=new, return_stats=True
        ),
        f"fastspec_chain_k{k}": lambda: fastspec.generate(
            target, ids, draft=draft, max_new_tokens=new, num_draft_tokens=k, return_stats=True
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    args = parser.parse_args()
    print(f"`python bench/random_pair.py {' '.join(sys.argv[1:])}` (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)\n")  # fmt: skip
    print("| model | method | tokens/s | vs HF generate | acceptance | tokens/step |")
    print("|---|---|---:|---:|---:|---:|")
    for arch, layers, hidden in [("llama", 8, 256), ("qwen2", 4, 384)]:
        target = build(arch, layers, hidden)
        draft = copy.deepcopy(target)
        with torch.no_grad():
            for p in draft.parameters():
                p.add_(torch.randn_like(p) * 0.004)
        ids = torch.randint(1, 4096, (1, 64), generator=torch.Generator().manual_seed(1))
        new = args.new_tokens
        methods = _methods(target, draft, ids, new, args.k)
        times = {name: [] for name in methods}
        stats = {}
        for fn in methods.values():  # warm-up
            fn()
        for _ in range(args.repeats):
            for name, fn in methods.items():
                start = time.perf_counter()
                _, st = fn()
                times[name].append(time.perf_counter() - start)
                stats[name] = st
        base = new / statistics.median(times["hf_generate"])
        for name in methods:
            tps = new / statistics.median(times[name])
            st = stats[name]
            acc = f"{st.acceptance_rate:.3f}" if st is not None and st.drafted else ""
            mal = f"{st.mean_accepted_length:.2f}" if st is not None else ""
            print(f"| {arch} {layers}x{hidden} | {name} | {tps:.1f} | {tps / base:.2f}x | {acc} | {mal} |")


if __name__ == "__main__":
    main()
