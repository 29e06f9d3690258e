"""Training data of a draft head: prompts, the target's own answers to them (regenerated, cached, extended), batches.

**Prompts** (`read_prompts`): a ``.jsonl`` file holds one JSON object per line with a ``prompt`` string, or chat
``messages`` (``[{"role": ..., "content": ...}]``: the conversation up to its last user turn becomes the prompt,
through the tokenizer's chat template with the generation prompt when it has one, else as ``role: content`` lines
followed by ``assistant:``); any other file is text with **one prompt per line** (empty lines skipped; a literal
``\\n`` in a line stands for a newline), or with ``text_mode="file"`` one prompt per whole file. ``stdlib`` names
built-in prompts for code models such as the shipped target: source windows of the running interpreter's standard
library (the shipped pair's training modules, never its held-out ones) that end after a function's signature and
docstring, where `fastspec.prompts.heldout_prompts` end; ``stdlib-windows`` names windows of the same modules that end
at a random line (mid-function, between definitions, in comments: the rest of what code generation continues).
Several sources are **interleaved** (`interleave_prompts`: one prompt of each in turn), so ``max_prompts`` takes
from all of them and the held-out tail mixes them.

**Corpus windows** (`corpus_stream`, `corpus_windows`): text that is not the target's own (``stdlib`` again, or text
files) as one token stream; a run can put fresh windows of it, drawn anew every step, beside the answers in each
batch, trained at every position with the target's distribution as the teacher (EAGLE-1 and EAGLE-3 trained on
fixed chat data this way; the shipped EAGLE-1 head's batches were a quarter such windows).

**Answers** (`regenerate`): EAGLE-3 trains on answers the *target* writes itself (the largest lever on acceptance,
notes/eagle3-formats.md). The target continues every training prompt (batched, greedy or at a temperature, up to
``max_new_tokens``, stopping at EOS) with `fastspec.autoregressive_generate`; sampled answers use per-prompt seeds
(``seed + prompt index``), so they do not depend on batching. Answers are cached in a directory (`RegenCache`): a
``cache.json`` header (the target's fingerprint and the generation settings) and ``chunk_*.safetensors`` files of
prompts generated together, with each prompt's hash. Answers are found by the prompt's hash, not its place in the
list, so a longer list, another order or another mix of sources reuses every answer the cache holds and generates
only the prompts it lacks (a new source interleaved with the old ones costs only its own answers). A cache from
another target or other settings is refused (ValueError) rather than silently mixed. Under
``torch.distributed`` every rank generates its share of the missing chunks. Answers made with other settings (say
greedy beside T=0.7) are other caches: `read_regen_cache` reads a complete one of the same target and prompts,
without generating, so one run can train on several answers per prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fastspec.prompts import function_cut_points, training_files

__all__ = [
    "RegenCache",
    "Sequences",
    "corpus_stream",
    "corpus_windows",
    "encode_prompts",
    "interleave_prompts",
    "prompt_hash",
    "read_prompts",
    "read_regen_cache",
    "regenerate",
    "stdlib_prompts",
    "stdlib_windows",
    "target_fingerprint",
]

CACHE_FORMAT = 1


# ---------------------------------------------------------------------------------------------------------- prompts
def _jsonl_prompt(obj, where: str):
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return obj["prompt"]
    messages = obj.get("messages") if isinstance(obj, dict) else None
    if isinstance(messages, list) and messages and all(isinstance(m, dict) and "content" in m for m in messages):
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
        if last_user is None:
            raise ValueError(f"prompts: {where}: `messages` has no user turn")
        return [{"role": m.get("role", "user"), "content": m["content"]} for m in messages[: last_user + 1]]
    raise ValueError(f"prompts: {where}: expected an object with a `prompt` string or a `messages` list")


def read_prompts(paths, text_mode: str = "line") -> list[str | list[dict]]:
    """Prompts of the files ``paths`` in order (module docstring): strings, or chat message lists from JSONL."""
    if text_mode not in ("line", "file"):
        raise ValueError(f"text_mode: 'line' or 'file', got {text_mode!r}")
    prompts: list = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"prompts: no file {path}")
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for number, line in enumerate(text.splitlines(), start=1):
                if line.strip():
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise ValueError(f"prompts: {path}:{number}: not JSON ({err.msg})") from None
                    prompts.append(_jsonl_prompt(obj, f"{path}:{number}"))
        elif text_mode == "file":
            if text.strip():
                prompts.append(text)
        else:
            prompts.extend(line.replace("\\n", "\n") for line in text.splitlines() if line.strip())
    return prompts


def _chat_text(tokenizer, messages: list[dict]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def encode_prompts(tokenizer, prompts, max_prompt_tokens: int | None = None) -> list[list[int]]:
    """Token ids of each prompt (chat prompts through the chat template, whose text carries its special tokens;
    plain ones with the tokenizer's special tokens, e.g. BOS), keeping the last ``max_prompt_tokens``."""
    out = []
    for prompt in prompts:
        if isinstance(prompt, list):
            ids = tokenizer(_chat_text(tokenizer, prompt), add_special_tokens=False).input_ids
        else:
            ids = tokenizer(prompt).input_ids
        if max_prompt_tokens is not None:
            ids = ids[-max_prompt_tokens:]
        if not ids:
            raise ValueError("prompts: a prompt encodes to no tokens")
        out.append(list(ids))
    return out


def _lines_before(tokenizer, lines: list[str], end: int, prompt_tokens: int) -> tuple[int, str]:
    """The longest run of whole lines ending at line ``end`` (exclusive, 0-based) of at most ``prompt_tokens``
    tokens and at most 80 lines: ``(its first line's index, its text)``; ``(end, "")`` when line ``end - 1`` alone is
    too long."""
    start, prompt = end, ""
    while start > max(0, end - 80):
        text = "".join(lines[start - 1 : end])
        if len(tokenizer.encode(text, add_special_tokens=False)) > prompt_tokens:
            break
        start, prompt = start - 1, text
    return start, prompt


def stdlib_prompts(tokenizer, count: int, prompt_tokens: int = 128, seed: int = 0) -> list[str]:
    """``count`` code prompts: windows of the standard library's training modules (never the held-out ones) that end
    after a function's signature and docstring, at most ``prompt_tokens`` tokens of whole lines (at most 80), in a
    seeded order whose first n do not depend on ``count``."""
    windows = []
    for path in training_files():
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            cuts = function_cut_points(source)
        except SyntaxError:  # written for another Python version
            continue
        lines = source.splitlines(keepends=True)
        windows.extend((lines, def_line, end) for def_line, end in cuts)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed + 2)).tolist()
    prompts = []
    for index in order:
        lines, def_line, end = windows[index]
        start, prompt = _lines_before(tokenizer, lines, end, prompt_tokens)
        if start <= def_line and prompt.strip():
            prompts.append(prompt)
            if len(prompts) == count:
                return prompts
    raise ValueError(f"prompts: only {len(prompts)} standard-library functions fit {prompt_tokens} tokens, asked "
                     f"for {count}")  # fmt: skip


