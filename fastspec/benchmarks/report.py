"""The markdown tables of `fastspec bench` (`grid_markdown`) and of its suite (`suite_markdown`), and the files
they write: each table starts with the command that made it, then the machine, its load and what the numbers sample.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["describe_grid_sample", "describe_suite_sample", "grid_markdown", "missing_text", "suite_markdown",
           "write_json", "write_outputs"]  # fmt: skip


def describe_grid_sample(cfg: dict) -> str:
    """What a table's tokens/s are: over which prompts, tokens and repeats, and what is a median of what."""
    n = cfg["num_prompts"]
    return (
        f"{n} '{cfg['prompt_set']}' prompts of <= {cfg['prompt_tokens']} tokens, {cfg['max_new_tokens']} new tokens "
        f"each; tokens/s = median over {cfg['repeats']} repeats of (new tokens / seconds, summed over the {n} "
        "prompts; at batch B the prompts go B to a call), after one untimed warm-up call per method; methods "
        "interleaved per prompt"
    )


def _grid_note(cfg: dict, rows: int) -> str:
    grid = cfg.get("grid")
    if grid == "default":
        return f"default grid ({rows} rows; `fastspec bench --full` runs every method at every setting)"
    return f"{grid} grid ({rows} rows)" if grid else f"{rows} rows"


def grid_markdown(result: dict) -> str:
    """The results as a markdown table (one line per setting and method) with the producing command, what the
    numbers sample, and, for an interrupted run, that it was interrupted and which rows are missing."""
    env, cfg = result["environment"], result["config"]
    missing = result.get("missing_rows", [])
    lines = [f"`{cfg['command']}`  "]
    if result.get("interrupted"):
        lines.append(
            f"**INTERRUPTED** (Ctrl-C): {len(result['rows'])} of {len(result['rows']) + len(missing)} rows finished; "
            "the missing ones are listed under the table  "
        )
    load = env.get("load_average_start")
    load = "" if load is None else f", load average {load} at the start and {env.get('load_average_end')} at the end"
    lines += [
        f"device: {env['device']}, torch {env['torch']}, {env['threads']} threads{load}, commit {env['commit']}; "
        f"{_grid_note(cfg, len(result['rows']) + len(missing))}; {describe_grid_sample(cfg)}",
        *(f"{note}  " for note in result.get("notes", [])),
        "",
        "| batch | temp | method | tokens/s | vs HF generate | acceptance | tokens/step | per-position acceptance "
        "| peak mem MB | greedy == HF |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in result["rows"]:
        acc = f"{r['acceptance_rate']:.3f}" if "acceptance_rate" in r else ""
        mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""
        per = " ".join(f"{a:.2f}" for a in r.get("per_position_acceptance", []))
        eq = {True: "yes", False: "NO", None: "n/a (sampled)"}[r["greedy_equal_hf"]]
        mem = "" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.1f}"
        timed = r.get("compiles_while_timed")
        method = r["method"] + (f" ({timed} compiles timed)" if timed else "")
        if r.get("repeats", cfg["repeats"]) < cfg["repeats"]:
            method += f" (interrupted: median of {r['repeats']} of {cfg['repeats']} repeats)"
        lines.append(
            f"| {r['batch']} | {r['temperature']} | {method} | {r['tokens_per_s']:.1f} | "
            f"{r['speedup_vs_hf']:.2f}x | {acc} | {mal} | {per} | {mem} | {eq} |"
        )
    if result.get("interrupted"):
        lines += ["", missing_text(missing)]
    return "\n".join(lines)


def missing_text(missing: list[dict]) -> str:
    """The rows an interrupted run did not finish, one line per setting."""
    if not missing:
        return "Missing rows: none (interrupted after the last row)."
    settings = {}
    for r in missing:
        settings.setdefault((r["batch"], r["temperature"]), []).append(r["method"])
    return "Missing rows (interrupted):  \n" + "  \n".join(
        f"batch {b}, temperature {t}: {', '.join(names)}" for (b, t), names in settings.items()
    )


