"""What a benchmark records beside its numbers: the machine and software (`environment`), how busy the machine was
(`load_average`, read at a run's start and end), and how many step shapes were compiled (`CompileCounter`)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch

__all__ = ["CompileCounter", "environment", "load_average"]


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, ours included); None where unknown."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _commit() -> str:
    """The checkout's short commit hash ("" outside a git checkout)."""
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=False)  # fmt: skip
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def environment(device: str) -> dict:
    """The record of a run's machine and software: device (the CUDA device's name, else the CPU's), torch and
    transformers versions, torch's CPU threads, the checkout's commit, Python, and the CPU linear mode in force
    (`fastspec.cpu_linear.mode`)."""
    import transformers

    from fastspec import cpu_linear

    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    return {
        "device": name, "torch": torch.__version__, "transformers": transformers.__version__,
        "threads": torch.get_num_threads(), "commit": _commit(), "python": platform.python_version(),
        "cpu_linear": cpu_linear.mode(),
    }  # fmt: skip


class CompileCounter:
    """The step shapes `fastspec.compiled.CompiledForward` compiled since this counter was made (`count`): read
    before and after a call, it says whether the call compiled (and so whether its time includes compiling)."""

    def __init__(self):
        from fastspec import compiled

        self._compiled = compiled
        self.start = compiled.compile_count()

    @property
    def count(self) -> int:
        return self._compiled.compile_count() - self.start
