"""Linear layers of a few rows on CPU as ``W @ x^T`` where the machine's BLAS runs ``x @ W^T`` slowly.

A decoding step multiplies 1 to K + 1 rows (per batch row) by every weight matrix of the model, so on CPU a step of
a model too big for the caches is bound by how fast the weights stream from memory. ``torch.nn.functional.linear``
computes ``x @ W^T``, which some BLAS builds (MKL on this project's 2-core AMD EPYC) run for a few rows as one
matrix-vector product per row, at a fraction of the memory bandwidth the same product reaches written
``(W @ x^T)^T``, a matrix-matrix product. Transposed, verifying K drafts costs what the speculation's premise
assumes, about one token's forward (the measurements: docs/results.md, "Measurements behind the code's constants").

`linear_mode(model)` gives a `TorchFunctionMode` (thread-local, the model untouched) that routes the model's
``F.linear`` calls of at most `MAX_ROWS` rows in float32 on CPU to `transposed_linear`, or None. Never for models whose
float32 CPU linear weights total less than `MIN_WEIGHT_BYTES` (cache-resident: the mode's Python dispatch outweighs the
gain) nor for other devices or dtypes; for the others the **mode** decides, a process-wide switch:

- ``"auto"`` (the default): one timed pass over the model's own weights (`calibrate`, once per model and process, on
  inputs from its own seeded generator, never torch's global one) turns it on where the transposed product measured
  at least `MIN_GAIN` faster. That is a timing: two processes near the threshold can decide differently, so the
  decision is logged (logger "fastspec", level INFO) with the gain it measured;
- ``"on"``: on, without calibrating; ``"off"``: off. Either makes a run's arithmetic independent of timing.

The mode is `set_mode("auto" | "on" | "off")` in Python, else the environment variable ``FASTSPEC_CPU_LINEAR``, else
"auto" (`mode()` says which is in force); it is read when a `fastspec.generate` call builds its runners. Results equal
``F.linear``'s up to float rounding (another summation order), like any change of BLAS kernel or of the number of rows
in a forward: outputs are lossless with the mode on or off.
"""

from __future__ import annotations

import logging
import os
import time
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = [
    "ENVIRONMENT_VARIABLE",
    "MAX_ROWS",
    "MIN_GAIN",
    "MIN_WEIGHT_BYTES",
    "MODES",
    "SmallRowLinear",
    "calibrate",
    "linear_mode",
    "linear_weights",
    "mode",
    "set_mode",
    "transposed_linear",
]

MAX_ROWS = 8  # past it the transposed product stopped paying over SmolLM2's layers (bench/cpu_linear.py)
MIN_WEIGHT_BYTES = 128 * 2**20  # four times this machine's 32 MiB L3: weights stream from memory every forward
MIN_GAIN = 1.2  # the calibration's F.linear time over the transposed product's, below which the mode stays off
MODES = ("auto", "on", "off")
ENVIRONMENT_VARIABLE = "FASTSPEC_CPU_LINEAR"

log = logging.getLogger("fastspec")
_set_mode: str | None = None  # `set_mode`'s choice; None: the environment variable's
_DECISIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> bool ("auto": calibrated once)


def set_mode(value: str | None) -> None:
    """The CPU linear mode of this process (module docstring): "auto", "on" or "off"; None goes back to the
    environment variable ``FASTSPEC_CPU_LINEAR`` (default "auto"). Read when a `fastspec.generate` call builds its
    runners, so it applies from the next call on."""
    global _set_mode
    if value is not None and value not in MODES:
        raise ValueError(f"mode: one of 'auto', 'on', 'off' (or None: the environment variable), got {value!r}")
    _set_mode = value


