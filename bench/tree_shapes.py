"""Greedy dynamic trees of several shapes and rank temperatures against the K=4 chain, interleaved per prompt.

Each variant decodes the same held-out prompts (batch 1, greedy) with the shipped pair and a draft (the shipped
draft head by default, `--draft model` for the draft model); every repeat runs all variants on each prompt back
to back. Reported: median tokens/s over repeats (all prompts together), its ratio to HF generate in the same run,
and tokens per target forward. Trees are `DynamicTree(top_k, num_nodes, depth, rank_temperature)`; every output
is checked against HF greedy output.

    python bench/tree_shapes.py                                   # head; shapes and temperatures below
    python bench/tree_shapes.py --draft model --rank-temperatures 1 0.25 --repeats 5
    python bench/tree_shapes.py --shapes 2,8,5 4,32,6 --compile
    python bench/tree_shapes.py --target smollm2 --shapes 3,3,1 2,4,2 4,7,3 --rank-temperatures 0.25 \
        --chains 1 auto --num-prompts 1 --max-new-tokens 64 --repeats 2

`--target smollm2` (or any target `fastspec.models` resolves that has a shipped head) decodes the suite's prompts
instead (`fastspec.prompts.sample_prompts`: `--num-prompts` MT-bench first turns per category and as many HumanEval
problems, under the chat template) with that target's shipped head.
"""

from __future__ import annotations

import argparse

import torch

from fastspec.prompts import PROMPT_SETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", choices=("head", "model"), default="head", help="the shipped head or draft model")
    ap.add_argument("--shapes", nargs="+", default=["2,6,5", "2,8,5", "2,10,6", "4,32,6"],
                    help="top_k,num_nodes,depth of each dynamic tree")  # fmt: skip
    ap.add_argument("--rank-temperatures", type=float, nargs="+", default=[1.0, 0.25])
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=192)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="compile=True for every fastspec variant")
    ap.add_argument("--chains", nargs="+", default=["4"], help="chain rows: draft lengths, or 'auto' (adaptive K)")
    ap.add_argument("--target", help="a target with a shipped head (e.g. smollm2) on the suite's prompts")
    args = ap.parse_args()

    import fastspec
    from fastspec.benchmarks import interleave, new_tokens
    from fastspec.heads import load_head
    from fastspec.pair import load_pair
    from fastspec.tree import DynamicTree

    if args.target:
        from fastspec.models import encode_prompt, load_target, shipped_head_dir
        from fastspec.prompts import sample_prompts

        if args.draft != "head":
            raise SystemExit("--target: only the target's shipped head (--draft head)")
        tokenizer, target = load_target(args.target)
        draft = load_head(shipped_head_dir(args.target), target)
        prompts = sample_prompts(args.num_prompts, args.num_prompts)
        inputs = [encode_prompt(tokenizer, p.text)[0] for p in prompts]
        where = f"{args.target}, {len(prompts)} suite prompts (chat template)"
    else:
        tokenizer, target, draft_model = load_pair()
        draft = load_head(None, target) if args.draft == "head" else draft_model
        prompts = PROMPT_SETS["heldout"](tokenizer, args.num_prompts, args.prompt_tokens)
        inputs = [tokenizer([p], return_tensors="pt").input_ids for p in prompts]
        where = f"the shipped pair, {len(prompts)} held-out prompts"
    common = dict(max_new_tokens=args.max_new_tokens)  # both stop at the target's EOS, as `fastspec bench` does
    pad = target.generation_config.pad_token_id or 0

    def fs(**extra):
        return lambda ids, seed: fastspec.generate(target, ids, draft=draft, return_stats=True,
                                                   compile=args.compile, **common, **extra)  # fmt: skip

    methods = {
        "hf_generate": lambda ids, seed: (target.generate(ids, do_sample=False, pad_token_id=pad, **common), None),
        "autoregressive": lambda ids, seed: fastspec.generate(target, ids, return_stats=True, compile=args.compile,
                                                             **common),
    }  # fmt: skip
    for chain in args.chains:  # adaptive K: one controller per method, kept across its calls (as in `fastspec bench`)
        k = fastspec.DraftLengthController() if chain == "auto" else int(chain)
        methods[f"chain_{'auto' if chain == 'auto' else f'k{chain}'}"] = fs(num_draft_tokens=k)
    for shape in args.shapes:
        top_k, num_nodes, depth = (int(x) for x in shape.split(","))
        for temp in args.rank_temperatures:
            tree = DynamicTree(top_k, num_nodes, depth, rank_temperature=temp)
            methods[f"tree_k{top_k}_n{num_nodes}_d{depth}_t{temp:g}"] = fs(tree=tree, num_draft_tokens=depth)
    if args.compile:  # compile every step shape before timing
        for fn in methods.values():
            for ids in inputs:
                fn(ids, 0)
    reference, steps, emitted, mismatches = {}, dict.fromkeys(methods, 0), dict.fromkeys(methods, 0), []

    def keep(name, repeat, index, result):
        sequences, stats = result
        if not torch.equal(sequences, reference.setdefault(index, sequences)):
            mismatches.append((name, index))
        if stats is not None:
            steps[name] += stats.row_steps
            emitted[name] += stats.emitted

    eos = target.generation_config.eos_token_id
    timed = interleave(methods, inputs, lambda result, ids: new_tokens(result[0], ids.shape[1], 0, eos),
                       repeats=args.repeats, on_result=keep)  # fmt: skip
    base = timed["hf_generate"].tokens_per_s
    print(f"cpu, {torch.get_num_threads()} threads, batch 1, greedy, draft {args.draft}, {where} "
          f"x {args.max_new_tokens} tokens, median of {args.repeats} interleaved repeats"
          + (", compile=True" if args.compile else ""))  # fmt: skip
    print("\n| method | tokens/s | vs HF generate | tokens per target forward |\n|---|---:|---:|---:|")
    for name, t in timed.items():
        per_forward = f"{emitted[name] / steps[name]:.2f}" if steps[name] else ""
        print(f"| {name} | {t.tokens_per_s:.1f} | {t.tokens_per_s / base:.2f}x | {per_forward} |")
    print(f"\ngreedy outputs equal to HF generate: {'all' if not mismatches else mismatches}")
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
