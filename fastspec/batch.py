"""`RowBatch`: the rows of one generate call that are still decoding, and every KV cache laid out like them.

The rows share one token buffer `tokens [R, S]` with an attention mask `[R, S]`, right-aligned: left padding,
so every row's newest token sits in the last column. A step (`fastspec.speculators`) proposes, scores and
verifies drafts and returns a `StepResult`; `commit` then
1. emits each row's accepted drafts and recovered / bonus token, cut at EOS, at max_new_tokens and at the first token
   after which a per-token stopping criterion says stop (`fastspec.stopping`; even inside a draft), into the
   host-side outputs (and the streamer, and the `scores` / `logits` outputs, `fastspec.outputs`). As in HF's loop,
   a row stopped by a criterion is padded only when the call has EOS ids; without them it keeps generating until
   every row has stopped, and the output ends at the last row's stop;
2. appends them to the buffer and shifts rows that accepted fewer than the best row right (more left padding), so
   all rows end at the same column;
3. compacts every cache to the entries the step kept (`KeptPositions`), moved right by the same shifts;
4. drops finished rows, and leading columns that are padding in every remaining row, from the buffer and caches.

Batch cost of step 2: when rows disagree, one gather over each KV cache per step, and the padding of a row grows
by the tokens it fell behind (attention over those columns is masked, but computed) until every row has it
(step 4). With batch 1, or when all rows accept the same count, it is a plain crop.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from fastspec.cache import right_align_index
from fastspec.layout import KeptPositions
from fastspec.outputs import ScoreRecorder
from fastspec.prefixes import FILL
from fastspec.runner import BufferCache
from fastspec.stopping import StopRules

__all__ = ["RowBatch", "StepOutcome", "StepResult", "left_padded"]


class StepResult(NamedTuple):
    """What one speculation step produced for the R rows of the batch (device tensors)."""

    out: torch.Tensor  # [R, D+1] int64: accepted drafts, then the recovered or bonus token, padded with -1
    num_accepted: torch.Tensor  # [R] int64 accepted drafts per row
    num_draft: torch.Tensor | None  # [R] drafts per row (tree: each row's tree depth); None: every row has D
    num_nodes: torch.Tensor | None  # [R] draft nodes per row (tree speculation), None for a chain
    kept: list[tuple[BufferCache, KeptPositions]]  # the cache entries each model keeps
    sources: list[str] | None = None  # per row, where its drafts came from (for adaptive K)
    read_prompt: bool = False  # a model read the prompt in this step (not timed for adaptive K)
    logits: torch.Tensor | None = None  # [R, P, V] the logits verified (processed), for outputs and stop criteria
    raw_logits: torch.Tensor | None = None  # [R, P, V] the target's logits before any processor
    path: torch.Tensor | None = None  # [R, D] a tree's accepted nodes (`verify_tree`'s accept_index); None: a chain


class StepOutcome(NamedTuple):
    """A committed step, on the host: what the stats and the draft-length policy learn from."""

    rows: list[int]  # original row of each row that took part
    num_draft: torch.Tensor  # [R] int64
    num_accepted: torch.Tensor  # [R] int64
    num_nodes: torch.Tensor | None  # [R] int64 or None
    emitted: int  # tokens appended to the outputs, summed over rows
    done: bool  # every row finished


class RowBatch:
    """The active rows: token buffer, attention mask, per-row padding and outputs, and the caches that mirror them.

    Args:
        input_ids: [B, T] prompts, left-padded; attention_mask: [B, T] or None (no padding).
        max_new_tokens: tokens each row generates at most; eos_ids: tokens that end a row; pad: output padding id.
        caches: every `BufferCache` whose stores covers a prefix of the buffer's columns (target and drafts).
        streamer: `put(tensor)` / `end()` object (batch 1), or None.
        history: keep `history` [B, T + max_new_tokens + 1] on the buffer's device, every row's prompt as given (left
            padding included) then its generated tokens (what logits processors and stopping criteria read).
        stop: the call's per-token stopping criteria (`fastspec.stopping.StopRules`; needs `history`), or None.
        recorder: collects `scores` / `logits` outputs, or None.
    """

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, max_new_tokens: int,
                 eos_ids: list[int], pad: int, caches: list[BufferCache], streamer=None, history: bool = False,
                 stop: StopRules | None = None, recorder: ScoreRecorder | None = None):  # fmt: skip
        batch = input_ids.shape[0]
        self.input_ids = input_ids
        self.prompt_width = input_ids.shape[1]
        self.history = None
        if history or (stop is not None and stop.per_token):
            self.history = torch.full((batch, self.prompt_width + max_new_tokens + 1), FILL, dtype=torch.long,
                                      device=input_ids.device)  # fmt: skip
            self.history[:, : self.prompt_width] = input_ids
        self.stop = stop
        self.recorder = recorder
        self.tokens = input_ids
        self.mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
        self.max_new_tokens = max_new_tokens
        self.limits = [max_new_tokens] * batch  # tokens each row may generate (lowered once every row stopped)
        self.stopped_at: list[int | None] = [None] * batch  # tokens a row had when a criterion stopped it (no EOS)
        self.eos = set(eos_ids)
        self.caches = caches
        self.streamer = streamer
        self.outputs = torch.full((batch, max_new_tokens), pad, dtype=torch.long)  # host-side, written per step
        self.counts = [0] * batch  # tokens generated per original row
        self.rows = list(range(batch))  # original row of each buffer row
        self.padding = (self.mask.cumsum(dim=1) == 0).sum(dim=1).tolist()  # leading padding columns per row
        self.steps = 0  # committed steps
        if streamer is not None:
            streamer.put(input_ids.cpu())

    def remaining(self) -> list[int]:
        """Tokens each active row may still generate."""
        return [self.limits[r] - self.counts[r] for r in self.rows]

    def prefix_history(self, rows: torch.Tensor, counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(history [R, W], its length T + generated [R]) of original rows `rows` [R] that have generated `counter`
        [R] tokens (`sampling_keys`): what the prefixes of this step's positions start with."""
        width = self.prompt_width + max(self.counts[row] for row in self.rows)  # the columns any prefix reads
        return self.history[rows, :width], self.prompt_width + counter

    def sampling_keys(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(original rows [R], tokens each has generated [R]) on the buffer's device: what keys this step's draws."""
        device = self.tokens.device
        return torch.tensor(self.rows, device=device), torch.tensor([self.counts[r] for r in self.rows], device=device)

    def commit(self, step: StepResult) -> StepOutcome:
        """Emit the step's tokens, then relayout the buffer and every cache (module docstring, steps 1-4)."""
        out_host, accepted_host = step.out.cpu(), step.num_accepted.cpu()
        num_draft = torch.full_like(accepted_host, step.out.shape[1] - 1) if step.num_draft is None else step.num_draft
        rows = self.rows
        if self.history is not None:
            self._record(step)
        if self.recorder is not None:
            self.recorder.step(step.logits, step.raw_logits, step.path)
        finished, emitted = self._emit(out_host, accepted_host)
        done = all(finished)
        if not done:
            self._append(step, accepted_host)
            self._drop(finished)
        self.steps += 1
        num_nodes = None if step.num_nodes is None else step.num_nodes.cpu()
        return StepOutcome(rows, num_draft.cpu(), accepted_host, num_nodes, emitted, done)

    def finish(self) -> torch.Tensor:
        """End the streamer; return [B, T + new] prompts and outputs (new = the longest row's output; shorter rows
        padded with the pad id)."""
        if self.streamer is not None:
            self.streamer.end()
        new = max(self.counts)
        return torch.cat([self.input_ids, self.outputs[:, :new].to(self.input_ids.device)], dim=1)

    def _record(self, step: StepResult) -> None:
        """Write each active row's step tokens (uncut) after its generated ones in `history`, on the device; tokens
        past max_new_tokens go to the spare last column."""
        device = self.history.device
        out = step.out.to(device)
        rows, counter = self.sampling_keys()
        spare = self.history.shape[1] - 1
        offsets = torch.arange(out.shape[1], device=device)
        columns = self.prompt_width + counter[:, None] + offsets
        valid = (offsets[None, :] <= step.num_accepted.to(device)[:, None]) & (columns < spare)
        self.history[rows[:, None].expand_as(columns), torch.where(valid, columns, spare)] = out

    def _emit(self, out: torch.Tensor, num_accepted: torch.Tensor) -> tuple[list[bool], int]:
        """Host bookkeeping of at most D+1 tokens per row, cut at EOS, max_new_tokens and the per-token stopping
        criteria: (finished [R], emitted)."""
        news, hits = [], []
        for i, row in enumerate(self.rows):
            new = out[i, : int(num_accepted[i]) + 1].tolist()[: self.limits[row] - self.counts[row]]
            hit = next((j for j, t in enumerate(new) if t in self.eos), None)
            news.append(new if hit is None else new[: hit + 1])
            hits.append(hit is not None)
        if self.stop is not None and self.stop.per_token:
            self._stop_rows(news, hits)
        finished, emitted = [], 0
        for i, (row, new) in enumerate(zip(self.rows, news, strict=True)):
            self.outputs[row, self.counts[row] : self.counts[row] + len(new)] = torch.tensor(new, dtype=torch.long)
            if self.recorder is not None:
                self.recorder.emitted(i, row, len(new))
            self.counts[row] += len(new)
            emitted += len(new)
            finished.append(hits[i] or self.counts[row] >= self.limits[row])
            if self.streamer is not None:
                self.streamer.put(torch.tensor(new))
        return finished, emitted

    def _stop_rows(self, news: list[list[int]], hits: list[bool]) -> None:
        """Apply the per-token stopping criteria to this step's tokens `news` (cut at EOS already). With EOS ids a
        stopped row is cut and finishes (`hits`), as HF pads finished rows then; without them HF keeps generating a
        stopped row, so it goes on until every row of the call has stopped, and then every row ends at the last
        stop."""
        before = [self.counts[row] for row in self.rows]
        checked = [0 if self.stopped_at[row] is not None else len(n) for row, n in zip(self.rows, news, strict=True)]
        scores = self.recorder.stop_scores if self.recorder is not None else lambda members, steps: None
        stops = self.stop.first_stops(self.history, self.rows, before, checked, self.prompt_width, scores)
        for i, stop in enumerate(stops):
            if stop is None:
                continue
            if self.eos:
                news[i], hits[i] = news[i][: stop + 1], True
            else:
                self.stopped_at[self.rows[i]] = before[i] + stop + 1
        if not self.eos and all(at is not None for at in self.stopped_at):
            # rows that stopped early kept going, some past the last stop: every row ends there
            last = max(self.stopped_at)
            self.limits = [last] * len(self.limits)
            self.counts = [min(count, last) for count in self.counts]
            for i in range(len(news)):
                news[i] = news[i][: max(last - before[i], 0)]

    def _append(self, step: StepResult, accepted_host: torch.Tensor) -> None:
        """Append the emitted tokens, right-align rows that accepted fewer than the best row, compact the caches."""
        # the verifier ran where the logits are (a device-mapped target's last device): back to the buffer's
        out, width = step.out.to(self.tokens.device), self.tokens.shape[1]
        most = int(accepted_host.max()) + 1
        shift = most - (step.num_accepted.to(self.tokens.device) + 1)
        self.tokens = torch.cat([self.tokens, out[:, :most].clamp_min(0)], dim=1)
        self.mask = torch.cat([self.mask, (out[:, :most] >= 0).to(self.mask.dtype)], dim=1)
        self.padding = [p + most - 1 - int(a) for p, a in zip(self.padding, accepted_host, strict=True)]
        shifted = bool((accepted_host != accepted_host.max()).any())
        if shifted:
            index = right_align_index(width + most, shift)
            shifted_in = torch.arange(width + most, device=shift.device)[None, :] < shift[:, None]
            self.tokens = self.tokens.gather(1, index)
            self.mask = self.mask.gather(1, index).masked_fill(shifted_in, 0)
        for cache, kept in step.kept:
            cache.keep(kept, shift, shifted)

    def _drop(self, finished: list[bool]) -> None:
        """Finished rows leave the batch; then columns that are padding in every row (no row attends to them)."""
        if any(finished):
            keep = torch.tensor([i for i, f in enumerate(finished) if not f], device=self.tokens.device)
            self.tokens, self.mask = self.tokens[keep], self.mask[keep]
            for cache in self.caches:
                cache.select_rows(keep)
            self.rows = [row for row, f in zip(self.rows, finished, strict=True) if not f]
            self.padding = [p for p, f in zip(self.padding, finished, strict=True) if not f]
        common = min(self.padding)
        if common > 0:
            self.tokens, self.mask = self.tokens[:, common:], self.mask[:, common:]
            for cache in self.caches:
                cache.drop_leading(common)
            self.padding = [p - common for p in self.padding]


def left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, W], attention_mask [B, W])`` of token id lists, right-aligned to the longest and padded with
    ``pad`` on the left."""
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.as_tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask
