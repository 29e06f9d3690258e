"""Train the small target/draft LlamaForCausalLM pair shipped in ``fastspec/pair/``.

The corpus is the Python standard library source of the running interpreter: the files of
`fastspec.prompts.training_files`, the same rule `fastspec train-head`'s ``stdlib`` prompts follow (the held-out
modules of `fastspec.prompts.HELD_OUT_MODULES` are evaluation text). The script

1. trains a byte-level BPE tokenizer (``<|endoftext|>`` is BOS, EOS and pad),
2. trains the target with next-token cross entropy (AdamW, warmup + cosine LR) for ``--target-minutes``,
3. trains the draft for ``--draft-minutes``: a short plain-CE warm start (``--draft-ce-frac``, no teacher forward, so
   several times the throughput), then distillation from the target (forward KL to its softmax, plus a little CE),
4. evaluates held-out loss of both models and draft/target greedy agreement, both teacher-forced on held-out text and
   on the target's own greedy continuations of held-out prompts (which is exactly the per-token greedy acceptance
   probability), and simulates greedy speculative decoding at K=4 on those continuations,
5. saves both models as bf16 safetensors with the tokenizer, plus its metrics (``--metrics``, by default
   ``bench/results/training/train_pair.json`` under the working directory, the checkout's root), with the
   command that made them.

Training is bounded by wall clock, not step count. ``--measure-cost`` only times one-token decode steps (KV cache of
``--cost-context`` tokens, fp32, batch 1) of randomly initialised models of the configured sizes and exits.

With other processes competing for the cores, OpenMP's default spin-waiting makes multi-threaded training steps many
times slower (threads spin while their partner is descheduled); passive waiting keeps throughput steady. libgomp reads
``OMP_WAIT_POLICY`` when torch loads, which importing ``fastspec`` already did, so without a policy of its own the
script runs itself again with ``OMP_WAIT_POLICY=PASSIVE``. Decode costs are measured in a subprocess with the caller's
setting, since that is how benchmarks run the models.

    python -m fastspec.training.train_pair --measure-cost
    python -m fastspec.training.train_pair --target-minutes 48 --draft-minutes 20
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from fastspec.pair import PAIR_DIR
from fastspec.prompts import HELD_OUT_MODULES, heldout_prompts, heldout_sources, training_files

CALLER_POLICY = "FASTSPEC_CALLER_OMP_WAIT_POLICY"  # set when this script ran itself again: the caller's policy
EOT = "<|endoftext|>"
T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def _run_with_passive_omp() -> None:
    """Run this script again with ``OMP_WAIT_POLICY=PASSIVE`` (module docstring), unless a policy is set."""
    if "OMP_WAIT_POLICY" in os.environ:
        return
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **{CALLER_POLICY: ""})
    os.execve(sys.executable, [sys.executable, "-m", "fastspec.training.train_pair", *sys.argv[1:]], env)


def _caller_policy() -> str | None:
    """The caller's OMP_WAIT_POLICY (None: unset), before `_run_with_passive_omp` set one."""
    if CALLER_POLICY in os.environ:
        return os.environ[CALLER_POLICY] or None
    return os.environ.get("OMP_WAIT_POLICY")


def read_texts(paths: list[Path]) -> list[str]:
    return [p.read_text(encoding="utf-8", errors="replace") for p in paths]


