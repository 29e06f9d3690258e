"""Microbenchmark of chain verification: host time and device time apart, for the Triton path and its baselines.

Methods, all given the same target logits [B, K+1, V], draft tokens and (mode "probs") draft distribution:
- lean: a `fastspec.kernels.verify_chain.ChainVerifier` built once for the shape, writing into preallocated
  outputs (`out=`): the host path a CUDA-graph-free decoding loop would use;
- triton: `fastspec.kernels.verify_chain` itself (checks, conversions, new outputs, then the cached verifier);
- reference: `fastspec.kernels.reference.verify_chain`, the eager PyTorch oracle;
- compile: `torch.compile` of the reference (compile time excluded by the warm-up);
- hf: transformers' own eager verification, as `_assisted_decoding` runs it: the fp32 cast of the target logits,
  then `_speculative_sampling` on the draft logits (mode "probs"), or the greedy argmax comparison (mode
  "greedy"). It supports batch 1 only, so B > 1 is a Python loop over the rows (as a batch-1 server would run it).

Modes: "probs" (temperature 1, tokens sampled from draft probabilities), "greedy" (temperature 0, a one-hot draft
equal to the target argmax half the time), "onehot" (temperature 1, one-hot draft: n-gram lookup).

Columns, in microseconds per call (medians):
- host: N back-to-back calls, one synchronisation at the end, divided by N: the latency a decoding loop sees;
- enqueue: N calls without any synchronisation, divided by N: the host's own cost (equal to host when the host is
  the bottleneck, smaller when it waits for the device);
- device: M calls captured in one `torch.cuda.CUDAGraph`, the replay timed with CUDA events, divided by M (no host
  in it). The calls rotate over enough copies of the inputs to exceed the L2 cache three times, so the timing
  reads memory, not L2. A method that cannot be captured (a host synchronisation) is timed by torch.profiler
  (sum of its kernels' device time) instead; `how` says which;
- floor: the bytes the call must read (target logits, draft probs, noise; each once) at the bandwidth of a
  device-to-device copy measured the same way (a copy moves each byte twice: read and write); % bw = floor /
  device, GB/s = bytes / device.
`exact` compares lean and triton with the reference, token for token.

On CPU only the reference and HF are timed (host times; no device columns), plus lean and triton when
TRITON_INTERPRET=1 is set (the interpreter: a smoke test of the host path, not a benchmark).

    python bench/kernels/bench_verify.py --grid small --json out.json --markdown out.md   # GPU suite
    python bench/kernels/bench_verify.py --grid full
    TRITON_INTERPRET=1 python bench/kernels/bench_verify.py --device cpu --grid tiny       # CPU smoke test
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers.generation.utils import _speculative_sampling

from fastspec.kernels import reference

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
METHODS = ("lean", "triton", "reference", "compile", "hf")
MODES = ("probs", "greedy", "onehot")
L2_BYTES = 60 * 2**20  # H200 (50 MB on an H100): rotate inputs over >= 3x this
# (B, K, V, dtype, mode) rows; "full" is the product of FULL_AXES (mode probs) plus greedy at K = 4
SMALL = [
    *[(b, k, 128256, d, "probs") for d in ("fp32", "bf16") for b, k in ((1, 4), (8, 4), (32, 8))],
    (8, 4, 32000, "fp32", "probs"),
    *[(b, 4, 128256, d, "greedy") for d in ("fp32", "bf16") for b in (1, 8)],
]
TINY = [(2, 2, 500, "fp32", "probs"), (2, 3, 300, "fp32", "greedy"), (3, 2, 400, "bf16", "onehot")]
FULL_AXES = dict(batch=[1, 8, 32], k=[1, 4, 8], vocab=[32000, 128256, 151936], dtype=["fp32", "bf16"])


def _grid(args) -> list[tuple]:
    if args.batch or args.k or args.vocab or args.dtype:  # an explicit grid
        axes = [args.batch or [8], args.k or [4], args.vocab or [128256], args.dtype or ["fp32"], args.modes]
        return list(itertools.product(*axes))
    if args.grid == "full":
        axes = FULL_AXES
        rows = [(*r, "probs") for r in itertools.product(axes["batch"], axes["k"], axes["vocab"], axes["dtype"])]
        return rows + [(b, 4, v, d, "greedy") for d in axes["dtype"] for v in axes["vocab"] for b in axes["batch"]]
    return {"small": SMALL, "tiny": TINY}[args.grid]


# ---------------------------------------------------------------------------------------------------- inputs


def _inputs(batch, k, vocab, dtype, mode, device, copies: int) -> list[dict]:
    """`copies` input sets (copies of one draw, on distinct memory) for one shape and mode."""
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = (torch.randn(batch, k + 1, vocab, generator=g) * 3).to(dtype)
    draft_logits = (torch.randn(batch, k, vocab, generator=g) * 3).to(dtype)
    if mode == "probs":
        probs = torch.softmax(draft_logits.float(), -1)
        tokens = torch.multinomial(probs.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
        probs = probs.to(dtype)
    else:  # one-hot: the target argmax half the time
        probs = None
        argmax = logits[:, :k].float().argmax(-1)
        tokens = torch.where(torch.rand(batch, k, generator=g) < 0.5, argmax, torch.randint(0, vocab, (batch, k)))
    uniforms, noise = reference.draw_randomness(batch, k, vocab, 1, "cpu")
    shared = dict(uniforms=uniforms.to(device), noise=noise.to(device), temperature=0.0 if mode == "greedy" else 1.0)
    base = dict(logits=logits.to(device), tokens=tokens.to(device), probs=None if probs is None else probs.to(device))
    base["draft_logits"] = draft_logits.to(device)
    sets = [base] + [{n: None if t is None else t.clone() for n, t in base.items()} for _ in range(copies - 1)]
    return [dict(s, **shared) for s in sets]


def read_bytes(batch: int, k: int, vocab: int, dtype: torch.dtype, mode: str) -> int:
    """What a call must read: target logits and draft probs once, and the fp32 noise row of sampled rows."""
    size = torch.finfo(dtype).bits // 8
    return batch * vocab * ((k + 1) * size + (k * size if mode == "probs" else 0) + (4 if mode != "greedy" else 0))


# --------------------------------------------------------------------------------------------------- methods

_HF_PARAMS = inspect.signature(_speculative_sampling).parameters  # older versions take `is_done_candidate`


def _hf_verify(x: dict) -> None:
    """HF's eager verification, one batch-1 call per row (the only batch size `_assisted_decoding` accepts)."""
    tokens = x["tokens"]
    k = tokens.shape[1]
    for b in range(tokens.shape[0]):
        new_logits = x["logits"][b : b + 1].to(torch.float32)  # `.to(float32)` of outputs.logits, as HF does
        if x["temperature"] > 0:
            extra = {"is_done_candidate": False} if "is_done_candidate" in _HF_PARAMS else {}
            _speculative_sampling(tokens[b : b + 1], x["draft_logits"][b : b + 1], k, new_logits, **extra)
        else:  # `_assisted_decoding`'s greedy branch
            selected = new_logits.argmax(dim=-1)
            n_matches = ((~(tokens[b : b + 1] == selected[:, :-1])).cumsum(dim=-1) < 1).sum()
            _ = selected[:, : int(n_matches) + 1]


