"""How fastspec imports, each in a fresh interpreter: from the checkout root, without Triton, from a bare checkout.

kernels/ is a namespace folder (no __init__.py) mapped to `fastspec.kernels`, so Python started in the checkout
root still imports Hugging Face's `kernels` package (which transformers imports) rather than this folder, and
`import fastspec` leaves Triton unloaded until the first kernel call.
"""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, cwd: Path, **env: str) -> str:
    """Run `python -c code` in cwd (PYTHONSAFEPATH unset, so the cwd is first on sys.path); returns stdout."""
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONSAFEPATH"} | env
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_checkout_root_does_not_shadow_hf_kernels():
    out = run_python(
        "import transformers, fastspec\nfrom transformers import LlamaForCausalLM\nimport kernels\n"
        "print(getattr(kernels, '__file__', None) or list(kernels.__path__)[0])",
        cwd=ROOT,
    )
    try:
        hf_kernels = importlib.metadata.distribution("kernels").locate_file("kernels/__init__.py")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("Hugging Face's kernels package is not installed")
    assert Path(out.strip()) == Path(hf_kernels), f"`import kernels` found {out.strip()}, not {hf_kernels}"


def test_import_fastspec_leaves_triton_unloaded():
    out = run_python("import sys, fastspec\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))", ROOT)
    assert out.strip() == "[]"


def test_bare_checkout_imports_the_kernels(tmp_path):
    """The checkout on sys.path, no install (an editable install's finders removed): the kernels still import and
    run (through the interpreter), from the checkout's kernels/ folder."""
    code = f"""
import sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.path.insert(0, {str(ROOT)!r})
import torch
import fastspec
from fastspec.kernels import verify_chain
from fastspec.verify import verify_chain as dispatch
out, n = dispatch(torch.zeros(1, 2, 4), torch.zeros(1, 1, dtype=torch.long), temperature=0.0, backend="triton")
print(fastspec.__file__, verify_chain.__file__, n.tolist())
"""
    fastspec_file, kernel_file, accepted = run_python(code, tmp_path, TRITON_INTERPRET="1").split()
    assert Path(fastspec_file) == ROOT / "fastspec" / "__init__.py"
    assert Path(kernel_file) == ROOT / "kernels" / "verify_chain.py"
    assert accepted == "[1]"
