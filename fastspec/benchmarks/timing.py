"""The timing harness of every benchmark (`fastspec bench`, its suite, and the scripts in bench/).

Benchmarks only: the decoding loop times its own steps for adaptive K (`fastspec.adaptive`) and uses none of this.

`measure` times one call: the device is synchronised before and after (CUDA kernels run asynchronously), and the
peak memory growth during the call is read from the kernel's high-water mark (`PeakRSS`). `interleave` runs
several methods on the same inputs: each method is warmed up untimed first, then every repeat runs the methods
back to back on each input (method A, B, C on input 1, then on input 2, ...), so slow phases of a noisy shared
machine hit them alike; `MethodTimes.tokens_per_s` is the median over repeats of (tokens / seconds), both summed
over the inputs of the repeat. A KeyboardInterrupt inside `interleave` is raised again as `Interrupted`, which
carries the repeats every method finished. `Progress` is the benchmarks' progress line on stderr: done/total,
elapsed time and an estimate of the time left, warm-ups included, from the first line on.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Interrupted", "MethodTimes", "Measurement", "PeakRSS", "Progress", "format_duration", "interleave", "measure",
    "synchronize",
]  # fmt: skip


def synchronize(device: str) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class PeakRSS:
    """Peak resident-set growth (bytes) of this process while the context is open; None where unmeasurable.

    On Linux the kernel's high-water mark of the resident set (VmHWM) is reset on entry (`/proc/self/clear_refs`)
    and read on exit, so nothing runs beside the timed code (a thread sampling the RSS, used before, slowed the
    decoding it measured: docs/results.md). On CUDA `torch.cuda.max_memory_allocated` is
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
    progress: Callable[[str], Any] | None = None,
    on_warmup: Callable[[str], Any] | None = None,
) -> dict[str, MethodTimes]:
    """Time every method on every input, interleaved, `repeats` times after `warmup` untimed calls each.

    `methods[name](x, seed)` decodes input `x`; `count_tokens(result, x)` says how many new tokens it made.
    Before each call `torch.manual_seed(seed)` is set (outside the timed span), `seed = seed_stride * repeat +
    index of x` (warm-up: seed 0), and passed on, so every method sees the same random state for the same input
    and repeat. Warm-up calls run on `inputs[0]`. After each timed call `on_result(name, repeat, index, result)`
    gets the result (nothing is kept here: what a call leaves allocated would change the next call's peak
    memory), then `progress(name)` is called; `on_warmup(name)` is called after each warm-up call.

    A KeyboardInterrupt (Ctrl-C) is raised again as `Interrupted`, whose `times` hold the repeats that every
    method finished (none when it came during the warm-up or the first repeat).
    """
    if repeats < 1 or not inputs:
        raise ValueError(f"interleave needs repeats >= 1 and at least one input (got {repeats}, {len(inputs)})")
    out = {name: MethodTimes([0.0] * repeats, [0] * repeats) for name in methods}
    rep = 0
    try:
        for name, fn in methods.items():
            for _ in range(warmup):
                torch.manual_seed(0)
                fn(inputs[0], 0)
                synchronize(device)
                if on_warmup is not None:
                    on_warmup(name)
        for rep in range(repeats):
            _repeat(methods, inputs, count_tokens, rep, out, device, seed_stride, on_result, progress)
    except KeyboardInterrupt as exc:
        done = {name: MethodTimes(t.seconds[:rep], t.tokens[:rep], t.peak_bytes) for name, t in out.items()}
        raise Interrupted(done, rep) from exc
    return out


class Interrupted(KeyboardInterrupt):
    """A KeyboardInterrupt inside `interleave`: `times` holds each method's finished repeats (`repeats_done` of
    them; their `MethodTimes` lists are that long), so a caller can still report what was measured."""

    def __init__(self, times: dict[str, MethodTimes], repeats_done: int):
        super().__init__(f"interrupted after {repeats_done} finished repeats")
        self.times = times
        self.repeats_done = repeats_done


