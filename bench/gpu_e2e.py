"""End-to-end decoding speed on a GPU (or, tiny, on the CPU): HF generate and its fast paths against fastspec.

Pairs:
- synthetic: a random Llama target (default ~1.1B parameters: hidden 2048, 16 layers, 32 heads, 8 key/value
  heads, intermediate 8192, vocabulary 32000) whose layers past the first two have their output projections
  (o_proj, down_proj) scaled by epsilon, and a draft made of its first two layers with the same embeddings, final
  norm and lm_head (shared modules, no copy). The target computes everything, yet agrees with the draft as often
  as epsilon allows: epsilon "auto" is calibrated (bisection on log epsilon) until the draft's argmax agrees with
  the target's on `--acceptance` of the positions of a teacher-forced draft continuation. The acceptance the
  speculative rows then measure is reported beside it.
- shipped: `fastspec.pair.load_pair` (the trained pair) and the shipped draft head, held-out prompts.

Rows (batch 1, greedy, exactly --new-tokens tokens: EOS is switched off in both models' generation configs):
hf_eager (`generate`), hf_static_compile (`generate(cache_implementation="static")` with a `CompileConfig`: HF's
documented compiled path, CUDA graphs on CUDA), hf_assisted (`assistant_model=draft`, K draft tokens a step),
and fastspec autoregressive / chain K / chain auto K / prompt lookup (n = 3) / draft-head chain K (EAGLE-style,
shipped pair only: no head is trained for the synthetic target), each eager and with compile=True.
Each row is warmed up untimed first (twice for compiled rows: Triton and torch.compile compile there), then timed
`--repeats` times; tokens/s is the median. Every run's output is compared with hf_eager's: "first mismatch" is the
index of the first new token that differs (None: all equal). In bf16 a K+1-token forward rounds differently from a
1-token forward, so lossless speculation can leave the greedy path of HF's 1-token decoding; fp32 should not.
A compile during a timed run (`fastspec.benchmarks.CompileCounter`) is flagged in the row's note. Timing,
synchronisation and the environment record are the harness's (`fastspec.benchmarks`).

Writes e2e.json and e2e.md into --out after every row, so a run stopped by its time budget, a timeout or SIGTERM
keeps what it measured; --budget stops starting rows once the time is spent.

    python bench/gpu_e2e.py --out $OUT --budget 200                 # on the GPU
    python bench/gpu_e2e.py --device cpu --tiny --out /tmp/e2e      # CPU smoke run (eager rows)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shlex
import signal
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM

import fastspec
from fastspec.benchmarks import CompileCounter, environment, measure, synchronize

EAGER_ROWS = ("hf_eager", "hf_assisted", "fs_autoregressive", "fs_chain", "fs_chain_auto", "fs_lookup", "fs_head_chain")
COMPILED_ROWS = (
    "fs_chain_compile",
    "hf_static_compile",
    "fs_head_chain_compile",
    "fs_chain_auto_compile",
    "fs_autoregressive_compile",
    "fs_lookup_compile",
)  # fmt: skip (the rows of the issue's goal first: compiling is slow)
ROWS = EAGER_ROWS + COMPILED_ROWS
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SYNTHETIC = dict(vocab=32000, hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192)
TINY = dict(vocab=256, hidden=64, layers=4, heads=4, kv_heads=2, intermediate=128)


class Stop(Exception):
    """SIGTERM (e.g. `timeout`): stop measuring, write what was measured."""


def _on_sigterm(signum, frame):
    raise Stop(f"signal {signum}")


# ---------------------------------------------------------------------------------------------------- models


def synthetic_pair(size: dict, dtype: torch.dtype, device: str, seed: int = 0, draft_layers: int = 2):
    """(target, draft): a random Llama and its first `draft_layers` layers (shared modules) as the draft. The
    lm_head is scaled x4 so next-token distributions are peaked (argmax margins well above bf16 rounding)."""
    config = LlamaConfig(
        vocab_size=size["vocab"], hidden_size=size["hidden"], intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"], num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"],
        max_position_embeddings=4096, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(seed)
    with torch.device(device):
        target = LlamaForCausalLM(config).to(dtype).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(4.0)
    draft_config = copy.deepcopy(config)
    draft_config.num_hidden_layers = draft_layers
    if getattr(draft_config, "layer_types", None):  # transformers 5 lists each layer's attention type
        draft_config.layer_types = draft_config.layer_types[:draft_layers]
    with torch.device("meta"):
        draft = LlamaForCausalLM(draft_config)
    draft.model.embed_tokens = target.model.embed_tokens
    draft.model.layers = torch.nn.ModuleList(target.model.layers[:draft_layers])
    draft.model.norm = target.model.norm
    draft.model.rotary_emb = target.model.rotary_emb
    draft.lm_head = target.lm_head
    draft.eval()
    left = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.device.type == "meta"]
    if left:
        raise RuntimeError(f"synthetic draft: {left} not shared from the target")
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target, draft


class ScaledTail:
    """The output projections of the target's layers past the draft's, scaled to `epsilon` (in place)."""

    def __init__(self, target, draft_layers: int = 2):
        self.weights = [w for layer in target.model.layers[draft_layers:]
                        for w in (layer.self_attn.o_proj.weight, layer.mlp.down_proj.weight)]  # fmt: skip
        self.epsilon = 1.0

    @torch.no_grad()
    def set(self, epsilon: float) -> None:
        for w in self.weights:
            w.mul_(epsilon / self.epsilon)
        self.epsilon = epsilon


@torch.no_grad()
def agreement(target, seq: torch.Tensor, draft_argmax: torch.Tensor, prompt_len: int) -> float:
    """Share of the positions of `seq` past the prompt where the target's argmax is `draft_argmax`."""
    return float((target(seq).logits[:, prompt_len - 1 : -1].argmax(-1) == draft_argmax).float().mean())


