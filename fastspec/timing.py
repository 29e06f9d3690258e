"""The timing harness of every benchmark (`fastspec bench`, bench/auto_vs_fixed.py, bench/long_run.py).

`measure` times one call: the device is synchronised before and after (CUDA kernels run asynchronously), and the
peak memory growth during the call is read from the kernel's high-water mark (`PeakRSS`). `interleave` runs
several methods on the same inputs: each method is warmed up untimed first, then every repeat runs the methods
back to back on each input (method A, B, C on input 1, then on input 2, ...), so slow phases of a noisy shared
machine hit them alike; `MethodTimes.tokens_per_s` is the median over repeats of (tokens / seconds), both summed
over the inputs of the repeat.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MethodTimes", "Measurement", "PeakRSS", "interleave", "measure", "synchronize"]


def synchronize(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PeakRSS:
    """Peak resident-set growth (bytes) of this process while the context is open; None where unmeasurable.

    On Linux the kernel's high-water mark of the resident set (VmHWM) is reset on entry (`/proc/self/clear_refs`)
    and read on exit, so nothing runs beside the timed code: a thread sampling the RSS every millisecond, used
    before, slowed fastspec's decoding loop on 2 cores by 10-12 %. On CUDA `torch.cuda.max_memory_allocated` is
    used instead (exact, per method). `base` is the resident set (or allocated CUDA memory) on entry, so
    `base + peak` is the absolute peak.
    """

    def __init__(self, device: str):
        self.device = device
        self.base: int | None = None
        self.peak: int | None = None

    @staticmethod
    def _status_bytes(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        try:
            self.base = self._status_bytes("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
        except (OSError, StopIteration):  # not Linux, or not allowed
            self.base = None
        return self

    def __exit__(self, *exc):
        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated() - self.base
        elif self.base is not None:
            self.peak = self._status_bytes("VmHWM") - self.base


@dataclass
class Measurement:
    """One timed call: what it returned, its wall time, and memory (bytes; None where unmeasurable)."""

    result: Any
    seconds: float
    peak_bytes: int | None  # growth during the call
    base_bytes: int | None  # resident (CUDA: allocated) on entry


def measure(fn: Callable[[], Any], device: str = "cpu") -> Measurement:
    """Call `fn()` once, timed between device synchronisations, with its peak memory growth (`PeakRSS`)."""
    with PeakRSS(device) as mem:
        synchronize(device)
        start = time.perf_counter()
        result = fn()
        synchronize(device)
        seconds = time.perf_counter() - start
    return Measurement(result, seconds, mem.peak, mem.base)


@dataclass
class MethodTimes:
    """One method's timed calls in `interleave`: seconds and new tokens per repeat, summed over the inputs."""

    seconds: list[float]
    tokens: list[int]
    peak_bytes: int | None = None  # the largest growth of any call; None where unmeasurable

    @property
    def rates(self) -> list[float]:
        """Tokens per second of each repeat."""
        return [t / s for t, s in zip(self.tokens, self.seconds, strict=True)]

    @property
    def tokens_per_s(self) -> float:
        """Median over repeats of tokens per second."""
        return statistics.median(self.rates)


def interleave(
    methods: Mapping[str, Callable[[Any, int], Any]],
    inputs: Sequence[Any],
    count_tokens: Callable[[Any, Any], int],
    *,
    repeats: int,
    device: str = "cpu",
    warmup: int = 1,
    seed_stride: int = 1000,
    on_result: Callable[[str, int, int, Any], Any] | None = None,
    progress: Callable[[], Any] | None = None,
) -> dict[str, MethodTimes]:
    """Time every method on every input, interleaved, `repeats` times after `warmup` untimed calls each.

    `methods[name](x, seed)` decodes input `x`; `count_tokens(result, x)` says how many new tokens it made.
    Before each call `torch.manual_seed(seed)` is set (outside the timed span), `seed = seed_stride * repeat +
    index of x` (warm-up: seed 0), and passed on, so every method sees the same random state for the same input
    and repeat. Warm-up calls run on `inputs[0]`. After each timed call `on_result(name, repeat, index, result)`
    gets the result (nothing is kept here: what a call leaves allocated would change the next call's peak
    memory), then `progress()` is called.
    """
    if repeats < 1 or not inputs:
        raise ValueError(f"interleave needs repeats >= 1 and at least one input (got {repeats}, {len(inputs)})")
    for fn in methods.values():
        for _ in range(warmup):
            torch.manual_seed(0)
            fn(inputs[0], 0)
            synchronize(device)
    out = {name: MethodTimes([0.0] * repeats, [0] * repeats) for name in methods}
    for rep in range(repeats):
        for i, x in enumerate(inputs):
            seed = seed_stride * rep + i
            for name, fn in methods.items():
                torch.manual_seed(seed)
                m = measure(lambda fn=fn, x=x, seed=seed: fn(x, seed), device)
                times = out[name]
                times.seconds[rep] += m.seconds
                times.tokens[rep] += count_tokens(m.result, x)
                if on_result is not None:
                    on_result(name, rep, i, m.result)
                times.peak_bytes = None if m.peak_bytes is None else max(times.peak_bytes or 0, m.peak_bytes)
                if progress is not None:
                    progress()
    return out