def write_outputs(result: dict, json_path: str | None, plot_path: str | None) -> None:
    """Write the JSON results and, if asked, a speedup-vs-K chart (needs matplotlib: `pip install .[plot]`)."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    if plot_path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for batch in sorted({r["batch"] for r in result["rows"]}):
            for temp in sorted({r["temperature"] for r in result["rows"]}):
                pts = [(int(r["method"].rsplit("k", 1)[1]), r["speedup_vs_hf"]) for r in result["rows"]
                       if r["batch"] == batch and r["temperature"] == temp and "_chain_k" in r["method"]]  # fmt: skip
                if pts:
                    ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=f"batch {batch}, temperature {temp}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens/s vs HF generate")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plot_path, dpi=120)


def describe_suite_sample(result: dict) -> str:
    """How many prompts of which sets, tokens, repeats: what each number is a median of."""
    cfg, prompts = result["config"], result["prompts"]
    counts = {}
    for p in prompts:
        counts[p["category"]] = counts.get(p["category"], 0) + 1
    mt = [c for c in counts if c != "humaneval"]
    parts = []
    if mt:
        parts.append(f"MT-bench first turns: {sum(counts[c] for c in mt)} questions ({counts[mt[0]]} per category, "
                     "spread evenly over each category)")  # fmt: skip
    if "humaneval" in counts:
        parts.append(f"HumanEval: {counts['humaneval']} of 164 problems")
    chat = "under the target's chat template" if cfg["chat"] else "tokenized as they are (--no-chat-template)"
    return (
        f"{'; '.join(parts)}; prompts {chat}; up to {cfg['max_new_tokens']} new tokens each (EOS ends a row "
        f"earlier); tokens/s = median over {cfg['repeats']} repeat(s) of (new tokens / seconds, summed over a "
        "category's prompts), after one untimed warm-up call per method per setting; methods interleaved per "
        f"prompt; prompt lookup: n-gram {cfg['prompt_lookup']}, K={cfg['k']} (HF: prompt_lookup_num_tokens={cfg['k']})"
    )


def _fmt_equal(row: dict) -> str:
    if row["temperature"] != 0.0:
        return "n/a (sampled)"
    if "greedy_equal_hf" not in row:
        return "n/a"
    ok, n = row["greedy_equal_hf"]
    text = "yes" if ok == n else f"NO ({n - ok} of {n}: {', '.join(row['unequal_prompts'])})"
    return text if ok != n else f"yes ({n}/{n})"


def suite_markdown(result: dict) -> str:
    """The suite's results as markdown: the command, the machine and its load, what was sampled, notes (rows
    skipped and why), then per setting a matrix of speedups per category and a detailed table."""
    env, cfg, rows = result["environment"], result["config"], result["rows"]
    load = env.get("load_average_start")
    load = "" if load is None else f", load average {load} at the start and {env.get('load_average_end')} at the end"
    lines = [
        f"`{cfg['command']}`  ",
        f"target: {cfg['target'] or 'shipped'}; device: {env['device']}, torch {env['torch']}, {env['threads']} "
        f"threads{load}, commit {env['commit']}; {cfg['grid']} sample; {describe_suite_sample(result)}  ",
        *(f"Note: {n}  " for n in result.get("notes", [])),
    ]
    settings = list(dict.fromkeys((r["batch"], r["temperature"]) for r in rows))
    for batch, temperature in settings:
        sub = [r for r in rows if r["batch"] == batch and r["temperature"] == temperature]
        categories = list(dict.fromkeys(r["category"] for r in sub))
        methods = list(dict.fromkeys(r["method"] for r in sub))
        lines += ["", f"**Batch {batch}, {'greedy' if temperature == 0.0 else f'temperature {temperature}'}**", ""]
        if temperature > 0:
            lines += [
                "Sampled: each method draws its own text (lossless: the target's distribution, not the same tokens), "
                "so rows stop at EOS after different lengths, and a row that stops within a few tokens is mostly "
                "its prefill. With few prompts per category, per-category ratios here are noise: read the `all` "
                "columns, or run the default or --full sample.",
                "",
            ]
        if len(categories) > 1:  # the matrix: speedup over HF generate per category
            shown = [c for c in categories if c != "all"]
            mt = any("mt_bench_mean_speedup" in r for r in sub)
            lines += [
                "| method | "
                + " | ".join(shown)
                + (" | MT-bench mean" if mt else "")
                + " | all: tokens/s | all: vs HF | all: tokens/step | greedy == HF |",
                "|---|" + "---:|" * (len(shown) + (1 if mt else 0) + 3) + "---|",
            ]
            for m in methods:
                by = {r["category"]: r for r in sub if r["method"] == m}
                total = by.get("all", {})
                cells = [f"{by[c]['speedup_vs_hf']:.2f}x" if c in by else "" for c in shown]
                if mt:
                    cells.append(f"{total['mt_bench_mean_speedup']:.2f}x" if "mt_bench_mean_speedup" in total else "")
                mal = f"{total['mean_accepted_length']:.2f}" if "mean_accepted_length" in total else ""
                lines.append(
                    f"| {m} | " + " | ".join(cells) + f" | {total.get('tokens_per_s', 0):.1f} | "
                    f"{total.get('speedup_vs_hf', 0):.2f}x | {mal} | {_fmt_equal(total) if total else ''} |"
                )
            lines.append("")
        lines += [
            "| category | method | tokens/s | vs HF generate | tokens/step | acceptance | per-position acceptance "
            "| greedy == HF (prompts) |",
            "|---|---|---:|---:|---:|---:|---|---|",
        ]
        for r in sub:
            if r["category"] == "all" and len(categories) > 1:
                continue
            mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""
            acc = f"{r['acceptance_rate']:.3f}" if "acceptance_rate" in r else ""
            per = " ".join(f"{a:.2f}" for a in r.get("per_position_acceptance", []))
            lines.append(f"| {r['category']} | {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup_vs_hf']:.2f}x | "
                         f"{mal} | {acc} | {per} | {_fmt_equal(r)} |")  # fmt: skip
    return "\n".join(lines)


def write_json(result: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(result, indent=2))