@torch.no_grad()
def calibrate(target, draft, tail: ScaledTail, ids, want: float | None, new: int, probes: int = 10):
    """(epsilon, agreement): with `want`, bisect log epsilon in [1e-4, 1] for a draft/target argmax agreement ~
    `want` on a greedy draft continuation of `ids` (epsilon left set); else measure it at the current epsilon."""
    seq = draft.generate(ids, do_sample=False, max_new_tokens=new, pad_token_id=0)
    draft_argmax = draft(seq).logits[:, ids.shape[1] - 1 : -1].argmax(-1)
    if want is None:
        return tail.epsilon, agreement(target, seq, draft_argmax, ids.shape[1])
    lo, hi = math.log(1e-4), 0.0  # agreement falls as epsilon grows
    best = None
    for _ in range(probes):
        mid = (lo + hi) / 2
        tail.set(math.exp(mid))
        a = agreement(target, seq, draft_argmax, ids.shape[1])
        if best is None or abs(a - want) < abs(best[1] - want):
            best = (tail.epsilon, a)
        if abs(a - want) < 0.02:
            break
        lo, hi = (mid, hi) if a > want else (lo, mid)
    tail.set(best[0])
    return best


# ------------------------------------------------------------------------------------------------------ rows


def _methods(target, draft, head, new: int, k: int, device: str) -> dict:
    """name -> fn(ids) -> (sequences, SpecStats | None); the head rows only with a draft `head`."""
    common = dict(do_sample=False, max_new_tokens=new)

    def hf(**extra):
        return lambda ids: (target.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, **common,
                                            **extra), None)  # fmt: skip

    def fs(compiled, **extra):
        return lambda ids: fastspec.generate(target, ids, return_stats=True, compile=compiled, **common, **extra)

    compile_config = CompileConfig()  # HF's default: mode "reduce-overhead" (CUDA graphs on CUDA)
    if not device.startswith("cuda"):
        compile_config = CompileConfig(mode="default")
        compile_config._compile_all_devices = True  # HF's own switch to compile off CUDA (tests use it)
    methods = {
        "hf_eager": hf(),
        "hf_static_compile": hf(cache_implementation="static", compile_config=compile_config),
        "hf_assisted": hf(assistant_model=draft),
    }
    for suffix, compiled in (("", False), ("_compile", True)):
        methods["fs_autoregressive" + suffix] = fs(compiled)
        methods["fs_chain" + suffix] = fs(compiled, draft=draft, num_draft_tokens=k)
        methods["fs_chain_auto" + suffix] = fs(compiled, draft=draft, num_draft_tokens="auto")
        methods["fs_lookup" + suffix] = fs(compiled, prompt_lookup=3, num_draft_tokens=k)
        if head is not None:
            methods["fs_head_chain" + suffix] = fs(compiled, draft=head, num_draft_tokens=k)
    return methods