def _methods(names, device, x0: dict) -> dict:
    """name -> fn(x) for one shape; lean writes into outputs preallocated here."""
    from fastspec.kernels.verify_chain import ChainVerifier, verify_chain

    def args(x):
        return dict(uniforms=x["uniforms"], noise=x["noise"], temperature=x["temperature"])

    fns = {}
    for name in names:
        if name == "lean":
            batch, k = x0["tokens"].shape
            vocab, probs = x0["logits"].shape[-1], x0["probs"]
            verifier = ChainVerifier(batch, k, vocab, dtype=x0["logits"].dtype, device=device,
                                     draft_probs=False if probs is None else probs.dtype,
                                     temperature=x0["temperature"])  # fmt: skip
            out = verifier.new_outputs()
            fns[name] = lambda x, v=verifier, out=out: v(x["logits"], x["tokens"], x["probs"], **args(x), out=out)
        elif name == "triton":
            fns[name] = lambda x: verify_chain(x["logits"], x["tokens"], x["probs"], **args(x))
        elif name == "reference":
            fns[name] = lambda x: reference.verify_chain(x["logits"], x["tokens"], x["probs"], **args(x))
        elif name == "compile":
            compiled = torch.compile(reference.verify_chain, dynamic=False)
            fns[name] = lambda x, c=compiled: c(x["logits"], x["tokens"], x["probs"], **args(x))
        elif name == "hf":
            fns[name] = _hf_verify
    return fns


