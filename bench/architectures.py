"""Architecture sweep: every decoder-only model type of transformers' causal-LM mapping, built tiny, decoded by HF and
by fastspec; a table of pass / refused / fail / skip per model type and case.

    .venv/bin/python bench/architectures.py                      # every model type, 2 workers
    .venv/bin/python bench/architectures.py --types llama mistral mamba --json /tmp/arch.json

Each model type runs in its own process (`python -m tests.architecture_cases MODEL_TYPE`, from the repository root)
with `OMP_NUM_THREADS=1`, a time limit and a memory limit, so a hang, a crash or a runaway allocation costs one row,
not the sweep; a worker that dies is restarted on the cases it had not finished (the case it was on is marked `fail`).
The cases, their statuses and the tiny models are described in tests/architecture_cases.py and tests/tiny_configs.py.
Writes bench/results/architectures.md (or `--out`) and, with `--json PATH`, every status as JSON.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parent.parent
WORKER = "tests.architecture_cases"


def _worker_env() -> dict[str, str]:
    """The environment of a worker: one intra-op thread, no Python warnings."""
    return os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def list_types() -> dict:
    """{"types": model types swept, "skipped": {model type: reason}, "cases": case names}, from the worker module."""
    listed = subprocess.run(
        [sys.executable, "-m", WORKER, "--list"], cwd=REPO, env=_worker_env(), capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    return json.loads(listed.stdout)


def run_type(model_type: str, cases: list[str], timeout: float, memory_gb: float) -> dict[str, str]:
    """{case: status} of one model type, from worker processes; a worker that times out or dies leaves `fail` on the
    case it was running and a new worker takes the remaining cases."""

    def limit_memory():
        limit = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    statuses: dict[str, str] = {}
    while remaining := [case for case in cases if case not in statuses]:
        command = [sys.executable, "-m", WORKER, model_type, "--cases", *remaining]
        try:
            done = subprocess.run(
                command, cwd=REPO, env=_worker_env(), capture_output=True, text=True, timeout=timeout,
                preexec_fn=limit_memory,
            )  # fmt: skip
            stdout, stderr, failure = done.stdout, done.stderr, f"worker exited with code {done.returncode}"
        except subprocess.TimeoutExpired as expired:
            stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout or ""
            stderr = expired.stderr.decode() if isinstance(expired.stderr, bytes) else expired.stderr or ""
            failure = f"timeout: no result within {timeout:.0f} s"
        for line in stdout.splitlines():
            if line.startswith("{"):
                result = json.loads(line)
                if result["case"] in cases:
                    statuses[result["case"]] = result["status"]
        unfinished = [case for case in remaining if case not in statuses]
        if unfinished:  # the worker stopped in unfinished[0]
            last = next((line for line in reversed(stderr.strip().splitlines()) if line.strip()), "")
            statuses[unfinished[0]] = f"fail: {failure}" + (f" ({last.strip()[:120]})" if last else "")
    return statuses


def _cell(status: str, width: int = 90) -> str:
    """A status as a markdown table cell: pipes escaped, long messages cut."""
    text = status if len(status) <= width else status[: width - 3] + "..."
    return text.replace("|", "\\|")


def _cause(case: str, status: str) -> str:
    """A case's status with its numbers blanked, so failures of one cause group together; HF's own apart."""
    cause = "fail: mismatch" if status.startswith("fail: mismatch") else re.sub(r"\d+(\.\d+)?", "N", status)[:140]
    return f"{'HF assisted: ' if case == 'hf_assisted' else ''}{cause}"


def summarise(results: dict[str, dict[str, str]], cases: list[str]) -> dict[str, int]:
    """Counts over model types and fastspec cases (every case but `hf_assisted`); see the table header."""
    fastspec_cases = [case for case in cases if case != "hf_assisted"]
    statuses = [row[case] for row in results.values() for case in fastspec_cases]
    return {
        "types": len(results),
        "types_all_pass": sum(all(row[c] == "pass" for c in fastspec_cases) for row in results.values()),
        "types_all_pass_or_refused": sum(
            all(row[c] == "pass" or row[c].startswith("refused") for c in fastspec_cases) for row in results.values()
        ),
        "hf_assisted_equal": sum(row["hf_assisted"] == "pass" for row in results.values()),
        "mismatch_cases": sum(s.startswith("fail: mismatch") for s in statuses),
        "mismatch_types": sum(
            any(row[c].startswith("fail: mismatch") for c in fastspec_cases) for row in results.values()
        ),
        "crash_cases": sum(s.startswith("fail:") and not s.startswith("fail: mismatch") for s in statuses),
        "refused_cases": sum(s.startswith("refused") for s in statuses),
        "skip_cases": sum(s.startswith("skip") for s in statuses),
        "pass_cases": sum(s == "pass" for s in statuses),
    }


def markdown(results: dict[str, dict[str, str]], cases: list[str], skipped: dict[str, str], header: dict) -> str:
    """The report: header, summary, one row per model type, failures grouped by cause, skipped model types."""
    s = header["summary"]
    fastspec_cases = len(cases) - ("hf_assisted" in cases)
    lines = [
        "# Architecture sweep: fastspec against HF greedy on every decoder-only causal-LM type",
        "",
        f"transformers {header['transformers']}, torch {header['torch']}, {header['date']}, "
        f"{header['minutes']:.0f} min on {header['host_cpus']} CPUs. Commands: "
        + "; then ".join(f"`{command}`" for command in header["commands"]),
        "",
        "Each model type built tiny from its config class (random weights, hidden 64, 2-4 layers covering every layer "
        "kind, vocabulary 256, windows of 8 tokens, EOS off; tests/tiny_configs.py); greedy, 12-token prompt, 24 new "
        "tokens (so prompt + output passes every window); the draft is a noisy copy of the target, partly accepted. "
        "Cases (tests/architecture_cases.py): `hf_assisted` HF's own assisted generation with that draft; `chain`; "
        '`lookup` (prompt_lookup=2, repetitive prompt); `tree` (tree="small"); `ragged` (2 left-padded prompts); '
        "`static` (static_cache=True); `sampling` (runs, right shape). Reference: `target.generate(do_sample=False)` "
        "on the same input. `fail: mismatch at token i (target logit gap g)`: silently wrong output, g = target's "
        "top-1 logit minus the emitted token's logit at the first difference (near 0: a near-tie; larger: a logic "
        "error).",
        "",
        f"**Summary:** {s['types_all_pass']} of {s['types']} model types pass every fastspec case "
        f"({s['types_all_pass_or_refused']} pass or are refused by name); HF assisted decodes equal to greedy on "
        f"{s['hf_assisted_equal']} of {s['types']}; **{s['mismatch_cases']} silently wrong (mismatch) cases** on "
        f"{s['mismatch_types']} model types; {s['crash_cases']} crash cases, {s['refused_cases']} refused, "
        f"{s['skip_cases']} skipped, {s['pass_cases']} pass (of {s['types'] * fastspec_cases} fastspec cases).",
        "",
        "| model type | " + " | ".join(cases) + " |",
        "|---|" + "---|" * len(cases),
    ]
    lines += [f"| {t} | " + " | ".join(_cell(results[t][c]) for c in cases) + " |" for t in sorted(results)]
    causes: dict[str, list[str]] = defaultdict(list)
    for model_type in sorted(results):
        for case in cases:
            status = results[model_type][case]
            if status != "pass" and not status.startswith("refused"):
                causes[_cause(case, status)].append(f"{model_type}/{case}")
    lines += [
        "",
        "## Failures and skips grouped by message",
        "",
        "| count | message | model type / case |",
        "|---|---|---|",
    ]
    for cause, where in sorted(causes.items(), key=lambda item: -len(item[1])):
        lines.append(f"| {len(where)} | {_cell(cause, 140)} | {', '.join(where)} |")
    lines += ["", "## Model types of the mapping not swept", "", "| model type | reason |", "|---|---|"]
    lines += [f"| {t} | {reason} |" for t, reason in sorted(skipped.items())]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", help="model types to sweep (default: every decoder-only type)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="worker processes at a time")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one worker may run")
    parser.add_argument("--memory-gb", type=float, default=6, help="address-space limit of one worker")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "architectures.md")
    parser.add_argument("--json", type=Path, help="also write every status as JSON here")
    parser.add_argument(
        "--update", type=Path, help="a previous --json output: keep its rows, rerun only --types, table of all"
    )
    args = parser.parse_args(argv)
    if args.update and not args.types:
        parser.error("--update reruns the model types given by --types")

    listed = list_types()
    types, skipped, cases = args.types or listed["types"], listed["skipped"], listed["cases"]
    previous = json.loads(args.update.read_text()) if args.update else {"results": {}, "commands": [], "minutes": 0}
    start = time.perf_counter()
    results: dict[str, dict[str, str]] = dict(previous["results"])
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_type, t, cases, args.timeout, args.memory_gb): t for t in types}
        for done, future in enumerate(as_completed(futures), 1):
            model_type = futures[future]
            results[model_type] = future.result()
            brief = " ".join(f"{c}={results[model_type][c].split(':')[0]}" for c in cases)
            print(f"[{done}/{len(types)} {time.perf_counter() - start:.0f}s] {model_type}: {brief}", file=sys.stderr)

    command = shlex.join(["python", "bench/architectures.py", *(argv if argv is not None else sys.argv[1:])])
    header = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "commands": [*previous["commands"], command],
        "minutes": previous["minutes"] + (time.perf_counter() - start) / 60,
        "host_cpus": os.cpu_count(),
    }
    header["summary"] = summarise(results, cases)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(results, cases, skipped if set(results) >= set(listed["types"]) else {}, header))
    if args.json:
        args.json.write_text(json.dumps({**header, "results": results, "skipped": skipped}, indent=1) + "\n")
    print(json.dumps(header["summary"]), file=sys.stderr)


if __name__ == "__main__":
    main()