def stdlib_windows(tokenizer, count: int, prompt_tokens: int = 128, seed: int = 0) -> list[str]:
    """``count`` code prompts: windows of whole lines of the standard library's training modules (never the held-out
    ones) that end at a random line, at most ``prompt_tokens`` tokens (at most 80 lines), none empty, in a seeded
    order whose first n do not depend on ``count``."""
    files = training_files()
    texts = [path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True) for path in files]
    ends = [(f, end) for f, lines in enumerate(texts) for end in range(1, len(lines))]  # the next line continues it
    order = torch.randperm(len(ends), generator=torch.Generator().manual_seed(seed + 3)).tolist()
    prompts = []
    for index in order:
        f, end = ends[index]
        _, prompt = _lines_before(tokenizer, texts[f], end, prompt_tokens)
        if prompt.strip():
            prompts.append(prompt)
            if len(prompts) == count:
                return prompts
    raise ValueError(f"prompts: only {len(prompts)} standard-library windows, asked for {count}")


def corpus_stream(tokenizer, sources: list[str], separator: int) -> torch.Tensor:
    """The token stream [N] (int64) of the documents of ``sources``, each followed by ``separator`` (the EOS id):
    ``"stdlib"`` is the standard library's training modules (never the held-out ones), any other entry a text file
    read as one document. ValueError naming ``corpus`` for a missing file or an empty stream."""
    paths: list[Path] = []
    for source in sources:
        if source == "stdlib":
            paths += training_files()
        elif Path(source).is_file():
            paths.append(Path(source))
        else:
            raise ValueError(f"corpus: {source} is neither 'stdlib' nor a text file")
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in paths]
    docs = tokenizer(texts, add_special_tokens=False).input_ids if texts else []
    stream = [t for doc in docs if doc for t in [*doc, separator]]
    if not stream:
        raise ValueError(f"corpus: {sources} hold no text")
    return torch.tensor(stream, dtype=torch.long)


