"""bench/results/README.md is the index `bench/index_results.py` writes from the results' own headers: every result
file is in it, every entry has a file, and it is what the files say now (rerun the script after adding, renaming or
removing a result); a file whose header says nothing is refused by name."""

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SCRIPT = ROOT / "bench" / "index_results.py"


def load_script():
    spec = importlib.util.spec_from_file_location("index_results", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_result_file_is_indexed_and_every_entry_has_a_file():
    index = (RESULTS / "README.md").read_text(encoding="utf-8")
    indexed = set(re.findall(r"^\| `([^`]+)` \|", index, flags=re.MULTILINE))
    files = {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file()} - {"README.md"}
    assert files - indexed == set(), "result files missing from bench/results/README.md: run bench/index_results.py"
    assert indexed - files == set(), "index entries without a file: run bench/index_results.py"


def test_the_index_is_what_the_files_say_now():
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_headers_are_read_and_a_file_without_one_is_refused(tmp_path, monkeypatch):
    script = load_script()
    monkeypatch.setattr(script, "RESULTS", tmp_path)
    (tmp_path / "training").mkdir()
    (tmp_path / "grid.md").write_text("`fastspec bench --quick`  \ndevice: cpu, commit abc1234\n\n| a |\n")
    (tmp_path / "grid.json").write_text(json.dumps({"config": {"command": "fastspec bench --quick"}}))
    (tmp_path / "study.md").write_text("# A study\n\nRun as\n`python bench/x.py\n--flag`\n")
    record = {"command": "fastspec train-head --max-steps 2", "heldout_acceptance": {"acceptance_rate_k4": 0.5}}
    (tmp_path / "training" / "run.json").write_text(json.dumps(record))
    (tmp_path / "training" / "run.log").write_text("[train-head] step 1\n")
    text = script.index()
    assert "| `grid.md` | — | `fastspec bench --quick` | abc1234 |" in text
    assert "| `grid.json` | the data of `grid.md` | `fastspec bench --quick` | abc1234 |" in text
    assert "| `study.md` | A study | `python bench/x.py --flag` | — |" in text
    assert "| `training/run.json` | record | `fastspec train-head --max-steps 2` | 0.500 |" in text
    assert "| `training/run.log` | log | `fastspec train-head --max-steps 2` | — |" in text  # the JSON's command
    (tmp_path / "notes.md").write_text("some text\n")
    assert script.main([]) == 2 and not (tmp_path / "README.md").exists()