def _first_mismatch(seq: torch.Tensor, ref: torch.Tensor, prompt_len: int) -> int | None:
    """Index of the first new token where `seq` differs from `ref` (None: equal)."""
    a, b = seq[0, prompt_len:].tolist(), ref[0, prompt_len:].tolist()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_row(name: str, fn, ids, device: str, repeats: int, warmups: int, reference, compiles: CompileCounter) -> dict:
    row = dict(method=name)
    start = time.perf_counter()
    for _ in range(warmups):
        fn(ids)
    synchronize(device)
    row["warmup_s"] = time.perf_counter() - start
    compiles_before = compiles.count
    seconds, stats, outputs = [], [], []
    for _ in range(repeats):
        run = measure(lambda: fn(ids), device)
        seconds.append(run.seconds)
        seq, st = run.result
        outputs.append(seq)
        stats.append(st)
    new = outputs[0].shape[1] - ids.shape[1]
    row["new_tokens"] = new
    row["tokens_per_s"] = new / statistics.median(seconds)
    row["seconds"] = seconds
    ref = outputs[0] if reference is None else reference
    row["first_mismatch"] = [_first_mismatch(seq, ref, ids.shape[1]) for seq in outputs]
    spec = [st for st in stats if st is not None and st.drafted]
    if spec:
        row["acceptance"] = sum(st.accepted for st in spec) / sum(st.drafted for st in spec)
        row["tokens_per_step"] = statistics.mean(st.mean_accepted_length for st in spec)
    if compiles.count > compiles_before:
        row["note"] = f"{compiles.count - compiles_before} compile(s) during the timed runs"
    row["_output"] = outputs[0]
    return row


class Pair:
    """One target/draft pair, its prompt and methods, and the rows measured so far (`result["pairs"]` entry)."""

    def __init__(self, name: str, info: dict, target, draft, ids: torch.Tensor, args, head=None):
        self.target, self.draft, self.ids = target, draft, ids
        self.methods = _methods(target, draft, head, args.new_tokens, args.k, args.device)
        draft.generation_config.num_assistant_tokens = args.k  # HF assisted: K draft tokens a step, as fs_chain
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        self.entry = dict(name=name, info=info, rows=[])
        self.reference = self.base_time = None  # hf_eager's output and seconds per run


def run_rows(pair: Pair, names, args, result: dict, write, deadline: float, compiles: CompileCounter) -> None:
    """The rows `names` of one pair, in order, into its entry; a row that would not fit the budget is skipped."""
    rows = pair.entry["rows"]
    for name in names:
        if name not in pair.methods:
            rows.append(dict(method=name, skipped="no draft head for this pair"))
            continue
        left = deadline - time.monotonic()
        compiled = name in COMPILED_ROWS
        need = (args.compile_reserve if compiled else 0) + (args.repeats + 2) * (pair.base_time or 0)
        if left < need or left <= 0:
            rows.append(dict(method=name, skipped=f"time budget ({left:.0f} s left, ~{need:.0f} s needed)"))
            write(result)
            continue
        try:
            row = run_row(name, pair.methods[name], pair.ids, args.device, args.repeats, 2 if compiled else 1,
                          pair.reference, compiles)  # fmt: skip
        except Stop:
            rows.append(dict(method=name, error="stopped (SIGTERM / timeout) during this row"))
            write(result)
            raise
        except Exception as exc:  # noqa: BLE001 - a method that fails (e.g. a compile error) is reported
            lines = str(exc).strip().splitlines()
            row = dict(method=name, error=f"{type(exc).__name__}: {lines[0][:300] if lines else ''}")
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
        output = row.pop("_output", None)
        if name == "hf_eager" and output is not None:
            pair.reference, pair.base_time = output, args.new_tokens / row["tokens_per_s"]
        rows.append(row)
        _ratios(pair.entry)
        write(result)