def corpus_windows(stream: torch.Tensor, count: int, length: int, seed: int) -> torch.Tensor:
    """[count, length] windows of ``stream`` [N] at uniformly drawn offsets, a function of ``seed`` alone (a resumed
    run draws the same windows at the same step)."""
    if len(stream) < length:
        raise ValueError(f"corpus: {len(stream)} tokens, shorter than one window of corpus_tokens={length}")
    starts = torch.randint(0, len(stream) - length + 1, (count,), generator=torch.Generator().manual_seed(seed))
    return torch.stack([stream[s : s + length] for s in starts.tolist()])


def interleave_prompts(sources: list[list]) -> list:
    """One prompt of each source in turn (a source that runs out is skipped): the first n of the result depend only on
    the sources' first n, so a longer prompt list extends a shorter one (the regeneration cache's rule)."""
    out = []
    for i in range(max((len(s) for s in sources), default=0)):
        out.extend(s[i] for s in sources if i < len(s))
    return out


# ---------------------------------------------------------------------------------------------- regeneration cache
def prompt_hash(ids) -> str:
    """A short stable hash of a prompt's token ids."""
    return hashlib.sha1(torch.as_tensor(ids, dtype=torch.int64).numpy().tobytes()).hexdigest()[:16]


def target_fingerprint(target) -> str:
    """A hash of the target's config (model type and shapes) and a sample of its weights (as float32): answers
    cached for one target are refused for another. Independent of the dtype it was loaded in when that dtype holds
    the stored weights exactly (bf16 weights loaded as fp32)."""
    cfg = target.config.to_dict()
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "intermediate_size", "n_embd", "n_layer", "n_head")  # fmt: skip
    digest = hashlib.sha1(json.dumps({k: cfg.get(k) for k in keys}, sort_keys=True).encode())
    with torch.no_grad():
        for name, param in sorted(target.named_parameters()):
            digest.update(name.encode())
            digest.update(param.detach().flatten()[:64].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:20]


@dataclass
class Sequences:
    """Prompts and answers of the regenerated data, by prompt index."""

    prompts: list[torch.Tensor]
    answers: list[torch.Tensor]
    generated_tokens: int  # new tokens in the whole cache (this run and earlier ones)
    generation_seconds: float  # seconds they took
    generated_now: int  # prompts answered in this call

    @classmethod
    def from_cached(cls, found: dict, count: int, tokens: int, seconds: float, generated_now: int) -> Sequences:
        """From `RegenCache.load`'s ``found`` (``{index: (prompt ids, answer ids)}``, holding every index below
        ``count``), its token and second totals, and the number of prompts generated in this call."""
        return cls(
            prompts=[found[i][0] for i in range(count)],
            answers=[found[i][1] for i in range(count)],
            generated_tokens=tokens,
            generation_seconds=seconds,
            generated_now=generated_now,
        )

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def __len__(self) -> int:
        return len(self.prompts)


