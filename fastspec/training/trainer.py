"""`train_head`: train a draft head for a target, end to end (what `fastspec train-head` runs).

1. Load the target (a local HF directory, a ``.gguf`` file, ``shipped`` or a model object), frozen.
2. Prompts (`fastspec.training.data`); a held-out slice (the last ``heldout_count`` prompts, unless held-out prompts
   are given) never trains and measures acceptance at the end.
3. The target regenerates the answers of the training prompts (cached, extended, never regenerated); complete caches
   of answers made with other settings (``extra_regen_caches``, e.g. T=0.7 beside greedy) add one more training row
   per prompt each. With ``corpus``, a share of every batch (``corpus_fraction``) is fresh windows of other text
   (``corpus_tokens`` long, drawn anew each step), trained at every position.
4. EAGLE-3: the reduced draft vocabulary from the answers' token frequencies (`fastspec.training.vocab`).
5. Training-time test (`fastspec.training.ttt`): random batches of whole prompt + answer rows of similar lengths
   (right-padded, loss on the answer positions; `epoch_order`), the target's features and logits computed on the fly
   under no_grad, the head unrolled ``unroll`` steps, AdamW with warmup and a cosine decay over the budget
   (``minutes`` and/or ``max_steps``, totals over resumed runs), gradients clipped. bf16 autocast on CUDA (fp32
   master weights); on CPU fp32, or bf16 autocast of the features and the training step with ``bf16`` (CPUs with
   AMX or AVX512-BF16 run bf16 matrix products several times faster; regeneration and the held-out measurement stay
   fp32).
6. Checkpoints (``checkpoint.pt`` in the work directory: head, optimizer, step, epoch and batch position, elapsed
   time, RNG states, history, every run's command) every ``ckpt_minutes`` and at the end; ``resume`` continues one,
   bit for bit the same data order (resumed with more prompts, the epoch's order is drawn again over all of them and
   goes on from the checkpoint's batch position).
7. The head saved (EAGLE-3: the official layout SGLang and vLLM load; EAGLE-1: fastspec's layout), reloaded with
   `fastspec.heads.load_head`, and its greedy acceptance at K = 4 measured with `fastspec.generate` on the held-out
   prompts; everything (the commands of every run, data, minutes, throughput, results) written to ``training.json``
   beside it.

Data parallel under ``torchrun`` (``torch.distributed`` initialised from the environment: gloo on CPU, nccl on CUDA):
every rank regenerates its share of the missing answers, trains on its own share of every epoch's batches through
`torch.nn.parallel.DistributedDataParallel` (gradients averaged), and rank 0 writes checkpoints, the head and
``training.json``.
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from fastspec.runner import target_logits_and_features
from fastspec.training.data import (
    corpus_stream,
    corpus_windows,
    encode_prompts,
    interleave_prompts,
    read_prompts,
    read_regen_cache,
    regenerate,
    stdlib_prompts,
    stdlib_windows,
)
from fastspec.training.instructions import instruction_prompts
from fastspec.training.self_questions import self_questions
from fastspec.training.ttt import eagle1_loss, eagle3_loss, feature_regression, unroll
from fastspec.training.vocab import select_draft_vocab, token_counts, vocab_coverage

__all__ = ["TrainConfig", "head_from_checkpoint", "heldout_acceptance", "load_target", "read_checkpoint", "train_head"]


@dataclass
class TrainConfig:
    """Everything `train_head` needs; the fields are `fastspec train-head`'s options."""

    out: str  # the head directory written
    target: str = "shipped"  # a local HF model directory, a .gguf file, or "shipped"
    kind: str = "eagle3"  # "eagle3" or "eagle1"
    prompts: list[str] = field(default_factory=lambda: ["stdlib"])  # files or built-in sources (fastspec.training.cli)
    text_mode: str = "line"  # text files: one prompt per "line" or per "file"
    max_prompts: int | None = None  # first N prompts only ("stdlib": how many)
    max_prompt_tokens: int = 512
    heldout: list[str] | None = None  # held-out prompt files; None: the last heldout_count prompts
    heldout_count: int = 8
    heldout_tokens: int = 96
    regen_tokens: int = 256
    regen_temperature: float = 0.0
    regen_batch_size: int = 16
    regen_cache: str | None = None  # default <work_dir>/regen
    extra_regen_caches: list[str] = field(default_factory=list)  # complete caches of other answers, trained beside
    prompt_loss: bool = False  # also train on the prompts' tokens (human-written text), not only answers
    corpus: list[str] = field(default_factory=list)  # "stdlib" and/or text files: windows trained beside the answers
    corpus_fraction: float = 0.25  # share of every batch's rows that are corpus windows (with corpus)
    corpus_tokens: int = 256  # tokens per corpus window
    init_head: str | None = None  # a head directory whose weights start a new run (a resumed checkpoint wins)
    work_dir: str | None = None  # checkpoint and cache; default "<out>.work"
    draft_vocab: int | None = None  # EAGLE-3 draft vocabulary size; default min(vocab, 32000)
    aux_layers: list[int] | None = None  # EAGLE-3 target states (hidden_states indices); default {2, L//2, L-3}
    unroll: int = 7
    decay: float = 0.8
    feature_regression: float = 0.0  # EAGLE-3: weight of EAGLE-1's regression onto the target's last hidden state
    batch_size: int = 8
    max_len: int = 1024
    lr: float = 5e-4
    warmup: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    minutes: float | None = None
    max_steps: int | None = None
    ckpt_minutes: float = 5.0
    resume: bool = False
    seed: int = 0
    device: str | None = None  # default cuda when available
    bf16: bool = False  # CPU: bf16 autocast of the features and the training step (CUDA: always)
    save_dtype: str = "float32"  # weights of the written head ("bfloat16"/"float16": half the size); measured so
    threads: int | None = None
    progress: bool = True
    command: str | None = None  # the command line recorded in training.json

    def __post_init__(self):
        if self.kind not in ("eagle3", "eagle1"):
            raise ValueError(f"kind: 'eagle3' or 'eagle1', got {self.kind!r}")
        if self.minutes is None and self.max_steps is None:
            raise ValueError("give a budget: minutes and/or max_steps")
        if self.unroll < 1:
            raise ValueError(f"unroll: must be >= 1, got {self.unroll}")
        if self.save_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"save_dtype: 'float32', 'bfloat16' or 'float16', got {self.save_dtype!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {self.batch_size}")
        if self.corpus and not 1 <= self.corpus_rows < self.batch_size:
            raise ValueError(f"corpus_fraction: {self.corpus_fraction} of batch_size {self.batch_size} rows leaves "
                             f"{self.batch_size - self.corpus_rows} answer rows and {self.corpus_rows} corpus rows; "
                             "both must be at least 1")  # fmt: skip
        if self.corpus and not 2 <= self.corpus_tokens <= self.max_len:
            raise ValueError(f"corpus_tokens: must be in [2, max_len={self.max_len}], got {self.corpus_tokens}")
        if self.kind == "eagle1" and (self.draft_vocab is not None or self.aux_layers is not None):
            raise ValueError("draft_vocab / aux_layers: EAGLE-1 heads use the target's whole vocabulary and its last "
                             "hidden state; these options are for --kind eagle3")  # fmt: skip
        if self.feature_regression < 0 or (self.kind == "eagle1" and self.feature_regression):
            raise ValueError(f"feature_regression: a weight >= 0 for --kind eagle3 (EAGLE-1's loss always has it), got "
                             f"{self.feature_regression} for {self.kind}")  # fmt: skip

    @property
    def corpus_rows(self) -> int:
        """Corpus windows per batch (0 without a corpus)."""
        return round(self.batch_size * self.corpus_fraction) if self.corpus else 0

    @property
    def work_path(self) -> Path:
        return Path(self.work_dir) if self.work_dir else Path(str(Path(self.out)) + ".work")


