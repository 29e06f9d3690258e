"""`generate`, `speculative_generate`, `autoregressive_generate`: the decoding loop.

One loop serves normal and speculative decoding, chains and trees alike. Each step:
1. the speculator (`fastspec.speculators`) chooses the draft length, drafts K tokens (or a tree of depth K) per
   active row (K = 0 for normal decoding), scores them and the buffer's new columns in one target forward (the
   first step is the prefill) and verifies them: every row gains between 1 and K+1 tokens;
2. the row batch (`fastspec.batch.RowBatch`) emits them, cut at EOS and max_new_tokens, appends them to the
   right-aligned token buffer, compacts every KV cache to the kept entries and drops finished rows;
3. the speculator's draft-length policy learns from the committed step (adaptive K).
"""

from __future__ import annotations

import time

import torch

from fastspec.adaptive import DraftLengthController, FixedDraftLength
from fastspec.batch import RowBatch
from fastspec.cache_kinds import check_state_paths
from fastspec.checks import check_generate_args, check_tree_fits_vocabulary, vocab_size
from fastspec.compiled import WIDTHS, static_capacity
from fastspec.distributed import RankAgreement
from fastspec.drafters import Drafter, DraftSetup, TreeDrafter, build_drafter
from fastspec.rng import RowRandom
from fastspec.runner import CachedModel
from fastspec.sampling import Sampler
from fastspec.speculators import ChainSpeculator, Speculator, TreeSpeculator
from fastspec.stats import SpecStats
from fastspec.support import check_architecture
from fastspec.tree import StaticTree, resolve_tree

__all__ = ["autoregressive_generate", "generate", "speculative_generate"]


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    draft: torch.nn.Module | None = None,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: int | str | DraftLengthController = 4,
    tree=None,
    prompt_lookup: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    seed: int | list[int] | torch.Tensor | None = None,
    return_stats: bool = False,
    streamer=None,
    compile: bool = False,  # noqa: A002 - the public API's name
    static_cache: bool | None = None,
    verify_backend: str = "auto",
    check_logits: bool = True,
):
    """Decode from `target`, speculatively when a `draft` model is given; a drop-in for `target.generate`.

    Args:
        target: any HF causal LM.
        input_ids: [B, T] prompt ids (left-padded when B > 1, with `attention_mask`).
        draft: HF causal LM with the target's vocabulary, a `fastspec.heads.DraftHead` for this target (EAGLE-style:
            drafts from the target's features), a `fastspec.drafters.Drafter` (used as is for this call), or None
            (normal decoding).
        attention_mask: [B, T], 1 for real tokens, 0 for left padding.
        max_new_tokens: tokens to generate per row (>= 1); generation stops exactly there.
        do_sample, temperature, top_k, top_p: as in HF generate; greedy when do_sample is False.
        num_draft_tokens: chain length K, or "auto" to choose K (<= 8) each step from each row's measured
            per-position acceptance and the measured step time per K (`fastspec.adaptive`), or a
            `DraftLengthController` to do the same and keep what it measured for the next call given it (short
            calls then skip the exploration a fresh "auto" starts with).
        tree: tree speculation with `draft` (`fastspec.tree`): a list of paths of child ranks (e.g. [[0], [1],
            [0, 0]]), a named static tree ("small", "medium", "large": 16/32/64 nodes of depth num_draft_tokens),
            "dynamic" or a `DynamicTree` (EAGLE-2, depth num_draft_tokens); None drafts a chain.
        prompt_lookup: n-gram size for drafting from the prompt (and the text generated so far) instead of a draft
            model; with a `draft` too, rows whose last n-gram occurs earlier draft by lookup, the others with the
            draft model or head (`fastspec.drafters.LookupThenDrafter`).
        eos_token_id, pad_token_id: default to the target's generation config.
        seed: fixes every random draw. An int seeds row b with seed + b; a list / tensor [B] gives each row its
            own seed, and a row's output then depends only on its prompt and seed, not on the rest of the batch.
        return_stats: also return a `SpecStats`.
        streamer: object with `put(tensor)` / `end()` (transformers' TextStreamer), batch 1 only.
        compile: decode with a static KV cache and the target's and draft's steps compiled for fixed shapes
            (`fastspec.compiled`: torch.compile, CUDA graphs on CUDA); the first call of each step shape compiles
            (logged), later calls in the process reuse it; a model that fails to compile decodes eagerly (warning).
        static_cache: preallocated KV caches (`fastspec.static_cache`) without compiling; None follows `compile`.
        verify_backend: "auto" (Triton on CUDA), "triton" or "reference".
        check_logits: raise `NonFiniteLogitsError` when the target or draft emits NaN/inf logits or a row with
            no finite logit (one reduction over V per forward); False skips the check.

    Returns:
        sequences [B, T + new] (new = longest row's output; shorter rows padded with pad_token_id), and
        `SpecStats` when `return_stats`.
    """
    check_generate_args(
        target=target, input_ids=input_ids, draft=draft, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, num_draft_tokens=num_draft_tokens,
        tree=tree, prompt_lookup=prompt_lookup, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
        streamer=streamer, compile=compile, static_cache=static_cache, verify_backend=verify_backend,
    )  # fmt: skip
    check_architecture(target, draft, tree=tree, static=bool(compile or static_cache))
    config = target.generation_config
    eos = eos_token_id if eos_token_id is not None else config.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = pad_token_id if pad_token_id is not None else config.pad_token_id
    pad = pad if pad is not None else (eos_ids[0] if eos_ids else 0)
    ranks = RankAgreement(target)  # a sharded target's ranks must draw and time alike; inactive otherwise
    sampler = Sampler(do_sample, float(temperature), top_k, top_p, RowRandom(_row_seeds(seed, input_ids, ranks)))
    capacity = None
    if compile or static_cache:
        capacity = call_capacity(input_ids.shape[1], max_new_tokens, tree)
    check_state_paths(target, draft, tree=tree, static=capacity is not None, prompt_lookup=prompt_lookup,
                      rows=input_ids.shape[0], compiled=bool(compile))  # fmt: skip
    target_runner = CachedModel(target, capacity, "target" if compile else None)
    setup = DraftSetup(target_runner, vocab_size(target), capacity, compile, check_logits, verify_backend)
    drafter = build_drafter(draft, prompt_lookup, setup)
    speculator = _speculator(drafter, tree, num_draft_tokens, setup)
    batch = RowBatch(input_ids, attention_mask, max_new_tokens, eos_ids, pad, [target_runner, *speculator.caches],
                     streamer)  # fmt: skip
    stats = _decode(target_runner, speculator, batch, sampler, ranks)
    sequences = batch.finish()
    return (sequences, stats) if return_stats else sequences


