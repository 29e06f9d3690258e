"""Linear layers of a few rows on CPU as ``W @ x^T`` where the machine's BLAS runs ``x @ W^T`` slowly.

A decoding step multiplies 1 to K + 1 rows (per batch row) by every weight matrix of the model, so on CPU a step of
a model too big for the caches is bound by how fast the weights stream from memory. ``torch.nn.functional.linear``
computes ``x @ W^T``, which some BLAS builds (MKL on this project's 2-core AMD EPYC) run for a few rows as one
matrix-vector product per row, at a fraction of the memory bandwidth the same product reaches written
``(W @ x^T)^T``, a matrix-matrix product. Transposed, verifying K drafts costs what the speculation's premise
assumes, about one token's forward (the measurements: docs/results.md, "Measurements behind the code's constants").

`linear_mode(model)` gives a `TorchFunctionMode` (thread-local, the model untouched) that routes the model's
``F.linear`` calls of at most `MAX_ROWS` rows in float32 on CPU to `transposed_linear`, or None where that does not pay:
models whose float32 linear weights total less than `MIN_WEIGHT_BYTES` (cache-resident: the mode's Python dispatch
outweighs the gain), other devices or dtypes, and machines where one timed pass over the model's own weights
(`_calibrate`, once per model and process) measured the transposed product less than `MIN_GAIN` faster. Results equal
``F.linear``'s up to float rounding (another summation order), like any change of BLAS kernel or of the number of rows
in a forward.
"""

from __future__ import annotations

import time
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["MAX_ROWS", "MIN_GAIN", "MIN_WEIGHT_BYTES", "linear_mode", "transposed_linear"]

MAX_ROWS = 8  # past it the transposed product stopped paying over SmolLM2's layers (bench/cpu_linear.py)
MIN_WEIGHT_BYTES = 128 * 2**20  # four times this machine's 32 MiB L3: weights stream from memory every forward
MIN_GAIN = 1.2  # the calibration's F.linear time over the transposed product's, below which the mode stays off

_DECISIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> bool (calibrated once)


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


class _SmallRowLinear(TorchFunctionMode):
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


def _linear_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear) and _eligible_weight(m.weight)]


@torch.no_grad()
def _calibrate(weights: list[torch.Tensor], repeats: int = 3) -> float:
    """F.linear's time over the transposed product's for one pass of 2 rows through ``weights`` (best of
    ``repeats`` each, interleaved, after one pass of each)."""
    inputs = {w.shape[1]: torch.randn(2, w.shape[1]) for w in weights}
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
    if model not in _DECISIONS:
        weights = _linear_weights(model)
        large = sum(w.numel() * w.element_size() for w in weights) >= MIN_WEIGHT_BYTES
        _DECISIONS[model] = large and _calibrate(weights) >= MIN_GAIN
    return _SmallRowLinear() if _DECISIONS[model] else None