def _log(msg: str, rank: int = 0) -> None:
    if rank == 0:
        print(f"[train-head] {msg}", file=sys.stderr, flush=True)


def load_target(spec: str, device: str, dtype: torch.dtype):
    """``(tokenizer, target)`` of a target spec (`fastspec.models`: "shipped", "smollm2", an HF directory or a
    ``.gguf`` file), frozen, in eval mode."""
    from fastspec import models

    tokenizer, target = models.load_target(spec, dtype, device)
    for p in target.parameters():
        p.requires_grad_(False)
    return tokenizer, target


def _build_head(kind: str, target, kept: torch.Tensor | None, aux_layers):
    if kind == "eagle3":
        from fastspec.heads.eagle3 import Eagle3Head

        head = Eagle3Head.from_target(target, kept, aux_layers=aux_layers)
    else:
        from fastspec.heads import DraftHead, DraftHeadConfig

        head = DraftHead(DraftHeadConfig.from_target_config(target.config)).bind(target)
    device = next(target.parameters()).device
    return head.to(device=device, dtype=torch.float32)  # fp32 master weights (under bf16 autocast too)


def read_checkpoint(path, what: str = "checkpoint") -> dict:
    """A `train_head` checkpoint file, read with ``torch.load(weights_only=True)``: tensors and plain values only, so a
    checkpoint from elsewhere cannot run code while it loads. ValueError naming ``what`` and ``path`` for a file that
    holds anything else."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        first = str(error).splitlines()[0]
        raise ValueError(f"{what}: {path} holds objects other than tensors and plain values, which fastspec does not "
                         f"unpickle (torch.load(weights_only=True): {first})") from None  # fmt: skip


def head_from_checkpoint(path, target):
    """The head of a `train_head` checkpoint (``checkpoint.pt`` in a work directory, `read_checkpoint`), bound to
    ``target``, fp32, in eval mode, and the checkpoint's step: a run's head measured while it trains (the head
    directory is written only at the end). ValueError naming ``path`` for a file that is not such a checkpoint."""
    ckpt = read_checkpoint(path)
    if not isinstance(ckpt, dict) or not {"kind", "head", "step", "config"} <= ckpt.keys():
        raise ValueError(f"{path}: not a train-head checkpoint (no kind, head, step and config)")
    head = _build_head(ckpt["kind"], target, ckpt.get("kept"), ckpt["config"].get("aux_layers"))
    head.load_state_dict(ckpt["head"])
    return head.eval(), ckpt["step"]


def _read_init_head(cfg: TrainConfig, target):
    """The head in ``cfg.init_head`` (any format `fastspec.heads.load_head` reads), bound to ``target``, fp32 on its
    device: a new run's starting weights. ValueError naming ``init_head`` when its kind, draft vocabulary size or
    feature layers differ from what ``cfg`` asks for."""
    from fastspec.heads import DraftHead, load_head
    from fastspec.heads.eagle3 import Eagle3Head

    head = load_head(cfg.init_head, target, dtype=torch.float32)
    want = Eagle3Head if cfg.kind == "eagle3" else DraftHead
    if not isinstance(head, want):
        raise ValueError(f"init_head: {cfg.init_head} holds a head of class {type(head).__name__}; a --kind "
                         f"{cfg.kind} run starts from a {want.__name__}")  # fmt: skip
    if cfg.kind == "eagle3":
        if cfg.draft_vocab is not None and cfg.draft_vocab != head.config.draft_vocab_size:
            raise ValueError(f"init_head: {cfg.init_head} has a draft vocabulary of {head.config.draft_vocab_size} "
                             f"tokens, draft_vocab asks for {cfg.draft_vocab}")  # fmt: skip
        if cfg.aux_layers is not None and list(cfg.aux_layers) != list(head.feature_layers):
            raise ValueError(f"init_head: {cfg.init_head} reads hidden_states {list(head.feature_layers)}, "
                             f"aux_layers asks for {list(cfg.aux_layers)}")  # fmt: skip
    return head


class _Unrolled(nn.Module):
    """The head and its training-time-test loss as one module, so DistributedDataParallel sees one forward per
    backward however many steps are unrolled. With ``regression`` > 0 (EAGLE-3), ``features`` [R, L, F + H] carry
    the target's last hidden state after the head's own features, and the loss adds ``regression`` times
    `feature_regression` onto it."""

    def __init__(self, head, kind: str, kept: torch.Tensor | None, steps: int, decay: float, regression: float = 0.0):
        super().__init__()
        self.head, self.kind, self.steps, self.decay = head, kind, steps, decay
        self.kept, self.regression = kept, regression

    def forward(self, features, input_ids, target_logits, loss_mask):
        hidden_size = self.head.config.hidden_size
        last = features[..., -hidden_size:]  # EAGLE-1: its own feature; EAGLE-3 with regression: appended
        if self.kind == "eagle3" and self.regression:
            features = features[..., :-hidden_size]
        outs = unroll(self.head, features, input_ids, self.steps)
        if self.kind == "eagle1":
            return eagle1_loss(outs, target_logits, last, loss_mask, self.decay)
        loss, stats = eagle3_loss(outs, target_logits, loss_mask, self.kept, self.decay)
        if not self.regression:
            return loss, stats
        reg, _ = feature_regression(outs, last, loss_mask, self.decay, stats)
        return loss + self.regression * reg, stats


def _batch(seqs, prompts_lens, index: list[int], max_len: int, pad: int, prompt_loss: bool = False,
           windows: torch.Tensor | None = None):  # fmt: skip
    """Right-padded rows [B, T] of sequences ``index``, then of corpus ``windows`` [n, W], and their loss mask
    [B, T]: 1 at the positions predicting answer tokens (``prompt_loss``: every position predicting a next token of
    the row; a window: every position but its last)."""
    rows, masks = [], []
    for i in index:
        seq, plen = seqs[i], prompts_lens[i]
        if len(seq) > max_len:  # drop prompt tokens from the left (keeping one), then answer tokens from the right
            drop = min(len(seq) - max_len, plen - 1)
            seq, plen = seq[drop:][:max_len], plen - drop
        mask = torch.zeros(len(seq), dtype=torch.float32)
        mask[0 if prompt_loss else plen - 1 : len(seq) - 1] = 1.0
        rows.append(seq)
        masks.append(mask)
    for window in windows if windows is not None else []:
        rows.append(window)
        masks.append(torch.cat([torch.ones(len(window) - 1), torch.zeros(1)]))
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    loss_mask = torch.zeros(len(rows), width)
    for b, (r, m) in enumerate(zip(rows, masks, strict=True)):
        ids[b, : len(r)], loss_mask[b, : len(m)] = r, m
    return ids, loss_mask


def epoch_order(lengths: list[int], batch_size: int, seed: int, rank: int = 0, world: int = 1) -> list[int]:
    """Rank ``rank``'s row indices of one epoch in batch order (consecutive ``batch_size`` entries form a batch): a
    permutation seeded by ``seed``, this rank's equal share of it, cut into windows of 16 batches whose rows are
    sorted by ``lengths`` into batches (little padding), the full batches then shuffled (a short one last)."""
    gen = torch.Generator().manual_seed(seed)
    share = len(lengths) // world
    perm = torch.randperm(len(lengths), generator=gen).tolist()[rank::world][:share]
    window, batches = 16 * batch_size, []
    for start in range(0, len(perm), window):
        rows = sorted(perm[start : start + window], key=lambda i: lengths[i])
        batches += [rows[b : b + batch_size] for b in range(0, len(rows), batch_size)]
    full = [b for b in batches if len(b) == batch_size]
    short = [b for b in batches if len(b) < batch_size]  # at most one: last, so every batch starts at a multiple
    return [i for b in torch.randperm(len(full), generator=gen).tolist() for i in full[b]] + sum(short, [])


def _lr(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to 10 % of ``peak`` over the budget's progress."""
    return peak * min(1.0, (step + 1) / max(warmup, 1)) * (0.1 + 0.45 * (1 + math.cos(math.pi * min(progress, 1.0))))


