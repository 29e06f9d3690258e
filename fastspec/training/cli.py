"""`fastspec train-head`: the command line of `fastspec.training.train_head`.

`add_parser(subparsers)` adds the subcommand to the `fastspec` command (`fastspec.cli`); `main(argv)` runs it alone
(``python -m fastspec.training ...``, and under ``torchrun``).
"""

from __future__ import annotations

import argparse
import shlex
import sys

__all__ = ["add_parser", "main", "run"]

HELP = """\
Train a draft head for a target: the target regenerates the answers to your prompts (cached in the work directory
and extended, never regenerated, when you add prompts), an EAGLE-3 head (default; --kind eagle1 for fastspec's
EAGLE-1 head) with a reduced vocabulary of the answers' most frequent tokens learns them with the training-time test
(the head unrolled --unroll steps on its own outputs, step losses decayed 0.8^k), and the head is written to --out in
the official EAGLE-3 layout (SGLang and vLLM load it) with training.json: the command, data, minutes, throughput and
the held-out greedy acceptance at K=4 measured with fastspec.generate.

Prompts: .jsonl files (a "prompt" string or chat "messages" per line; the tokenizer's chat template is applied),
text files (one prompt per line, a literal \\n is a newline; --text-mode file: one prompt per file), "stdlib"
(function-signature prompts from the Python standard library, for code models like the shipped target),
"stdlib-windows" (windows of the same modules ending at a random line), "instructions" (chat prompts for
instruction-tuned targets built from the standard library and templates here, in MT-bench's categories plus code,
none taken from a benchmark: fastspec/training/instructions.py), or "self-questions" (user requests a chat target
writes itself when asked for one of a kind and topic, cached in the work directory:
fastspec/training/self_questions.py). Several sources are interleaved, one prompt of each in turn, before
--max-prompts cuts the list; answers are cached by prompt, so adding a source reuses the answers of the others.
Held-out prompts: --heldout FILE..., else the last --heldout-count prompts (never trained on).
Corpus: --corpus stdlib (or text files) puts fresh windows of other text in every batch (--corpus-fraction of its
rows, --corpus-tokens long), trained at every position with the target's distribution as the teacher.

Budget: --minutes and/or --max-steps (totals over resumed runs). --resume continues the checkpoint in the work
directory (<out>.work by default). Data parallel: torchrun --nproc-per-node N -m fastspec.training ... ."""


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add `train-head` to the `fastspec` command's subparsers."""
    p = subparsers.add_parser(
        "train-head", help="train an EAGLE-3 (or EAGLE-1) draft head for a target on its own answers",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--target", default="shipped",
                   help="HF model directory, a .gguf file, 'smollm2' or 'shipped' (default)")  # fmt: skip
    p.add_argument("--kind", choices=["eagle3", "eagle1"], default="eagle3")
    p.add_argument("--prompts", nargs="+", default=["stdlib"], help="prompt files (.jsonl or text) or built-in "
                   "sources: 'stdlib', 'stdlib-windows', 'instructions', 'self-questions'")  # fmt: skip
    p.add_argument("--text-mode", choices=["line", "file"], default="line", help="text files: a prompt per line/file")
    p.add_argument("--max-prompts", type=int, help="use the first N prompts (built-in sets share N, default 1024)")
    p.add_argument("--max-prompt-tokens", type=int, default=512, help="keep each prompt's last N tokens")
    p.add_argument("--heldout", nargs="+", help="held-out prompt files (default: the last --heldout-count prompts)")
    p.add_argument("--heldout-count", type=int, default=8)
    p.add_argument("--heldout-tokens", type=int, default=96, help="new tokens per held-out prompt")
    p.add_argument("--out", required=True, help="head directory to write")
    p.add_argument("--work-dir", help="checkpoint and regeneration cache (default: <out>.work)")
    p.add_argument("--regen-cache", help="regeneration cache directory (default: <work-dir>/regen)")
    p.add_argument("--extra-regen-caches", nargs="+", default=[], metavar="DIR",
                   help="complete caches of answers to the same prompts made with other settings (e.g. T=0.7 "
                        "beside greedy): each adds a training row per prompt; read, never extended")  # fmt: skip
    p.add_argument("--regen-tokens", type=int, default=256, help="max new tokens per regenerated answer")
    p.add_argument("--regen-temperature", type=float, default=0.0, help="0 = greedy answers")
    p.add_argument("--regen-batch-size", type=int, default=16)
    p.add_argument("--prompt-loss", action="store_true", help="also train on the prompts' tokens, not only the answers")
    p.add_argument(
        "--corpus",
        nargs="+",
        default=[],
        metavar="SRC",
        help="'stdlib' and/or text files: fresh windows of them in every batch, trained at every position",
    )
    p.add_argument("--corpus-fraction", type=float, default=0.25, help="share of every batch's rows (with --corpus)")
    p.add_argument("--corpus-tokens", type=int, default=256, help="tokens per corpus window")
    p.add_argument("--init-head", help="start from this head's weights (a directory load_head reads; a new run)")
    p.add_argument("--draft-vocab", type=int, help="EAGLE-3 draft vocabulary size (default: min(vocab, 32000))")
    p.add_argument("--aux-layers", type=int, nargs=3, help="EAGLE-3 target hidden_states indices (default 2 L/2 L-3)")
    p.add_argument("--unroll", type=int, default=7, help="training-time-test steps")
    p.add_argument("--decay", type=float, default=0.8, help="loss weight factor per later step")
    p.add_argument("--feature-regression", type=float, default=0.0, metavar="W",
                   help="EAGLE-3: add W x EAGLE-1's smooth-L1 of each unrolled step's hidden onto the target's last "
                        "hidden state (a training signal only: the head's format is unchanged)")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=8, help="rows (prompt + answer) per step and process")
    p.add_argument("--max-len", type=int, default=1024, help="tokens per row at most")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--minutes", type=float, help="training time budget (total over resumed runs)")
    p.add_argument("--max-steps", type=int, help="training steps (total over resumed runs)")
    p.add_argument("--ckpt-minutes", type=float, default=5.0)
    p.add_argument("--resume", action="store_true", help="continue from the work directory's checkpoint")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="default: cuda when available")
    p.add_argument("--bf16", action="store_true",
                   help="CPU: bf16 autocast of the target's features and the training step (fast on CPUs with AMX "
                        "or AVX512-BF16; regeneration stays fp32). CUDA: always bf16")  # fmt: skip
    p.add_argument("--save-dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weights of the written head (held-out acceptance is measured on what is written)")  # fmt: skip
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run, _train_head_parser=p)
    return p


