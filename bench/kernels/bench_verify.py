"""Microbenchmark of chain verification: the fused Triton kernel against three eager baselines.

Methods, all given the same target logits [B, K+1, V], draft tokens and draft distribution:
- triton: `fastspec.kernels.verify_chain` (two launches; CUDA only, the CPU interpreter is not a benchmark);
- reference: `fastspec.kernels.reference.verify_chain`, the eager PyTorch oracle;
- compile: `torch.compile` of the reference (CUDA only; compile time excluded by the warm-up);
- hf: transformers' own eager verification, step 2.3 + 3 of `_assisted_decoding`: the fp32 cast of the target
  logits, then `transformers.generation.utils._speculative_sampling` on the draft logits (it softmaxes both).
  It supports batch 1 only, so B > 1 is timed as a Python loop over the rows (as a batch-1 server would run it).

Times are medians of `triton.testing.do_bench` (CUDA, L2 flushed before every run, so the GPU is still busy
flushing while the host enqueues the call: device time) or of `time.perf_counter` (CPU), in microseconds. On CUDA
`wall` is the per-call latency of 30 back-to-back calls and one synchronisation (host launch overhead included).
GB/s counts the minimum bytes, target logits and draft probs each read once, over the triton device time; % copy
compares that with a measured device copy of the same bytes ((read + write) / time).

    python bench/kernels/bench_verify.py                       # full grid (GPU); a small subset on CPU
    python bench/kernels/bench_verify.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
import triton
import triton.testing
from transformers.generation.utils import _speculative_sampling

from fastspec.kernels import reference
from fastspec.kernels.verify_chain import verify_chain

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHODS = ("triton", "reference", "compile", "hf")
CPU_SUBSET = dict(batch=[1, 8], k=[1, 4], vocab=[32000], dtype=["fp32"])
QUICK = dict(batch=[1, 8], k=[4], vocab=[128256], dtype=["fp32", "bf16"])


def _time_us(fn, device: torch.device, cpu_budget_s: float = 0.5) -> tuple[float, float, float]:
    """(median, p20, p80) in microseconds."""
    if device.type == "cuda":
        med, p20, p80 = triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])
        return med * 1e3, p20 * 1e3, p80 * 1e3
    fn()  # warm-up
    times, end = [], time.perf_counter() + cpu_budget_s
    while len(times) < 5 or (time.perf_counter() < end and len(times) < 100):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e6)
    q = statistics.quantiles(times, n=5)
    return statistics.median(times), q[0], q[-1]


def _wall_us(fn, device: torch.device, calls: int = 30) -> float:
    """Back-to-back calls, then one synchronisation: the per-call latency a decoding loop sees (host included)."""
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / calls * 1e6


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


_HF_PARAMS = inspect.signature(_speculative_sampling).parameters  # older versions take `is_done_candidate`


def _hf_verify(logits: torch.Tensor, draft_tokens: torch.Tensor, draft_logits: torch.Tensor) -> None:
    """HF's eager verification, one batch-1 call per row (the only batch size `_assisted_decoding` accepts)."""
    extra = {"is_done_candidate": False} if "is_done_candidate" in _HF_PARAMS else {}
    k = draft_tokens.shape[1]
    for b in range(logits.shape[0]):
        new_logits = logits[b : b + 1].to(torch.float32)  # `.to(float32)` of outputs.logits, as HF does
        _speculative_sampling(draft_tokens[b : b + 1], draft_logits[b : b + 1], k, new_logits, **extra)


def _inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, device: torch.device, one_hot: bool):
    g = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(batch, k + 1, vocab, device=device, generator=g) * 3).to(dtype)
    draft_logits = (torch.randn(batch, k, vocab, device=device, generator=g) * 3).to(dtype)
    draft_probs = torch.softmax(draft_logits.float(), -1)
    tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
    uniforms, noise = reference.draw_randomness(batch, k, vocab, 1, device)
    return logits, tokens, None if one_hot else draft_probs.to(dtype), draft_logits, uniforms, noise


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(args: argparse.Namespace, on_row=None) -> dict:
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    methods = [m for m in args.methods if on_gpu or m in ("reference", "hf")]
    grid = dict(batch=args.batch, k=args.k, vocab=args.vocab, dtype=args.dtype)
    notes = []
    if not on_gpu:
        grid = {key: [v for v in values if v in CPU_SUBSET[key]] or CPU_SUBSET[key][:1] for key, values in grid.items()}
        notes.append(
            "CPU: the Triton kernels need CUDA and torch.compile is skipped; only the eager reference and HF are "
            f"timed, on a small subset (B {grid['batch']}, K {grid['k']}, V {grid['vocab']}, {grid['dtype']})"
        )
    if "hf" in methods:
        notes.append("hf: transformers' _speculative_sampling supports batch 1 only; B > 1 is a Python loop over rows")
    filters = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    if "hf" in methods and (args.top_k or args.top_p or args.temperature != 1.0):
        notes.append("hf: timed without logits processors (no temperature/top-k/top-p), as a lower bound")
    compiled = torch.compile(reference.verify_chain, dynamic=True) if "compile" in methods else None

    result = dict(
        command=args.command,
        device=torch.cuda.get_device_name(device) if on_gpu else f"cpu ({platform.processor() or platform.machine()})",
        commit=_git_commit(),
        versions=dict(torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__),
        cpu_threads=torch.get_num_threads(),
        draft="one-hot" if args.one_hot else "probs",
        filters=filters,
        notes=notes,
        rows=[],
    )
    for dtype_name in grid["dtype"]:
        for vocab in grid["vocab"]:
            for batch in grid["batch"]:
                for k in grid["k"]:
                    row = _bench_one(batch, k, vocab, dtype_name, device, methods, filters, compiled, args)
                    result["rows"].append(row)
                    print(_row_line(row), file=sys.stderr, flush=True)
                    if on_row is not None:
                        on_row(result)
    return result