class RegenCache:
    """The on-disk cache of regenerated answers (module docstring): ``cache.json`` + ``chunk_<start>.safetensors``."""

    def __init__(self, path):
        self.path = Path(path)

    def header(self) -> dict | None:
        """The cache's ``cache.json`` (target fingerprint and generation settings), None when there is none."""
        file = self.path / "cache.json"
        return json.loads(file.read_text()) if file.is_file() else None

    def check_header(self, header: dict) -> None:
        """Write ``header`` for a new cache; ValueError if an existing one differs (another target or settings)."""
        old = self.header()
        if old is not None:
            diff = {k: (old.get(k), v) for k, v in header.items() if old.get(k) != v}
            if diff:
                what = ", ".join(f"{k}: cached {a!r}, asked {b!r}" for k, (a, b) in diff.items())
                raise ValueError(f"regeneration cache {self.path} was made for another target or other settings "
                                 f"({what}); pass another cache directory")  # fmt: skip
            return
        self.path.mkdir(parents=True, exist_ok=True)
        file = self.path / "cache.json"
        tmp = file.with_suffix(".tmp")
        tmp.write_text(json.dumps(header, indent=2) + "\n")
        os.replace(tmp, file)

    def load(self, hashes: list[str]) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor]], int, float]:
        """``({prompt index: (prompt ids, answer ids)}, generated tokens, seconds)`` of the prompts among ``hashes``
        that the cache holds, found by hash wherever they stand in ``hashes`` (tokens and seconds: the whole
        cache's)."""
        from safetensors import safe_open

        wanted: dict[str, list[int]] = {}
        for index, digest in enumerate(hashes):
            wanted.setdefault(digest, []).append(index)
        found: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        tokens, seconds = 0, 0.0
        for file in sorted(self.path.glob("chunk_*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                meta = f.metadata()
                cached = json.loads(meta["hashes"])
                tokens, seconds = tokens + int(meta["new_tokens"]), seconds + float(meta["seconds"])
                if not any(digest in wanted for digest in cached):
                    continue
                prompt_ids, prompt_lens = f.get_tensor("prompt_ids"), f.get_tensor("prompt_lens")
                answer_ids, answer_lens = f.get_tensor("answer_ids"), f.get_tensor("answer_lens")
            p_parts = prompt_ids.split(prompt_lens.tolist())
            a_parts = answer_ids.split(answer_lens.tolist())
            for j, digest in enumerate(cached):
                for index in wanted.get(digest, ()):
                    found.setdefault(index, (p_parts[j], a_parts[j]))
        return found, tokens, seconds

    def write_chunk(self, start: int, prompts, answers, hashes: list[str], seconds: float) -> None:
        from safetensors.torch import save_file

        new_tokens = sum(len(a) for a in answers)
        tensors = {
            "prompt_ids": torch.cat([torch.as_tensor(p, dtype=torch.int64) for p in prompts]),
            "prompt_lens": torch.tensor([len(p) for p in prompts], dtype=torch.int64),
            "answer_ids": torch.cat([torch.as_tensor(a, dtype=torch.int64) for a in answers]),
            "answer_lens": torch.tensor([len(a) for a in answers], dtype=torch.int64),
        }
        meta = {"start": str(start), "hashes": json.dumps(hashes), "new_tokens": str(new_tokens),
                "seconds": f"{seconds:.3f}"}  # fmt: skip
        file = self.path / f"chunk_{start:09d}_{hashes[0][:12]}.safetensors"  # unique: a start index may repeat
        tmp = file.with_name(file.name + ".tmp")
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, file)


def _dist():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist, dist.get_rank(), dist.get_world_size()
    return None, 0, 1


@torch.no_grad()
def regenerate(
    target,
    prompts: list[list[int]],
    cache_dir,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 16,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    progress: bool = False,
) -> Sequences:
    """The target's answers to ``prompts`` (token id lists), from the cache in ``cache_dir`` and generated where it
    lacks them (module docstring). ``temperature`` 0 is greedy. Chunks of ``batch_size`` missing prompts (in list
    order) are generated as one left-padded batch and written as they finish, so an interrupted run loses at most one
    chunk."""
    import fastspec
    from fastspec.batch import left_padded

    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be >= 1, got {max_new_tokens}")
    dist, rank, world = _dist()
    cache = RegenCache(cache_dir)
    header = {"format": CACHE_FORMAT, "target": target_fingerprint(target), "max_new_tokens": max_new_tokens,
              "temperature": float(temperature), "seed": seed if temperature > 0 else None,
              "eos_token_id": eos_token_id}  # fmt: skip
    if rank == 0:
        cache.check_header(header)
    if dist is not None:
        dist.barrier()
    if rank != 0:
        cache.check_header(header)
    hashes = [prompt_hash(p) for p in prompts]
    found, _, _ = cache.load(hashes)
    missing, asked = [], set()  # the first index of each prompt the cache lacks, in list order
    for index, digest in enumerate(hashes):
        if index not in found and digest not in asked:
            asked.add(digest)
            missing.append(index)
    chunks = [missing[i : i + batch_size] for i in range(0, len(missing), batch_size)]
    mine = chunks[rank::world]
    device = next(target.parameters()).device
    bar = None
    if progress and mine:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(c) for c in mine), desc="regenerating answers", unit="prompt", disable=rank != 0)
    pad = pad_token_id if pad_token_id is not None else 0
    eos_ids = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    for run in mine:
        ids, mask = left_padded([prompts[j] for j in run], pad)
        width = ids.shape[1]
        t0 = time.perf_counter()
        out = fastspec.autoregressive_generate(
            target, ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
            do_sample=temperature > 0, temperature=temperature if temperature > 0 else 1.0,
            eos_token_id=eos_token_id, pad_token_id=pad, seed=[seed + j for j in run],
        )  # fmt: skip
        seconds = time.perf_counter() - t0
        answers = []
        for row in range(len(run)):
            new = out[row, width:].cpu().tolist()
            stop = next((k + 1 for k, tok in enumerate(new) if tok in eos_ids), len(new))
            answers.append(new[:stop])
        cache.write_chunk(run[0], [prompts[j] for j in run], answers, [hashes[j] for j in run], seconds)
        if bar is not None:
            bar.update(len(run))
    if bar is not None:
        bar.close()
    if dist is not None:
        dist.barrier()
    found, tokens, seconds = cache.load(hashes)
    if len(found) != len(prompts):
        raise RuntimeError(f"regeneration cache {cache.path}: {len(prompts) - len(found)} prompts still missing")
    return Sequences.from_cached(found, len(prompts), tokens, seconds, generated_now=len(missing))