# ---------------------------------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _calls_for(fn, device, budget_s: float, lo: int, hi: int = 200) -> int:
    """How many calls fit `budget_s`, from one timed call (after the warm-up)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return max(lo, min(hi, int(budget_s / max(time.perf_counter() - start, 1e-7))))


def host_times(fn, device, calls: int, repeats: int) -> tuple[float, float]:
    """(host, enqueue) microseconds per call, medians over `repeats` rounds of `calls` back-to-back calls."""
    host, enqueue = [], []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        queued = time.perf_counter()
        _sync(device)
        done = time.perf_counter()
        host.append((done - start) / calls * 1e6)
        enqueue.append((queued - start) / calls * 1e6)
    return statistics.median(host), statistics.median(enqueue)


def graph_device_us(fns: list, calls: int, replays: int = 7) -> float:
    """Device microseconds per call: `calls` calls (rotating over `fns`) captured in one CUDA graph, replays timed
    with CUDA events. Raises when a call cannot be captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture (compilation, caches keyed by stream)
        for fn in fns[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def profiler_device_us(fn, calls: int) -> float:
    """Device microseconds per call from torch.profiler: the summed duration of the CUDA kernels (and copies)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.events() if e.device_type == DeviceType.CUDA)
    if total <= 0:
        raise RuntimeError("the profiler recorded no CUDA kernels")
    return total / calls


def _error(exc: Exception) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200] if lines else ''}"


def events_device_us(fn, calls: int) -> float:
    """Microseconds per call between CUDA events around `calls` back-to-back calls: an upper bound of the device
    time (it includes the device's idle gaps when the host is slower)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / calls


CAPTURABLE = ("lean", "triton")  # the others synchronise with the host (HF's .item(), the reference's any())


def device_time(method: str, method_fns: list, calls: int) -> tuple[float | None, str, str | None]:
    """(microseconds, how, errors): graph replay for capturable methods, else the profiler's kernel time, else CUDA
    events around back-to-back calls (an upper bound, how = "events>=")."""
    timers = [("profiler", lambda: profiler_device_us(method_fns[0], min(calls, 20))),
              ("events>=", lambda: events_device_us(method_fns[0], calls))]  # fmt: skip
    if method in CAPTURABLE:
        timers.insert(0, ("graph", lambda: graph_device_us(method_fns, calls)))
    errors = []
    for how, timer in timers:
        try:
            return timer(), how, "; ".join(errors) or None
        except Exception as exc:  # noqa: BLE001 - a timer that does not work here is reported, the next one tried
            errors.append(f"{how}: {_error(exc)}")
            torch.cuda.synchronize()
    return None, "-", "; ".join(errors)


def copy_floor_us(read_bytes: int, device, calls: int = 20) -> float:
    """Microseconds a device-to-device copy needs per `read_bytes` bytes read (it also writes them), measured as
    `graph_device_us` measures the methods, rotating over enough buffers to exceed L2."""
    numel = max(read_bytes // 4, 1)
    copies = max(1, min(calls, math.ceil(3 * L2_BYTES / (4 * numel))))
    src = [torch.empty(numel, device=device) for _ in range(copies)]
    dst = [torch.empty(numel, device=device) for _ in range(copies)]
    fns = [lambda s=s, d=d: d.copy_(s) for s, d in zip(src, dst, strict=True)]
    return graph_device_us(fns, calls) * read_bytes / (2 * numel * 4)  # a copy of numel floats moves 8*numel bytes


# ------------------------------------------------------------------------------------------------------ runs


def _bench_shape(batch, k, vocab, dtype_name, mode, device, methods, args) -> list[dict]:
    on_gpu = device.type == "cuda"
    set_bytes = read_bytes(batch, k, vocab, DTYPES[dtype_name], mode)
    copies = max(1, min(args.graph_calls, math.ceil(3 * L2_BYTES / set_bytes))) if on_gpu else 1
    sets = _inputs(batch, k, vocab, DTYPES[dtype_name], mode, device, copies)
    x0 = sets[0]
    fns = _methods(methods, device, x0)
    want = reference.verify_chain(x0["logits"], x0["tokens"], x0["probs"], uniforms=x0["uniforms"],
                                  noise=x0["noise"], temperature=x0["temperature"])  # fmt: skip
    floor = copy_floor_us(set_bytes, device) if on_gpu else None
    rows = []
    for name, fn in fns.items():
        row = dict(batch=batch, k=k, vocab=vocab, dtype=dtype_name, mode=mode, method=name, read_bytes=set_bytes)
        try:
            got = fn(x0)  # warm-up: Triton compilation, torch.compile
            _sync(device)
            if name in ("lean", "triton"):
                row["exact"] = bool(torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]))
            calls = _calls_for(lambda fn=fn: fn(x0), device, args.budget_per_timing, args.min_calls)
            row["calls"] = calls
            row["host_us"], row["enqueue_us"] = host_times(lambda fn=fn: fn(x0), device, calls, args.repeats)
            if on_gpu:
                method_fns = [lambda fn=fn, x=x: fn(x) for x in sets]
                row["device_us"], row["device_how"], error = device_time(name, method_fns, args.graph_calls)
                if error:
                    row.setdefault("errors", []).append(error)
                if row["device_us"]:
                    row["floor_us"] = floor
                    row["bw_pct"] = 100 * floor / row["device_us"]
                    row["gbps"] = set_bytes / (row["device_us"] * 1e-6) / 1e9
        except Exception as exc:  # noqa: BLE001 - a method that fails (e.g. torch.compile) is reported, not fatal
            row.setdefault("errors", []).append(_error(exc))
            if on_gpu:
                torch.cuda.synchronize()
        rows.append(row)
    base = {r["mode"]: r for r in rows if r["method"] == "reference"}.get(mode)
    for r in rows:
        for col in ("host_us", "device_us"):
            if base and r.get(col) and base.get(col):
                r[f"x_ref_{col[:-3]}"] = base[col] / r[col]
    del sets, fns
    if on_gpu:
        torch.cuda.empty_cache()
    return rows


def _environment(device) -> dict:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).parent)  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                               cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
        commit = out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import triton

    return dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})",
        commit=commit, python=platform.python_version(), torch=torch.__version__, triton=triton.__version__,
        transformers=transformers.__version__, cpu_threads=torch.get_num_threads(),
        interpreter=os.environ.get("TRITON_INTERPRET") == "1",
    )  # fmt: skip


