"""Train an EAGLE-style draft head (``fastspec.heads.DraftHead``) for the shipped target into ``fastspec/pair/head``.

Corpus, tokenizer and held-out split are those of ``training/train_pair.py``: the CPython standard library source of the
running interpreter, tokenized with the shipped pair's tokenizer, with :data:`fastspec.pair.HELD_OUT_MODULES` left
out of training. The target (``fastspec.pair.load_pair()``) is frozen; its features are computed on the fly for random
training windows (no_grad forward, ``target_logits_and_features``): the last hidden state (lm_head input) for an
EAGLE-1 head, or with ``--feature-layers`` several hidden states that the head fuses into its input feature
(EAGLE-3's low, middle and high layers, arXiv 2503.01840; the head's ``fuse`` starts as the pick of the last state).

Loss (EAGLE-1, arXiv 2401.15077): per unrolled step, smooth-L1 regression of the next position's last hidden state plus
``--ce-weight`` times the cross entropy of ``lm_head(hidden)`` against the target's own next-token distribution
(soft labels: softmax of the target logits, not the data token). ``--target-dtype bfloat16`` runs the frozen
target's training forward under bf16 autocast (cheaper, so more steps fit the budget; held-out evaluation and
drafting use fp32 features). Input features get uniform noise
U(-noise/2, noise/2) (EAGLE's data augmentation). With ``--unroll K`` > 1 (training-time test), step s feeds the
head's own step s-1 output as the feature; its queries attend to the step-1 keys of real features up to the same
position and to their own earlier unrolled entries, exactly as when drafting, via a 4D mask over the head's cache.

Held-out metrics: teacher-forced agreement of the head's argmax with the target's argmax at unrolled steps 1 and 2
on held-out windows, and, on the target's greedy continuations of held-out prompts, the per-step agreement and a
simulated greedy chain at K=4 (acceptance rate and tokens per target call, as in train_pair.py).

Self-distillation (``--self-distill N``): at inference a head drafts on the target's own text, which training windows
of the corpus are not; with N > 0 a share of every batch (``--self-distill-fraction``) comes from N target greedy
continuations of random training windows (Medusa-2 and EAGLE train on target-generated text too), and with
``--self-distill-functions N`` also from N continuations of training-module windows that end after a function's
signature and docstring, as the bench's held-out prompts do. Both are generated once and cached in training/out.

Wall-clock bounded (``--minutes``, total over resumed runs), checkpointed to ``--ckpt`` every ``--ckpt-minutes``.

    python -m training.train_head --minutes 30 --threads 2
    python -m training.train_head --resume --minutes 30   # continue from the checkpoint up to 30 minutes in total
    python -m training.train_head --init fastspec/pair/head --minutes 60   # warm start from a saved head directory

``--init DIR`` is a resume without the optimizer state: the weights come from a saved head directory and the
minutes and history from its ``training.json``, so the learning-rate schedule and the budget continue where that
run stopped (AdamW's moments start afresh).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train_pair.py: spin-waiting hurts on shared cores

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from fastspec.heads import DraftHead, DraftHeadConfig, default_head_dir, target_logits_and_features  # noqa: E402
from fastspec.pair import function_cut_points, load_pair  # noqa: E402
from training.train_pair import corpus_files, encode_docs, greedy_paths, read_texts  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"  # checkpoints, token cache, self-distillation data (not committed)

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def unroll_mask(n_prev: list[int], n: int, dtype=torch.float32) -> torch.Tensor:
    """Additive mask [1, 1, n, sum(n_prev) + n] for unrolled step len(n_prev) + 1 over a cache of earlier steps.

    Entry i of every step belongs to base position i. A query of base i sees the step-1 keys of bases <= i (real
    features) and, of each later step (including the new one), only the entry of its own base i.
    """
    cols, rows = [], torch.arange(n)[:, None]
    for s, width in enumerate(n_prev):
        j = torch.arange(width)[None, :]
        cols.append(j <= rows if s == 0 else j == rows)
    cols.append(torch.arange(n)[None, :] == rows)
    allowed = torch.cat(cols, dim=1)
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def run_unrolled(head: DraftHead, feats: torch.Tensor, ids: torch.Tensor, steps: int, noise: float = 0.0):
    """Unroll the head ``steps`` steps from every base position of windows ``ids`` [R, L] with target ``feats``
    [R, L, F] (``target_logits_and_features`` with the head's ``feature_layers``; noise is added before the fusion).

    Step s (1-based) has L - s entries: entry i reads (feature of i + s - 1: real for s = 1, else the head's step
    s - 1 output of entry i) and token i + s; its output predicts the feature of i + s and the token i + s + 1.
    Returns a list of (hidden, logits) per step.
    """
    length = ids.shape[1]
    cache, outs, n_prev = head.new_cache(), [], []
    f_in = feats[:, : length - 1]
    if noise > 0:
        f_in = f_in + (torch.rand_like(f_in) - 0.5) * noise
    f_in = head.target_features(f_in)
    for s in range(1, steps + 1):
        n = length - s
        if s > 1:
            f_in = outs[-1][0][:, :n]
        pos = torch.arange(s - 1, s - 1 + n)[None].expand(ids.shape[0], n)
        mask = None if s == 1 else unroll_mask(n_prev, n).expand(ids.shape[0], 1, n, sum(n_prev) + n)
        hidden, logits = head(f_in, ids[:, s : s + n], pos, mask, cache)
        outs.append((hidden, logits))
        n_prev.append(n)
    return outs


def head_loss(outs, last_hidden, t_logits, ce_weight: float, step_weight: float):
    """EAGLE-1 loss summed over unrolled steps: smooth-L1(the target's last hidden state [R, L, H]) + ce_weight *
    CE(target distribution)."""
    total, parts = 0.0, []
    for s, (hidden, logits) in enumerate(outs, start=1):
        n = hidden.shape[1]
        tgt_f, tgt_logp = last_hidden[:, s : s + n], F.log_softmax(t_logits[:, s : s + n].float(), -1)
        reg = F.smooth_l1_loss(hidden.float(), tgt_f.float())
        ce = -(tgt_logp.exp() * F.log_softmax(logits.float(), -1)).sum(-1).mean()
        total = total + step_weight ** (s - 1) * (reg + ce_weight * ce)
        agree = (logits.argmax(-1) == t_logits[:, s : s + n].argmax(-1)).float().mean().item()
        parts.append((reg.item(), ce.item(), agree))
    return total, parts


@torch.no_grad()
def teacher_forced_agreement(head, target, windows: torch.Tensor, steps: int = 2) -> list[float]:
    """Agreement of head argmax with target argmax at each unrolled step on held-out windows (data tokens)."""
    hits, counts = [0] * steps, [0] * steps
    for i in range(0, len(windows), 4):
        x = windows[i : i + 4]
        t_logits, feats = target_logits_and_features(target, 0, head.config.feature_layers, input_ids=x)
        outs = run_unrolled(head, feats, x, steps)
        for s, (_, logits) in enumerate(outs, start=1):
            n = logits.shape[1]
            hits[s - 1] += (logits.argmax(-1) == t_logits[:, s : s + n].argmax(-1)).sum().item()
            counts[s - 1] += logits.shape[0] * n
    return [round(h / c, 4) for h, c in zip(hits, counts, strict=True)]


@torch.no_grad()
def chain_acceptance(head, target, paths, k: int = 4) -> dict:
    """Simulated greedy chain drafting with the head on the target's greedy paths.

    A round starts at base i (features known up to i, token i + 1 just emitted): draft s predicts token i + s + 1
    and is accepted while it equals the target's greedy token; the round emits the accepted drafts plus one target
    token, and the next round starts at base i + m + 1. The first round starts at base P - 1 (P = prompt length).
    """
    accepted, rounds, per_step_hits, per_step_n = 0, 0, [0] * k, [0] * k
    accept_at_least = [0] * (k + 1)
    for full, plen in paths:
        t_logits, feats = target_logits_and_features(target, 0, head.config.feature_layers, input_ids=full)
        greedy = t_logits[0].argmax(-1)  # greedy[p] = the target's choice for token p + 1
        outs = run_unrolled(head, feats, full, k)
        draft = [logits[0].argmax(-1) for _, logits in outs]  # draft[s-1][i] predicts token i + s + 1
        length = full.shape[1]
        match = {}
        for i in range(plen - 1, length - k - 1):
            match[i] = [bool(draft[s - 1][i] == greedy[i + s]) for s in range(1, k + 1)]
            for s in range(k):
                per_step_hits[s] += match[i][s]
                per_step_n[s] += 1
        i = plen - 1
        while i in match:
            m = 0
            while m < k and match[i][m]:
                m += 1
            accepted, rounds, i = accepted + m, rounds + 1, i + m + 1
            for s in range(m + 1):
                accept_at_least[s] += 1
    return {
        f"acceptance_rate_k{k}": round(accepted / (k * rounds), 4),
        f"tokens_per_target_call_k{k}": round((accepted + rounds) / rounds, 3),
        "agreement_per_step": [round(h / n, 4) for h, n in zip(per_step_hits, per_step_n, strict=True)],
        "accepted_at_least_per_position": [round(a / rounds, 4) for a in accept_at_least[1:]],
        "rounds": rounds,
        "num_prompts": len(paths),
    }


def lr_at(step: int, progress: float, peak: float, warmup: int) -> float:
    return peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def load_tokens(tokenizer, cache_path: Path):
    if cache_path.is_file():
        data = torch.load(cache_path)
        return data["train"], data["held"], data["n_train_files"]
    train_paths, held_paths = corpus_files()
    train = encode_docs(tokenizer, read_texts(train_paths))
    held = encode_docs(tokenizer, read_texts(held_paths))
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"train": train, "held": held, "n_train_files": len(train_paths)}, cache_path)
    return train, held, len(train_paths)


def window_prompts(train_data: torch.Tensor, count: int, prompt_tokens: int, seed: int) -> torch.Tensor:
    """[count, prompt_tokens] random windows of the training tokens; the first n rows do not depend on ``count``."""
    gen = torch.Generator().manual_seed(seed + 1)
    starts = torch.randint(0, len(train_data) - prompt_tokens, (count,), generator=gen)
    return torch.stack([train_data[i : i + prompt_tokens] for i in starts.tolist()])


def function_prompts(tokenizer, sources: list[str], count: int, prompt_tokens: int, seed: int) -> torch.Tensor:
    """[count, prompt_tokens] token windows of Python ``sources`` that end just after a function's signature and
    docstring: where the bench's held-out prompts end (``fastspec.pair.heldout_prompts``), so the continuation is a
    function body. Functions are drawn without replacement in a seeded order; the first n rows do not depend on
    ``count``. Each window is the last ``prompt_tokens`` tokens of the (up to 80) source lines before the cut."""
    windows = []
    for source in sources:
        try:
            cuts = function_cut_points(source)
        except SyntaxError:  # a stdlib file written for another Python version
            continue
        lines = source.splitlines(keepends=True)
        windows.extend("".join(lines[max(0, end - 80) : end]) for _, end in cuts)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed + 2)).tolist()
    rows = []
    for i in order:
        ids = tokenizer.encode(windows[i], add_special_tokens=False)
        if len(ids) >= prompt_tokens:
            rows.append(ids[-prompt_tokens:])
            if len(rows) == count:
                return torch.tensor(rows)
    raise ValueError(f"only {len(rows)} training functions have {prompt_tokens} tokens of context, asked for {count}")


@torch.no_grad()
def greedy_continuations(target, prompts: torch.Tensor, new_tokens: int, cache_path: Path,
                         chunk: int = 128) -> torch.Tensor:  # fmt: skip
    """[N, P + new_tokens]: the target's greedy continuations of ``prompts`` [N, P] (self-distillation data: the text
    a head drafts on at inference is the target's own). Generated in batches of ``chunk`` with HF generate (about
    1,100 new tokens/s on this 2-core CPU) and cached after every batch, so an interrupted run, or one asking for
    more rows of the same prompt order, generates only the rows the cache lacks."""
    done = torch.load(cache_path) if cache_path.is_file() else prompts.new_empty(0, prompts.shape[1] + new_tokens)
    n = min(len(done), len(prompts))
    if not torch.equal(done[:n, : prompts.shape[1]], prompts[:n]):
        raise ValueError(f"{cache_path} holds continuations of other prompts; move it away")
    for i in range(len(done), len(prompts), chunk):
        x = prompts[i : i + chunk]
        out = target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, pad_token_id=0, eos_token_id=None)  # fmt: skip
        done = torch.cat([done, out])
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(done, cache_path.with_suffix(".tmp"))
        os.replace(cache_path.with_suffix(".tmp"), cache_path)
        log(f"self-distillation data ({cache_path.name}): {len(done)}/{len(prompts)} greedy continuations")
    return done[: len(prompts)]


def save_ckpt(path: Path, head, opt, step: int, elapsed: float, gen: torch.Generator, history: list) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "head": head.state_dict(),
            "config": head.config.to_dict(),
            "opt": opt.state_dict(),
            "step": step,
            "elapsed": elapsed,
            "gen": gen.get_state(),
            "history": history,
        },
        tmp,
    )
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30.0, help="training wall clock budget (total, resumes included)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=default_head_dir())
    ap.add_argument("--resume", action="store_true", help="continue from --ckpt")
    ap.add_argument("--init", type=Path, help="warm start from a saved head directory and its training.json")
    ap.add_argument("--ckpt", type=Path, default=OUT_DIR / "head_ckpt.pt")
    ap.add_argument("--ckpt-minutes", type=float, default=3.0)
    ap.add_argument("--tokens-cache", type=Path, default=OUT_DIR / "head_corpus_tokens.pt")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument(
        "--ce-weight",
        type=float,
        default=1.0,
        help="weight of the CE term (EAGLE-1's p_w is 0.1; 1.0 reached higher acceptance here)",
    )
    ap.add_argument(
        "--target-dtype",
        choices=("bfloat16", "float32"),
        default="float32",
        help="dtype of the frozen target's training forward (features and soft labels): bfloat16 autocast halves its "
        "cost on CPUs with avx512_bf16/AMX (12%% more steps here), but its 60-minute head accepted less on the bench "
        "prompts than the 45-minute fp32 one (docs/training.md); evaluation is fp32",
    )
    ap.add_argument(
        "--feature-layers",
        type=int,
        nargs="+",
        default=[-1],
        help="target hidden states the head reads (0 = embeddings, i = output of decoder layer i - 1, -1 last = the "
        "last hidden state): -1 is EAGLE-1; e.g. 2 6 9 -1 fuses low, middle and high layers as EAGLE-3 does",
    )
    ap.add_argument(
        "--self-distill",
        type=int,
        default=0,
        help="train also on this many target greedy continuations of random training windows (half prompt, half "
        "continuation, --seq-len in all; generated once and cached in training/out)",
    )
    ap.add_argument(
        "--self-distill-functions",
        type=int,
        default=0,
        help="and on this many continuations of training-module windows that end after a function's signature and "
        "docstring (where the held-out prompts end)",
    )
    ap.add_argument(
        "--self-distill-fraction",
        type=float,
        default=0.5,
        help="share of each batch's rows from that data (both kinds pooled)",
    )
    ap.add_argument("--noise", type=float, default=0.2, help="input feature noise U(-noise/2, noise/2) (EAGLE)")
    ap.add_argument("--unroll", type=int, default=2, help="unrolled steps in training (1 = plain EAGLE-1)")
    ap.add_argument("--step-weight", type=float, default=1.0, help="loss weight factor per extra unrolled step")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-minutes", type=float, default=6.0)
    ap.add_argument("--eval-prompts", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    tokenizer, target, _ = load_pair()
    for p in target.parameters():
        p.requires_grad_(False)
    train_data, held_data, n_files = load_tokens(tokenizer, args.tokens_cache)
    log(f"threads {torch.get_num_threads()}, {len(train_data)} training tokens ({n_files} files), "
        f"{len(held_data)} held-out tokens")  # fmt: skip

    config = DraftHeadConfig.from_target_config(target.config, feature_layers=args.feature_layers)
    head = DraftHead(config).bind(target)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    step, elapsed_before, history, init_record = 0, 0.0, [], None
    if args.resume and args.ckpt.is_file():
        ck = torch.load(args.ckpt, weights_only=False)
        head.load_state_dict(ck["head"])
        opt.load_state_dict(ck["opt"])
        gen.set_state(ck["gen"])
        step, elapsed_before, history = ck["step"], ck["elapsed"], ck["history"]
        log(f"resumed from {args.ckpt}: step {step}, {elapsed_before / 60:.1f} min trained")
    elif args.init is not None:
        record = json.loads((args.init / "training.json").read_text())
        init_record = {"path": str(args.init), "command": record["command"], "init": record.get("init")}
        head.load_state_dict(DraftHead.from_pretrained(args.init, target=target).state_dict())
        step, elapsed_before = record["steps"], record["train_minutes"] * 60
        history = [*record["history"], record["final"]]
        log(f"warm start from {args.init}: step {step}, {elapsed_before / 60:.1f} min trained (fresh optimizer)")
    n_params = sum(p.numel() for p in head.parameters())
    log(f"head {n_params / 1e6:.3f}M params (fp32 {4 * n_params / 1e6:.2f} MB); args {vars(args)}")

    seq = args.seq_len
    prompt_sets = {}  # self-distillation prompts by kind (the kind names the cache)
    if args.self_distill > 0:
        prompt_sets["windows"] = window_prompts(train_data, args.self_distill, seq // 2, args.seed)
    if args.self_distill_functions > 0:
        sources = read_texts(corpus_files()[0])
        prompt_sets["functions"] = function_prompts(
            tokenizer, sources, args.self_distill_functions, seq // 2, args.seed
        )
    distilled = None
    if prompt_sets:
        distilled = torch.cat([greedy_continuations(target, prompts, seq - seq // 2,
                                                    OUT_DIR / f"head_greedy_{kind}_{seq}_seed{args.seed}.pt")
                               for kind, prompts in prompt_sets.items()])  # fmt: skip
        log(f"self-distillation data: {tuple(distilled.shape)} (generation not counted in --minutes)")
    n_distilled = 0 if distilled is None else round(args.batch_size * args.self_distill_fraction)
    n_win = (len(held_data) - 1) // seq
    held_windows = held_data[: n_win * seq].view(n_win, seq)[torch.linspace(0, n_win - 1, 16).long()]
    t = time.time()
    paths = greedy_paths(target, tokenizer, args.eval_prompts, 128, 64)
    log(f"held-out: {len(held_windows)} windows of {seq}, {len(paths)} greedy paths ({time.time() - t:.1f}s)")

    def evaluate(full: bool) -> dict:
        head.eval()
        res = {"step": step, "minutes": round((elapsed_before + time.time() - start) / 60, 2)}
        res["teacher_forced_agreement_steps_1_2"] = teacher_forced_agreement(head, target, held_windows, 2)
        res["greedy_chain"] = chain_acceptance(head, target, paths if full else paths[:8], 4)
        head.train()
        return res

    budget = args.minutes * 60
    start = last_ckpt = last_eval = time.time()
    ema = None
    head.train()
    while elapsed_before + time.time() - start < budget:
        progress = (elapsed_before + time.time() - start) / budget
        lr = lr_at(step, progress, args.lr, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_data) - seq - 1, (args.batch_size - n_distilled,), generator=gen)
        x = torch.stack([train_data[i : i + seq] for i in starts.tolist()])
        if n_distilled:
            x = torch.cat([x, distilled[torch.randint(0, len(distilled), (n_distilled,), generator=gen)]])
        with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=args.target_dtype == "bfloat16"):
            t_logits, feats = target_logits_and_features(target, 0, config.feature_layers, input_ids=x)
        t_logits, feats = t_logits.float(), feats.float()
        outs = run_unrolled(head, feats, x, args.unroll, noise=args.noise)
        last_hidden = feats[..., -config.hidden_size :]
        loss, parts = head_loss(outs, last_hidden, t_logits, args.ce_weight, args.step_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % args.log_every == 0 or step == 1:
            el = elapsed_before + time.time() - start
            desc = " ".join(f"s{s}[reg {r:.4f} ce {c:.3f} agree {a:.3f}]" for s, (r, c, a) in enumerate(parts, 1))
            log(f"step {step} loss {loss.item():.4f} (ema {ema:.4f}) {desc} lr {lr:.2e} "
                f"tok/s {step * x.numel() / max(el, 1e-9):.0f} {el / 60:.1f}/{args.minutes:.1f} min")  # fmt: skip
        if time.time() - last_eval > args.eval_minutes * 60:
            res = evaluate(False)
            history.append(res)
            log(f"eval: {json.dumps(res)}")
            last_eval = time.time()
        if time.time() - last_ckpt > args.ckpt_minutes * 60:
            save_ckpt(args.ckpt, head, opt, step, elapsed_before + time.time() - start, gen, history)
            last_ckpt = time.time()
            log(f"checkpoint {args.ckpt} at step {step}")
    trained = elapsed_before + time.time() - start
    save_ckpt(args.ckpt, head, opt, step, trained, gen, history)
    head.eval()
    head.save_pretrained(args.out)  # fp32
    reloaded = DraftHead.from_pretrained(args.out, target=target)
    final = evaluate(True) | {"step": step, "minutes": round(trained / 60, 2)}
    final_reloaded = chain_acceptance(reloaded, target, paths, 4)
    assert final_reloaded == final["greedy_chain"], "reloaded head disagrees with the trained one"
    log(f"final (reloaded from {args.out}): {json.dumps(final)}")
    size = sum(f.stat().st_size for f in args.out.iterdir() if f.name in ("config.json", "model.safetensors"))
    info = {
        "command": " ".join([Path(sys.executable).name, "-m", "training.train_head", *sys.argv[1:]]),
        "init": init_record,  # the warm start's own recipe (its command, and its warm start's, ...)
        "loss": "sum over unrolled steps of smooth_l1(hidden, next target last hidden state) + ce_weight * "
        "CE(lm_head(hidden), softmax(target logits))",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "threads": torch.get_num_threads(),
        "steps": step,
        "tokens_seen": step * args.batch_size * seq,
        "train_minutes": round(trained / 60, 2),
        "head_params": n_params,
        "weights_dtype": "float32",
        "size_bytes": size,
        "final": final,
        "history": history,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }
    (args.out / "training.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"saved {args.out} ({size / 1e6:.2f} MB); total {(time.time() - T0) / 60:.1f} min")


if __name__ == "__main__":
    main()
