"""fastspec: lossless speculative decoding for Hugging Face causal LMs, with fused Triton verification kernels."""

import importlib.machinery
import importlib.util
import sys
from pathlib import Path


def _map_kernels_folder() -> None:
    """Make `fastspec.kernels` importable from a checkout: a bare one (the root on PYTHONPATH) or an editable install.

    The kernels live in the top-level folder kernels/, a namespace folder (no __init__.py, so it never shadows
    Hugging Face's `kernels` package) that a wheel installs as fastspec/kernels/. Nothing else finds it: a bare
    checkout has no mapping, and setuptools' editable finder resolves only folders with an __init__.py. Then
    register that folder, the sibling of this package, as the namespace package `fastspec.kernels`.
    """
    name = f"{__name__}.kernels"
    folder = Path(__file__).resolve().parent.parent / "kernels"
    if importlib.util.find_spec(name) is not None or not (folder / "reference.py").is_file():
        return
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    sys.modules[name] = module = importlib.util.module_from_spec(spec)
    globals()["kernels"] = module


_map_kernels_folder()

from fastspec.adaptive import DraftLengthController  # noqa: E402
from fastspec.custom_generate import custom_generate  # noqa: E402
from fastspec.generate import autoregressive_generate, generate, speculative_generate  # noqa: E402
from fastspec.stats import SpecStats  # noqa: E402

__all__ = [
    "DraftLengthController",
    "SpecStats",
    "autoregressive_generate",
    "custom_generate",
    "generate",
    "speculative_generate",
]
__version__ = "0.1.0"
