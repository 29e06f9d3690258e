"""`ScoreRecorder`: the per-token `scores` and `logits` of transformers' `GenerateDecoderOnlyOutput`, from speculation.

HF's sampling loop stores, for every generated token, the processed scores it chose the token from (`scores`: after
every logits processor, warpers included when sampling) and the raw logits (`logits`, fp32), each a tuple with one
[B, V] tensor per new token. A speculation step scores P positions per row and emits up to K + 1 tokens; the token
at index i of a row's emitted tokens was chosen from the logits at position i of a chain, or at the i-th node of a
tree's accepted path (the root first), so the recorder keeps those rows of the processed and raw logits. The
kernel's fused warpers (`fastspec.processors.LogitsPipeline.output_scores`) are applied to the kept rows by HF's own
classes, so the scores are HF's. After a row has finished (EOS, a stop, max_new_tokens) HF keeps scoring it on
padding; those entries are 0 here.
"""

from __future__ import annotations

import torch

from fastspec.processors import LogitsPipeline

__all__ = ["ScoreRecorder"]


class ScoreRecorder:
    """Collects `scores` and / or `logits` of the emitted tokens of a call of `batch` rows.

    Args:
        batch: rows of the call; scores, logits: which outputs to keep; pipeline: the call's processors.
    """

    def __init__(self, batch: int, scores: bool, logits: bool, pipeline: LogitsPipeline):
        self.keep_scores, self.keep_logits = scores, logits
        self.pipeline = pipeline
        self.scores: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self.logits: list[list[torch.Tensor]] = [[] for _ in range(batch)]
        self._step_scores: torch.Tensor | None = None

    def step(self, processed: torch.Tensor, raw: torch.Tensor, path: torch.Tensor | None) -> None:
        """One step's processed and raw logits [R, P, V], and for a tree its accepted nodes [R, D] (None: a chain,
        whose out token i was chosen at position i)."""
        rows = torch.arange(processed.shape[0], device=processed.device)[:, None]
        if path is None:
            index = torch.arange(processed.shape[1], device=processed.device).expand(processed.shape[0], -1)
        else:  # the root, then the accepted nodes (-1 padding: never emitted)
            index = torch.cat([rows * 0, path.to(processed.device).clamp_min(0)], dim=1)
        self._step_scores = None
        if self.keep_scores:
            picked = processed[rows, index]  # [R, D+1, V]
            flat = self.pipeline.output_scores(picked.reshape(-1, picked.shape[-1]))
            self._step_scores = flat.reshape(picked.shape)
        self._step_logits = raw[rows, index].float() if self.keep_logits else None

    def emitted(self, i: int, row: int, count: int) -> None:
        """Keep the first `count` tokens' entries of batch position i (original row `row`) of the current step."""
        if self.keep_scores:
            self.scores[row].append(self._step_scores[i, :count])
        if self.keep_logits:
            self.logits[row].append(self._step_logits[i, :count])

    def stop_scores(self, members: list[int], steps: list[int]) -> tuple | None:
        """The `scores` argument of stopping criteria for batch positions `members` at token indices `steps`."""
        if self._step_scores is None:
            return None
        return (self._step_scores[torch.tensor(members), torch.tensor(steps)],)

    def outputs(self, new_tokens: int) -> tuple[tuple | None, tuple | None]:
        """(scores, logits): tuples of `new_tokens` tensors [B, V] (None for an output not kept)."""
        return self._tuple(self.scores, new_tokens) if self.keep_scores else None, \
            self._tuple(self.logits, new_tokens) if self.keep_logits else None  # fmt: skip

    @staticmethod
    def _tuple(per_row: list[list[torch.Tensor]], new_tokens: int) -> tuple:
        pieces = [torch.cat(chunks) for chunks in per_row if chunks]
        if not pieces:
            return ()
        vocab, device = pieces[0].shape[-1], pieces[0].device
        out = torch.zeros(len(per_row), new_tokens, vocab, device=device)
        for row, chunks in enumerate(per_row):
            if chunks:
                values = torch.cat(chunks)[:new_tokens]
                out[row, : values.shape[0]] = values
        return tuple(out[:, g] for g in range(new_tokens))
