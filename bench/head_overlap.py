"""How close draft heads' next-token distributions are to the shipped target's, teacher-forced, on two kinds of text.

Sampled decoding accepts a draft token with probability sum_x min(p(x), q(x)) (the overlap of target and draft
distributions); greedy decoding needs only argmax agreement. A head trained only on the target's greedy answers
can agree on greedy text and still be far off on text the target samples or a person wrote. Per head, on
(a) 24 windows of 256 tokens of the held-out modules' source (human-written code) and (b) the last 192 tokens of
16 held-out prompts continued by 128 greedy target tokens: the head's first-step argmax agreement with the target
and the mean overlap at temperature 0.7, plus both mean entropies at 0.7 (every position of the rows).

    python bench/head_overlap.py fastspec/pair/head training/out/eagle3_220min
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F


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
    ap.add_argument(
        "heads",
        type=Path,
        nargs="+",
        help="draft head directories or train-head checkpoint.pt files (full draft vocabulary)",
    )
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from fastspec.pair import load_pair
    from fastspec.prompts import heldout_prompts, heldout_sources
    from fastspec.runner import target_logits_and_features
    from fastspec.training.ttt import unroll

    torch.set_num_threads(args.threads)
    tokenizer, target, _ = load_pair()
    ids = tokenizer("\n".join(heldout_sources().values()), return_tensors="pt").input_ids[0]
    source = torch.stack([ids[i : i + 256] for i in range(0, 24 * 2000, 2000)])
    greedy = []
    for prompt in heldout_prompts(tokenizer, 16, 128):
        x = tokenizer([prompt], return_tensors="pt").input_ids
        greedy.append(target.generate(x, do_sample=False, max_new_tokens=128, pad_token_id=0)[0, -192:])
    texts = {"held-out source text": source, "greedy continuations": torch.stack(greedy)}

    t = args.temperature
    print(f"`python bench/head_overlap.py {' '.join(sys.argv[1:])}`\n")
    print(f"| head | text | argmax agreement | overlap at T={t} | target entropy | head entropy |")
    print("|---|---|---:|---:|---:|---:|")
    for path in args.heads:
        head, label = load_head_or_checkpoint(path, target)
        for name, rows in texts.items():
            with torch.no_grad():
                logits, feats = target_logits_and_features(target, 0, head.feature_layers, input_ids=rows)
                ((_, q_logits),) = unroll(head, feats, rows, 1)
            if q_logits.shape[-1] != logits.shape[-1]:
                raise SystemExit(f"{path}: a reduced draft vocabulary; this script compares full-vocabulary heads")
            p = F.softmax(logits[:, 1:].float() / t, -1)  # the head at j predicts token j + 2, as the target at j + 1
            q = F.softmax(q_logits.float() / t, -1)
            agree = (p.argmax(-1) == q.argmax(-1)).float().mean().item()
            overlap = torch.minimum(p, q).sum(-1).mean().item()
            entropy = [-(d * d.clamp_min(1e-12).log()).sum(-1).mean().item() for d in (p, q)]
            print(f"| {label} | {name} | {agree:.3f} | {overlap:.3f} | {entropy[0]:.2f} | {entropy[1]:.2f} |")


if __name__ == "__main__":
    main()