def call_capacity(prompt_tokens: int, max_new_tokens: int, tree=None) -> int:
    """The static caches' capacity of a call (`compile` or `static_cache`): the prompt, every new token and the
    widest padded step (tree nodes included), rounded up by `static_capacity`. Compiled graphs are per capacity."""
    return static_capacity(prompt_tokens + max_new_tokens + 2 * WIDTHS[-1] + _tree_nodes(tree))


def _tree_nodes(tree) -> int:
    """Nodes of a tree given as a list of paths (other trees fit the padding slack of the static cache)."""
    return len(tree) + 1 if isinstance(tree, list | tuple) else 0


def _speculator(drafter: Drafter | None, tree, num_draft_tokens: int | str | DraftLengthController,
                setup: DraftSetup) -> Speculator:  # fmt: skip
    """A tree speculator when `tree` is given (the drafter is then a `TreeDrafter`), else a chain speculator (no
    drafter: normal decoding), with the draft-length policy of `num_draft_tokens`."""
    kept = num_draft_tokens if isinstance(num_draft_tokens, DraftLengthController) else None
    auto = kept is not None or num_draft_tokens == "auto"
    longest = kept.max_k if kept is not None else DraftLengthController().max_k  # "auto"'s longest K or depth

    def controller(max_k: int) -> DraftLengthController:
        if kept is None:
            return DraftLengthController(max_k)
        if kept.max_k != max_k:
            raise ValueError(f"num_draft_tokens: the controller drafts up to {kept.max_k}, the tree is {max_k} deep")
        kept.new_call()
        return kept

    if tree is not None:
        if not isinstance(drafter, TreeDrafter):
            raise ValueError(f"tree: {type(drafter).__name__} drafts chains only (pass tree=None)")
        spec = resolve_tree(tree, longest if auto else num_draft_tokens)
        if isinstance(spec, StaticTree):
            check_tree_fits_vocabulary(spec.ranks, setup.target_vocab)
        length = controller(spec.depth) if auto else FixedDraftLength(spec.depth)
        return TreeSpeculator(drafter, spec, length, setup.backend, setup.check_logits)
    if drafter is None:
        length = FixedDraftLength(0)
    else:
        length = controller(longest) if auto else FixedDraftLength(num_draft_tokens)
    return ChainSpeculator(drafter, length, setup.backend, setup.check_logits)


def speculative_generate(target: torch.nn.Module, input_ids: torch.Tensor, draft: torch.nn.Module, **kwargs):
    """Speculative decoding with a draft model; same arguments and results as `generate`."""
    if draft is None:
        raise ValueError("draft must be a model for speculative_generate (use autoregressive_generate without one)")
    return generate(target, input_ids, draft=draft, **kwargs)


def autoregressive_generate(target: torch.nn.Module, input_ids: torch.Tensor, **kwargs):
    """Normal decoding (one target forward per token) through the same loop, sampling and stopping rules."""
    if kwargs.get("draft") is not None:
        raise ValueError("draft must be None for autoregressive_generate")
    return generate(target, input_ids, **kwargs)


def _row_seeds(seed, input_ids: torch.Tensor, ranks: RankAgreement) -> torch.Tensor:
    """Per-row seeds [B] int64: seed + row for an int, the given values for a list/tensor, random for None (rank 0's
    draw on every rank of a sharded target)."""
    batch = input_ids.shape[0]
    if seed is None:  # drawn from torch's global generator, so torch.manual_seed still fixes the output
        seed = ranks.seed(int(torch.randint(0, 2**62, (1,))))
    if isinstance(seed, int):
        return seed + torch.arange(batch, device=input_ids.device)
    seeds = torch.as_tensor(seed, dtype=torch.long, device=input_ids.device).reshape(-1)
    if seeds.numel() != batch:
        raise ValueError(f"seed has {seeds.numel()} per-row values for a batch of {batch}")
    return seeds


@torch.no_grad()
def _decode(target: CachedModel, speculator: Speculator, batch: RowBatch, sampler: Sampler,
            ranks: RankAgreement) -> SpecStats:  # fmt: skip
    """The loop of the module docstring, until every row is done. Returns the call's `SpecStats`. A draft-length
    policy that learns from step times gets rank 0's on every rank of a sharded target."""
    start = time.perf_counter()
    stats = SpecStats()
    while True:
        step_start = time.perf_counter()
        step = speculator.step(target, batch, sampler.for_step(*batch.sampling_keys()))
        outcome = batch.commit(step)
        stats.record(outcome.num_draft, outcome.num_accepted, outcome.emitted, outcome.num_nodes)
        if outcome.done:
            break
        seconds = time.perf_counter() - step_start
        speculator.commit(step, outcome, ranks.seconds(seconds) if speculator.timed else seconds)
    stats.wall_time = time.perf_counter() - start
    return stats
