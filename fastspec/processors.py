"""`LogitsPipeline`: transformers' logits processors applied at every scored position of a speculation step.

transformers' `generate` runs a `LogitsProcessorList` on the next-token logits of every step; its assisted
generation runs it at each drafted position i with that position's own prefix (`candidate_input_ids[:, :cur_len +
i]`). A speculation step here scores P positions per row at once (`fastspec.prefixes.PositionPrefixes`), so the same
list is applied to all R x P positions, in the list's order, before verification; greedy verification then takes the
argmax of the processed logits and sampled verification the distribution HF would sample from. The list is HF's own
(`fastspec.generation_config` builds it with the model's `_get_logits_processor`, or `generate` hands it to
`fastspec.custom_generate`), so arguments mean what they mean in HF. Each processor runs one of three ways:

- *fused*: temperature, top-k, top-p and min-p when they end the list (HF's warper order, sampling only) are the
  verification kernel's own transform (`fastspec.kernels.sampling`): no pass here. transformers' `LogitNormalization`
  (`renormalize_logits=True`) after them changes no probability: it is applied to output scores only.
- *vectorised*: one call for all R x P positions, no Python loop over positions. Repetition penalty: HF's gather /
  penalise / scatter at each position's prefix ids ([R, P, W + D], `PositionPrefixes.token_ids`): O(R P (W + D))
  plus one copy of the [R P, V] scores. Minimum length / minimum new tokens / forced EOS / forced BOS / suppression
  at the first step: a comparison of each prefix's length, one `where` over [R P, V]. n-gram blocking: every prefix
  right-aligned in one [R P, L] tensor (`PositionPrefixes.sequences`), its last n - 1 tokens compared with every
  window, one scatter of the banned tokens (O(R P L n)). Sequence bias and bad words: HF's own class called once on
  those right-aligned prefixes (its suffix match meets the -1 fill, never a token). Suppressed tokens and the
  warpers that read no prefix (temperature, top-k, top-p, min-p, typical, epsilon, eta, top-h when not fused;
  `InfNanRemoveLogitsProcessor`): HF's class once on [R P, V].
- *per position*: any other processor (a user's `logits_processor`, or an HF class not listed above) is called as
  assisted generation calls it, `processor(input_ids [n, L], scores [n, V])`, once per distinct prefix length L
  with every position of that length (rows and positions alike), so it sees HF's own `input_ids` for each. It must
  compute each row from that row alone (as for any batched `generate`).

Scores are fp32 as in HF's loop (logits are upcast before the first processor). Shapes: R rows, P positions, V
vocabulary, M = R P flattened positions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from transformers.generation import logits_process as hf

from fastspec.prefixes import FILL, PositionPrefixes

__all__ = ["KernelSampling", "LogitsPipeline"]

# processors that read no input_ids: called once on every position's scores
_SCORES_ONLY = tuple(
    getattr(hf, name)
    for name in (
        "TemperatureLogitsWarper",
        "TopKLogitsWarper",
        "TopPLogitsWarper",
        "MinPLogitsWarper",
        "TypicalLogitsWarper",
        "EpsilonLogitsWarper",
        "EtaLogitsWarper",
        "TopHLogitsWarper",
        "SuppressTokensLogitsProcessor",
        "LogitNormalization",
        "InfNanRemoveLogitsProcessor",
    )  # fmt: skip
    if hasattr(hf, name)
)
# processors that match the end of input_ids (biased sequences): HF's class on right-aligned prefixes
_SEQUENCE = (hf.SequenceBiasLogitsProcessor, hf.NoBadWordsLogitsProcessor)
_LENGTH = (hf.MinLengthLogitsProcessor, hf.MinNewTokensLengthLogitsProcessor, hf.ForcedEOSTokenLogitsProcessor,
           hf.ForcedBOSTokenLogitsProcessor, hf.SuppressTokensAtBeginLogitsProcessor)  # fmt: skip
_FUSABLE = (hf.TemperatureLogitsWarper, hf.TopKLogitsWarper, hf.TopPLogitsWarper, hf.MinPLogitsWarper)


class KernelSampling(NamedTuple):
    """The transform the verification kernel applies after the pipeline: temperature (0: greedy), top-k, top-p and
    min-p, None where off (`fastspec.kernels.sampling`)."""

    temperature: float
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None


class LogitsPipeline:
    """transformers' processors of one call, split into the stages run here and the kernel's fused transform.

    Args:
        processors: a `LogitsProcessorList` (or list) in HF's order.
        do_sample: sampled decoding; greedy decoding fuses nothing (the kernel takes the argmax of the result).
    """

    def __init__(self, processors, do_sample: bool):
        items = list(processors)
        self.normalize = bool(items) and type(items[-1]) is hf.LogitNormalization
        if self.normalize:
            items = items[:-1]
        self.tail = _fusable_tail(items) if do_sample else []
        self.head = items[: len(items) - len(self.tail)]
        self.kinds = [_kind(p) for p in self.head]
        self.kernel = _kernel_sampling(self.tail, do_sample)

    @property
    def active(self) -> bool:
        """Whether any processor runs before verification (else logits go to the kernel as they are)."""
        return bool(self.head)

    def describe(self) -> list[tuple[str, str]]:
        """(processor class, "fused" / "vectorised" / "per position") of every processor, in order."""
        rows = [(type(p).__name__, kind) for p, kind in zip(self.head, self.kinds, strict=True)]
        rows += [(type(p).__name__, "fused") for p in self.tail]
        return rows + ([("LogitNormalization", "fused")] if self.normalize else [])

    def apply(self, logits: torch.Tensor, prefixes: PositionPrefixes, rows: torch.Tensor) -> torch.Tensor:
        """Processed fp32 logits [R, P, V] of target logits [R, P, V] whose positions have `prefixes`; `rows` [R] are
        the rows' indices in the call's batch (per-row processor settings are indexed by them)."""
        if not self.head:
            return logits
        r, p, vocab = logits.shape
        scores = logits.float().reshape(r * p, vocab)
        for processor, kind in zip(self.head, self.kinds, strict=True):
            if kind == "per position":
                scores = _per_position(processor, scores, prefixes)
            elif isinstance(processor, _SCORES_ONLY):
                scores = processor(scores.new_zeros((r * p, 0), dtype=torch.long), scores)
            elif isinstance(processor, _SEQUENCE):
                scores = processor(prefixes.sequences(), scores)
            elif isinstance(processor, _LENGTH):
                scores = _length_rule(processor, scores, prefixes.lengths.reshape(-1))
            elif isinstance(processor, hf.NoRepeatNGramLogitsProcessor):
                scores = _no_repeat_ngram(processor.ngram_size, scores, prefixes.sequences())
            else:
                scores = _repetition_penalty(processor, scores, prefixes, rows)
        return scores.reshape(r, p, vocab)

    def output_scores(self, processed: torch.Tensor) -> torch.Tensor:
        """HF's `scores` of emitted tokens from their processed logits [n, V]: the fused warpers and the
        normalisation, applied by HF's own classes (which read no input_ids)."""
        scores = processed.float()
        ids = scores.new_zeros((scores.shape[0], 0), dtype=torch.long)
        for processor in self.tail:
            scores = processor(ids, scores)
        return scores.log_softmax(dim=-1) if self.normalize else scores


