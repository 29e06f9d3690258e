"""`fastspec bench`: end-to-end decoding speed, side by side, in one process.

Every method decodes the same prompts with the same settings. Methods are interleaved inside each repeat
(method A, B, C on prompt 1, then on prompt 2, ...) so a noisy shared machine slows them alike; each method is
warmed up once first; tokens/s is the median over repeats of (new tokens / seconds) summed over the prompts.
Greedy outputs of every method are checked against HF greedy output of the same run.

Methods: HF `generate` (normal decoding, the 1.0x baseline), `fastspec.autoregressive_generate`, HF assisted
generation with the draft and HF prompt lookup (batch 1 only: HF supports no more), fastspec chain
speculation for each K of the sweep and with adaptive K, tree speculation, fastspec prompt lookup, and prompt
lookup with the draft model as fallback.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import fastspec

__all__ = ["BenchConfig", "run_bench"]


@dataclass
class BenchConfig:
    """What `run_bench` measures. `ks` is the chain-length sweep; `trees` the tree specs to try."""

    target_dir: str | None = None
    draft_dir: str | None = None
    num_prompts: int = 4
    prompt_tokens: int = 192
    max_new_tokens: int = 96
    repeats: int = 3
    batch_sizes: tuple[int, ...] = (1, 4)
    temperatures: tuple[float, ...] = (0.0, 0.7)
    ks: tuple[int, ...] = (2, 4, 6)
    trees: tuple[str, ...] = ("small", "dynamic")
    prompt_lookup: int | None = 3
    prompt_set: str = "heldout"  # "heldout": functions cut after their docstring; "repeat": copy a function;
    # "mixed": both, alternating
    dtype: str = "float32"
    device: str = "cpu"
    threads: int | None = None
    command: str = ""
    extra: dict = field(default_factory=dict)


class PeakRSS:
    """Peak resident-set growth (bytes) of this process while the context is open; None where unmeasurable.

    On Linux the kernel's high-water mark of the resident set (VmHWM) is reset on entry (`/proc/self/clear_refs`)
    and read on exit, so nothing runs beside the timed code: a thread sampling the RSS every millisecond, used
    before, slowed fastspec's decoding loop on 2 cores by 10-12 %. On CUDA `torch.cuda.max_memory_allocated` is
    used instead (exact, per method).
    """

    def __init__(self, device: str):
        self.device = device
        self.peak: int | None = None

    @staticmethod
    def _status_bytes(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        try:
            self.base = self._status_bytes("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current RSS
        except (OSError, StopIteration):  # not Linux, or not allowed
            self.base = None
        return self

    def __exit__(self, *exc):
        if self.device.startswith("cuda"):
            self.peak = torch.cuda.max_memory_allocated() - self.base
        elif self.base is not None:
            self.peak = self._status_bytes("VmHWM") - self.base


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _methods(cfg: BenchConfig, target, draft, batch: int, temperature: float):
    """(name, fn(ids, mask) -> (sequences, SpecStats | None)) for one setting."""
    sample = temperature > 0
    common = {"max_new_tokens": cfg.max_new_tokens, "do_sample": sample}
    if sample:
        common.update(temperature=temperature)
    hf_common = dict(common, pad_token_id=target.generation_config.pad_token_id, top_k=None, top_p=None)

    def hf(**extra):
        return lambda ids, mask: (target.generate(ids, attention_mask=mask, **hf_common, **extra), None)

    def fs(**extra):
        return lambda ids, mask: fastspec.generate(target, ids, attention_mask=mask, return_stats=True, **common,
                                                   **extra)  # fmt: skip

    methods = [("hf_generate", hf()), ("fastspec_autoregressive", fs())]
    if batch == 1:  # HF assisted generation and prompt lookup support batch 1 only
        methods.append(("hf_assisted", hf(assistant_model=draft)))
        if cfg.prompt_lookup:
            methods.append(("hf_prompt_lookup", hf(prompt_lookup_num_tokens=cfg.ks[-1])))
    methods += [(f"fastspec_chain_k{k}", fs(draft=draft, num_draft_tokens=k)) for k in cfg.ks]
    methods.append(("fastspec_chain_auto", fs(draft=draft, num_draft_tokens="auto")))
    methods += [(f"fastspec_tree_{tree}_d4", fs(draft=draft, tree=tree, num_draft_tokens=4)) for tree in cfg.trees]
    if cfg.prompt_lookup:
        lookup = fs(prompt_lookup=cfg.prompt_lookup, num_draft_tokens=cfg.ks[-1])
        methods.append((f"fastspec_prompt_lookup_n{cfg.prompt_lookup}", lookup))
        both = fs(prompt_lookup=cfg.prompt_lookup, draft=draft, num_draft_tokens="auto")
        methods.append((f"fastspec_lookup_n{cfg.prompt_lookup}_then_chain_auto", both))
    return methods


def _batches(tokenizer, prompts: list[str], batch: int, device: str):
    """Left-padded (input_ids, attention_mask) batches of `batch` prompts."""
    tokenizer.padding_side = "left"
    out = []
    for i in range(0, len(prompts) - batch + 1, batch):
        enc = tokenizer(prompts[i : i + batch], return_tensors="pt", padding=True)
        out.append((enc.input_ids.to(device), enc.attention_mask.to(device)))
    return out


def _new_tokens(sequences: torch.Tensor, prompt_len: int, pad: int | None, eos) -> int:
    """Generated tokens, not counting padding after EOS."""
    new = sequences[:, prompt_len:]
    if pad is None:
        return new.numel()
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    count = 0
    for row in new.tolist():
        stop = next((j + 1 for j, t in enumerate(row) if t in eos_ids), len(row))
        count += stop
    return count


def run_bench(cfg: BenchConfig, progress: bool = True) -> dict:
    """Run every setting of `cfg`; return a JSON-able dict with one row per (setting, method)."""
    from tqdm.auto import tqdm

    from fastspec.pair import PROMPT_SETS, load_pair

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    tokenizer, target, draft = load_pair(cfg.target_dir, cfg.draft_dir, getattr(torch, cfg.dtype), cfg.device)
    prompts = PROMPT_SETS[cfg.prompt_set](tokenizer, cfg.num_prompts, cfg.prompt_tokens)
    pad, eos = target.generation_config.pad_token_id, target.generation_config.eos_token_id
    settings = [(b, t) for t in cfg.temperatures for b in cfg.batch_sizes]
    plan = []
    for batch, temperature in settings:
        batches = _batches(tokenizer, prompts, batch, cfg.device)
        plan.append((batch, temperature, batches, _methods(cfg, target, draft, batch, temperature)))
    total = sum(len(m) * len(b) * cfg.repeats for _, _, b, m in plan)
    bar = tqdm(total=total, disable=not progress, desc="fastspec bench", unit="gen")
    rows = []
    for batch, temperature, batches, methods in plan:
        times = {name: [0.0] * cfg.repeats for name, _ in methods}
        tokens = {name: [0] * cfg.repeats for name, _ in methods}
        stats = {name: [] for name, _ in methods}
        peak = dict.fromkeys(times, 0)
        matches = dict.fromkeys(times, True)
        reference = {}
        for _, fn in methods:  # warm-up
            fn(*batches[0])
        for rep in range(cfg.repeats):
            for i, (ids, mask) in enumerate(batches):
                for name, fn in methods:
                    torch.manual_seed(1000 * rep + i)
                    with PeakRSS(cfg.device) as mem:
                        _sync(cfg.device)
                        start = time.perf_counter()
                        seqs, st = fn(ids, mask)
                        _sync(cfg.device)
                        elapsed = time.perf_counter() - start
                    times[name][rep] += elapsed
                    tokens[name][rep] += _new_tokens(seqs, ids.shape[1], pad, eos)
                    peak[name] = None if mem.peak is None else max(peak[name] or 0, mem.peak)
                    if st is not None:
                        stats[name].append(st)
                    if temperature == 0.0 and rep == 0:
                        reference.setdefault(i, seqs)
                        matches[name] &= bool(torch.equal(seqs, reference[i]))
                    bar.update(1)
        base = statistics.median(tokens["hf_generate"][r] / times["hf_generate"][r] for r in range(cfg.repeats))
        for name, _ in methods:
            tps = statistics.median(tokens[name][r] / times[name][r] for r in range(cfg.repeats))
            row = {
                "batch": batch, "temperature": temperature, "method": name, "tokens_per_s": tps,
                "speedup_vs_hf": tps / base, "peak_mem_mb": None if peak[name] is None else peak[name] / 2**20,
                "greedy_equal_hf": matches[name] if temperature == 0.0 else None,
            }  # fmt: skip
            if stats[name]:
                drafted = sum(s.drafted for s in stats[name])
                accepted = sum(s.accepted for s in stats[name])
                row_steps = sum(s.row_steps for s in stats[name])
                per_pos_d = _sum_lists([s.drafted_per_position for s in stats[name]])
                per_pos_a = _sum_lists([s.accepted_per_position for s in stats[name]])
                row.update(
                    acceptance_rate=accepted / drafted if drafted else 0.0,
                    mean_accepted_length=(accepted + row_steps) / row_steps,
                    per_position_acceptance=[
                        round(a / d, 3) if d else 0.0 for a, d in zip(per_pos_a, per_pos_d, strict=True)
                    ],
                )
            rows.append(row)
    bar.close()
    return {"config": cfg.__dict__, "environment": _environment(cfg), "rows": rows}


def _sum_lists(lists: list[list[int]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[j] for x in lists if j < len(x)) for j in range(width)]


def _environment(cfg: BenchConfig) -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, check=False).stdout.strip()  # fmt: skip
    except OSError:
        commit = ""
    device = torch.cuda.get_device_name() if cfg.device.startswith("cuda") else platform.processor() or "cpu"
    return {
        "device": device, "torch": torch.__version__, "threads": torch.get_num_threads(), "commit": commit,
        "python": platform.python_version(),
    }  # fmt: skip


def markdown(result: dict) -> str:
    """The results as a markdown table (one line per setting and method) with the producing command."""
    env, cfg = result["environment"], result["config"]
    lines = [
        f"`{cfg['command']}`  ",
        f"device: {env['device']}, torch {env['torch']}, {env['threads']} threads, commit {env['commit']}; "
        f"{cfg['num_prompts']} '{cfg['prompt_set']}' prompts of <= {cfg['prompt_tokens']} tokens, "
        f"{cfg['max_new_tokens']} new tokens, "
        f"median of {cfg['repeats']} repeats after warm-up",
        "",
        "| batch | temp | method | tokens/s | vs HF generate | acceptance | tokens/step | per-position acceptance "
        "| peak mem MB | greedy == HF |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for r in result["rows"]:
        acc = f"{r['acceptance_rate']:.3f}" if "acceptance_rate" in r else ""
        mal = f"{r['mean_accepted_length']:.2f}" if "mean_accepted_length" in r else ""
        per = " ".join(f"{a:.2f}" for a in r.get("per_position_acceptance", []))
        eq = {True: "yes", False: "NO", None: "n/a (sampled)"}[r["greedy_equal_hf"]]
        mem = "" if r["peak_mem_mb"] is None else f"{r['peak_mem_mb']:.1f}"
        lines.append(
            f"| {r['batch']} | {r['temperature']} | {r['method']} | {r['tokens_per_s']:.1f} | "
            f"{r['speedup_vs_hf']:.2f}x | {acc} | {mal} | {per} | {mem} | {eq} |"
        )
    return "\n".join(lines)


def write_outputs(result: dict, json_path: str | None, plot_path: str | None) -> None:
    """Write the JSON results and, if asked, a speedup-vs-K chart (needs matplotlib: `pip install .[plot]`)."""
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2))
    if plot_path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        for batch in sorted({r["batch"] for r in result["rows"]}):
            for temp in sorted({r["temperature"] for r in result["rows"]}):
                pts = [(int(r["method"].rsplit("k", 1)[1]), r["speedup_vs_hf"]) for r in result["rows"]
                       if r["batch"] == batch and r["temperature"] == temp and "_chain_k" in r["method"]]  # fmt: skip
                if pts:
                    ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=f"batch {batch}, temperature {temp}")
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xlabel("draft length K")
        ax.set_ylabel("tokens/s vs HF generate")
        ax.legend()
        fig.tight_layout()
        fig.savefig(plot_path, dpi=120)
