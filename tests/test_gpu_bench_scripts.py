"""The GPU benchmark scripts run on the CPU too: bench/kernels/bench_verify.py (interpreter smoke grid),
bench/gpu_e2e.py (tiny pair, eager rows) and bench/gpu_suite.sh (a dry run: CUDA-only steps skipped).

Each runs as the GPU suite runs it: a subprocess from a bare checkout (PYTHONPATH = the checkout root).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def run(args, tmp_path, timeout=300, **env):
    environ = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run(args, cwd=tmp_path, env=environ, capture_output=True, text=True, timeout=timeout)


def test_bench_verify_cpu_smoke(tmp_path):
    out = tmp_path / "bv.json"
    proc = run([sys.executable, str(ROOT / "bench/kernels/bench_verify.py"), "--device", "cpu", "--grid", "tiny",
                "--repeats", "1", "--min-calls", "1", "--budget-per-timing", "0.01", "--json", str(out),
                "--markdown", str(tmp_path / "bv.md")], tmp_path, TRITON_INTERPRET="1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["method"] for r in rows} == {"lean", "triton", "reference", "hf"}
    assert all(r["exact"] for r in rows if r["method"] in ("lean", "triton")), rows
    assert all(r["host_us"] > 0 and "device_us" not in r for r in rows)
    assert "| lean |" in (tmp_path / "bv.md").read_text()


def test_bench_verify_needs_cuda_for_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    proc = run([sys.executable, str(ROOT / "bench/kernels/bench_verify.py"), "--device", "cuda"], tmp_path)
    assert proc.returncode != 0 and "CUDA is not available" in proc.stderr


def test_gpu_e2e_cpu_tiny(tmp_path):
    rows = ["--rows", "hf_eager", "fs_chain", "fs_lookup", "fs_head_chain"]
    proc = run([sys.executable, str(ROOT / "bench/gpu_e2e.py"), "--device", "cpu", "--tiny", "--pairs", "synthetic",
                *rows, "--threads", "1", "--out", str(tmp_path)], tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "e2e.json").read_text())
    (pair,) = result["pairs"]
    rows = {r["method"]: r for r in pair["rows"]}
    assert rows.pop("fs_head_chain") == {"method": "fs_head_chain", "skipped": "no draft head for this pair"}
    assert set(rows) == {"hf_eager", "fs_chain", "fs_lookup"}
    assert all(r["first_mismatch"] == [None] for r in rows.values()), rows  # fp32: greedy output equals HF's
    assert rows["fs_chain"]["acceptance"] > 0 and rows["fs_chain"]["x_hf_eager"] > 0
    assert "| fs_chain |" in (tmp_path / "e2e.md").read_text()


def test_gpu_e2e_needs_cuda_for_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    proc = run([sys.executable, str(ROOT / "bench/gpu_e2e.py"), "--device", "cuda", "--out", str(tmp_path)], tmp_path)
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_suite_dry_run_without_cuda(tmp_path):
    """Syntax, and a run on a machine without CUDA: every CUDA step says so, the summary and logs are written."""
    assert subprocess.run(["bash", "-n", str(ROOT / "bench/gpu_suite.sh")]).returncode == 0
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the dry run would be the real suite")
    bin_dir = str(Path(sys.executable).parent)  # the suite runs `python3`: this interpreter
    proc = run(["bash", str(ROOT / "bench/gpu_suite.sh")], tmp_path, timeout=120, OUT=str(tmp_path / "out"),
               PATH=f"{bin_dir}:{os.environ.get('PATH', '')}", PYTHON=sys.executable)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["logs.tar.gz", "summary.md", "tests.log"] and len(files) <= 8
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.count("skipped: no CUDA") == 4 and "| environment | ok |" in summary


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_gpu_suite_cpu_smoke_mode_runs_every_step(tmp_path):
    """SUITE_CPU_SMOKE=1: every step of the suite in a small CPU variant (kernel tests through the interpreter, the
    compile table for one kernel, the microbenchmark and the end-to-end rows on tiny shapes): a broken suite fails
    here, before a device is lent. About 30 s on idle cores."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the suite would run for real")
    bin_dir = str(Path(sys.executable).parent)
    environ = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    proc = subprocess.run(["bash", str(ROOT / "bench/gpu_suite.sh")], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(environ, PYTHONPATH=str(ROOT), OUT=str(tmp_path / "out"),
                                                SUITE_CPU_SMOKE="1", PATH=f"{bin_dir}:{os.environ.get('PATH', '')}",
                                                PYTHON=sys.executable))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == ["bench_verify.json", "bench_verify.md", "e2e.json", "e2e.md", "logs.tar.gz", "summary.md",
                     "tests.log", "tests.xml"]  # fmt: skip
    summary = (tmp_path / "out" / "summary.md").read_text()
    steps = [line for line in summary.splitlines() if line.startswith("| ") and line.endswith(" |")][:7]
    names = ["environment", "kernel tests", "compile table", "microbenchmark", "end-to-end"]
    for name in names:
        assert any(line.startswith(f"| {name}") and "| ok |" in line for line in steps), (name, summary[:3000])
    assert "tests: 2 run, 0 failed, 0 errors" in summary
    assert "compile table: 2 specialisations" in summary and ", 0 problems" in summary
