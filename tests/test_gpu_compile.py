"""Every Triton kernel specialisation the host code produces compiles for real GPUs (sm_90a, sm_80), on this CPU.

`bench/kernels/compile_table.py` drives the real host wrappers (`verify_chain`, the lean `ChainVerifier`,
`verify_tree`, `tree_mask`) with CPU tensors at the shapes `generate` and the benchmarks use, lets Triton's own
`JITFunction.run` work out each launch's specialisation against a stand-in driver that reports the GPU, compiles
every distinct one with `triton.compile` for the target and runs the `ptxas -v` Triton uses for that architecture.
It runs in a subprocess: conftest sets TRITON_INTERPRET=1 before the kernel modules are imported, and kernels
defined under the interpreter are not JIT functions, so this process cannot compile them; a fresh process with
TRITON_INTERPRET unset defines them as Triton does on a GPU machine, with nothing to undo.

Fails on a host-code error, a compile error, `printf`/assert left in, and spills in hot variants (batch <= 8,
K or tree depth <= 8). A representative set by default (about a minute with a warm Triton cache, a few cold);
FASTSPEC_COMPILE_FULL=1 compiles the whole grid. Skips, with the reason, where the installed Triton has no NVIDIA
backend or no ptxas.

Under Triton 3.6 (the GPU machine's version, whose ptxas allocates differently) when FASTSPEC_TRITON36 names a
Python that has it, e.g. a side venv:

    python3 -m venv /work/venv36 && /work/venv36/bin/pip install torch==2.13.0 \
        && /work/venv36/bin/pip install --no-deps triton==3.6.0 \
        && /work/venv36/bin/pip install transformers==5.17.0 tokenizers safetensors tqdm numpy
    FASTSPEC_TRITON36=/work/venv36/bin/python .venv/bin/pytest tests/test_gpu_compile.py
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "kernels" / "compile_table.py"
KERNELS = {"_chunk_stats_kernel", "_filtered_stats_kernel", "_accept_residual_kernel", "_verify_tree_kernel",
           "_tree_mask_kernel"}  # fmt: skip
AUDIT_CASE = "chain B=1 K=4 V=128256 bf16 greedy"  # spilled 3,636 bytes under Triton 3.6 before the retile


def compile_table(python: str, tmp_path: Path) -> dict:
    """Run the compile table under `python`; its JSON result (skips the test when that Triton cannot compile)."""
    out = tmp_path / "compile.json"
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    args = [python, str(SCRIPT), "--json", str(out)]
    if os.environ.get("FASTSPEC_COMPILE_FULL") == "1":
        args.append("--full")
    proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3000)
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip().removeprefix("skip: "))
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert not result["problems"], "\n".join(result["problems"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return result


def check_rows(rows: list[dict]) -> None:
    assert {r["arch"] for r in rows} == {"sm_90a", "sm_80"}
    assert {r["kernel"] for r in rows} == KERNELS
    for r in rows:
        assert r["registers"] > 0 and not r["printf"] and not r["asserts"], r
        if r["hot"]:
            assert r["spill_stores"] == r["spill_loads"] == 0, r
    audit = [r for r in rows if r["kernel"] == "_accept_residual_kernel" and AUDIT_CASE in r["cases"]]
    assert len(audit) == 2 and all(r["spill_stores"] == 0 for r in audit), audit


def test_every_kernel_compiles_for_sm90a_and_sm80_without_spills_in_hot_variants(tmp_path):
    check_rows(compile_table(sys.executable, tmp_path)["rows"])


@pytest.mark.skipif(not os.environ.get("FASTSPEC_TRITON36"),
                    reason="FASTSPEC_TRITON36 names no Python with triton 3.6 (see the module docstring)")  # fmt: skip
def test_every_kernel_compiles_under_triton_36_without_spills_in_hot_variants(tmp_path):
    python = os.environ["FASTSPEC_TRITON36"]
    version = subprocess.run([python, "-c", "import triton; print(triton.__version__)"], capture_output=True,
                             text=True, timeout=120).stdout.strip()  # fmt: skip
    assert version.startswith("3.6"), f"{python} has triton {version or 'missing'}, not 3.6"
    result = compile_table(python, tmp_path)
    assert result["header"]["triton"].startswith("3.6")
    check_rows(result["rows"])


def _script():
    spec = importlib.util.spec_from_file_location("compile_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("compile_table", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_ptxas_report_parsing():
    log = """ptxas info    : Compiling entry function '_accept_residual_kernel' for 'sm_90a'
ptxas info    : Function properties for _accept_residual_kernel
    3680 bytes stack frame, 3636 bytes spill stores, 3632 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 3680 bytes cumulative stack size, 16 bytes smem, 432 bytes cmem[0]
"""
    assert _script().parse_ptxas(log) == dict(registers=64, stack=3680, spill_stores=3636, spill_loads=3632,
                                              static_smem=16)  # fmt: skip


def test_hot_variants_and_failures_are_named():
    module = _script()
    assert module.Case("chain", 8, 8, 128256, "bf16", "greedy").hot
    assert not module.Case("chain", 32, 4, 128256, "bf16", "greedy").hot
    assert not module.Case("tree", 1, 16, 4096, "fp32", "probs").hot
    row = dict(kernel="k", arch="sm_80", variant="BLOCK_V=1024", cases=["chain B=1"], printf=False, asserts=True,
               hot=True, spill_stores=8, spill_loads=8)  # fmt: skip
    found = module.problems([row, dict(row, hot=False, asserts=False), dict(row, error="boom")], ["host error"])
    assert len(found) == 4 and "printf/assert" in found[1] and "spills 8 bytes" in found[2] and "boom" in found[3]