_LINEAGE_KEYS = ("command", "runs", "data", "steps", "train_minutes", "heldout_acceptance", "init_head",
                 "init_head_training")  # fmt: skip


def _init_head_record(init_head: str | None) -> dict | None:
    """How the starting head was trained: the lineage keys of its training.json (its own starting head's included,
    recursively), so a head trained in stages records every stage; None without a starting head or record."""
    record = Path(init_head) / "training.json" if init_head is not None else None
    if record is None or not record.is_file():
        return None
    earlier = json.loads(record.read_text())
    return {key: earlier[key] for key in _LINEAGE_KEYS if key in earlier}


@torch.no_grad()
def heldout_acceptance(target, head, prompts: list[list[int]], max_new_tokens: int, k: int = 4) -> dict:
    """Greedy chain decoding (K = ``k``) of each held-out prompt with ``fastspec.generate``: acceptance rate
    (accepted / drafted) and tokens per target forward over all prompts, and whether every output equals the
    target's own greedy decoding (it must: decoding is lossless)."""
    import fastspec

    device = next(target.parameters()).device
    accepted = drafted = row_steps = 0
    equal = True
    t0 = time.perf_counter()
    for ids in prompts:
        x = torch.tensor([ids], device=device)
        out, stats = fastspec.generate(target, x, draft=head, num_draft_tokens=k, max_new_tokens=max_new_tokens,
                                       return_stats=True)  # fmt: skip
        ref = fastspec.autoregressive_generate(target, x, max_new_tokens=max_new_tokens)
        equal &= bool(torch.equal(out, ref))
        accepted, drafted, row_steps = accepted + stats.accepted, drafted + stats.drafted, row_steps + stats.row_steps
    return {
        f"acceptance_rate_k{k}": round(accepted / drafted, 4) if drafted else 0.0,
        f"tokens_per_target_forward_k{k}": round((accepted + row_steps) / row_steps, 3) if row_steps else 0.0,
        "prompts": len(prompts),
        "new_tokens_per_prompt": max_new_tokens,
        "greedy_equal_to_target": equal,
        "seconds": round(time.perf_counter() - t0, 1),
    }


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _init_distributed(device: str):
    """``(dist or None, rank, world size, owned)``: the process group torchrun's environment asks for, created here
    unless the caller has one (``owned``: created here, so `train_head` destroys it at the end)."""
    import torch.distributed as dist

    owned = int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized()
    if owned:
        dist.init_process_group("nccl" if device.startswith("cuda") else "gloo")
    if dist.is_available() and dist.is_initialized():
        return dist, dist.get_rank(), dist.get_world_size(), owned
    return None, 0, 1, False


