"""Write bench/results/README.md, the index of the committed results, from the files' own headers.

bench/results holds the newest result of each benchmark under that benchmark's name (a new run replaces the file; git
keeps the earlier ones), and bench/results/training/ the logs and metrics of training runs. Every file says what it is
in its first lines, and the index is read from there:

- a markdown result: its title (a first line ``# ...``), the command that made it (the first backticked command in its
  header, the lines before its first table or code block, else its JSON's ``config.command``) and the commit it ran
  at (the first ``commit <hash>`` in it, else its JSON's ``environment.commit``);
- a JSON file beside a markdown file of the same name: that result's data; any other JSON: its ``command`` field
  (`fastspec train-head`'s training.json, the pair trainer's metrics), else the header of the log of the same name;
- a log: its first line when that is a ``# command`` comment, else the command of the JSON of the same name.

A file that says none of these is an error (exit status 2, naming it): give it a header, then run this again.

    python bench/index_results.py            # rewrite bench/results/README.md
    python bench/index_results.py --check    # exit status 1 when README.md is not what the files say
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
INDEX = "README.md"
COMMAND = re.compile(r"`((?:fastspec |python3? |torchrun |PYTHONPATH=|\.venv/bin/|bash |OUT=)[^`]*)`")
COMMIT = re.compile(r"\bcommit ([0-9a-f]{7,40})\b")
HEADER_LINES = 40  # a markdown file's header ends at its first table or code block, at the latest here

PREAMBLE = """# bench/results: the newest result of each benchmark

Written by `python bench/index_results.py` from each file's own header (its title, the command that made it, the
commit it ran at); `tests/test_results_index.py` fails when a file is missing here or an entry has no file, so run the
script after adding, renaming or removing a result. One name per benchmark: a new run replaces the file, and the
earlier ones are in git (`git log --follow -- bench/results/<file>`, then `git show <commit>:<path>`). Before the cut
to one name each, the same benchmarks wrote `cpu*.md` (`fastspec bench`, now `bench.md`), `spec_smollm2*.md` (the
suite, now `suite_spec.md`), `gpu_compile_*.md` (now `compile_table_*.md`), `tp_cpu.md`, `*_smollm2.md`, and the head
studies of issue 24 (`compare_heads_*.md`, `ab_issue24_*.md`, `eagle3_regression_*.md`, `side_by_side_*`: the last of
them is `pair_head.md`). All runs: the 2-core shared CPU of the build machine, torch 2.13 CPU, fp32, unless the file
says otherwise; no GPU result is committed (`bench/gpu_suite.sh` writes to `$OUT`). docs/results.md reads them."""


class Unindexable(Exception):
    """A file whose header says nothing the index can use."""


def _lines(path: Path, count: int) -> list[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n") for _, line in zip(range(count), f, strict=False)]


def _json(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _log_command(path: Path) -> str | None:
    first = _lines(path, 1)
    return first[0][2:].strip() if first and first[0].startswith("# ") else None


def _json_command(path: Path) -> str | None:
    data = _json(path)
    command = data.get("command") or (data.get("config") or {}).get("command")
    if command:
        return command
    log = path.with_suffix(".log")
    return _log_command(log) if log.is_file() else None


def markdown_entry(path: Path) -> dict:
    """title, command and commit of a markdown result (module docstring)."""
    head = _lines(path, HEADER_LINES)
    title = head[0][2:].strip() if head and head[0].startswith("# ") else ""
    end = next((i for i, line in enumerate(head) if line.startswith(("|", "```"))), len(head))
    found = COMMAND.search(" ".join(line.strip() for line in head[:end]))
    command = " ".join(found.group(1).split()) if found else ""
    found = COMMIT.search(path.read_text(encoding="utf-8", errors="replace"))
    commit = found.group(1) if found else ""
    data = path.with_suffix(".json")
    if data.is_file():
        record = _json(data)
        command = command or (record.get("config") or {}).get("command", "")
        commit = commit or (record.get("environment") or {}).get("commit", "")
    if not title and not command:
        raise Unindexable(f"{path}: no `# title` first line and no backticked command before its first table")
    return {"title": title, "command": command, "commit": commit}


def training_entry(path: Path) -> dict:
    """command and held-out acceptance of a training log or metrics file (module docstring)."""
    if path.suffix == ".log":
        command = _log_command(path)
        data = path.with_suffix(".json")
        if command is None and data.is_file():
            command = _json_command(data)
        what = "log"
    else:
        command = _json_command(path)
        what = "record"
    if not command:
        raise Unindexable(f"{path}: no `# command` first line (log), no command field (JSON), no partner that has one")
    accepted = ""
    if path.suffix == ".json":
        heldout = _json(path).get("heldout_acceptance")
        if isinstance(heldout, dict) and "acceptance_rate_k4" in heldout:
            accepted = f"{heldout['acceptance_rate_k4']:.3f}"
    return {"what": what, "command": command, "accepted": accepted}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{text}`" if text else "—"


def index() -> str:
    """The text of README.md for the files now in bench/results."""
    files = sorted(p for p in RESULTS.rglob("*") if p.is_file() and p.relative_to(RESULTS).as_posix() != INDEX)
    results = [p for p in files if p.parent == RESULTS]
    training = [p for p in files if p.parent != RESULTS]
    lines = [PREAMBLE, "", "## Results", "", "| file | title | command | run at |", "|---|---|---|---|"]
    for path in results:
        name = path.relative_to(RESULTS).as_posix()
        partner = path.with_suffix(".md")
        if path.suffix == ".json" and partner.is_file():
            entry = markdown_entry(partner)
            lines.append(f"| `{name}` | the data of `{partner.name}` | {_code(_cell(entry['command']))} | "
                         f"{entry['commit'] or '—'} |")  # fmt: skip
        elif path.suffix == ".md":
            entry = markdown_entry(path)
            lines.append(f"| `{name}` | {_cell(entry['title']) or '—'} | {_code(_cell(entry['command']))} | "
                         f"{entry['commit'] or '—'} |")  # fmt: skip
        else:
            raise Unindexable(f"{path}: a result is a markdown file (with, optionally, a JSON file of the same name)")
    lines += ["", "## Training runs (`training/`)", "",
              "Logs and records of the training runs behind the shipped weights and of the runs that did not ship "
              "(docs/training.md tells which is which); the records' held-out acceptance is greedy, K=4, on the run's "
              "own held-out prompts. Commands as they ran: `python -m training.train_pair` is now `python -m "
              "fastspec.training.train_pair`.",
              "", "| file | kind | command | held-out acceptance |", "|---|---|---|---:|"]  # fmt: skip
    for path in training:
        name = path.relative_to(RESULTS).as_posix()
        entry = training_entry(path)
        lines.append(f"| `{name}` | {entry['what']} | {_code(_cell(entry['command']))} | {entry['accepted'] or '—'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with README.md instead of writing it")
    args = parser.parse_args(argv)
    try:
        text = index()
    except Unindexable as error:
        print(f"index_results: {error}", file=sys.stderr)
        return 2
    path = RESULTS / INDEX
    if args.check:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            print(f"index_results: {path} is not the index of the files there: run python bench/index_results.py",
                  file=sys.stderr)  # fmt: skip
            return 1
        return 0
    path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
