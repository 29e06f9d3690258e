"""The methods `fastspec bench` and its suite time, by row name, and what they share around them.

`method_table` gives one setting's methods (batch size and temperature), in table order: HF `generate` (normal
decoding, the 1.0x baseline), `fastspec.autoregressive_generate`, HF assisted generation with the draft and HF
prompt lookup (batch 1 only: HF supports no more), fastspec chain speculation for each K of the sweep and with
adaptive K, tree speculation, fastspec prompt lookup, and prompt lookup with the draft model as fallback; with a
draft head (the one shipped for the target by default), head chains (K = 4, adaptive K, prompt lookup then head) and
a dynamic head tree, for each head when several are compared (``compare_heads``: their rows are named
``method@label`` and interleaved with the rest, so two heads are timed side by side in one run); with ``compile``
(batch 1), HF generate with its static cache and torch.compile, and fastspec autoregressive, adaptive-K chain and
head chain with ``compile=True``; at batch 1, HF generate, the adaptive-K chain and the head's adaptive-K chain with
HF's repetition penalty and min-p (`PROCESSORS`, rows named with `PROCESSED`: fastspec applies the processors at
every drafted position, and these rows are measured against HF generate with the same arguments). Adaptive-K
rows (``*_auto``) pass one `fastspec.DraftLengthController` per method and setting to all of that method's calls,
warm-up included, as a server keeping one per model pair would (`AUTO_NOTE`, written under every table);
``num_draft_tokens="auto"`` starts afresh every call and explores at its start. Compiled methods run over the
prompts before timing until a pass compiles no new step shape (`precompile`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

import fastspec
from fastspec.compiled import WIDTHS
from fastspec.generate import call_capacity

if TYPE_CHECKING:
    from fastspec.benchmarks.environment import CompileCounter
    from fastspec.benchmarks.grid import BenchConfig

__all__ = [
    "AUTO_NOTE",
    "PROCESSED",
    "PROCESSED_NOTE",
    "PROCESSORS",
    "acceptance_summary",
    "first_head_dir",
    "head_labels",
    "head_suffixes",
    "hf_static_compiled",
    "load_heads",
    "method_kind",
    "method_table",
    "new_tokens",
    "precompile",
    "processed_group",
]

PROCESSORS = {"repetition_penalty": 1.1, "min_p": 0.05}  # the processed rows' HF arguments (min_p: sampled only)
PROCESSED = "_rp1.1_minp0.05"  # their name suffix; their speedup is against hf_generate with the same arguments


PROCESSED_NOTE = (
    f"rows named `*{PROCESSED}` decode with HF's repetition_penalty=1.1 and min_p=0.05 (min-p applies when sampling), "
    f"applied by fastspec at every drafted position; their speedup is against `hf_generate{PROCESSED}`, HF generate "
    "with the same arguments"
)


def processed_group(name: str) -> str:
    """The baseline a row's speedup and greedy equality are measured against: "hf_generate", or
    "hf_generate" + `PROCESSED` for rows decoding with `PROCESSORS`."""
    return f"hf_generate{PROCESSED}" if PROCESSED in name else "hf_generate"


AUTO_NOTE = (
    "adaptive-K rows (`*_auto`) keep one `DraftLengthController` per method and setting across its calls (warm-up "
    "included): step costs and acceptance carry over, so only the first call explores; a fresh "
    '`num_draft_tokens="auto"` explores at the start of every call'
)


def method_table(cfg: BenchConfig, target, draft, batch: int, temperature: float, heads=(), hf_compiled=None):
    """{name: fn((ids, mask), seed) -> (sequences, SpecStats | None)} for one setting, in table order.

    ``heads``: ``(suffix, head)`` pairs, each giving the head rows with its suffix ("" for the first head,
    ``@label`` for compared ones; `load_heads`).

    The seed is unused: `timing.interleave` sets torch's global seed before each call, which HF and fastspec
    (with `seed=None`) both draw from.
    """
    sample = temperature > 0
    common = {"max_new_tokens": cfg.max_new_tokens, "do_sample": sample}
    if sample:
        common.update(temperature=temperature)
    hf_common = dict(common, pad_token_id=target.generation_config.pad_token_id, top_k=None, top_p=None)

    def hf(**extra):
        return lambda batch, seed: (target.generate(batch[0], attention_mask=batch[1], **hf_common, **extra), None)

    def fs(**extra):
        return lambda batch, seed: fastspec.generate(target, batch[0], attention_mask=batch[1], return_stats=True,
                                                     **common, **extra)  # fmt: skip

    def auto() -> fastspec.DraftLengthController:  # one per method: what it learns carries over to its next call
        return fastspec.DraftLengthController()

    def auto_compiled(drafter):
        """A compiled adaptive-K method, with `fixed_k`: the same drafter at one fixed K per compiled step width
        (`fastspec.compiled.WIDTHS`) the controller can pick, which `precompile` runs first: a controller kept
        across calls may pick a K that no warm-up call of its own drafted."""
        controller = auto()
        run = fs(draft=drafter, num_draft_tokens=controller, compile=True)
        ks = [w - 1 for w in WIDTHS if 2 <= w <= controller.max_k + 1]
        run.fixed_k = [fs(draft=drafter, num_draft_tokens=k, compile=True) for k in ks]
        return run

    methods = [("hf_generate", hf()), ("fastspec_autoregressive", fs())]
    if batch == 1:  # HF assisted generation and prompt lookup support batch 1 only
        if draft is not None:
            methods.append(("hf_assisted", hf(assistant_model=draft)))
        if cfg.prompt_lookup:
            methods.append(("hf_prompt_lookup", hf(prompt_lookup_num_tokens=cfg.ks[-1])))
    if draft is not None:  # no draft model: a target whose vocabulary differs from the shipped draft's
        methods += [(f"fastspec_chain_k{k}", fs(draft=draft, num_draft_tokens=k)) for k in cfg.ks]
        methods.append(("fastspec_chain_auto", fs(draft=draft, num_draft_tokens=auto())))
        methods += [(f"fastspec_tree_{tree}_d4", fs(draft=draft, tree=tree, num_draft_tokens=4)) for tree in cfg.trees]
    if cfg.prompt_lookup:
        lookup = fs(prompt_lookup=cfg.prompt_lookup, num_draft_tokens=cfg.ks[-1])
        methods.append((f"fastspec_prompt_lookup_n{cfg.prompt_lookup}", lookup))
        if draft is not None:
            both = fs(prompt_lookup=cfg.prompt_lookup, draft=draft, num_draft_tokens=auto())
            methods.append((f"fastspec_lookup_n{cfg.prompt_lookup}_then_chain_auto", both))
    for suffix, head in heads:
        methods.append((f"fastspec_head_chain_k4{suffix}", fs(draft=head, num_draft_tokens=4)))
        methods.append((f"fastspec_head_chain_auto{suffix}", fs(draft=head, num_draft_tokens=auto())))
        if cfg.prompt_lookup:
            both = fs(prompt_lookup=cfg.prompt_lookup, draft=head, num_draft_tokens=auto())
            methods.append((f"fastspec_lookup_n{cfg.prompt_lookup}_then_head_auto{suffix}", both))
        methods.append((f"fastspec_head_tree_dynamic_d6{suffix}", fs(draft=head, tree="dynamic", num_draft_tokens=6)))
    if batch == 1 and (draft is not None or heads):  # HF's processors inside speculation, beside HF with them
        methods.append((f"hf_generate{PROCESSED}", hf(**PROCESSORS)))
        if draft is not None:
            methods.append((f"fastspec_chain_auto{PROCESSED}", fs(draft=draft, num_draft_tokens=auto(), **PROCESSORS)))
        for suffix, head in heads[:1]:
            run = fs(draft=head, num_draft_tokens=auto(), **PROCESSORS)
            methods.append((f"fastspec_head_chain_auto{PROCESSED}{suffix}", run))
    if cfg.compile and batch == 1:  # batch 1 only: each batch size compiles its own graphs (minutes on a CPU)
        if hf_compiled is not None:
            methods.append(("hf_generate_static_compiled", hf_compiled(hf_common)))
        methods.append(("fastspec_autoregressive_compiled", fs(compile=True)))
        if draft is not None:
            methods.append(("fastspec_chain_auto_compiled", auto_compiled(draft)))
        for suffix, head in heads:
            methods.append((f"fastspec_head_chain_auto_compiled{suffix}", auto_compiled(head)))
    return dict(methods)


def hf_static_compiled(target):
    """HF generate with its static cache and torch.compile (HF's documented compiled path; off CUDA HF compiles
    only with `CompileConfig._compile_all_devices`), on a copy of the target so the other rows stay eager."""
    import copy

    from transformers import CompileConfig

    model = copy.deepcopy(target)
    config = CompileConfig(mode="default" if target.device.type != "cuda" else "reduce-overhead")
    config._compile_all_devices = True

    def method(hf_common):
        kwargs = dict(hf_common, cache_implementation="static", compile_config=config)
        return lambda batch, seed: (model.generate(batch[0], attention_mask=batch[1], **kwargs), None)

    return method


def first_head_dir(cfg: BenchConfig):
    """The first head's directory: `cfg.head_dir`, else the head shipped for the target
    (`fastspec.models.shipped_head_dir`); None when head rows are off or there is none."""
    from fastspec.models import shipped_head_dir

    path = cfg.head_dir if cfg.head_dir is not None else shipped_head_dir(cfg.target_dir)
    return path if cfg.use_head else None


def head_labels(paths) -> list[str]:
    """Row-name labels of compared head directories: each one's name, with its parents' prepended while two
    would be equal. ValueError when two paths are the same directory."""
    paths = [Path(p).resolve() for p in paths]
    if len(set(paths)) != len(paths):
        raise ValueError(f"compare_heads: a head directory is given twice: {[str(p) for p in paths]}")
    depth = 1
    while True:
        labels = ["/".join(p.parts[-depth:]) for p in paths]
        if len(set(labels)) == len(labels):
            return labels
        depth += 1


def head_suffixes(paths) -> list[str]:
    """Row-name suffixes of the heads in `paths`, in order: "" for the first, ``@label`` (`head_labels`) for the
    compared ones."""
    return ["@" + label if i else "" for i, label in enumerate(head_labels(paths))]


def method_kind(name: str) -> str:
    """A row's method name without a compared head's ``@label`` (what grid patterns and `precompile` read)."""
    return name.split("@", 1)[0]


def load_heads(cfg: BenchConfig, target) -> list[tuple[str, torch.nn.Module]]:
    """``(row-name suffix, head)`` of every head with rows, bound to `target`: the first head (`first_head_dir`, suffix
    "") and each of `cfg.compare_heads` (suffix ``@label``, `head_labels`); empty when head rows are off or there is
    no head."""
    from fastspec.heads import load_head

    first = first_head_dir(cfg)
    if first is None:
        if cfg.compare_heads:
            raise ValueError("compare_heads: comparing heads needs head rows and a first head (head_dir, or a head "
                             "shipped for the target)")  # fmt: skip
        return []
    paths = [first, *cfg.compare_heads]
    return [(suffix, load_head(path, target)) for suffix, path in zip(head_suffixes(paths), paths, strict=True)]


def new_tokens(sequences: torch.Tensor, prompt_len: int, pad: int | None, eos) -> int:
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


def precompile(plan, compiles: CompileCounter, max_new_tokens: int, max_passes: int = 4) -> None:
    """Compile every compiled method's step shapes before timing. First each method's `fixed_k` variants (compiled
    adaptive K: one fixed K per step width) run on one batch per static-cache capacity (`call_capacity`: a graph's
    shape includes it); then every compiled method runs over its batches (seeds 0, 1, ...) until a pass compiles
    no new step shape, at most `max_passes` times. A head's catch-up and the controller pick step widths at run
    time, so a shape can still be missed; any that are show in `compiles_while_timed`."""
    for _, _, batches, methods in plan:
        sweep = [fixed for fn in methods.values() for fixed in getattr(fn, "fixed_k", ())]
        by_capacity = {call_capacity(x[0].shape[1], max_new_tokens): x for x in batches} if sweep else {}
        for fixed in sweep:
            for x in by_capacity.values():
                torch.manual_seed(0)
                fixed(x, 0)
    for seed in range(max_passes):
        before = compiles.count
        for _, _, batches, methods in plan:
            for name, fn in methods.items():
                for x in batches if method_kind(name).endswith("_compiled") else []:
                    torch.manual_seed(seed)
                    fn(x, seed)
        if compiles.count == before:
            return


def acceptance_summary(stats: list) -> dict:
    """Acceptance over several calls' `SpecStats`: acceptance rate, mean accepted length (tokens per target forward,
    bonus included) and per-position acceptance."""
    drafted = sum(s.drafted for s in stats)
    accepted = sum(s.accepted for s in stats)
    row_steps = sum(s.row_steps for s in stats)
    per_pos_d = _sum_lists([s.drafted_per_position for s in stats])
    per_pos_a = _sum_lists([s.accepted_per_position for s in stats])
    return dict(
        acceptance_rate=accepted / drafted if drafted else 0.0,
        mean_accepted_length=(accepted + row_steps) / row_steps,
        per_position_acceptance=[a / d if d else 0.0 for a, d in zip(per_pos_a, per_pos_d, strict=True)],
    )


def _sum_lists(lists: list[list[int]]) -> list[int]:
    width = max((len(x) for x in lists), default=0)
    return [sum(x[j] for x in lists if j < len(x)) for j in range(width)]