def run(args, on_row=None) -> dict:
    device = torch.device(args.device)
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_verify: --device cuda but CUDA is not available (use --device cpu)")
    methods = list(args.methods)
    notes = []
    if device.type != "cuda":
        dropped = [m for m in methods if m == "compile" or (m in ("lean", "triton") and not interpreted)]
        methods = [m for m in methods if m not in dropped]
        notes.append(f"CPU: host times only; not timed: {dropped or 'none'}"
                     + ("; lean/triton run in Triton's interpreter (a smoke test)" if interpreted else ""))  # fmt: skip
    if "hf" in methods:
        notes.append("hf: batch 1 only in transformers; B > 1 is a Python loop over the rows")
    result = dict(command=args.command, environment=_environment(device), notes=notes, rows=[])
    deadline = time.monotonic() + args.time_budget if args.time_budget else None
    for batch, k, vocab, dtype_name, mode in _grid(args):
        if deadline is not None and time.monotonic() > deadline:
            result["notes"].append(f"stopped at the time budget ({args.time_budget} s) before B={batch} K={k} "
                                   f"V={vocab} {dtype_name} {mode}")  # fmt: skip
            break
        try:
            rows = _bench_shape(batch, k, vocab, dtype_name, mode, device, methods, args)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: the shape is reported, the run goes on
            rows = [
                dict(batch=batch, k=k, vocab=vocab, dtype=dtype_name, mode=mode, method="all", errors=[_error(exc)])
            ]
            if device.type == "cuda":
                torch.cuda.empty_cache()
        result["rows"].extend(rows)
        for r in rows:
            print(_row_line(r), file=sys.stderr, flush=True)
        if on_row is not None:
            on_row(result)
    return result


# ---------------------------------------------------------------------------------------------------- output


