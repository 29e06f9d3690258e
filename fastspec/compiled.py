"""`CompiledForward`: a model's forward compiled for the fixed shapes of decoding steps over a static KV cache.

With `fastspec.static_cache.StaticKVCache` a forward's shapes are (rows, new tokens) and the capacity, never the
context length, so a step compiles once per (rows, width, capacity) and is reused for the whole call and by later
calls in the process. Capacities are rounded up to multiples of `CAPACITY_STEP` (`static_capacity`), so calls with
prompts of different lengths share graphs. Widths are bucketed (`WIDTHS`: 1, 2, then 2**i + 1, which are K + 1 for
K = 2, 4, 8, ... and the sizes of the named trees): a step of n new tokens is padded to the next bucket
(`CachedModel._run_static`), so adaptive K and tree levels of varying size reuse a handful of graphs. The prefill
and wider forwards run eagerly.

On CUDA the compiled step is captured in a CUDA graph (torch.compile mode "reduce-overhead", as gpt-fast does);
on CPU it is an Inductor graph (fused C++ kernels, no Python per op). The first call of each shape compiles, says
so in a log line (logger "fastspec") and adds one to `compile_count`; a model or shape that fails to compile falls
back to eager decoding with a warning, and the output is the same either way (greedy output equals the eager path in
fp32; in bf16 the fused kernels may round differently, as any change of kernels may).
"""

from __future__ import annotations

import logging
import time
import warnings
import weakref

import torch

__all__ = ["WIDTHS", "CompiledForward", "compile_count"]

log = logging.getLogger("fastspec")

WIDTHS = (1, 2, 3, 5, 9, 17, 33, 65)
CAPACITY_STEP = 256
# model -> {step name: (compiled step, the (rows, width, cache positions) shapes it has compiled)}: once per process
_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_compiles = 0  # step shapes compiled in this process (`compile_count`)


def compile_count() -> int:
    """How many step shapes `CompiledForward` has compiled in this process (a failed compile included): compared
    before and after a call, it says whether the call compiled."""
    return _compiles


def _compiled_step(model: torch.nn.Module, key: str, step, device: torch.device) -> tuple:
    steps = _COMPILED.setdefault(model, {})
    if key not in steps:
        # one graph per (rows, width, capacity) and model, and the steps of a target and its draft model share one
        # code object: allow far more than the default 8 (past the limit dynamo falls back to eager, silently)
        config = torch._dynamo.config
        name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
        setattr(config, name, max(getattr(config, name), 256))
        if hasattr(config, "accumulated_recompile_limit"):
            config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, 1024)
        mode = "reduce-overhead" if device.type == "cuda" else None
        steps[key] = (torch.compile(step, mode=mode, dynamic=False), set())
    return steps[key]


def static_capacity(positions: int) -> int:
    """The capacity of a call's static caches: `positions` rounded up to a multiple of `CAPACITY_STEP`. Attention
    reads every cache column, so the capacity is part of each compiled shape; rounding lets calls whose prompts
    differ in length (up to 256 positions apart) share their graphs instead of compiling again."""
    return -(-positions // CAPACITY_STEP) * CAPACITY_STEP


class CompiledForward:
    """`step(**inputs)`, a step of `model` (its logits, or logits and features, or a draft head's `step`), through
    torch.compile for the widths in `WIDTHS`; eager for other widths, or for good after a failed compile (with a
    warning). `inputs` holds `input_ids` [rows, width]. A step is compiled once per (model, `key`) and process."""

    def __init__(self, model: torch.nn.Module, name: str, step, key: str):
        self.name = name
        self.eager = step
        device = next(model.parameters()).device
        self.fn, self.shapes = _compiled_step(model, key, step, device)

    @staticmethod
    def width(num: int) -> int:
        """The bucket a forward of `num` new tokens is padded to (`num` itself above the widest bucket)."""
        return next((w for w in WIDTHS if w >= num), num)

    def __call__(self, inputs: dict):
        rows, width = inputs["input_ids"].shape
        if self.fn is None or width not in WIDTHS:
            return self.eager(**inputs)
        mask = inputs["attention_mask"]  # one 4D mask, or one per layer kind (`fastspec.masks`)
        columns = next(iter(mask.values())).shape[-1] if isinstance(mask, dict) else mask.shape[-1]  # the capacity
        first = (rows, width, columns) not in self.shapes
        if first:
            global _compiles
            _compiles += 1
            log.warning("fastspec: compiling the %s's %d-token step for %d rows over %d cache positions (once per "
                        "shape and process)", self.name, width, rows, columns)  # fmt: skip
            start = time.perf_counter()
        try:
            out = self.fn(**inputs)
        except Exception as error:  # noqa: BLE001 - any compiler failure means: decode eagerly
            warnings.warn(f"fastspec: torch.compile failed for the {self.name} ({type(error).__name__}: {error}); "
                          "decoding eagerly", RuntimeWarning, stacklevel=2)  # fmt: skip
            self.fn = None
            return self.eager(**inputs)
        if first:
            self.shapes.add((rows, width, columns))
            log.warning("fastspec: %s step ready in %.1f s", self.name, time.perf_counter() - start)
        return out