def train_head(config: TrainConfig, target=None, tokenizer=None, prompt_ids: list[list[int]] | None = None,
               heldout_ids: list[list[int]] | None = None) -> dict:  # fmt: skip
    """Train a head per ``config`` (module docstring) and return what ``training.json`` records.

    ``target``/``tokenizer`` replace ``config.target`` (a model object: its fingerprint guards the cache, and
    ``training.json`` names it by its class); ``prompt_ids``/``heldout_ids`` (token id lists) replace the prompt
    files (then ``heldout_ids`` None means the last ``heldout_count`` prompts)."""
    cfg = config
    t_start = time.time()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and "LOCAL_RANK" in os.environ:
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}"
        torch.cuda.set_device(device)
    dist, rank, world, owned_group = _init_distributed(device)
    on_cuda = device.startswith("cuda")
    amp_device = "cuda" if on_cuda else "cpu"
    autocast = on_cuda or cfg.bf16
    if target is None:
        tokenizer, target = load_target(cfg.target, device, torch.bfloat16 if on_cuda else torch.float32)
    else:
        target = target.to(device).eval()
        for p in target.parameters():
            p.requires_grad_(False)
    work = cfg.work_path
    work.mkdir(parents=True, exist_ok=True)

    # ---- prompts
    from_files = prompt_ids is None
    if from_files:
        if tokenizer is None:
            raise ValueError("tokenizer: needed to encode prompt files (or pass prompt_ids)")
        share = -(-(cfg.max_prompts or 1024) // len(cfg.prompts))  # a built-in source's count
        code_tokens = min(cfg.max_prompt_tokens, 128)
        lists = []
        for source in cfg.prompts:
            if source == "stdlib":
                lists.append(stdlib_prompts(tokenizer, share, code_tokens, cfg.seed))
            elif source == "stdlib-windows":
                lists.append(stdlib_windows(tokenizer, share, code_tokens, cfg.seed))
            elif source == "instructions":
                lists.append(instruction_prompts(share, cfg.seed))
            elif source == "self-questions":
                lists.append(self_questions(target, tokenizer, share, work / "self_questions.jsonl", cfg.seed,
                                            batch_size=cfg.regen_batch_size, progress=cfg.progress))  # fmt: skip
            else:
                lists.append(read_prompts([source], cfg.text_mode))
        texts = interleave_prompts(lists)
        if cfg.max_prompts is not None:
            texts = texts[: cfg.max_prompts]
        prompt_ids = encode_prompts(tokenizer, texts, cfg.max_prompt_tokens)
        if heldout_ids is None and cfg.heldout:
            heldout_ids = encode_prompts(tokenizer, read_prompts(cfg.heldout, cfg.text_mode), cfg.max_prompt_tokens)
    elif cfg.max_prompts is not None:
        prompt_ids = prompt_ids[: cfg.max_prompts]
    if heldout_ids is None:
        count = min(cfg.heldout_count, len(prompt_ids) // 2)
        prompt_ids, heldout_ids = prompt_ids[: len(prompt_ids) - count], prompt_ids[len(prompt_ids) - count :]
    if not prompt_ids:
        raise ValueError("prompts: no training prompts")
    _log(f"{len(prompt_ids)} training prompts, {len(heldout_ids)} held-out; device {device}, {world} process(es)", rank)

    # ---- answers by the target
    gen_cfg = getattr(target, "generation_config", None)
    eos = getattr(gen_cfg, "eos_token_id", None)
    pad = getattr(gen_cfg, "pad_token_id", None)
    if pad is None and tokenizer is not None:
        pad = tokenizer.pad_token_id
    pad = pad if pad is not None else (eos if isinstance(eos, int) else 0)
    regen_dir = Path(cfg.regen_cache) if cfg.regen_cache else work / "regen"
    data = regenerate(target, prompt_ids, regen_dir, max_new_tokens=cfg.regen_tokens,
                      temperature=cfg.regen_temperature, seed=cfg.seed, batch_size=cfg.regen_batch_size,
                      eos_token_id=eos, pad_token_id=pad, progress=cfg.progress)  # fmt: skip
    answer_tokens = sum(len(a) for a in data.answers)
    _log(f"answers: {answer_tokens} tokens ({data.generated_now} prompts generated now; the cache's "
         f"{data.tokens_per_second:.0f} tokens/s)", rank)  # fmt: skip
    sources = [data]
    extra_settings = []
    for extra in cfg.extra_regen_caches:
        more, header = read_regen_cache(target, prompt_ids, extra)
        sources.append(more)
        extra_settings.append({"cache": str(extra), "temperature": header.get("temperature"),
                               "max_new_tokens": header.get("max_new_tokens"),
                               "answer_tokens": sum(len(a) for a in more.answers)})  # fmt: skip
        _log(f"answers from {extra}: {extra_settings[-1]['answer_tokens']} tokens "
             f"(temperature {header.get('temperature')})", rank)  # fmt: skip
    seqs = [torch.cat([p, a]) for src in sources for p, a in zip(src.prompts, src.answers, strict=True)]
    plens = [len(p) for src in sources for p in src.prompts]
    all_answers = [a for src in sources for a in src.answers]
    stream = None
    if cfg.corpus:
        if tokenizer is None:
            raise ValueError("tokenizer: needed to encode the corpus")
        stream = corpus_stream(tokenizer, cfg.corpus, eos if isinstance(eos, int) else pad)
        _log(f"corpus: {len(stream)} tokens; {cfg.corpus_rows} windows of {cfg.corpus_tokens} per batch", rank)

    # ---- checkpoint, vocabulary, head
    ckpt_path = work / "checkpoint.pt"
    ckpt = None
    if cfg.resume:
        if not ckpt_path.is_file():
            raise FileNotFoundError(f"resume: no checkpoint at {ckpt_path}")
        ckpt = read_checkpoint(ckpt_path, "resume")
        if ckpt["kind"] != cfg.kind:
            raise ValueError(f"resume: {ckpt_path} trains a {ckpt['kind']} head, asked for {cfg.kind}")
    vocab = target.get_output_embeddings().weight.shape[0]
    counts = token_counts(all_answers, vocab)
    init = _read_init_head(cfg, target) if cfg.init_head is not None and ckpt is None else None
    kept, coverage = None, 1.0
    if cfg.kind == "eagle3":
        size = cfg.draft_vocab or min(vocab, 32000)
        if size > vocab:
            raise ValueError(f"draft_vocab: {size} exceeds the target's vocabulary of {vocab} tokens")
        if ckpt is not None:
            kept = ckpt["kept"]
        elif init is not None:
            kept = init.t2d.nonzero().flatten().cpu() if init.config.draft_vocab_size < vocab else None
        elif size < vocab:
            kept = select_draft_vocab(counts, size)
        if kept is not None:
            coverage = vocab_coverage(counts, kept)
            _log(f"draft vocabulary: {len(kept)} of {vocab} tokens, covering {coverage:.2%} of the answers", rank)
    if init is not None:
        head = init.train()
        _log(f"initial weights: {cfg.init_head}", rank)
    else:
        head = _build_head(cfg.kind, target, kept, cfg.aux_layers)
    kept_dev = kept.to(device) if kept is not None else None
    module = _Unrolled(head, cfg.kind, kept_dev, cfg.unroll, cfg.decay, cfg.feature_regression)
    read_layers = [*head.feature_layers, -1] if cfg.feature_regression else list(head.feature_layers)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    step, epoch, position, elapsed, history, total_tokens = 0, 0, 0, 0.0, [], 0
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    if ckpt is not None:
        head.load_state_dict(ckpt["head"])
        opt.load_state_dict(ckpt["opt"])
        step, epoch, position, elapsed = ckpt["step"], ckpt["epoch"], ckpt["position"], ckpt["elapsed"]
        history = ckpt["history"]
        total_tokens = ckpt.get("trained_tokens")  # None: a checkpoint written before the count was kept
        _set_rng_state(ckpt["rng"])
        _log(f"resumed {ckpt_path}: step {step}, epoch {epoch}, {elapsed / 60:.1f} min trained", rank)
    # every invocation that trained this head, oldest first (training.json's provenance across --resume)
    runs = ckpt.get("runs") if ckpt is not None else []
    if ckpt is not None and not runs:
        runs = [{"command": None, "from_step": 0, "to_step": step, "train_minutes": round(elapsed / 60, 2),
                 "note": "runs written before checkpoints kept their commands"}]  # fmt: skip
    this_run = {"command": cfg.command, "from_step": step, "to_step": step, "train_minutes": 0.0,
                "training_prompts": len(prompt_ids), "training_rows": len(seqs)}  # fmt: skip
    runs.append(this_run)
    runner = module
    if dist is not None:
        from torch.nn.parallel import DistributedDataParallel

        runner = DistributedDataParallel(module, device_ids=[torch.device(device).index] if on_cuda else None)
    n_params = sum(p.numel() for p in params)
    _log(f"{cfg.kind} head: {n_params / 1e6:.3f}M trainable parameters, feature layers {head.feature_layers}", rank)

    # ---- training
    share = len(seqs) // world  # every rank the same number of batches
    if share == 0:
        raise ValueError(f"prompts: {len(seqs)} training sequences for {world} processes")
    answer_rows = cfg.batch_size - cfg.corpus_rows  # answer rows per batch; the rest are corpus windows
    per_epoch = math.ceil(share / answer_rows)
    budget_s = cfg.minutes * 60 if cfg.minutes is not None else None

    lengths = [len(q) for q in seqs]

    def order(ep: int) -> list[int]:
        return epoch_order(lengths, answer_rows, cfg.seed * 1000 + ep, rank, world)

    def save_checkpoint() -> None:
        if rank != 0:
            return
        this_run.update(to_step=step, train_minutes=round((elapsed - elapsed0) / 60, 2))
        state = {"kind": cfg.kind, "kept": kept, "head": head.state_dict(), "opt": opt.state_dict(), "step": step,
                 "epoch": epoch, "position": position, "elapsed": elapsed, "rng": _rng_state(),
                 "history": history, "trained_tokens": total_tokens, "config": asdict(cfg), "runs": runs}  # fmt: skip
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, ckpt_path)

    bar = None
    if cfg.progress and rank == 0:
        from tqdm import tqdm

        bar = tqdm(total=cfg.max_steps, initial=step, desc=f"train-head {cfg.kind}", unit="step", file=sys.stderr)
    head.train()
    trained_tokens = 0
    run_start = last_ckpt = time.time()
    elapsed0 = elapsed
    ema_loss = ema_agree = None
    perm = order(epoch)
    while True:
        elapsed = elapsed0 + time.time() - run_start
        stop = (cfg.max_steps is not None and step >= cfg.max_steps) or (budget_s is not None and elapsed >= budget_s)
        if dist is not None:  # every rank stops at the same step: rank 0's clock decides
            flag = torch.tensor([float(stop)], device=device)
            dist.broadcast(flag, 0)
            stop = bool(flag.item())
        if stop:
            break
        progress = max(elapsed / budget_s if budget_s else 0.0, step / cfg.max_steps if cfg.max_steps else 0.0)
        for group in opt.param_groups:
            group["lr"] = _lr(step, progress, cfg.lr, cfg.warmup)
        index = perm[position * answer_rows : (position + 1) * answer_rows]
        windows = None
        if stream is not None:  # drawn from (seed, step, rank) alone: a resumed run draws the same
            seed = (cfg.seed * 1_000_003 + step) * 1009 + rank
            windows = corpus_windows(stream, cfg.corpus_rows, cfg.corpus_tokens, seed)
        ids, loss_mask = _batch(seqs, plens, index, cfg.max_len, pad, cfg.prompt_loss, windows)
        ids, loss_mask = ids.to(device), loss_mask.to(device)
        with torch.no_grad(), torch.autocast(amp_device, torch.bfloat16, enabled=autocast):
            t_logits, feats = target_logits_and_features(target, 0, read_layers, input_ids=ids)
        steps = min(cfg.unroll, ids.shape[1] - 1)
        module.steps = steps
        with torch.autocast(amp_device, torch.bfloat16, enabled=autocast):
            loss, stats = runner(feats, ids, t_logits, loss_mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        opt.step()
        step += 1
        trained_tokens += ids.numel() * world
        total_tokens = None if total_tokens is None else total_tokens + ids.numel() * world
        position += 1
        if position >= per_epoch:
            epoch, position = epoch + 1, 0
            perm = order(epoch)
        value, agree = loss.item(), stats[0]["agree"]
        ema_loss = value if ema_loss is None else 0.95 * ema_loss + 0.05 * value
        ema_agree = agree if ema_agree is None else 0.95 * ema_agree + 0.05 * agree
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{ema_loss:.3f}", agree1=f"{ema_agree:.3f}", epoch=epoch)
        if step % 50 == 0 or step == 1:
            history.append({"step": step, "minutes": round((elapsed0 + time.time() - run_start) / 60, 2),
                            "loss": round(ema_loss, 4), "agree_step1": round(ema_agree, 4),
                            "agree_per_step": [round(s["agree"], 4) for s in stats]})  # fmt: skip
        if time.time() - last_ckpt > cfg.ckpt_minutes * 60:
            elapsed = elapsed0 + time.time() - run_start
            save_checkpoint()
            last_ckpt = time.time()
    if bar is not None:
        bar.close()
    run_seconds = time.time() - run_start
    elapsed = elapsed0 + run_seconds
    save_checkpoint()
    if dist is not None:  # equal on every rank: DDP averages the gradients (tests compare the lines)
        checksum = sum(float(p.detach().double().abs().sum()) for p in params)
        sys.stderr.write(f"[train-head rank {rank}] parameter checksum {checksum!r}\n")  # one write: ranks share stderr
        sys.stderr.flush()

    # ---- save, reload, held-out acceptance, training.json
    result = None
    if rank == 0:
        from fastspec.heads import load_head

        out = Path(cfg.out)
        head.eval()
        head.save_pretrained(out, dtype=getattr(torch, cfg.save_dtype))
        if total_tokens is not None and elapsed > 0:
            train_rate, rate_span = round(total_tokens / elapsed, 1), "over every run"
        else:  # a checkpoint from before the count was kept: this run's rate
            train_rate = round(trained_tokens / run_seconds, 1) if trained_tokens else None
            rate_span = "of this run (the checkpoint kept no count)"
        reloaded = load_head(out, target)
        acceptance = heldout_acceptance(target, reloaded, heldout_ids, cfg.heldout_tokens) if heldout_ids else None
        _log(f"held-out acceptance: {acceptance}")
        regression_text = (f", plus {cfg.feature_regression} x the smooth-L1 of each step's hidden to the target's "
                           "last hidden state (EAGLE-1's regression)" if cfg.feature_regression else "")  # fmt: skip
        result = {
            "command": cfg.command,
            "runs": runs,
            "kind": cfg.kind,
            "format": "EAGLE-3 official layout (LlamaForCausalLMEagle3)"
            if cfg.kind == "eagle3"
            else "fastspec EAGLE-1 head",
            "target": cfg.target if isinstance(cfg.target, str) else type(target).__name__,
            "target_class": type(target).__name__,
            "feature_layers": list(head.feature_layers),
            "data": {
                "prompts": cfg.prompts if from_files else "token ids given to train_head",
                "text_mode": cfg.text_mode,
                "training_prompts": len(prompt_ids),
                "training_rows": len(seqs),
                "heldout_prompts": len(heldout_ids),
                "heldout": cfg.heldout or f"the last {len(heldout_ids)} prompts",
                "answer_tokens": sum(len(a) for a in all_answers),
                "prompt_tokens": sum(plens),
                "regen_tokens": cfg.regen_tokens,
                "regen_temperature": cfg.regen_temperature,
                "regen_cache": str(regen_dir),
                "extra_regen_caches": extra_settings,
                "loss_positions": "prompt and answer tokens" if cfg.prompt_loss else "answer tokens",
                "corpus": None
                if stream is None
                else {
                    "sources": cfg.corpus,
                    "tokens": len(stream),
                    "windows_per_batch": cfg.corpus_rows,
                    "answer_rows_per_batch": answer_rows,
                    "window_tokens": cfg.corpus_tokens,
                    "loss_positions": "every position of a window but its last",
                },
            },
            "init_head": cfg.init_head,
            "init_head_training": _init_head_record(cfg.init_head),
            "draft_vocab": len(kept) if kept is not None else vocab,
            "vocab_size": vocab,
            "draft_vocab_coverage_of_answers": round(coverage, 4),
            "loss": "training-time test: head unrolled {} steps on its own outputs (diagonal attention to later "
            "steps), per step {} weighted {}^k".format(
                cfg.unroll,
                "CE against the target's distribution renormalised over the kept tokens, counted where the "
                "target's argmax is kept"
                if cfg.kind == "eagle3"
                else "smooth-L1 to the next last hidden state + CE against the target's distribution",
                cfg.decay,
            )
            + regression_text,
            "steps": step,
            "epochs": round(epoch + position / per_epoch, 3),
            "train_minutes": round(elapsed / 60, 2),
            "throughput": {
                "regeneration_tokens_per_s": round(data.tokens_per_second, 1),
                "training_tokens_per_s": train_rate,
                "training_tokens_per_s_note": "batch tokens (padding included) per second of training, all processes, "
                + rate_span,
                "regeneration_note": "generated tokens / summed seconds of the cache's chunks, per process",
            },
            "heldout_acceptance": acceptance,
            "history": history,
            "config": {k: v for k, v in asdict(cfg).items() if k != "command"},
            "processes": world,
            "device": str(device),
            "autocast": "bfloat16" if autocast else None,
            "threads": torch.get_num_threads(),
            "head_parameters": n_params,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "wall_minutes": round((time.time() - t_start) / 60, 2),
        }
        (out / "training.json").write_text(json.dumps(result, indent=2) + "\n")
        _log(f"saved {out} (step {step}, {elapsed / 60:.1f} min)")
    if dist is not None:
        dist.barrier()
        if owned_group:  # a gloo group left to interpreter shutdown can abort a rank on exit ("terminate called")
            dist.destroy_process_group()
    return result