def train_tokenizer(texts: list[str], vocab_size: int):
    """Train a byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT, unk_token=EOT)


def encode_docs(tokenizer, texts: list[str]) -> torch.Tensor:
    """Concatenate the token ids of all texts, each followed by EOS."""
    eos, ids = tokenizer.eos_token_id, []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def make_model(vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, inter: int, eos_id: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,  # RoPE: no learned positions; the value only bounds what callers may ask for
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
    )
    return LlamaForCausalLM(cfg)


def build_models(args, vocab_size: int, eos_id: int = 0):
    target = make_model(vocab_size, *args.target_shape, eos_id=eos_id)
    draft = make_model(vocab_size, *args.draft_shape, eos_id=eos_id)
    return target, draft


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied embeddings are counted once


@torch.no_grad()
def decode_costs_ms(models: list, context: int, steps: int, vocab_size: int) -> list[tuple[float, float]]:
    """(median, 10th percentile) ms of one batch-1 fp32 decode step of each model with ``context`` cached tokens.

    Steps of the models are interleaved so that CPU contention from other processes affects all of them alike.
    """
    ids = torch.randint(1, vocab_size, (1, context))
    caches = [m.eval()(ids, use_cache=True).cache for m in models]
    times: list[list[float]] = [[] for _ in models]
    for i in range(steps + 10):
        for model, cache, ts in zip(models, caches, times, strict=True):
            t = time.perf_counter()
            model(ids[:, -1:], cache=cache, use_cache=True)
            if i >= 10:  # warm-up
                ts.append(time.perf_counter() - t)
            cache.crop(-1)  # keep the cache at `context` tokens
    return [(statistics.median(ts) * 1e3, statistics.quantiles(ts, n=10)[0] * 1e3) for ts in times]


def measure_cost(args, vocab_size: int) -> dict:
    target, draft = build_models(args, vocab_size)
    (t_ms, t_p10), (d_ms, d_p10) = decode_costs_ms([target, draft], args.cost_context, args.cost_steps, vocab_size)
    res = {
        "target_decode_ms": round(t_ms, 3),
        "draft_decode_ms": round(d_ms, 3),
        "cost_ratio": round(t_ms / d_ms, 2),
        "target_decode_ms_p10": round(t_p10, 3),
        "draft_decode_ms_p10": round(d_p10, 3),
        "cost_ratio_p10": round(t_p10 / d_p10, 2),
        "context": args.cost_context,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "target_params": n_params(target),
        "draft_params": n_params(draft),
        "bf16_total_mb": round(2 * (n_params(target) + n_params(draft)) / 1e6, 2),
    }
    log(f"decode cost (random init, fp32, batch 1): {json.dumps(res)}")
    return res


def measure_cost_subprocess(args) -> dict:
    """Run ``--measure-cost`` in a child process with the caller's OpenMP settings and return its result."""
    env = dict(os.environ)
    caller = _caller_policy()
    env.pop("OMP_WAIT_POLICY", None)
    env.pop(CALLER_POLICY, None)
    if caller is not None:
        env["OMP_WAIT_POLICY"] = caller
    cmd = [
        sys.executable,
        "-m",
        "fastspec.training.train_pair",
        "--measure-cost",
        "--vocab-size",
        str(args.vocab_size),
        "--threads",
        str(args.threads),
    ]
    cmd += ["--cost-context", str(args.cost_context), "--cost-steps", str(args.cost_steps)]
    cmd += ["--target-shape", *map(str, args.target_shape), "--draft-shape", *map(str, args.draft_shape)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    res = json.loads(out.strip().splitlines()[-1])
    log(f"decode cost (random init, fp32, batch 1, caller's OpenMP settings): {json.dumps(res)}")
    return res


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to 10% over the wall-clock ``progress`` in [0, 1]."""
    return peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def sample_windows(data: torch.Tensor, args, gen: torch.Generator, separators: list[torch.Tensor]) -> torch.Tensor:
    """A batch [batch_size, seq_len + 1] of random windows of ``data``; a ``copy_frac`` share of them are copy windows.

    A copy window is a span of L tokens (16 <= L <= half the window), a separator (a comment line announcing a copy,
    or just a blank line), then the text again from the span's start: its second half starts with an exact copy of
    the span, which teaches the model to look back and repeat (induction), the behaviour that makes prompt lookup
    decoding pay off on code edits. The separator phrases avoid the wording of the benchmark's repeat prompts.
    """
    rows = []
    for _ in range(args.batch_size):
        if float(torch.rand((), generator=gen)) < args.copy_frac:
            sep = separators[int(torch.randint(0, len(separators), (), generator=gen))]
            room = args.seq_len + 1 - len(sep)
            span = int(torch.randint(16, room // 2 + 1, (), generator=gen))
            i = int(torch.randint(0, len(data) - room, (), generator=gen))
            rows.append(torch.cat([data[i : i + span], sep, data[i : i + room - span]]))
        else:
            i = int(torch.randint(0, len(data) - args.seq_len - 1, (), generator=gen))
            rows.append(data[i : i + args.seq_len + 1])
    return torch.stack(rows)


def train(
    model, data: torch.Tensor, args, separators: list[torch.Tensor], minutes: float, peak_lr: float, name: str,
    teacher=None, ce_frac: float = 0.0,
) -> dict:  # fmt: skip
    """Train ``model`` on random windows of ``data`` (`sample_windows`) for ``minutes`` of wall clock.

    With a ``teacher``, the first ``ce_frac`` of the budget is plain CE on the data (cheap: no teacher forward), the
    rest distils: forward KL to the teacher's softmax plus ``args.distill_ce`` times CE.
    """
    if minutes <= 0:  # keep the model as it is (e.g. a --resume run that trains only one of the pair)
        model.eval()
        return {"steps": 0, "tokens_seen": 0, "minutes": 0.0}
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(args.seed + (teacher is not None))
    budget, start, step, tokens, ema, kd_steps, kd_tokens = minutes * 60, time.time(), 0, 0, None, 0, 0
    model.train()
    while time.time() - start < budget:
        progress = (time.time() - start) / budget
        distil = teacher is not None and progress >= ce_frac
        if distil and kd_steps == 0:
            log(f"{name}: switching from CE to distillation at step {step}")
            ema = None
        lr = lr_at(step, progress, peak_lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = sample_windows(data, args, gen, separators)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        logits = model(inputs).logits.float()
        ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
        if not distil:
            loss = ce
        else:
            with torch.no_grad():
                t_logp = F.log_softmax(teacher(inputs).logits.float(), -1)
            kl = F.kl_div(F.log_softmax(logits, -1), t_logp, log_target=True, reduction="none").sum(-1).mean()
            loss = kl + args.distill_ce * ce
            kd_steps, kd_tokens = kd_steps + 1, kd_tokens + inputs.numel()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step, tokens = step + 1, tokens + inputs.numel()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % args.log_every == 0 or step == 1:
            el = time.time() - start
            log(
                f"{name} step {step} loss {loss.item():.4f} (ema {ema:.4f}) ce {ce.item():.4f} lr {lr:.2e} "
                f"tok/s {tokens / el:.0f} elapsed {el / 60:.1f}/{minutes:.1f} min"
            )
    model.eval()
    el = time.time() - start
    log(f"{name} done: {step} steps, {tokens} tokens, {el / 60:.1f} min, final loss ema {ema:.4f}")
    stats = {"steps": step, "tokens_seen": tokens, "minutes": round(el / 60, 2), "final_train_loss_ema": round(ema, 4)}
    if teacher is not None:
        stats |= {"distill_steps": kd_steps, "distill_tokens": kd_tokens, "final_loss": "KL + distill_ce * CE"}
    return stats


@torch.no_grad()
def heldout_eval(target, draft, data: torch.Tensor, seq_len: int) -> dict:
    """Held-out CE of both models and teacher-forced greedy top-1 agreement, over non-overlapping windows."""
    n = (len(data) - 1) // seq_len
    x = data[: n * seq_len + 1]
    inputs, labels = x[:-1].view(n, seq_len), x[1:].view(n, seq_len)
    tot = {"target": 0.0, "draft": 0.0, "agree": 0}
    for i in range(0, n, 8):
        t_logits, d_logits = target(inputs[i : i + 8]).logits, draft(inputs[i : i + 8]).logits
        lab = labels[i : i + 8].flatten()
        tot["target"] += F.cross_entropy(t_logits.flatten(0, 1), lab, reduction="sum").item()
        tot["draft"] += F.cross_entropy(d_logits.flatten(0, 1), lab, reduction="sum").item()
        tot["agree"] += (t_logits.argmax(-1) == d_logits.argmax(-1)).sum().item()
    m = n * seq_len
    return {
        "heldout_tokens": m,
        "target_heldout_loss": round(tot["target"] / m, 4),
        "draft_heldout_loss": round(tot["draft"] / m, 4),
        "teacher_forced_agreement": round(tot["agree"] / m, 4),
    }


@torch.no_grad()
def greedy_paths(target, tokenizer, num_prompts: int, prompt_tokens: int, new_tokens: int):
    """(full sequence [1, T], prompt length) of the target's greedy continuations of held-out prompts."""
    paths = []
    for prompt in heldout_prompts(tokenizer, num_prompts, prompt_tokens):
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
        out = target(ids, use_cache=True)
        cache, seq = out.cache, [out.logits[0, -1].argmax().item()]
        for _ in range(new_tokens - 1):
            out = target(torch.tensor([[seq[-1]]]), cache=cache, use_cache=True)
            seq.append(out.logits[0, -1].argmax().item())
        paths.append((torch.cat([ids, torch.tensor([seq])], 1), ids.shape[1]))
    return paths


@torch.no_grad()
def greedy_acceptance(target, draft, tokenizer, num_prompts: int, prompt_tokens: int, new_tokens: int, k: int) -> dict:
    """Agreement on the target's greedy continuations of held-out prompts, and simulated greedy spec decoding at K."""
    agree, total, accepted, proposed, rounds = 0, 0, 0, 0, 0
    for full, prompt_len in greedy_paths(target, tokenizer, num_prompts, prompt_tokens, new_tokens):
        seq = full[0, prompt_len:].tolist()
        d_pred = draft(full[:, :-1]).logits[0, prompt_len - 1 :].argmax(-1).tolist()
        match = [int(a == b) for a, b in zip(d_pred, seq, strict=True)]
        agree, total = agree + sum(match), total + len(match)
        pos = 0
        while pos < len(match):  # one verification round: accept the matching prefix of K proposals, plus a bonus
            m = 0
            while m < k and pos + m < len(match) and match[pos + m]:
                m += 1
            accepted, proposed, rounds, pos = accepted + m, proposed + k, rounds + 1, pos + m + 1
    return {
        "greedy_agreement_on_target_path": round(agree / total, 4),
        f"acceptance_rate_k{k}": round(accepted / proposed, 4),
        f"tokens_per_target_call_k{k}": round(total / rounds, 3),
        "num_prompts": num_prompts,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
    }


def save(model, tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    model.float()
    tokenizer.save_pretrained(out_dir)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape = "HIDDEN LAYERS HEADS KV_HEADS INTERMEDIATE"
    ap.add_argument("--target-shape", type=int, nargs=5, default=[256, 12, 4, 2, 768], metavar=shape.split())
    ap.add_argument("--draft-shape", type=int, nargs=5, default=[192, 1, 4, 2, 576], metavar=shape.split())
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--measure-cost", action="store_true", help="only time decode steps of random models and exit")
    ap.add_argument("--cost-context", type=int, default=200)
    ap.add_argument("--cost-steps", type=int, default=200)
    ap.add_argument("--target-minutes", type=float, default=48.0)
    ap.add_argument("--draft-minutes", type=float, default=20.0)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--distill-ce", type=float, default=0.1, help="weight of the CE term added to the distillation KL")
    ap.add_argument("--draft-ce-frac", type=float, default=0.25, help="share of the draft budget spent on plain CE")
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--copy-frac", type=float, default=0.0, help="share of training windows that repeat a span")
    ap.add_argument("--resume", type=Path, help="continue training this pair directory (tokenizer, target, draft)")
    ap.add_argument("--out-dir", type=Path, default=PAIR_DIR)
    ap.add_argument("--metrics", type=Path, default=Path("bench/results/training/train_pair.json"))
    args = ap.parse_args()

    if args.measure_cost:
        torch.set_num_threads(args.threads)
        torch.manual_seed(args.seed)
        print(json.dumps(measure_cost(args, args.vocab_size)), flush=True)
        return
    _run_with_passive_omp()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    cost = measure_cost_subprocess(args)
    train_paths = training_files()
    train_texts, held_texts = read_texts(train_paths), list(heldout_sources().values())
    log(
        f"corpus: {len(train_paths)} training files ({sum(map(len, train_texts)) / 1e6:.1f} MB), "
        f"{len(held_texts)} held-out files ({sum(map(len, held_texts)) / 1e3:.0f} kB)"
    )
    if args.resume is None:
        tokenizer = train_tokenizer(train_texts, args.vocab_size)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.resume / "target")
    eos = tokenizer.eos_token_id
    separators = [
        torch.tensor(tokenizer.encode(text, add_special_tokens=False))
        for text in ("\n\n# Copy of the code above:\n", "\n\n# Repeated:\n", "\n\n# Again, as before:\n", "\n\n")
    ]
    train_data, held_data = encode_docs(tokenizer, train_texts), encode_docs(tokenizer, held_texts)
    log(
        f"tokenizer: vocab {len(tokenizer)}, eos id {eos}, {len(train_data)} training tokens "
        f"({sum(map(len, train_texts)) / len(train_data):.2f} chars/token), {len(held_data)} held-out tokens"
    )

    if args.resume is None:
        target, draft = build_models(args, len(tokenizer), eos_id=eos)
    else:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(args.resume / "target", dtype=torch.float32)
        draft = AutoModelForCausalLM.from_pretrained(args.resume / "draft", dtype=torch.float32)
        log(f"resuming from {args.resume}")
    log(f"target {n_params(target) / 1e6:.2f}M params, draft {n_params(draft) / 1e6:.2f}M params")
    t_stats = train(target, train_data, args, separators, args.target_minutes, args.target_lr, "target")
    for p in target.parameters():
        p.requires_grad_(False)
    d_stats = train(
        draft, train_data, args, separators, args.draft_minutes, args.draft_lr, "draft", target, args.draft_ce_frac
    )

    save(target, tokenizer, args.out_dir / "target")
    save(draft, tokenizer, args.out_dir / "draft")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.out_dir / "target")
    target = AutoModelForCausalLM.from_pretrained(args.out_dir / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.out_dir / "draft", dtype=torch.float32).eval()
    log("reloaded the saved pair (bf16 weights, evaluated in fp32)")
    held = heldout_eval(target, draft, held_data, args.seq_len)
    log(f"held-out: {json.dumps(held)}")
    acc = greedy_acceptance(target, draft, tokenizer, args.eval_prompts, 128, 64, 4)
    log(f"greedy acceptance: {json.dumps(acc)}")

    size_mb = {
        d: round(sum(f.stat().st_size for f in (args.out_dir / d).iterdir()) / 1e6, 2) for d in ("target", "draft")
    }
    metrics = {
        "command": "python -m fastspec.training.train_pair " + shlex.join(sys.argv[1:]),
        "target_shape": dict(zip(shape.lower().split(), args.target_shape, strict=True)),
        "draft_shape": dict(zip(shape.lower().split(), args.draft_shape, strict=True)),
        "vocab_size": len(tokenizer),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "train_files": len(train_paths),
        "train_tokens": len(train_data),
        "heldout_modules": HELD_OUT_MODULES,
        "target_params": n_params(target),
        "draft_params": n_params(draft),
        "dir_size_mb": size_mb,
        "decode_cost": cost,
        "target_training": t_stats,
        "draft_training": d_stats,
        "heldout": held,
        "greedy_acceptance": acc,
        "total_minutes": round((time.time() - T0) / 60, 2),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    args.metrics.parent.mkdir(parents=True, exist_ok=True)
    args.metrics.write_text(json.dumps(metrics, indent=2) + "\n")
    log(f"wrote {args.metrics}; total {metrics['total_minutes']} min")


if __name__ == "__main__":
    main()