def read_regen_cache(target, prompts: list[list[int]], cache_dir) -> tuple[Sequences, dict]:
    """The answers a complete cache in ``cache_dir`` holds for ``prompts`` (token id lists), and its header (the
    generation settings it was made with), without generating anything: answers made with other settings than this
    run's, trained beside its own. ValueError, naming the directory, when it is not a cache, was made for another
    target, holds other prompts, or lacks some of ``prompts``."""
    cache = RegenCache(cache_dir)
    header = cache.header()
    if header is None:
        raise ValueError(f"regeneration cache {cache.path}: no cache.json (not a regeneration cache)")
    fingerprint = target_fingerprint(target)
    if header.get("target") != fingerprint:
        raise ValueError(f"regeneration cache {cache.path} was made for another target (fingerprint "
                         f"{header.get('target')!r}, this target's {fingerprint!r})")  # fmt: skip
    found, tokens, seconds = cache.load([prompt_hash(p) for p in prompts])
    if len(found) != len(prompts):
        raise ValueError(f"regeneration cache {cache.path} answers {len(found)} of the {len(prompts)} training "
                         f"prompts; complete it first (the train-head command that made it, with these prompts "
                         f"and --max-steps 0)")  # fmt: skip
    return Sequences.from_cached(found, len(prompts), tokens, seconds, generated_now=0), header
