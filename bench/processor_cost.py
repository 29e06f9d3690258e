"""Per-step cost of transformers' logits processors run over speculated positions (`fastspec.processors`).

One speculation step applies the call's processors to the target logits of every scored position, R rows x P
positions (a chain of K drafts: P = K + 1), each with its own prefix (history of W tokens + the drafts on its path).
This times `LogitsPipeline.apply` (prefixes built from scratch each step, as in a decoding step) per processor
kind, and the verification kernel with and without min-p (the reference on CPU; the Triton kernel too on CUDA).

    python bench/processor_cost.py [--vocab 49152] [--history 512] [--device cpu|cuda]

Prints a markdown table: milliseconds per step for each (rows, positions) pair, the fastest of 30 repeats taken in
turns (on a shared CPU other work inflates the rest; the fastest is the closest to the cost itself).
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import LogitsProcessor  # noqa: E402
from transformers.generation import logits_process as hf  # noqa: E402

from fastspec.prefixes import PositionPrefixes  # noqa: E402
from fastspec.processors import LogitsPipeline  # noqa: E402
from fastspec.verify import verify_chain  # noqa: E402


class LastTokenBan(LogitsProcessor):
    """A user processor (run per position): bans the prefix's last token."""

    def __call__(self, input_ids, scores):
        return scores.scatter(1, input_ids[:, -1:], -float("inf"))


def processor_sets(prompt: int) -> dict[str, list]:
    eos = torch.tensor([2])
    return {
        "repetition_penalty=1.1": [hf.RepetitionPenaltyLogitsProcessor(1.1)],
        "no_repeat_ngram_size=3": [hf.NoRepeatNGramLogitsProcessor(3)],
        "min_new_tokens=8": [hf.MinNewTokensLengthLogitsProcessor(prompt, 8, eos)],
        "bad_words_ids (3 words)": [hf.NoBadWordsLogitsProcessor([[5], [6, 7], [8, 9, 10]], eos)],
        "user processor (per position)": [LastTokenBan()],
        "all of the above": [hf.RepetitionPenaltyLogitsProcessor(1.1), hf.NoRepeatNGramLogitsProcessor(3),
                             hf.MinNewTokensLengthLogitsProcessor(prompt, 8, eos),
                             hf.NoBadWordsLogitsProcessor([[5], [6, 7], [8, 9, 10]], eos), LastTokenBan()],
    }  # fmt: skip


def fastest_ms(cells: dict, device: torch.device, repeats: int = 30) -> dict:
    """The fastest of `repeats` timings of each closure in `cells`, in ms: the cells take turns (round robin) so a
    burst of other work on a shared machine slows them alike, and the fastest repeat is the least disturbed."""
    best = dict.fromkeys(cells, float("inf"))
    for fn in cells.values():  # warm-up: allocations, first-call work
        fn()
    for _ in range(repeats):
        for key, fn in cells.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best[key] = min(best[key], (time.perf_counter() - start) * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)  # SmolLM2's
    parser.add_argument("--history", type=int, default=512)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device, vocab, width = torch.device(args.device), args.vocab, args.history
    shapes = [(1, 5), (4, 5), (8, 9)]
    g = torch.Generator().manual_seed(0)
    cells = {}
    for rows, positions in shapes:
        history = torch.randint(0, vocab, (rows, width + 64), generator=g).to(device)
        drafts = torch.randint(0, vocab, (rows, positions - 1), generator=g).to(device)
        logits = torch.randn(rows, positions, vocab, generator=g).to(device)
        lengths = torch.full((rows,), width, device=device)
        row_ids = torch.arange(rows, device=device)
        for name, procs in processor_sets(width).items():
            pipeline = LogitsPipeline(procs, do_sample=False)
            cells[name, rows, positions] = functools.partial(
                lambda p, h, n, d, x, i: p.apply(x, PositionPrefixes.chain(h, n, d), i),
                pipeline,
                history,
                lengths,
                drafts,
                logits,
                row_ids,
            )
        uniforms = torch.rand(rows, positions - 1, generator=g).clamp_min(1e-6).to(device)
        noise = torch.empty(rows, vocab).exponential_(generator=g).to(device)
        for backend in ["reference"] + (["triton"] if device.type == "cuda" else []):
            for label, min_p in (("verify, top_k=50", None), ("verify, top_k=50 + min_p=0.05", 0.05)):
                cells[f"{label} ({backend})", rows, positions] = functools.partial(
                    verify_chain, logits, drafts, None, None, 0.7, 50, None, uniforms, noise, min_p=min_p,
                    backend=backend,
                )  # fmt: skip
    best = fastest_ms(cells, device)
    print(f"{device}, V={vocab}, history {width} tokens; ms per step (fastest of 30, round robin)\n")
    print("| processors | " + " | ".join(f"R={r} P={p}" for r, p in shapes) + " |")
    print("|---|" + "---|" * len(shapes))
    for name in dict.fromkeys(key[0] for key in cells):
        print(f"| {name} | " + " | ".join(f"{best[name, r, p]:.2f}" for r, p in shapes) + " |")


if __name__ == "__main__":
    main()