def _ratios(pair: dict) -> None:
    rates = {r["method"]: r.get("tokens_per_s") for r in pair["rows"]}
    for r in pair["rows"]:
        for base in ("hf_eager", "hf_static_compile"):
            if r.get("tokens_per_s") and rates.get(base):
                r[f"x_{base}"] = r["tokens_per_s"] / rates[base]


# ---------------------------------------------------------------------------------------------------- output


def _fmt(value, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def markdown(result: dict) -> str:
    runs = f"{result['new_tokens']} new tokens, median of {result['repeats']} runs after warm-up"
    lines = ["## End-to-end decoding (batch 1, greedy)", "", f"`{result['command']}`", ""]
    lines += [f"- {key}: {value}" for key, value in result["environment"].items()] + [f"- {runs}"]
    lines += [f"- {note}" for note in result["notes"]]
    for pair in result["pairs"]:
        lines += ["", f"### {pair['name']}", "", *[f"- {k}: {v}" for k, v in pair["info"].items()], ""]
        lines += [
            "| method | tok/s | × HF eager | × HF static+compile | acceptance | tokens/step | first mismatch vs HF "
            "| warm-up s | note |",
            "|---|---:|---:|---:|---:|---:|---|---:|---|",
        ]
        for r in pair["rows"]:
            note = r.get("skipped") or r.get("error") or r.get("note") or ""
            lines.append(
                f"| {r['method']} | {_fmt(r.get('tokens_per_s'), '.1f')} | {_fmt(r.get('x_hf_eager'))} "
                f"| {_fmt(r.get('x_hf_static_compile'))} | {_fmt(r.get('acceptance'), '.3f')} "
                f"| {_fmt(r.get('tokens_per_step'))} | {r.get('first_mismatch', '–')} "
                f"| {_fmt(r.get('warmup_s'), '.1f')} | {note} |"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ main


def synthetic(args) -> Pair:
    size = TINY if args.tiny else SYNTHETIC
    start = time.perf_counter()
    target, draft = synthetic_pair(size, DTYPES[args.dtype], args.device)
    params = sum(p.numel() for p in target.parameters())
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, size["vocab"], (1, args.prompt_tokens), generator=gen).to(args.device)
    tail = ScaledTail(target)
    if args.epsilon != "auto":
        tail.set(float(args.epsilon))
    want = args.acceptance if args.epsilon == "auto" else None
    epsilon, agree = calibrate(target, draft, tail, ids, want, min(args.new_tokens, 64))
    info = dict(model=f"random Llama {size}, {params / 1e9:.2f}B parameters, {args.dtype}",
                draft="its first 2 layers (shared embeddings, norm, lm_head)",
                epsilon=f"{epsilon:.3g} (draft/target argmax agreement {agree:.2f} on a teacher-forced draft "
                        f"continuation; target {args.acceptance})",
                prompt=f"{args.prompt_tokens} random tokens", setup_s=f"{time.perf_counter() - start:.1f}")  # fmt: skip
    return Pair(f"synthetic {args.dtype}", info, target, draft, ids, args)


def shipped(dtype_name: str, args) -> Pair:
    from fastspec.heads import load_head
    from fastspec.pair import load_pair
    from fastspec.prompts import PROMPT_SETS

    tokenizer, target, draft = load_pair(dtype=DTYPES[dtype_name], device=args.device)
    head = load_head(None, target)
    for model in (target, draft):
        model.generation_config.eos_token_id = None  # exactly --new-tokens tokens for every method
        model.generation_config.pad_token_id = model.generation_config.pad_token_id or 0
    prompt = PROMPT_SETS["heldout"](tokenizer, 1, args.prompt_tokens)[0]
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(args.device)
    params = sum(p.numel() for p in target.parameters()) / 1e6
    info = dict(model=f"fastspec.pair target ({params:.1f}M parameters), draft and draft head, {dtype_name}",
                prompt=f"held-out prompt, {ids.shape[1]} tokens")  # fmt: skip
    return Pair(f"shipped {dtype_name}", info, target, draft, ids, args, head)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--pairs", nargs="+", choices=["synthetic", "shipped"], default=["synthetic", "shipped"])
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="synthetic pair dtype")
    parser.add_argument("--shipped-dtypes", nargs="+", choices=list(DTYPES), default=["fp32"])
    parser.add_argument("--rows", nargs="+", choices=ROWS, help=f"default: all ({', '.join(ROWS)})")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--k", type=int, default=4, help="draft tokens a step (fs_chain, fs_lookup, hf_assisted)")
    parser.add_argument("--epsilon", default="auto", help="synthetic tail scale, or 'auto' (calibrated)")
    parser.add_argument("--acceptance", type=float, default=0.7, help="agreement 'auto' calibrates epsilon to")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds; no row starts after they are spent")
    parser.add_argument("--compile-reserve", type=float, help="seconds a compiled row needs (default 60 GPU, 150 CPU)")
    parser.add_argument("--tiny", action="store_true", help="tiny synthetic pair, 16 new tokens, 1 run, eager rows")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--out", default="bench/out", help="folder for e2e.json and e2e.md")
    args = parser.parse_args(argv)
    command = "python bench/gpu_e2e.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_e2e: --device cuda but CUDA is not available (use --device cpu)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.tiny:
        args.new_tokens, args.repeats, args.prompt_tokens = min(args.new_tokens, 16), 1, min(args.prompt_tokens, 16)
        args.dtype = "fp32" if not args.device.startswith("cuda") else args.dtype
        args.rows = args.rows or list(EAGER_ROWS)
    args.rows = args.rows or list(ROWS)
    if args.compile_reserve is None:
        args.compile_reserve = 60.0 if args.device.startswith("cuda") else 150.0
    deadline = time.monotonic() + args.budget
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = dict(command=command, environment=environment(args.device), new_tokens=args.new_tokens,
                  repeats=args.repeats, notes=[], pairs=[])  # fmt: skip

    def write(res: dict) -> None:
        (out / "e2e.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
        (out / "e2e.md").write_text(markdown(res) + "\n")

    compiles = CompileCounter()
    signal.signal(signal.SIGTERM, _on_sigterm)
    builders = [("synthetic", lambda: synthetic(args))] if "synthetic" in args.pairs else []
    if "shipped" in args.pairs:
        builders += [(f"shipped {d}", lambda d=d: shipped(d, args)) for d in args.shipped_dtypes]
    status, pairs = 0, []
    try:
        for name, build in builders:
            try:
                pair = build()
            except Stop:
                raise
            except Exception as exc:  # noqa: BLE001 - a pair that cannot be built (e.g. out of memory) is reported
                lines = str(exc).strip().splitlines()
                result["notes"].append(f"{name}: {type(exc).__name__}: {lines[0][:300] if lines else ''}")
                status = 1
                continue
            pairs.append(pair)
            result["pairs"].append(pair.entry)
            write(result)
        # eager rows of every pair first, then the compiled ones (each compile costs tens of seconds)
        for phase in (EAGER_ROWS, COMPILED_ROWS):
            for pair in pairs:
                run_rows(pair, [r for r in phase if r in args.rows], args, result, write, deadline, compiles)
    except Stop as stop:
        result["notes"].append(f"stopped by {stop} before finishing")
        status = 124
    finally:
        write(result)
    print(markdown(result))
    return status


if __name__ == "__main__":
    sys.exit(main())
