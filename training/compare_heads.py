"""Compare draft heads for the shipped target by greedy acceptance on held-out prompts (no timing: deterministic).

Each head decodes the same held-out prompts (batch 1, greedy, `fastspec.generate`) as a K-chain and as a dynamic
tree; reported per head: acceptance rate and per-position acceptance of the chain, tokens per target forward (bonus
included, as `SpecStats.tokens_per_step`) of both. Every output is checked against HF greedy generate. Acceptance
does not depend on the machine's load, so this is the measure to pick a head by; speed comes from
`fastspec bench --head DIR`.

    python -m training.compare_heads fastspec/pair/head training/out/head_fused --num-prompts 16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def load_head_or_checkpoint(path: Path, target):
    """``(head, label)``: a head directory (`fastspec.heads.load_head`) or a `fastspec train-head` checkpoint file
    (`fastspec.training.head_from_checkpoint`, measured while its run goes on; the label names its step)."""
    if path.is_file():
        from fastspec.training import head_from_checkpoint

        head, step = head_from_checkpoint(path, target)
        return head, f"{path} (step {step})"
    from fastspec.heads import load_head

    return load_head(path, target).eval(), str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("heads", type=Path, nargs="+", help="draft head directories or train-head checkpoint.pt files")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--k", type=int, default=4, help="chain length")
    ap.add_argument("--tree", default="32,6", help="dynamic tree as NODES,DEPTH (top-k 4)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import fastspec
    from fastspec.benchmarks import acceptance_summary
    from fastspec.pair import load_pair
    from fastspec.prompts import PROMPT_SETS
    from fastspec.tree import DynamicTree

    torch.set_num_threads(args.threads)
    tokenizer, target, _ = load_pair()
    prompts = PROMPT_SETS["heldout"](tokenizer, args.num_prompts, args.prompt_tokens)
    inputs = [tokenizer([p], return_tensors="pt").input_ids for p in prompts]
    expected = [target.generate(ids, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=0)
                for ids in inputs]  # fmt: skip
    nodes, depth = (int(x) for x in args.tree.split(","))
    variants = {f"chain K={args.k}": dict(num_draft_tokens=args.k),
                f"dynamic tree {nodes} nodes depth {depth}": dict(tree=DynamicTree(4, nodes, depth))}  # fmt: skip

    print(f"`python -m training.compare_heads {' '.join(sys.argv[1:])}`  ")
    print(f"{len(prompts)} held-out prompts of <= {args.prompt_tokens} tokens, {args.max_new_tokens} new tokens, "
          f"batch 1, greedy\n")  # fmt: skip
    print("| head | feature layers | draft | acceptance | tokens per target forward | per-position acceptance |")
    print("|---|---|---|---:|---:|---|")
    for path in args.heads:
        head, label = load_head_or_checkpoint(path, target)
        for name, kwargs in variants.items():
            runs = []
            for ids, want in zip(inputs, expected, strict=True):
                out, stats = fastspec.generate(target, ids, draft=head, max_new_tokens=args.max_new_tokens,
                                               return_stats=True, **kwargs)  # fmt: skip
                if not torch.equal(out, want):
                    raise SystemExit(f"{path} {name}: output differs from HF greedy generate")
                runs.append(stats)
            summary = acceptance_summary(runs)
            per_pos = " ".join(f"{a:.2f}" for a in summary["per_position_acceptance"])
            # a tree drafts many nodes per step: its acceptance is per node, not comparable with a chain's
            rate = f"{summary['acceptance_rate']:.3f}" if "chain" in name else ""
            per_forward = summary["mean_accepted_length"]
            print(f"| {label} | {head.config.feature_layers} | {name} | {rate} | {per_forward:.2f} | {per_pos} |")


if __name__ == "__main__":
    main()