def _kind(processor) -> str:
    """How a processor before the fused tail runs (module docstring)."""
    kind = type(processor)
    if kind in _SCORES_ONLY or kind in _SEQUENCE or kind in _LENGTH or kind is hf.NoRepeatNGramLogitsProcessor:
        return "vectorised"
    if kind is hf.RepetitionPenaltyLogitsProcessor and getattr(processor, "logits_indices", None) is None:
        return "vectorised"
    return "per position"


def _fusable_tail(items: list) -> list:
    """The longest suffix of `items` that is temperature, top-k, top-p, min-p in that order (each at most once) and
    that the kernel's transform reproduces: HF's classes exactly, filter value -inf, min_tokens_to_keep 1."""
    order = _FUSABLE
    tail: list = []
    rank = len(order)
    for processor in reversed(items):
        kind = type(processor)
        if kind not in order or order.index(kind) >= rank or not _fusable(processor):
            break
        rank = order.index(kind)
        tail.insert(0, processor)
    return tail


def _fusable(processor) -> bool:
    if getattr(processor, "filter_value", -math.inf) != -math.inf:
        return False
    if isinstance(processor, hf.TopKLogitsWarper):
        return True  # HF's top_k is already max(top_k, min_tokens_to_keep)
    if getattr(processor, "min_tokens_to_keep", 1) != 1:
        return False
    if isinstance(processor, hf.TopPLogitsWarper):
        return 0.0 < processor.top_p <= 1.0
    if isinstance(processor, hf.MinPLogitsWarper):
        return 0.0 <= processor.min_p <= 1.0
    return processor.temperature > 0


def _kernel_sampling(tail: list, do_sample: bool) -> KernelSampling:
    if not do_sample:
        return KernelSampling(0.0)
    values = {type(p): p for p in tail}
    temperature = values.get(hf.TemperatureLogitsWarper)
    top_k, top_p, min_p = (values.get(kind) for kind in _FUSABLE[1:])
    return KernelSampling(
        1.0 if temperature is None else float(temperature.temperature),
        None if top_k is None else int(top_k.top_k),
        None if top_p is None else float(top_p.top_p),
        None if min_p is None else float(min_p.min_p),
    )


