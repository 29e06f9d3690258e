"""The cases of the architecture sweep: one tiny model type decoded by HF and by fastspec, each case given a status.

Shared by `tests/test_architectures.py` and `bench/architectures.py`; the latter runs every model type in its own
process as `python -m tests.architecture_cases MODEL_TYPE`, which prints one JSON line per finished case.

Every case decodes greedily (prompt of `PROMPT_LEN` tokens, `NEW_TOKENS` new ones, attention windows of `WINDOW` tokens,
so prompt + output passes the window) and compares with `target.generate(do_sample=False)` on the same input:

- `hf_assisted`: HF's own `target.generate(assistant_model=draft)`, the reference of what HF achieves;
- `chain`: `fastspec.generate(draft=partial_draft)`; `lookup`: `prompt_lookup=2` on a repetitive prompt, no draft;
  `tree`: `tree="small"` with the draft; `ragged`: a left-padded batch of 2 prompts of different lengths, chain;
  `static`: `static_cache=True`, chain; `sampling`: `do_sample=True, seed=0`, only the shape is checked.

A status is one line: `pass`; `refused: <message>` (fastspec raised ValueError / NotImplementedError / TypeError
naming the model type; when it was raised is not checked); `fail: mismatch at token i (target logit gap g)` (g: the
target's top-1 logit minus the logit of the token fastspec emitted, at the first differing position, after HF's greedy
prefix, from one forward without cache: near 0 is a near-tie, larger is a logic error; "HF's own token's gap h" is added
where HF's token is not that forward's top-1 either); `fail: <ExceptionType: message>` for a crash; `skip: <reason>`
where HF itself cannot decode (or the tiny model does not build or run).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from collections.abc import Callable, Iterator

import torch
import transformers

import fastspec
from tests.tiny_configs import SKIPPED, VOCAB, decoder_types, partial_draft, tiny_causal_lm

PROMPT_LEN = 12
NEW_TOKENS = 24
WINDOW = 8
RAGGED_LENGTHS = (PROMPT_LEN, 7)
CASES = ("hf_assisted", "chain", "lookup", "tree", "ragged", "static", "sampling")
GREEDY_FASTSPEC_CASES = ("chain", "lookup", "tree", "ragged", "static")


def short(error: BaseException, limit: int = 160) -> str:
    """`ExceptionType: first line of the message`, cut to `limit` characters."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refusal(error: BaseException, model_type: str) -> str | None:
    """The refusal message if `error` is fastspec refusing the model type by name (ValueError, NotImplementedError or
    TypeError whose message contains the model type), else None."""
    if isinstance(error, ValueError | NotImplementedError | TypeError) and model_type.lower() in str(error).lower():
        return " ".join(str(error).split())
    return None


