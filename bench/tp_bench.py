"""Tensor parallel on CPU: the shipped target sharded over 2 ranks (transformers `tp_plan="auto"`, gloo), HF generate
against fastspec under the same TP, greedy, batch 1. Every rank runs the same calls (the target's forwards are
collectives); rank 0 prints the table. Methods are interleaved per prompt, timed after a warm-up, median of the
repeats of (new tokens / seconds summed over the prompts) (`fastspec.benchmarks.interleave`).

    torchrun --standalone --nproc-per-node 2 bench/tp_bench.py [--prompts 4] [--new-tokens 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, AutoTokenizer

import fastspec
from fastspec.benchmarks import interleave
from fastspec.heads import load_head
from fastspec.pair import default_draft_dir, default_target_dir
from fastspec.prompts import heldout_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=192)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target = AutoModelForCausalLM.from_pretrained(default_target_dir(), tp_plan="auto", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(default_draft_dir(), dtype=torch.float32).eval()
    head = load_head(None, target)
    tokenizer = AutoTokenizer.from_pretrained(default_target_dir())
    prompts = [tokenizer([p], return_tensors="pt").input_ids for p in
               heldout_prompts(tokenizer, args.prompts, args.prompt_tokens)]  # fmt: skip
    common = dict(max_new_tokens=args.new_tokens, eos_token_id=None)
    methods = {
        "hf_generate": lambda ids, seed: target.generate(ids, do_sample=False, pad_token_id=0, **common),
        "fastspec_autoregressive": lambda ids, seed: fastspec.autoregressive_generate(target, ids, **common),
        "fastspec_chain_k4": lambda ids, seed: fastspec.generate(target, ids, draft=draft, **common),
        "fastspec_chain_auto": lambda ids, seed: fastspec.generate(
            target, ids, draft=draft, num_draft_tokens="auto", **common
        ),  # fmt: skip
        "fastspec_head_auto": lambda ids, seed: fastspec.generate(
            target, ids, draft=head, num_draft_tokens="auto", **common
        ),  # fmt: skip
    }
    outputs = {}

    def keep(name, repeat, index, result):
        outputs.setdefault(index, {})[name] = result

    times = interleave(methods, prompts, lambda out, ids: out.shape[1] - ids.shape[1], repeats=args.repeats,
                       on_result=keep)  # fmt: skip
    if dist.get_rank() == 0:
        base = times["hf_generate"].tokens_per_s
        equal = all(torch.equal(row[name], row["hf_generate"]) for row in outputs.values() for name in row)
        print(f"`torchrun --standalone --nproc-per-node 2 bench/tp_bench.py {' '.join(sys.argv[1:])}`".strip())
        print(f"\nshipped target sharded over {dist.get_world_size()} ranks (gloo, 1 thread each), {args.prompts} "
              f"held-out prompts x {args.new_tokens} new tokens, greedy, median of {args.repeats} repeats; every "
              f"output equal to HF generate's: {equal}\n")  # fmt: skip
        print("| method | tokens/s | vs HF generate (same TP) |\n|---|---:|---:|")
        for name, t in times.items():
            print(f"| {name} | {t.tokens_per_s:.1f} | {t.tokens_per_s / base:.2f}x |")
    dist.barrier()


if __name__ == "__main__":
    main()