def _fmt(value, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _row_line(r: dict) -> str:
    return (f"B={r['batch']} K={r['k']} V={r['vocab']} {r['dtype']} {r['mode']} {r['method']}: host "
            f"{_fmt(r.get('host_us'), '.1f')} us, enqueue {_fmt(r.get('enqueue_us'), '.1f')} us, device "
            f"{_fmt(r.get('device_us'), '.1f')} us ({r.get('device_how', '-')}), {_fmt(r.get('bw_pct'), '.0f')} % bw"
            + (f", errors: {r['errors']}" if r.get("errors") else ""))  # fmt: skip


def headline(result: dict) -> list[str]:
    """The issue's targets, where the rows measured them."""
    rows = {(r["batch"], r["k"], r["vocab"], r["dtype"], r["mode"], r["method"]): r for r in result["rows"]}
    lines = []
    for method in ("lean", "triton"):
        r = rows.get((8, 4, 128256, "fp32", "probs", method))
        if r and r.get("host_us"):
            device = _fmt(r.get("device_us"), ".1f")
            lines.append(f"B=8 K=4 V=128256 fp32 {method}: host {r['host_us']:.1f} us/call (target <= 20), enqueue "
                         f"{r['enqueue_us']:.1f} us, device {device} us (target <= 15)")  # fmt: skip
        r = rows.get((32, 8, 128256, "fp32", "probs", method)) or rows.get((32, 8, 128256, "bf16", "probs", method))
        if r and r.get("bw_pct"):
            lines.append(f"B=32 K=8 V=128256 {r['dtype']} {method}: device {r['device_us']:.1f} us = "
                         f"{r['bw_pct']:.0f} % of copy bandwidth (target >= 60)")  # fmt: skip
    return lines


def markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        "## Chain verification microbenchmark",
        "",
        f"`{result['command']}`",
        "",
        f"device: {env['device']}; commit {env['commit']}; python {env['python']}, torch {env['torch']}, triton "
        f"{env['triton']}, transformers {env['transformers']}; {env['cpu_threads']} CPU threads",
        "",
        *[f"- {note}" for note in result["notes"]],
        *[f"- {line}" for line in headline(result)],
        "",
        "µs per call: host = back-to-back calls and one sync; enqueue = without the sync; device = CUDA-graph "
        "replay (or profiler kernel time); floor = the bytes read at copy bandwidth.",
        "",
        "| B | K | V | dtype | mode | method | host µs | enqueue µs | device µs | how | floor µs | % bw | GB/s "
        "| × ref host | × ref device | exact |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['batch']} | {r['k']} | {r['vocab']} | {r['dtype']} | {r['mode']} | {r['method']} "
            f"| {_fmt(r.get('host_us'), '.1f')} | {_fmt(r.get('enqueue_us'), '.1f')} "
            f"| {_fmt(r.get('device_us'), '.1f')} | {r.get('device_how', '–')} | {_fmt(r.get('floor_us'), '.1f')} "
            f"| {_fmt(r.get('bw_pct'), '.0f')} | {_fmt(r.get('gbps'), '.0f')} | {_fmt(r.get('x_ref_host'), '.1f')} "
            f"| {_fmt(r.get('x_ref_device'), '.1f')} | {_fmt(r.get('exact'), '')} |"
        )
    errors = [f"- B={r['batch']} K={r['k']} V={r['vocab']} {r['dtype']} {r['mode']} {r['method']}: {e}"
              for r in result["rows"] for e in r.get("errors", [])]  # fmt: skip
    return "\n".join(lines + (["", "Errors:", *errors] if errors else []))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    grids = "small: the GPU suite's shapes; full: B x K x V x dtype; tiny: CPU smoke shapes"
    parser.add_argument("--grid", choices=["small", "full", "tiny"], default="small", help=grids)
    parser.add_argument("--batch", type=int, nargs="+", help="an explicit grid instead (with --k --vocab --dtype)")
    parser.add_argument("--k", type=int, nargs="+")
    parser.add_argument("--vocab", type=int, nargs="+")
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES))
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["probs"], help="modes of an explicit grid")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--graph-calls", type=int, default=20, help="calls captured per CUDA graph (M)")
    parser.add_argument("--budget-per-timing", type=float, default=0.1,
                        help="seconds of calls per host-timing round (sets N)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="host-timing rounds (median)")
    parser.add_argument("--min-calls", type=int, default=5, help="fewest calls per host-timing round")
    parser.add_argument("--time-budget", type=float, help="stop starting new shapes after this many seconds")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--json", help="write the results here (after every shape)")
    parser.add_argument("--markdown", help="write the table here too")
    args = parser.parse_args(argv)
    args.command = "python bench/kernels/bench_verify.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# {args.command}", flush=True)

    def write(result: dict) -> None:  # after every shape, so a run cut short by a timeout keeps what it measured
        for path, text in ((args.json, json.dumps(result, indent=2)), (args.markdown, markdown(result))):
            if path:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(text + "\n")

    result = run(args, on_row=write)
    write(result)
    print(markdown(result))


if __name__ == "__main__":
    main()