class Architecture:
    """One model type's tiny target, its partially accepted draft, the cases' inputs and HF's greedy references."""

    def __init__(self, model_type: str, *, window: int = WINDOW, seed: int = 0):
        self.model_type = model_type
        self.target = tiny_causal_lm(model_type, window=window, seed=seed)
        self.draft = partial_draft(self.target, seed=seed + 1)
        vocab = min(self.target.config.get_text_config().vocab_size, VOCAB)
        gen = torch.Generator().manual_seed(seed)
        self.prompt_ids = torch.randint(3, vocab, (1, PROMPT_LEN), generator=gen)  # [1, T]
        self.repetitive_ids = torch.randint(3, vocab, (1, 4), generator=gen).repeat(1, PROMPT_LEN // 4)  # [1, T]
        width = max(RAGGED_LENGTHS)
        self.ragged_mask = torch.tensor([[0] * (width - n) + [1] * n for n in RAGGED_LENGTHS])  # [2, T]
        self.ragged_ids = torch.randint(3, vocab, (len(RAGGED_LENGTHS), width), generator=gen) * self.ragged_mask
        self._references: dict[str, torch.Tensor] = {}

    def hf_greedy(self, name: str, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """`target.generate(do_sample=False)` on `ids` [B, T], computed once per `name`: [B, T + NEW_TOKENS]."""
        if name not in self._references:
            self._references[name] = self.target.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0
            )
        return self._references[name]

    def logit_gaps(self, reference: torch.Tensor, mask: torch.Tensor | None, row: int, col: int, token: int):
        """(gap of `token`, gap of HF's own token `reference[row, col]`): the target's top-1 logit minus each token's
        logit after `reference[row, :col]`, from one forward without cache (left padding dropped)."""
        prefix = reference[row, :col]
        if mask is not None:
            prefix = prefix[torch.cat([mask[row].bool(), torch.ones(col - mask.shape[1], dtype=torch.bool)])]
        with torch.no_grad():
            logits = self.target(prefix[None]).logits[0, -1].float()
        top = logits.max()
        return (top - logits[token]).item(), (top - logits[reference[row, col]]).item()

    def compare(self, reference: torch.Tensor, out: torch.Tensor, mask: torch.Tensor | None = None) -> str:
        """`pass`, or `fail: ...` naming the first position where `out` [B, T + N] differs from `reference`.

        A mismatch names the target's logit gap of the emitted token and, where HF's own token is not the top-1 of a
        forward over the same prefix either (HF's cached decoding disagrees with the model's full forward), its gap.
        """
        if out.shape != reference.shape:
            return f"fail: output shape {tuple(out.shape)}, expected {tuple(reference.shape)}"
        differs = (out != reference).nonzero()
        if len(differs) == 0:
            return "pass"
        col = int(differs[:, 1].min())
        row = int(differs[differs[:, 1] == col][0, 0])
        where = f"token {col - reference.shape[1] + NEW_TOKENS}" + (f" of row {row}" if len(reference) > 1 else "")
        if col < reference.shape[1] - NEW_TOKENS:
            return f"fail: prompt changed at {where}"
        try:
            gap, hf_gap = self.logit_gaps(reference, mask, row, col, int(out[row, col]))
            gaps = f"target logit gap {gap:.3g}" + (f"; HF's own token's gap {hf_gap:.3g}" if hf_gap > 0 else "")
        except Exception as error:  # the model cannot run the diagnostic forward: say so, keep the mismatch
            gaps = f"target logit gap n/a, {short(error, 60)}"
        return f"fail: mismatch at {where} ({gaps})"

    def fastspec_greedy(self, name: str, ids: torch.Tensor, mask: torch.Tensor | None = None, **kwargs) -> str:
        """Status of greedy `fastspec.generate(target, ids, **kwargs)` against HF greedy on the same input."""
        try:
            reference = self.hf_greedy(name, ids, mask)
        except Exception as error:
            return f"skip: HF generate fails: {short(error)}"
        try:
            out = fastspec.generate(
                self.target, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, pad_token_id=0, **kwargs
            )
        except Exception as error:
            message = refusal(error, self.model_type)
            return f"refused: {message}" if message else f"fail: {short(error)}"
        return self.compare(reference, out, mask)

    # the cases: each returns a status line
    def hf_assisted(self) -> str:
        try:
            reference = self.hf_greedy("prompt", self.prompt_ids)
        except Exception as error:
            return f"skip: HF generate fails: {short(error)}"
        try:
            out = self.target.generate(
                self.prompt_ids, assistant_model=copy.deepcopy(self.draft), do_sample=False,
                max_new_tokens=NEW_TOKENS, pad_token_id=0,
            )  # fmt: skip
        except Exception as error:
            return f"fail: {short(error)}"
        return self.compare(reference, out)

    def chain(self) -> str:
        return self.fastspec_greedy("prompt", self.prompt_ids, draft=self.draft)

    def lookup(self) -> str:
        return self.fastspec_greedy("repetitive", self.repetitive_ids, prompt_lookup=2)

    def tree(self) -> str:
        return self.fastspec_greedy("prompt", self.prompt_ids, draft=self.draft, tree="small")

    def ragged(self) -> str:
        return self.fastspec_greedy("ragged", self.ragged_ids, self.ragged_mask, draft=self.draft)

    def static(self) -> str:
        return self.fastspec_greedy("prompt", self.prompt_ids, draft=self.draft, static_cache=True)

    def sampling(self) -> str:
        try:
            self.hf_greedy("prompt", self.prompt_ids)
        except Exception as error:
            return f"skip: HF generate fails: {short(error)}"
        try:
            out = fastspec.generate(
                self.target, self.prompt_ids, draft=self.draft, do_sample=True, seed=0, max_new_tokens=NEW_TOKENS,
                pad_token_id=0,
            )  # fmt: skip
        except Exception as error:
            message = refusal(error, self.model_type)
            return f"refused: {message}" if message else f"fail: {short(error)}"
        expected = (1, PROMPT_LEN + NEW_TOKENS)
        if tuple(out.shape) != expected:
            return f"fail: output shape {tuple(out.shape)}, expected {expected}"
        return "pass" if torch.equal(out[:, :PROMPT_LEN], self.prompt_ids) else "fail: prompt changed"

    def run(self, case: str) -> str:
        """The status of one case (a name in `CASES`)."""
        if case not in CASES:
            raise ValueError(f"case must be one of {CASES}, got {case!r}")
        case_fn: Callable[[], str] = getattr(self, case)
        return case_fn()


def sweep_type(model_type: str, cases: tuple[str, ...] = CASES) -> Iterator[dict]:
    """Build `model_type` and run `cases`, yielding {"case", "status", "seconds"} per case as it finishes.

    If the tiny model does not build or run a forward, every case gets `skip: tiny model does not build or run: ...`.
    """
    start = time.perf_counter()
    try:
        arch = Architecture(model_type)
    except Exception as error:
        for case in cases:
            yield {"case": case, "status": f"skip: tiny model does not build or run: {short(error)}", "seconds": 0.0}
        return
    yield {"case": "build", "status": "pass", "seconds": round(time.perf_counter() - start, 2)}
    for case in cases:
        start = time.perf_counter()
        status = arch.run(case)
        yield {"case": case, "status": status, "seconds": round(time.perf_counter() - start, 2)}


def main(argv: list[str] | None = None) -> None:
    """Worker of `bench/architectures.py`: one model type, one JSON line per case on stdout; or, with `--list`, one
    JSON object {"types": [swept model types], "skipped": {model type: reason}, "cases": [case names]}."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_type", nargs="?")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--list", action="store_true", help="print the model types swept and those skipped")
    args = parser.parse_args(argv)
    if args.list:
        print(json.dumps({"types": decoder_types(), "skipped": SKIPPED, "cases": CASES}))
        return
    if args.model_type is None:
        parser.error("a model type (or --list) is required")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    warnings.simplefilter("ignore")
    for result in sweep_type(args.model_type, tuple(args.cases)):
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