def mode() -> str:
    """The CPU linear mode in force: `set_mode`'s, else ``FASTSPEC_CPU_LINEAR``'s, else "auto" (ValueError naming
    the variable for any other value)."""
    if _set_mode is not None:
        return _set_mode
    value = os.environ.get(ENVIRONMENT_VARIABLE, "").strip().lower() or "auto"
    if value not in MODES:
        raise ValueError(f"{ENVIRONMENT_VARIABLE}={value!r}: expected auto, on or off")
    return value


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` [..., N] of x [..., K] and weight [N, K] as ``(weight @ x^T)^T``; a single row
    is doubled first (as one row, the product is a matrix-vector product again). Contiguous output."""
    rows = x.numel() // x.shape[-1]
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        out = torch.mm(weight, flat.repeat(2, 1).t())[:, :1].t()
    else:
        out = torch.mm(weight, flat.t()).t()
    if bias is not None:
        out = out + bias
    return out.contiguous().view(*x.shape[:-1], weight.shape[0])


def _eligible_weight(weight) -> bool:
    """A plain float32 CPU tensor (not a DTensor or other subclass, not offloaded)."""
    return type(weight.data) is torch.Tensor and weight.device.type == "cpu" and weight.dtype == torch.float32


def _eligible(x, weight) -> bool:
    return (
        isinstance(x, torch.Tensor) and _eligible_weight(weight) and weight.dim() == 2
        and x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() >= 1
        and 0 < x.numel() <= MAX_ROWS * x.shape[-1] and not torch.is_autocast_enabled("cpu")
    )  # fmt: skip


class SmallRowLinear(TorchFunctionMode):
    """Routes eligible ``F.linear`` calls (float32 CPU, at most `MAX_ROWS` rows, no autocast) to `transposed_linear`;
    every other call runs as it would."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x = args[0] if args else kwargs.get("input")
            weight = args[1] if len(args) > 1 else kwargs.get("weight")
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if _eligible(x, weight):
                return transposed_linear(x, weight, bias)
        return func(*args, **kwargs)


def linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weights of ``model``'s linear layers that the mode can route: plain float32 CPU tensors."""
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and _eligible_weight(m.weight)]


@torch.no_grad()
def calibrate(weights: list[torch.Tensor], repeats: int = 3) -> float:
    """F.linear's time over the transposed product's for one pass of 2 rows through ``weights`` (best of
    ``repeats`` each, interleaved, after one pass of each). The inputs come from a generator of its own: torch's
    global random state is left as it was."""
    generator = torch.Generator().manual_seed(0)
    inputs = {w.shape[1]: torch.randn(2, w.shape[1], generator=generator) for w in weights}
    best = {F.linear: float("inf"), transposed_linear: float("inf")}
    for attempt in range(repeats + 1):
        for fn in best:
            start = time.perf_counter()
            for w in weights:
                fn(inputs[w.shape[1]], w)
            if attempt:
                best[fn] = min(best[fn], time.perf_counter() - start)
    return best[F.linear] / best[transposed_linear]


def linear_mode(model: torch.nn.Module) -> TorchFunctionMode | None:
    """The mode to run ``model``'s eager forwards under, or None (module docstring)."""
    chosen = mode()
    if chosen == "off":
        return None
    weights = linear_weights(model)
    size = sum(w.numel() * w.element_size() for w in weights)
    if size < MIN_WEIGHT_BYTES:
        return None
    if chosen == "on":
        return SmallRowLinear()
    if model not in _DECISIONS:
        gain = calibrate(weights)
        _DECISIONS[model] = gain >= MIN_GAIN
        log.info("fastspec: CPU linear mode %s for this %s: W @ x^T measured %.2fx F.linear over its %d MiB of linear "
                 "weights (on from %.2fx; %s=on or off, or fastspec.cpu_linear.set_mode, fixes it)",
                 "on" if _DECISIONS[model] else "off", type(model).__name__, gain, size // 2**20, MIN_GAIN,
                 ENVIRONMENT_VARIABLE)  # fmt: skip
    return SmallRowLinear() if _DECISIONS[model] else None
