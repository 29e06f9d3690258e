"""A/B of `fastspec bench --quick` between two checkouts, interleaved: old, new, old, new, ...

Each run is `python -m fastspec.cli bench --quick --json ...` with the checkout first on PYTHONPATH, so both use this
environment's packages. Rows are compared by their speedup over HF `generate` measured in the same run (the machine's
speed cancels), median over the rounds; the geometric mean of new/old over the rows both runs have (HF generate, the
baseline, left out) is the A/B's number. Fixed-K and tree rows must draft, accept and emit the same in both (their
acceptance and tokens per step are deterministic under greedy decoding); adaptive-K rows move with measured costs.

    python bench/ab_quick.py --old /tmp/old_checkout --new . --rounds 2 --out bench/results/ab_quick.md
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(checkout: Path, out: Path) -> float:
    """One quick bench from `checkout` into `out`; returns its wall time in seconds."""
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve()))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "fastspec.cli", "bench", "--quick", "--json", str(out)], env=env,
                   cwd=checkout, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    return time.perf_counter() - start


def _commit(checkout: Path) -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True,
                          text=True).stdout.strip()  # fmt: skip


def rows(path: Path) -> dict[tuple, dict]:
    """{(batch, temperature, method): row} of one run's JSON."""
    return {(r["batch"], r["temperature"], r["method"]): r for r in json.loads(path.read_text())["rows"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", type=Path, required=True, help="the old checkout")
    parser.add_argument("--new", type=Path, default=Path("."), help="the new checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, help="markdown table (default: stdout)")
    parser.add_argument("--label", default="", help="what is compared, for the table's title")
    args = parser.parse_args()
    commit = {side: _commit(path) for side, path in (("old", args.old), ("new", args.new))}
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    seconds: dict[str, list[float]] = {"old": [], "new": []}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for side, checkout in (("old", args.old), ("new", args.new)):
                out = Path(tmp) / f"{side}{round_}.json"
                seconds[side].append(run(checkout, out))
                runs[side].append(rows(out))
                print(f"round {round_ + 1} {side}: {seconds[side][-1]:.0f} s", file=sys.stderr)
    common = [key for key in runs["new"][0] if all(key in r for side in runs for r in runs[side])]
    lines, ratios, raw = [], [], []
    for key in common:
        old = statistics.median(r[key]["speedup_vs_hf"] for r in runs["old"])
        new = statistics.median(r[key]["speedup_vs_hf"] for r in runs["new"])
        speed = [statistics.median(r[key]["tokens_per_s"] for r in runs[side]) for side in ("old", "new")]
        raw.append(speed[1] / speed[0])
        if key[2] != "hf_generate":
            ratios.append(new / old)
        acc = [[round(r[key].get("mean_accepted_length", 0), 3) for r in runs[side]] for side in ("old", "new")]
        equal = runs["new"][0][key]["greedy_equal_hf"]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {old:.2f}x | {new:.2f}x | {new / old:.3f} | "
                     f"{speed[0]:.1f} -> {speed[1]:.1f} | {acc[0]} -> {acc[1]} | {equal} |")  # fmt: skip
    mean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    raw_mean = math.exp(sum(math.log(r) for r in raw) / len(raw))
    text = "\n".join([
        f"# A/B: `fastspec bench --quick`, old {commit['old']} vs new {commit['new']}{' (' + args.label + ')' if args.label else ''}",  # noqa: E501
        "",
        f"Command: `python bench/ab_quick.py --old <checkout of {commit['old']}> --new . --rounds {args.rounds}` on "
        f"{os.cpu_count()} CPUs, the shipped pair, fp32: {args.rounds} interleaved rounds (old, new, ...), each row's "
        "speedup over HF generate in its own run, median over the rounds. Run times (s): old "
        f"{[round(s) for s in seconds['old']]}, new {[round(s) for s in seconds['new']]}; load average at the end "
        f"{os.getloadavg()[0]:.2f}.",
        "",
        f"Geometric mean of new/old over the {len(ratios)} rows both have (HF generate left out): **{mean:.3f}** of "
        f"the speedups over HF generate in the same run; **{raw_mean:.3f}** of the raw tokens/s (all {len(raw)} rows, "
        "HF's own included: where HF's rows move too, the machine moved between runs).",
        "",
        "| batch | temp | method | old speedup | new speedup | new/old | tokens/s old -> new | tokens/step old -> new "
        "(per round) | greedy == HF (new) |",
        "|---:|---:|---|---:|---:|---:|---|---|---|",
        *lines,
        "",
    ])  # fmt: skip
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