def _bench_one(batch, k, vocab, dtype_name, device, methods, filters, compiled, args) -> dict:
    dtype = DTYPES[dtype_name]
    logits, tokens, probs, draft_logits, uniforms, noise = _inputs(batch, k, vocab, dtype, device, args.one_hot)
    min_bytes = logits.numel() * logits.element_size() + (0 if probs is None else probs.numel() * probs.element_size())
    calls = {
        "triton": lambda: verify_chain(logits, tokens, probs, uniforms=uniforms, noise=noise, **filters),
        "reference": lambda: reference.verify_chain(logits, tokens, probs, uniforms=uniforms, noise=noise, **filters),
        "compile": lambda: compiled(logits, tokens, probs, uniforms=uniforms, noise=noise, **filters),
        "hf": lambda: _hf_verify(logits, tokens, draft_logits),
    }
    row = dict(batch=batch, k=k, vocab=vocab, dtype=dtype_name, min_bytes=min_bytes, us={}, p20={}, p80={})
    for method in methods:
        try:
            row["us"][method], row["p20"][method], row["p80"][method] = _time_us(calls[method], device)
        except Exception as exc:  # a baseline that fails (e.g. torch.compile) is reported, not fatal
            row["us"][method] = None
            row.setdefault("errors", {})[method] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    if "triton" in methods and row["us"].get("triton"):
        row["wall_us"] = {m: _wall_us(calls[m], device) for m in methods if row["us"].get(m)}
        out, n = calls["triton"]()
        ref_out, ref_n = calls["reference"]()
        row["exact"] = bool((out == ref_out).all() and (n == ref_n).all())
        row["gbps"] = min_bytes / (row["us"]["triton"] * 1e-6) / 1e9
        src = torch.empty(min_bytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        row["copy_gbps"] = 2 * min_bytes / (_time_us(lambda: dst.copy_(src), device)[0] * 1e-6) / 1e9  # read + write
        for base in ("reference", "compile", "hf"):
            if row["us"].get(base):
                row[f"x_{base}"] = row["us"][base] / row["us"]["triton"]
    return row


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _row_line(row: dict) -> str:
    times = ", ".join(f"{m} {_fmt(t, '.1f')} us" for m, t in row["us"].items())
    return f"B={row['batch']} K={row['k']} V={row['vocab']} {row['dtype']}: {times}"


def markdown(result: dict) -> str:
    lines = [
        "## Chain verification microbenchmark",
        "",
        f"`{result['command']}`",
        "",
        f"device: {result['device']}; commit {result['commit']}; "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        + f"; draft {result['draft']}; {result['filters']}",
        "",
        *[f"- {note}" for note in result["notes"]],
        "",
        "| B | K | V | dtype | triton µs | triton wall µs | reference µs | compile µs | HF µs | × ref | × compile "
        "| × HF | GB/s | copy GB/s | % copy | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        us = r["us"]
        pct = 100 * r["gbps"] / r["copy_gbps"] if r.get("gbps") else None
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['vocab']} | {r['dtype']} | {_fmt(us.get('triton'), '.1f')} "
            f"| {_fmt(r.get('wall_us', {}).get('triton'), '.1f')} "
            f"| {_fmt(us.get('reference'), '.1f')} | {_fmt(us.get('compile'), '.1f')} | {_fmt(us.get('hf'), '.1f')} "
            f"| {_fmt(r.get('x_reference'), '.1f')} | {_fmt(r.get('x_compile'), '.1f')} | {_fmt(r.get('x_hf'), '.1f')} "
            f"| {_fmt(r.get('gbps'), '.0f')} | {_fmt(r.get('copy_gbps'), '.0f')} | {_fmt(pct, '.0f')} "
            f"| {_fmt(r.get('exact'), '')} |"
        )
    errors = [f"- B={r['batch']} K={r['k']} V={r['vocab']} {r['dtype']} {m}: {e}" for r in result["rows"]
              for m, e in r.get("errors", {}).items()]  # fmt: skip
    return "\n".join(lines + (["", "Errors:", *errors] if errors else []))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256, 151936])
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--one-hot", action="store_true", help="draft_probs=None (greedy / n-gram draft)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--quick", action="store_true", help=f"a small subset: {QUICK}")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, help="torch CPU threads (CPU timings on a busy machine: try 1)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args(argv)
    args.command = "python bench/kernels/bench_verify.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.batch, args.k, args.vocab, args.dtype = QUICK["batch"], QUICK["k"], QUICK["vocab"], QUICK["dtype"]
    print(f"# {args.command}", flush=True)

    def write(result: dict) -> None:  # after every row, so a run cut short by a timeout keeps what it measured
        for path, text in ((args.json, json.dumps(result, indent=2)), (args.markdown, markdown(result))):
            if path:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(text + "\n")

    result = run(args, on_row=write)
    write(result)
    print(markdown(result))


if __name__ == "__main__":
    main()
