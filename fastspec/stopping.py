"""Stopping criteria of a speculative decoding call: transformers' `StoppingCriteriaList`, checked per emitted token.

transformers' `generate` appends one token per row and then asks its stopping criteria whether each row is done. A
speculation step emits up to K + 1 tokens per row, so `StopRules` splits HF's list by what each criterion reads:
- `MaxLengthCriteria` becomes the call's max_new_tokens and `EosTokenCriteria` its EOS ids: `fastspec.batch.RowBatch`
  cuts every row there, inside an accepted draft too;
- `MaxTimeCriteria` is checked between steps (a step that starts in time finishes; the tokens it emitted stay);
- every other criterion (`StopStringCriteria` from `stop_strings` + `tokenizer`, a user's `stopping_criteria`) is
  called once per emitted token with that token's sequence, `criterion(input_ids [n, T + g], scores)` for the n rows
  whose g-th new token it is (T the prompt width, left padding included, as HF's `input_ids`), so a row stops at the
  same token as under HF's loop; a stop inside an accepted draft cuts the row there, as EOS does. `scores` is None,
  or, with `output_scores=True`, a 1-tuple holding those rows' processed scores [n, V] of that token (HF passes the
  tuple of every step's scores so far).
Cost: nothing when there are no such criteria; else one call per distinct new-token index per step (K + 1 calls when
every row emits K + 1 tokens), each on a [n, T + g] slice of the device history.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

__all__ = ["StopRules"]


class StopRules:
    """HF stopping criteria split into what a speculative loop checks where (module docstring).

    Args:
        criteria: a `StoppingCriteriaList` (or list).
    """

    def __init__(self, criteria):
        self.max_length: int | None = None
        self.eos_ids: list[int] = []
        self.deadlines: list[float] = []  # time.time() values after which the call stops
        self.per_token = []
        for criterion in criteria:
            if type(criterion) is MaxLengthCriteria:
                self.max_length = min(criterion.max_length, self.max_length or criterion.max_length)
            elif type(criterion) is EosTokenCriteria:
                self.eos_ids += [int(i) for i in criterion.eos_token_id.reshape(-1).tolist()]
            elif type(criterion) is MaxTimeCriteria:
                self.deadlines.append(criterion.initial_timestamp + criterion.max_time)
            else:
                self.per_token.append(criterion)

    def time_is_up(self) -> bool:
        """Whether a `max_time` has passed (checked between steps)."""
        return bool(self.deadlines) and time.time() > min(self.deadlines)

    def first_stops(self, history: torch.Tensor, rows: list[int], before: list[int], new: list[int],
                    prompt_width: int, scores: Callable[[list[int], list[int]], tuple | None]
                    ) -> list[int | None]:  # fmt: skip
        """For each active row, the index (0-based, within this step's tokens) of the first new token after which a
        per-token criterion says stop, None if none does.

        Args:
            history: [B, W] device history: each row's prompt then every token it generated, this step's included.
            rows: original row of each active row; before: tokens each had generated before this step; new: tokens
                this step emits for it (already cut at EOS and max_new_tokens).
            scores: (batch positions, token indices) -> the `scores` argument of the criteria for them.
        """
        stops: list[int | None] = [None] * len(rows)
        if not self.per_token:
            return stops
        for g in sorted({b + i + 1 for b, n in zip(before, new, strict=True) for i in range(n)}):
            members = [i for i, (b, n) in enumerate(zip(before, new, strict=True))
                       if stops[i] is None and b < g <= b + n]  # fmt: skip
            if not members:
                continue
            index = torch.tensor([rows[i] for i in members], device=history.device)
            ids = history[index, : prompt_width + g]
            steps = [g - before[i] - 1 for i in members]
            done = torch.zeros(len(members), dtype=torch.bool, device=history.device)
            for criterion in self.per_token:
                done |= torch.as_tensor(criterion(ids, scores(members, steps)), device=history.device).bool()
            for i, hit in zip(members, done.tolist(), strict=True):
                if hit:
                    stops[i] = g - before[i] - 1
        return stops