def _repetition_penalty(processor, scores: torch.Tensor, prefixes: PositionPrefixes, rows: torch.Tensor):
    """HF's `RepetitionPenaltyLogitsProcessor` at every position, HF's way: gather the scores of the prefix's ids
    (after the first `prompt_ignore_length`, per row when a tensor), divide the positive ones by the penalty and
    multiply the negative ones, scatter them back; ids that are no token go to a spare last column, dropped."""
    ignore = processor.prompt_ignore_length
    if isinstance(ignore, torch.Tensor):
        ignore = ignore.to(rows.device)[rows]
    vocab = scores.shape[-1]
    ids = prefixes.token_ids(vocab, ignore).reshape(scores.shape[0], -1)  # [M, W + D]
    padded = torch.nn.functional.pad(scores, (0, 1))
    score = padded.gather(1, ids)
    score = torch.where(score < 0, score * processor.penalty, score / processor.penalty)
    return padded.scatter_(1, ids, score)[:, :vocab]


def _no_repeat_ngram(n: int, scores: torch.Tensor, sequences: torch.Tensor) -> torch.Tensor:
    """HF's `NoRepeatNGramLogitsProcessor` at every position: the token after every earlier n-gram whose first n - 1
    tokens equal the prefix's last n - 1 is banned. `sequences` [M, L] are the right-aligned prefixes (FILL left);
    a window touching the fill is no n-gram (so a prefix shorter than n bans nothing, as in HF)."""
    vocab = scores.shape[-1]
    if sequences.shape[1] < n:
        return scores
    windows = sequences.unfold(1, n, 1)  # [M, L - n + 1, n]
    suffix = sequences[:, sequences.shape[1] - n + 1 :]  # [M, n - 1]
    match = (windows[..., :-1] == suffix[:, None, :]).all(-1) & (windows[..., 0] != FILL)
    last = windows[..., -1].clamp(max=vocab)  # ids past the scores' vocabulary ban nothing (HF's spare column)
    banned = torch.zeros(scores.shape[0], vocab + 1, dtype=torch.bool, device=scores.device)
    banned.scatter_(1, torch.where(match, last, vocab), True)
    return scores.masked_fill(banned[:, :vocab], -math.inf)


def _length_rule(processor, scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """HF's length-triggered processors at every position, `lengths` [M] being each prefix's `input_ids.shape[-1]`."""
    vocab = torch.arange(scores.shape[-1], device=scores.device)
    if isinstance(processor, hf.MinLengthLogitsProcessor | hf.MinNewTokensLengthLogitsProcessor):
        eos = torch.isin(vocab, processor.eos_token_id.to(scores.device))
        if isinstance(processor, hf.MinLengthLogitsProcessor):
            short = lengths < processor.min_length
        else:
            short = lengths - processor.prompt_length_to_skip < processor.min_new_tokens
        return torch.where(eos[None, :] & short[:, None], -math.inf, scores)
    if isinstance(processor, hf.SuppressTokensAtBeginLogitsProcessor):
        suppressed = torch.isin(vocab, processor.begin_suppress_tokens.to(scores.device))
        return torch.where(suppressed[None, :] & (lengths == processor.begin_index)[:, None], -math.inf, scores)
    if isinstance(processor, hf.ForcedEOSTokenLogitsProcessor):
        forced_ids, at = processor.eos_token_id.to(scores.device), lengths == processor.max_length - 1
    else:  # ForcedBOSTokenLogitsProcessor
        forced_ids, at = torch.tensor([processor.bos_token_id], device=scores.device), lengths == 1
    forced = torch.where(torch.isin(vocab, forced_ids), 0.0, -math.inf).to(scores.dtype)
    return torch.where(at[:, None], forced[None, :], scores)


def _per_position(processor, scores: torch.Tensor, prefixes: PositionPrefixes) -> torch.Tensor:
    """Call `processor` as assisted generation does, once per distinct prefix length with every position of that
    length: input_ids [n, L] (each position's prefix), scores [n, V]."""
    sequences = prefixes.sequences()
    lengths = prefixes.lengths.reshape(-1)
    out = torch.empty_like(scores)
    for length in sorted(set(lengths.tolist())):
        index = (lengths == length).nonzero()[:, 0]
        ids = sequences[index, sequences.shape[1] - length :]
        if bool((ids == FILL).any()):  # a position that is never verified (e.g. padding of a ragged draft)
            ids = ids.clamp_min(0)
        out[index] = processor(ids, scores[index]).to(out.dtype)
    return out
