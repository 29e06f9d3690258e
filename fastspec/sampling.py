"""`Sampler`: the sampling settings and random streams of one generate call, shared by the draft and the verifier.

The transform itself (temperature, then top-k, then top-p, then min-p) lives once in `fastspec.kernels.sampling`,
where the reference and the kernels use it too. The call's logits processors (`fastspec.processors.LogitsPipeline`:
repetition penalty, minimum length, a user's processors, ...) run on the target's logits at every scored position
before verification (`process`); what of them the kernel fuses is its transform (`verify_sampling`). Drafts are
drawn with the call's temperature / top-k / top-p / min-p on the draft's own logits: any q the draft token was really
drawn from keeps verification lossless (a q closer to the processed p is only accepted more often).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from fastspec.kernels.sampling import sampling_probs
from fastspec.prefixes import PositionPrefixes
from fastspec.processors import KernelSampling, LogitsPipeline
from fastspec.rng import ACCEPT, DRAFT, RESIDUAL, RowRandom

__all__ = ["Sampler"]


@dataclass
class Sampler:
    """The sampling settings of one generate call, shared by the draft and the verifier.

    Every random draw (draft sampling, acceptance coins, residual noise) comes from `rng`, keyed by the row's
    seed and its token counter, fixed per step by `for_step` (a copy: nothing is mutated). Greedy decoding
    (do_sample=False) is temperature 0 for the verifier and argmax for drafts.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    rng: RowRandom | None = None
    rows: torch.Tensor | None = None  # [R] original row of each active row, this step
    counter: torch.Tensor | None = None  # [R] tokens each row had generated when this step began
    min_p: float | None = None
    pipeline: LogitsPipeline | None = None  # the call's logits processors; None: none

    def verify_sampling(self) -> KernelSampling:
        """The verification kernel's transform: the pipeline's fused warpers, or this sampler's own settings."""
        if self.pipeline is not None:
            return self.pipeline.kernel
        return KernelSampling(self.verify_temperature, self.top_k, self.top_p, self.min_p)

    def process(self, logits: torch.Tensor, prefixes: Callable[[], PositionPrefixes]) -> torch.Tensor:
        """Target logits [R, P, V] after the call's processors (the same tensor when none runs); `prefixes` builds
        the positions' prefixes, only when a processor reads them."""
        if self.pipeline is None or not self.pipeline.active:
            return logits
        return self.pipeline.apply(logits, prefixes(), self.rows.to(logits.device))

    @property
    def verify_temperature(self) -> float:
        """Temperature handed to the verifier: 0 marks greedy rows."""
        return self.temperature if self.do_sample else 0.0

    def for_step(self, rows: torch.Tensor, counter: torch.Tensor) -> Sampler:
        """This sampler keyed for one step: rows [R] (original indices) and the tokens each had generated [R]."""
        return replace(self, rows=rows, counter=counter)

    def draft(self, logits: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Draw draft token `position` of this step from logits [R, V]: (tokens [R], probs q [R, V] or None).

        Sampling is an exponential race argmax_v q_v / E_v, E ~ Exp(1), which draws v with probability q_v.
        """
        if not self.do_sample:
            return logits.argmax(-1), None
        probs = sampling_probs(logits, self.temperature, self.top_k, self.top_p, self.min_p)
        noise = self.rng.exponential(self.rows, self.counter, (DRAFT << 16) + position, probs.shape[-1])
        return (probs / noise).argmax(-1), probs

    def verify_randomness(self, num_coins: int, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Acceptance uniforms [R, num_coins] in (0, 1] (one per draft token or tree node) and residual noise [R, V]
        for verifying target logits [R, *, V]. Greedy rows ignore both: ones, without drawing [R, V] noise."""
        rows, vocab = logits.shape[0], logits.shape[-1]
        if not self.do_sample:
            return logits.new_ones(rows, num_coins), logits.new_ones(rows, vocab)
        uniforms = self.rng.uniform(self.rows, self.counter, ACCEPT, num_coins).to(logits.device)
        return uniforms, self.rng.exponential(self.rows, self.counter, RESIDUAL, vocab).to(logits.device)
