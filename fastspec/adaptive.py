"""Adaptive draft length (`num_draft_tokens="auto"`): pick K each step from measured acceptance and cost.

Leviathan et al. 2023 (arXiv 2211.17192, section 3.4) choose K to maximise the expected tokens per unit of
time. Here acceptance is tracked per row and per position (alpha_j = P(draft j accepted | drafts < j
accepted), an exponential moving average over the row's steps), so the expected tokens of a row's K-chain are

    E(K) = 1 + sum_{j=1..K} prod_{i<=j} alpha_i

and a step that drafts K tokens costs S_K, the measured wall time of a whole step with K drafts: drafting (a
fixed part, the draft catching up on the tokens the last step accepted, plus one draft forward per token), the
target forward over K + 1 positions per row (on a CPU, or with a large batch, nearly in proportion to the
tokens scored), verification and bookkeeping. S_K is tracked as a slowly rising floor of the measured times,
because timing noise on a shared machine only ever adds time; each new S_K moves every other measured one by
the same factor, so the curve keeps its shape while its level follows context length, batch width and load.
S_K of a K not measured yet is read off the line through the nearest measured ones, which carries the fixed
part of drafting as well as the per-token part.

One K serves the whole batch, and the call lasts until its slowest row is done, so K* minimises the expected
time until the last row finishes:

    K* = argmin_K S_K * max_rows remaining_tokens / E(K)

(with one row: argmax_K E(K) / S_K), over K = 0 too: a step that drafts nothing emits E(0) = 1 token for S_0, so a
draft that never pays for itself (measured) stops being run, and the call decodes plainly until the acceptance of
the positions it no longer drafts has relaxed far enough toward the prior to probe drafting again (slowly after a
plain step, so probing a useless draft costs a few per cent). A controller passed to successive calls keeps its
step costs and pooled acceptance (`DraftLengthController.new_call`), so only its first call explores.
Rows differ a lot (one row quoting its prompt accepts everything, another accepts nothing), and a K that suits the
pooled acceptance only speeds up rows that finish early anyway.
Row estimates are first shrunk toward the batch mean as far as they differ by noise alone (`_shrunk`), since the
max over rows of noisy estimates follows whichever row merely looks worst.

Drafts from different sources (a draft model or head, prompt lookup: `fastspec.drafters`) differ in both terms,
so each row's acceptance is tracked per source, and step costs per *kind* of step: the set of sources its rows
drafted from and the number of rows. A step where every row looked up its drafts runs no draft model: K = 8 costs
it little more than K = 1 (one wider target forward), so it should draft the most, while a step that runs the
draft model pays a forward per token. One cost curve for both would price lookup steps like model steps. Rows
leave a batch as they finish, and the last rows' steps cost less: a new row count starts from the nearest row
count's curve, leveled by its first timed step.

The first timed step of each kind drafts the most and the next one half as many, so two lengths are measured.
Steps in which a model reads the prompt are not timed: the target's prefill, and a draft's first forward, which
for a draft head comes on the second step (the first that has the target's features): a head's catch-up on a
long prompt makes that step look far slower than later ones, and a cost line through it would keep K short for
the rest of the call.
Each position's estimate is the EMA of its outcomes blended with a fallback by how much evidence it has
(`PositionAcceptance`): the prior for the first position, and for position j the estimate of position j - 1, since
position j is verified only after j - 1 drafts were accepted. A position that a step did not verify keeps its outcomes
but loses evidence slowly, drifting back toward its fallback: one unlucky rejection must not keep K below that position
for the rest of the call (an estimate only moves when the position is verified). A fixed prior for the deep positions
instead would keep them near the prior for as long as the first drafts fail, so a weak draft (a quarter of first drafts
accepted, the deeper ones rarely reached) looks worth several drafts a step (simulated with SmolLM2-135M's step costs in
tests/test_adaptive_streaming.py; the numbers: docs/results.md). The choice only changes how much is drafted, never how
drafts are verified, so the output stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["DraftLengthController", "FixedDraftLength", "PositionAcceptance"]


@dataclass
class PositionAcceptance:
    """One row's acceptance by draft position, for one draft source.

    mean[j]: the EMA-weighted mean of the outcomes (1 accepted, 0 rejected) of the verified drafts at position j;
    weight[j] in [0, 1]: its evidence, 1 - momentum^n after n verifications, multiplied by a relax factor after
    every step that did not verify position j."""

    mean: list[float]
    weight: list[float]

    @classmethod
    def empty(cls, positions: int) -> PositionAcceptance:
        return cls([0.0] * positions, [0.0] * positions)

    def estimates(self, prior: float) -> list[float]:
        """alpha_j per position: weight * mean + (1 - weight) * fallback, the fallback being `prior` for the first
        position and the estimate of position j - 1 for the others."""
        out, fallback = [], prior
        for mean, weight in zip(self.mean, self.weight, strict=True):
            fallback = weight * mean + (1 - weight) * fallback
            out.append(fallback)
        return out

    def observe(self, j: int, accepted: bool, momentum: float) -> None:
        """Position j was verified: fold its outcome into the mean with weight 1 - momentum."""
        weight = momentum * self.weight[j] + (1 - momentum)
        self.mean[j] = (momentum * self.weight[j] * self.mean[j] + (1 - momentum) * float(accepted)) / weight
        self.weight[j] = weight

    def forget(self, j: int, relax: float) -> None:
        """Position j was not verified this step: its evidence decays by `relax`."""
        self.weight[j] *= relax


class FixedDraftLength:
    """The draft length policy of a fixed `num_draft_tokens`: K (or tree depth) every step, capped by the caller."""

    def __init__(self, max_k: int):
        self.max_k = max_k

    def choose(self, cap: int, rows: list[int], remaining: list[int], sources: list[str] | None = None) -> int:
        """min(K, cap), at least 0."""
        return max(min(self.max_k, cap), 0)

    def update(self, rows: list[int], num_draft: torch.Tensor, num_accepted: torch.Tensor, seconds: float | None,
               sources: list[str] | None = None) -> None:  # fmt: skip
        """Nothing to learn."""


class DraftLengthController:
    """Chooses the chain length (or tree depth) per step; `update` feeds it what the last step measured.

    Rows are identified by ids that stay fixed while rows leave the batch; `sources` names where each row's
    drafts come from this step (default: all "draft").
    """

    def __init__(self, max_k: int = 8, prior: float = 0.8, momentum: float = 0.8, relax: float = 0.95,
                 drift: float = 0.05, probe_gain: float = 1.5, idle_relax: float = 0.99):  # fmt: skip
        self.max_k = max_k
        self.prior = prior
        self.acceptance: dict[tuple[int, str], PositionAcceptance] = {}  # per (row, source)
        self.start: dict[str, PositionAcceptance] = {}  # per source: a new row's estimates (`new_call`)
        self.momentum = momentum  # EMA weight of the old outcomes, for positions a step verified
        self.relax = relax  # evidence kept by positions a step did not verify
        self.idle_relax = idle_relax  # the same after a step that drafted nothing
        self.drift = drift
        self.step_time: dict[tuple[str, int], list[float | None]] = {}  # per step kind: seconds per step by K
        # kinds whose curve came from elsewhere (another row count, the last call): the next timed step sets its level
        self.unleveled: set[tuple[str, int]] = set()
        # below this many tokens per step (the slowest row's), a step kind whose K = 0 cost is unmeasured times one
        self.probe_gain = probe_gain

    @staticmethod
    def step_kind(sources: list[str]) -> tuple[str, int]:
        """The kind of a step whose rows draft from `sources` (one per active row): the set of sources and the
        number of rows, e.g. ("draft+lookup", 3)."""
        return "+".join(sorted(set(sources))), len(sources)

    def _times(self, kind: tuple[str, int]) -> list[float | None]:
        """S_K by K of a step kind. A kind seen for the first time starts from the curve of the same sources at the
        nearest row count, if any (its shape; its first timed step rescales it to its own level), else unmeasured:
        rows leave a batch as they finish, and a K first measured on the cheaper steps of the last rows would
        otherwise enter the curve of the full batch far below the lengths measured with every row (a controller kept
        over calls then drafted less than a fresh one at batch 4, and ran slower than fixed K=4: docs/results.md)."""
        if kind not in self.step_time:
            sources, rows = kind
            near = [(abs(r - rows), (s, r)) for s, r in self.step_time if s == sources]
            self.step_time[kind] = list(self.step_time[min(near)[1]]) if near else [None] * (self.max_k + 1)
            if near:
                self.unleveled.add(kind)
        return self.step_time[kind]

    def _measured(self, kind: tuple[str, int]) -> list[int]:
        return [k for k, t in enumerate(self._times(kind)) if t is not None]

    def _step_cost(self, kind: tuple[str, int], k: int) -> float:
        """S_k of a step kind: measured, else on the line through the two nearest measured K (interpolated
        between them, extrapolated beyond them with a slope clamped at >= 0; flat when only one K is measured)."""
        times = self._times(kind)
        if times[k] is not None:
            return times[k]
        measured = self._measured(kind)
        if len(measured) == 1:
            return times[measured[0]]  # flat (for K = 0 too: no cheaper step is known yet)
        below = [j for j in measured if j < k]
        above = [j for j in measured if j > k]
        if below and above:
            lo, hi = below[-1], above[0]
        else:
            lo, hi = below[-2:] if below else above[:2]
        slope = max((times[hi] - times[lo]) / (hi - lo), 0.0)
        estimate = max(times[lo] + slope * (k - lo), 0.0)
        if k == 0:  # a step that drafts nothing does less than any measured step (noise can hide that in the line)
            estimate = min([estimate, *(times[j] for j in measured)])
        return estimate

    def _row_acceptance(self, row: int, source: str) -> PositionAcceptance:
        if (row, source) not in self.acceptance:
            start = self.start.get(source, PositionAcceptance.empty(self.max_k))
            self.acceptance[row, source] = PositionAcceptance(list(start.mean), list(start.weight))
        return self.acceptance[row, source]

    def new_call(self) -> None:
        """Carry what this controller learned into a new `generate` call (pass the same controller as
        `num_draft_tokens` to each call): the step costs as they are (the call's first timed step of each kind
        rescales that kind's curve to its context and load), and every source's acceptance pooled over the last
        call's rows (the evidence-weighted mean per position, with the rows' mean evidence) as each new row's
        start. A short call then skips the exploration a fresh controller needs (two long drafts, then steps of
        falling K: with a useless draft on SmolLM2-135M, most of the extra time of a 32-token call)."""
        pooled: dict[str, list[PositionAcceptance]] = {}
        for (_, source), acceptance in self.acceptance.items():
            pooled.setdefault(source, []).append(acceptance)
        for source, rows in pooled.items():
            weights = [sum(column) for column in zip(*(a.weight for a in rows), strict=True)]
            means = [sum(a.weight[j] * a.mean[j] for a in rows) / w if w > 0 else 0.0 for j, w in enumerate(weights)]
            self.start[source] = PositionAcceptance(means, [w / len(rows) for w in weights])
        self.acceptance = {}
        self.unleveled = set(self.step_time)

    def alpha(self, row: int, source: str = "draft") -> list[float]:
        """The row's per-position acceptance estimates alpha_1..alpha_max_k for drafts from `source`."""
        return self._row_acceptance(row, source).estimates(self.prior)

    def choose(self, cap: int, rows: list[int], remaining: list[int], sources: list[str] | None = None) -> int:
        """Best K in [0, min(cap, max_k)] for the active `rows`, which still need `remaining` tokens each and draft
        from `sources` this step. K = 0 (no drafting: one token per step at the cost S_0 of a plain step) wins when
        no draft length pays for itself; S_0 is read off the cost line until a K = 0 step has been timed, and the
        positions not drafted lose evidence (the first drifts back toward the prior), so drafting is probed again
        now and then."""
        cap = min(cap, self.max_k)
        if cap < 1:
            return 0
        sources = sources or ["draft"] * len(rows)
        kind = self.step_kind(sources)
        measured = self._measured(kind)
        if not measured:
            return cap  # nothing measured yet: draft the most, which measures every position
        if len(measured) == 1 and measured[0] > 1:
            return min(cap, measured[0] // 2)  # a second length, so the cost of drafting more is known
        alphas = self._shrunk([self.alpha(row, source) for row, source in zip(rows, sources, strict=True)])
        expected, survive = [1.0] * len(rows), [1.0] * len(rows)
        best_k, best_time, best_steps = 0, max(remaining) * self._step_cost(kind, 0), max(remaining)
        for k in range(1, cap + 1):
            for i, alpha in enumerate(alphas):
                survive[i] *= alpha[k - 1]
                expected[i] += survive[i]
            steps = max(left / min(e, left) for left, e in zip(remaining, expected, strict=True))
            finish = steps * self._step_cost(kind, k)
            if finish < best_time:
                best_k, best_time, best_steps = k, finish, steps
        if best_k > 0 and self._times(kind)[0] is None and max(remaining) < self.probe_gain * best_steps:
            return 0  # drafting gains little, and a plain step's cost is only a guess: measure it once
        return best_k

    def _shrunk(self, alphas: list[list[float]]) -> list[list[float]]:
        """Per-row estimates pulled toward the batch mean by as much as they differ only by noise (empirical Bayes).

        K follows the row that needs the most steps, and the max over rows of noisy estimates is biased: when rows
        are alike (sampling at 0.7: every row accepts about as much), the row that merely looks worst would set
        K, too short for all (shorter than the pooled estimate at batch 4: docs/results.md). An EMA of
        0/1 outcomes has variance a(1 - a)(1 - momentum)/(1 + momentum); the spread across rows beyond that is
        real and kept (a row copying its prompt next to one that does not)."""
        if len(alphas) < 2:
            return alphas
        noise = (1 - self.momentum) / (1 + self.momentum)
        shrunk = [list(alpha) for alpha in alphas]
        for j in range(self.max_k):
            column = [alpha[j] for alpha in alphas]
            mean = sum(column) / len(column)
            spread = sum((a - mean) ** 2 for a in column) / (len(column) - 1)
            noise_var = mean * (1 - mean) * noise
            keep = max(spread - noise_var, 0.0) / spread if spread > 0 else 0.0
            for alpha, a in zip(shrunk, column, strict=True):
                alpha[j] = mean + keep * (a - mean)
        return shrunk

    def _record_step_time(self, kind: tuple[str, int], k: int, seconds: float) -> None:
        """Move S_k of `kind` to its new floor and every other measured S_j of that kind by the same factor: the
        level of the cost curve (context length, rows left in the batch, machine load) follows each step, its
        shape (what drafting and scoring more tokens cost) comes from lengths measured near each other in time.
        Otherwise a length measured during a slow phase would look expensive, and never be tried again, long
        after the phase ended.

        The floor ignores spikes: interference (other processes, a descheduled thread) only ever adds time, so
        one slow step must not steer K for the rest of the call, while a real slowdown lifts the floor by `drift`
        per step."""
        times = self._times(kind)
        old = times[k]
        leveled = kind not in self.unleveled
        self.unleveled.discard(kind)
        times[k] = min(seconds, old * (1 + self.drift)) if old is not None and leveled else seconds
        if old:
            scale = times[k] / old
            self.step_time[kind] = [t if t is None or j == k else t * scale for j, t in enumerate(times)]

    def update(self, rows: list[int], num_draft: torch.Tensor, num_accepted: torch.Tensor, seconds: float | None,
               sources: list[str] | None = None) -> None:  # fmt: skip
        """Record one step of `rows` (drafting from `sources`, as given to `choose`): num_draft [R] and
        num_accepted [R] (CPU) and the step's wall time, None for a step that is not timed: one in which a model
        read the prompt (the target's prefill, a draft head's first catch-up), which no later step resembles."""
        sources = sources or ["draft"] * len(rows)
        if seconds is not None:
            k = int(num_draft.max()) if num_draft.numel() else 0
            self._record_step_time(self.step_kind(sources), k, seconds)
        for row, source, drafted, accepted in zip(rows, sources, num_draft.tolist(), num_accepted.tolist(),
                                                  strict=True):  # fmt: skip
            acceptance = self._row_acceptance(row, source)
            verified = min(drafted, accepted + 1)
            for j in range(verified):
                acceptance.observe(j, accepted > j, self.momentum)
            # a plain step (K = 0) relaxes slowly: each probe of a draft that does not pay costs a share of a step
            relax = self.relax if drafted > 0 else self.idle_relax
            for j in range(verified, self.max_k):
                acceptance.forget(j, relax)