def _repeat(methods, inputs, count_tokens, rep, out, device, seed_stride, on_result, progress) -> None:
    """One repeat of `interleave`: every method on every input, interleaved per input."""
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
                progress(name)


def format_duration(seconds: float) -> str:
    """`m:ss` under an hour, `h:mm:ss` from an hour on (rounded to the second; negative reads as 0:00)."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """A progress line on stderr: `desc: done/total calls, elapsed m:ss, about m:ss left (note)`.

    Every call has a weight, its expected cost (`fastspec bench` weighs a call by the tokens it generates, so a
    batch-4 call counts as four batch-1 calls), and a key, the method it belongs to: `totals` maps each key to the
    weight of all its calls (a number: one key for every call). The time left is each key's remaining weight at
    that key's own pace so far (seconds per unit of weight over its finished calls), or, for a key with no finished
    call yet, at the pace of every finished call. Warm-up calls count like any other: they come first and cost
    more than the timed calls after them, so the estimate is shown from the first line on and shrinks, rather
    than grows, as the run goes. On a terminal the line is rewritten in place at most every `interval` seconds;
    elsewhere (a log file) a new line is written at most every `log_interval` seconds.
    """

    def __init__(
        self,
        totals: float | Mapping[Any, float],
        total_steps: int,
        desc: str = "",
        *,
        stream=None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.5,
        log_interval: float = 15.0,
    ):
        self.totals = dict(totals) if isinstance(totals, Mapping) else {None: float(totals)}
        self.total_steps, self.desc = total_steps, desc
        self.stream = sys.stderr if stream is None else stream
        self.clock = clock
        self.start = self.last = clock()
        self.done = {}  # key -> [weight, seconds] of its finished calls
        self.done_steps = 0
        self.note = ""
        try:
            self.tty = self.stream.isatty()
        except (AttributeError, ValueError):
            self.tty = False
        self.interval = interval if self.tty else log_interval
        self.shown, self.shown_steps = None, 0  # when the line was last written, at how many steps
        self.closed = False

    def elapsed(self) -> float:
        return self.clock() - self.start

    def remaining(self) -> float | None:
        """Estimated seconds left (class docstring); None before the first finished call."""
        weight = sum(w for w, _ in self.done.values())
        if weight <= 0:
            return None
        pace = sum(s for _, s in self.done.values()) / weight
        left = 0.0
        for key, total in self.totals.items():
            done, seconds = self.done.get(key, (0.0, 0.0))
            left += max(total - done, 0.0) * (seconds / done if done > 0 else pace)
        return left

    def text(self) -> str:
        left = self.remaining()
        if self.done_steps >= self.total_steps:
            eta = "done"
        else:
            eta = "estimating the time left" if left is None else f"about {format_duration(left)} left"
        note = f" ({self.note})" if self.note else ""
        return (
            f"{self.desc}: {self.done_steps}/{self.total_steps} calls, {format_duration(self.elapsed())} elapsed, "
            f"{eta}{note}"
        )

    def step(self, weight: float = 1.0, key: Any = None) -> None:
        """One call of `key` (of weight `weight`) finished: its time is the time since the last step."""
        now = self.clock()
        done = self.done.setdefault(key, [0.0, 0.0])
        done[0] += weight
        done[1] += now - self.last
        self.last = now
        self.done_steps += 1
        if self.shown is None or now - self.shown >= self.interval or self.done_steps == self.total_steps:
            self.show()

    def show(self) -> None:
        self.shown, self.shown_steps = self.clock(), self.done_steps
        self.stream.write(("\r\033[K" if self.tty else "") + self.text() + ("" if self.tty else "\n"))
        self.stream.flush()

    def close(self) -> None:
        """Write the line a last time (unless it is up to date) and end it."""
        if self.closed:
            return
        self.closed = True
        if self.shown is None or self.shown_steps != self.done_steps:
            self.show()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
