"""Adaptive K against fixed K, interleaved per prompt: the finer comparison `fastspec bench` cannot make.

On a shared, noisy machine a few percent between two methods measured minutes apart means little. Here every
repeat runs each variant on each prompt batch back to back, so slow phases hit all variants alike; the report
is the median over repeats of each variant's tokens/s (all prompts of a repeat together), its tokens per target
forward, and the ratio of adaptive K to the best fixed K.

    python bench/auto_vs_fixed.py                                  # batch 1, greedy, K = 4 5 6 and auto
    python bench/auto_vs_fixed.py --temperature 0.7 --batch-size 4 --ks 2 4 6 --repeats 5
    python bench/auto_vs_fixed.py --prompt-set mixed --num-prompts 8 --prompt-tokens 160 --max-new-tokens 80
    python bench/auto_vs_fixed.py --prompt-lookup 3 --ks 4 6 8           # lookup first, the draft as fallback
"""

from __future__ import annotations

import argparse

from fastspec.prompts import PROMPT_SETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", type=int, nargs="+", default=[4, 5, 6], help="fixed chain lengths to compare")
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 for greedy")
    ap.add_argument("--prompt-set", choices=list(PROMPT_SETS), default="heldout", help="as `fastspec bench`")
    ap.add_argument("--num-prompts", type=int, default=4, help="a multiple of the batch size")
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    lookup_help = "every variant drafts by N-gram lookup first, the draft model as fallback"
    ap.add_argument("--prompt-lookup", type=int, metavar="N", help=lookup_help)
    args = ap.parse_args()

    import fastspec
    from fastspec.benchmarks import interleave
    from fastspec.pair import load_pair

    tokenizer, target, draft = load_pair(device=args.device)
    tokenizer.padding_side = "left"
    prompts = PROMPT_SETS[args.prompt_set](tokenizer, args.num_prompts, args.prompt_tokens)
    batches = [
        tokenizer(prompts[i : i + args.batch_size], return_tensors="pt", padding=True).to(args.device)
        for i in range(0, len(prompts), args.batch_size)
    ]
    sampling = {"do_sample": True, "temperature": args.temperature} if args.temperature > 0 else {}
    lookup = {"prompt_lookup": args.prompt_lookup} if args.prompt_lookup else {}
    variants = {f"k{k}": k for k in args.ks} | {"auto": "auto"}

    def variant(k):
        def run(batch, seed):
            return fastspec.generate(
                target, batch.input_ids, attention_mask=batch.attention_mask, draft=draft, num_draft_tokens=k,
                max_new_tokens=args.max_new_tokens, seed=seed, return_stats=True, **sampling, **lookup,
            )[1]  # fmt: skip

        return run

    steps = dict.fromkeys(variants, 0)

    def count_steps(name, repeat, index, stats):
        steps[name] += stats.steps

    timed = interleave(
        {name: variant(k) for name, k in variants.items()}, batches, lambda stats, batch: stats.emitted,
        repeats=args.repeats, device=args.device, seed_stride=100, on_result=count_steps,
    )  # fmt: skip
    print(
        f"{args.device}, batch {args.batch_size}, temperature {args.temperature}, {len(prompts)} {args.prompt_set} "
        f"prompts x {args.max_new_tokens} tokens, median of {args.repeats} interleaved repeats"
        + (f", lookup n={args.prompt_lookup} then draft" if args.prompt_lookup else "")
    )
    for name, t in timed.items():
        print(f"{name:>5}: {t.tokens_per_s:7.1f} tok/s  tokens/forward {sum(t.tokens) / steps[name]:.2f}"
              f"  repeats {[round(r) for r in t.rates]}")  # fmt: skip
    best = max((n for n in timed if n != "auto"), key=lambda n: timed[n].tokens_per_s)
    print(f"auto / best fixed ({best}): {timed['auto'].tokens_per_s / timed[best].tokens_per_s:.3f}")


if __name__ == "__main__":
    main()