def _canonical_argv(args: argparse.Namespace) -> list[str]:
    """The options of ``args`` that differ from their defaults, as a command line (when the process's own command
    line is not `fastspec train-head ...`, e.g. `fastspec.cli.main([...])` called from Python)."""
    argv = []
    for action in args._train_head_parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value == action.default:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv


def run(args: argparse.Namespace, argv: list[str] | None = None) -> dict | None:
    """Run `fastspec train-head` with parsed ``args``; ``argv`` (the subcommand's arguments) is the recorded
    command, else the process's own command line."""
    from fastspec.training.trainer import TrainConfig, train_head

    if args.minutes is None and args.max_steps is None:
        sys.exit("fastspec train-head: give a budget: --minutes and/or --max-steps")
    if argv is None:
        argv = sys.argv[2:] if sys.argv[1:2] == ["train-head"] else _canonical_argv(args)
    cfg = TrainConfig(
        out=args.out, target=args.target, kind=args.kind, prompts=args.prompts, text_mode=args.text_mode,
        max_prompts=args.max_prompts, max_prompt_tokens=args.max_prompt_tokens, heldout=args.heldout,
        heldout_count=args.heldout_count, heldout_tokens=args.heldout_tokens, regen_tokens=args.regen_tokens,
        regen_temperature=args.regen_temperature, regen_batch_size=args.regen_batch_size,
        regen_cache=args.regen_cache, extra_regen_caches=args.extra_regen_caches, prompt_loss=args.prompt_loss,
        corpus=args.corpus, corpus_fraction=args.corpus_fraction, corpus_tokens=args.corpus_tokens,
        init_head=args.init_head,
        work_dir=args.work_dir, draft_vocab=args.draft_vocab,
        aux_layers=args.aux_layers, unroll=args.unroll, decay=args.decay,
        feature_regression=args.feature_regression, batch_size=args.batch_size,
        max_len=args.max_len, lr=args.lr, warmup=args.warmup, minutes=args.minutes, max_steps=args.max_steps,
        ckpt_minutes=args.ckpt_minutes, resume=args.resume, seed=args.seed, device=args.device,
        bf16=args.bf16, save_dtype=args.save_dtype, threads=args.threads, progress=not args.no_progress,
        command="fastspec train-head " + shlex.join(argv),
    )  # fmt: skip
    return train_head(cfg)


def main(argv: list[str] | None = None) -> dict | None:
    """`fastspec train-head ARGS` on its own (``argv``: the arguments after ``train-head``)."""
    parser = argparse.ArgumentParser(prog="fastspec")
    add_parser(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(["train-head", *argv])
    return run(args, argv)
