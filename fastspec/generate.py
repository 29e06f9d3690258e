"""`generate`, `speculative_generate`, `autoregressive_generate`: the decoding loop.

One loop serves normal and speculative decoding, chains and trees alike. Each step:
1. the speculator (`fastspec.speculators`) chooses the draft length, drafts K tokens (or a tree of depth K) per
   active row (K = 0 for normal decoding), scores them and the buffer's new columns in one target forward (the
   first step is the prefill) and verifies them: every row gains between 1 and K+1 tokens;
   The call's logits processors (HF's, `fastspec.processors`) run on the target's logits at every scored position,
   each with its own prefix, before verification;
2. the row batch (`fastspec.batch.RowBatch`) emits them, cut at EOS, max_new_tokens and the stopping criteria
   (`fastspec.stopping`), appends them to the right-aligned token buffer, compacts every KV cache to the kept entries
   and drops finished rows;
3. the speculator's draft-length policy learns from the committed step (adaptive K); `max_time` ends the loop.
`generate` resolves HF's arguments first (`fastspec.generation_config`); `decode` is the loop on resolved inputs, which
`fastspec.custom_generate` shares.
"""

from __future__ import annotations

import time

import torch
from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

from fastspec.adaptive import DraftLengthController
from fastspec.batch import RowBatch
from fastspec.checks import check_generate_args, check_tree_fits_vocabulary, vocab_size
from fastspec.compiled import WIDTHS, static_capacity
from fastspec.distributed import RankAgreement
from fastspec.draft_length import chain_length, schedule, tree_and_length
from fastspec.drafters import Drafter, DraftSetup, TreeDrafter, build_drafter
from fastspec.generation_config import (
    builders,
    check_supported,
    check_types,
    expand_for_return_sequences,
    merged_config,
    new_tokens,
    refuse_generate_arguments,
    speculation,
)
from fastspec.outputs import ScoreRecorder
from fastspec.processors import LogitsPipeline
from fastspec.rng import RowRandom
from fastspec.runner import CachedModel
from fastspec.sampling import Sampler
from fastspec.speculators import ChainSpeculator, Speculator, TreeSpeculator
from fastspec.stats import SpecStats
from fastspec.stopping import StopRules
from fastspec.support import check_architecture
from fastspec.tree import StaticTree

__all__ = ["autoregressive_generate", "decode", "generate", "speculative_generate"]


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    draft: torch.nn.Module | None = None,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int | None = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: int | str | DraftLengthController | None = None,
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
    *,
    generation_config: GenerationConfig | None = None,
    logits_processor: LogitsProcessorList | list | None = None,
    stopping_criteria: StoppingCriteriaList | list | None = None,
    prompt_lookup_ngram_size: int | None = None,
    assistant_model: torch.nn.Module | None = None,
    tokenizer=None,
    **kwargs,
):
    """Decode from `target`, speculatively when a `draft` model is given; a drop-in for `target.generate`.

    Besides the arguments below it takes transformers' `generate` arguments under their names and precedence
    (`fastspec.generation_config`): `generation_config`, and as keywords any `GenerationConfig` field that applies to
    greedy or sampled decoding (`max_length`, `min_new_tokens`, `min_length`, `min_p`, `typical_p`, `epsilon_cutoff`,
    `eta_cutoff`, `repetition_penalty`, `no_repeat_ngram_size`, `bad_words_ids`, `suppress_tokens`,
    `begin_suppress_tokens`, `sequence_bias`, `forced_eos_token_id`, `renormalize_logits`, `num_return_sequences`,
    `stop_strings` (with `tokenizer`), `max_time`, `return_dict_in_generate` with `output_scores` / `output_logits`,
    `prompt_lookup_num_tokens`, `num_assistant_tokens`, `num_assistant_tokens_schedule`, ...), plus `logits_processor`
    and `stopping_criteria` lists. Every processor runs at every drafted position with that position's own prefix
    (`fastspec.processors`), every stopping criterion on every emitted token (`fastspec.stopping`), so greedy output is
    HF's token for token and sampled output has HF's distribution. What cannot be speculated (beam search,
    contrastive search, DoLa, ...) raises a ValueError naming the argument.

    Args:
        target: any HF causal LM.
        input_ids: [B, T] prompt ids (left-padded when B > 1, with `attention_mask`).
        draft: HF causal LM with the target's vocabulary, a `fastspec.heads.DraftHead` for this target (EAGLE-style:
            drafts from the target's features), a `fastspec.drafters.Drafter` (used as is for this call), or None
            (normal decoding). `assistant_model` is HF's name for it.
        attention_mask: [B, T], 1 for real tokens, 0 for left padding.
        max_new_tokens: tokens to generate per row (>= 1); generation stops exactly there. Unset (and no
            `max_length` anywhere): 128.
        do_sample, temperature, top_k, top_p: as in HF generate; greedy when do_sample is False (the default, unless
            the model's generation config says otherwise). top_k is off unless set (HF's default is 50).
        num_draft_tokens: chain length K (default 4, or HF's `num_assistant_tokens` / `prompt_lookup_num_tokens`), or
            "auto" to choose K (<= 8) each step from each row's measured per-position acceptance and the measured
            step time per K (`fastspec.adaptive`), or a `DraftLengthController` to do the same and keep what it
            measured for the next call given it (short calls then skip the exploration a fresh "auto" starts with).
        tree: tree speculation with `draft` (`fastspec.tree`): a list of paths of child ranks (e.g. [[0], [1],
            [0, 0]]), a named static tree ("small", "medium", "large": 16/32/64 nodes of depth num_draft_tokens),
            "dynamic" or a `DynamicTree` (EAGLE-2, depth num_draft_tokens); None drafts a chain.
        prompt_lookup: the old name of `prompt_lookup_ngram_size` (still accepted).
        eos_token_id, pad_token_id: default to the target's generation config.
        seed: fixes every random draw. An int seeds row b with seed + b; a list / tensor [B] gives each row its
            own seed, and a row's output then depends only on its prompt and seed, not on the rest of the batch.
            None draws one seed from torch's global generator (its only use of it), so `torch.manual_seed(s)` before
            the call reproduces it.
        return_stats: also return a `SpecStats`.
        streamer: object with `put(tensor)` / `end()` (transformers' TextStreamer), batch 1 only.
        compile: decode with a static KV cache and the target's and draft's steps compiled for fixed shapes
            (`fastspec.compiled`: torch.compile, CUDA graphs on CUDA); the first call of each step shape compiles
            (logged), later calls in the process reuse it; a model that fails to compile decodes eagerly (warning).
        static_cache: preallocated KV caches (`fastspec.static_cache`) without compiling; None follows `compile`
            (and HF's `cache_implementation="static"`).
        verify_backend: "auto" (Triton on CUDA), "triton" or "reference".
        check_logits: raise `NonFiniteLogitsError` when the target or draft emits NaN/inf logits or a row with
            no finite logit (one reduction over V per forward); False skips the check.
        generation_config: a `transformers.GenerationConfig`; explicit keywords override its fields, its fields
            override the model's own generation config.
        logits_processor, stopping_criteria: extra HF processors / criteria, merged into the ones the config builds
            as HF merges them.
        prompt_lookup_ngram_size: draft by prompt lookup with n-grams of up to this size (from the prompt and the
            text generated so far) instead of a draft model; with a `draft` too, rows whose last n-gram occurs
            earlier draft by lookup, the others with the draft model or head (`fastspec.drafters.LookupThenDrafter`).
        tokenizer: the tokenizer `stop_strings` are matched with.

    Returns:
        sequences [B * num_return_sequences, T + new] (new = longest row's output; shorter rows padded with
        pad_token_id), or a `transformers.generation.GenerateDecoderOnlyOutput` with `return_dict_in_generate=True`;
        and `SpecStats` when `return_stats`.
    """
    explicit = dict(max_new_tokens=max_new_tokens, do_sample=do_sample, temperature=temperature, top_k=top_k,
                    top_p=top_p, eos_token_id=eos_token_id, pad_token_id=pad_token_id)  # fmt: skip
    explicit = {name: value for name, value in explicit.items() if value is not None}
    explicit.update(refuse_generate_arguments(target, kwargs))
    check_types(explicit)
    if isinstance(explicit.get("temperature"), int):  # HF's TemperatureLogitsWarper takes floats only
        explicit["temperature"] = float(explicit["temperature"])
    config, user_set = merged_config(target, generation_config, explicit)
    check_supported(config, user_set)
    draft, ngram, num_draft_tokens = speculation(config, user_set, target, draft, assistant_model,
                                                 prompt_lookup_ngram_size, prompt_lookup, num_draft_tokens)  # fmt: skip
    prompt_tokens = input_ids.shape[-1] if isinstance(input_ids, torch.Tensor) else 0
    new = new_tokens(config, prompt_tokens)
    check_generate_args(
        target=target, input_ids=input_ids, draft=draft, attention_mask=attention_mask, max_new_tokens=new,
        do_sample=bool(config.do_sample), temperature=config.temperature, top_k=config.top_k, top_p=config.top_p,
        num_draft_tokens=num_draft_tokens, tree=tree, prompt_lookup=ngram, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id, streamer=streamer, compile=compile, static_cache=static_cache,
        verify_backend=verify_backend,
    )  # fmt: skip
    input_ids, attention_mask = expand_for_return_sequences(input_ids, attention_mask, config.num_return_sequences)
    # HF's `_prepare_generated_length`: lengths count the prompt
    config.max_length = prompt_tokens + new
    if config.min_new_tokens is not None:
        config.min_length = config.min_new_tokens + prompt_tokens
    device, batch = input_ids.device, input_ids.shape[0]
    hf = builders(target)  # the model's own GenerationMixin methods
    hf._prepare_special_tokens(config, attention_mask is not None, device=device, batch_size=batch)
    padded = attention_mask is not None and bool((attention_mask == 0).any())
    processors = hf._get_logits_processor(
        generation_config=config, input_ids_seq_length=prompt_tokens, encoder_input_ids=input_ids,
        prefix_allowed_tokens_fn=None, logits_processor=LogitsProcessorList(logits_processor or []), device=device,
        model_kwargs={"attention_mask": attention_mask if padded else None}, negative_prompt_ids=None,
        negative_prompt_attention_mask=None,
    )  # fmt: skip
    criteria = hf._get_stopping_criteria(
        generation_config=config, stopping_criteria=StoppingCriteriaList(stopping_criteria or []), tokenizer=tokenizer
    )
    return decode(
        target, input_ids, attention_mask, config, processors, criteria, draft=draft, num_draft_tokens=num_draft_tokens,
        tree=tree, prompt_lookup_ngram_size=ngram, seed=seed, return_stats=return_stats, streamer=streamer,
        compile=compile, static_cache=static_cache, verify_backend=verify_backend, check_logits=check_logits,
    )  # fmt: skip


def decode(target: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
           config: GenerationConfig, processors, criteria, *, draft=None, num_draft_tokens=4, tree=None,
           prompt_lookup_ngram_size: int | None = None, seed=None, return_stats: bool = False, streamer=None,
           compile: bool = False, static_cache: bool | None = None, verify_backend: str = "auto",
           check_logits: bool = True):  # noqa: A002  # fmt: skip
    """The decoding loop of `generate` (and of `fastspec.custom_generate`) on prepared inputs: `config` merged, with
    HF's special-token tensors and `max_length` set; `processors` and `criteria` HF's lists for it; `input_ids`
    already expanded for `num_return_sequences`. Returns what `generate` returns."""
    rules = StopRules(criteria)
    prompt_tokens = input_ids.shape[1]
    max_new_tokens = (rules.max_length if rules.max_length is not None else config.max_length) - prompt_tokens
    pad = config._pad_token_tensor
    pad = int(pad.reshape(-1)[0]) if pad is not None else 0
    do_sample = bool(config.do_sample)
    pipeline = LogitsPipeline(processors, do_sample)
    ranks = RankAgreement(target)  # a sharded target's ranks must draw and time alike; inactive otherwise
    sampler = Sampler(do_sample, *_draft_sampling(config), RowRandom(_row_seeds(seed, input_ids, ranks)),
                      min_p=config.min_p if do_sample and config.min_p else None, pipeline=pipeline)  # fmt: skip
    static_cache = static_cache if static_cache is not None else (config.cache_implementation == "static" or None)
    capacity = None
    if compile or static_cache:
        capacity = call_capacity(prompt_tokens, max_new_tokens, tree)
    padded = attention_mask is not None and bool((attention_mask == 0).any())
    check_architecture(target, draft, tree=tree, static=capacity is not None, compiled=bool(compile),
                       prompt_lookup=prompt_lookup_ngram_size, rows=input_ids.shape[0], padded=padded)  # fmt: skip
    target_runner = CachedModel(target, capacity, "target" if compile else None)
    check = check_logits and not config.remove_invalid_values  # InfNanRemoveLogitsProcessor repairs them
    setup = DraftSetup(target_runner, vocab_size(target), capacity, compile, check, verify_backend)
    drafter = build_drafter(draft, prompt_lookup_ngram_size, setup)
    speculator = _speculator(drafter, tree, schedule(num_draft_tokens, config), setup)
    outputs = config.return_dict_in_generate and (config.output_scores or config.output_logits)
    recorder = ScoreRecorder(input_ids.shape[0], bool(config.output_scores), bool(config.output_logits),
                             pipeline) if outputs else None  # fmt: skip
    batch = RowBatch(input_ids, attention_mask, max_new_tokens, rules.eos_ids, pad, [target_runner, *speculator.caches],
                     streamer, history=pipeline.active, stop=rules, recorder=recorder)  # fmt: skip
    stats = _decode(target_runner, speculator, batch, sampler, ranks, rules)
    result = batch.finish()
    if config.return_dict_in_generate:
        # transformers' generation utils import torch._dynamo (and Triton): not at `import fastspec` time
        from transformers.generation import GenerateDecoderOnlyOutput

        scores, logits = recorder.outputs(result.shape[1] - prompt_tokens) if recorder else (None, None)
        result = GenerateDecoderOnlyOutput(sequences=result, scores=scores, logits=logits)
    return (result, stats) if return_stats else result


def _draft_sampling(config: GenerationConfig) -> tuple[float, int | None, float | None]:
    """(temperature, top_k, top_p) drafts are drawn with when sampling: the call's, with HF's "off" values as None."""
    temperature = float(config.temperature) if config.temperature is not None else 1.0
    top_k = config.top_k if config.top_k is not None and config.top_k > 0 else None
    top_p = config.top_p if config.top_p is not None and config.top_p < 1.0 else None
    return temperature, top_k, top_p


def call_capacity(prompt_tokens: int, max_new_tokens: int, tree=None) -> int:
    """The static caches' capacity of a call (`compile` or `static_cache`): the prompt, every new token and the
    widest padded step (tree nodes included), rounded up by `static_capacity`. Compiled graphs are per capacity."""
    return static_capacity(prompt_tokens + max_new_tokens + 2 * WIDTHS[-1] + _tree_nodes(tree))


def _tree_nodes(tree) -> int:
    """Nodes of a tree given as a list of paths (other trees fit the padding slack of the static cache)."""
    return len(tree) + 1 if isinstance(tree, list | tuple) else 0


def _speculator(drafter: Drafter | None, tree, num_draft_tokens, setup: DraftSetup) -> Speculator:
    """A tree speculator when `tree` is given (the drafter is then a `TreeDrafter`), else a chain speculator (no
    drafter: normal decoding), with the draft-length policy of `num_draft_tokens` (`fastspec.draft_length`)."""
    if tree is None:
        length = chain_length(num_draft_tokens, drafter is not None)
        return ChainSpeculator(drafter, length, setup.backend, setup.check_logits)
    spec, length = tree_and_length(tree, num_draft_tokens)
    if not isinstance(drafter, TreeDrafter):
        raise ValueError(f"tree: {type(drafter).__name__} drafts chains only (pass tree=None)")
    if isinstance(spec, StaticTree):
        check_tree_fits_vocabulary(spec.ranks, setup.target_vocab)
    return TreeSpeculator(drafter, spec, length, setup.backend, setup.check_logits)


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
            ranks: RankAgreement, rules: StopRules) -> SpecStats:  # fmt: skip
    """The loop of the module docstring, until every row is done or a `max_time` has passed (checked between steps).
    Returns the call's `SpecStats`. A draft-length policy that learns from step times gets rank 0's on every rank of
    a sharded target."""
    start = time.perf_counter()
    stats = SpecStats()
    while True:
        step_start = time.perf_counter()
        step = speculator.step(target, batch, sampler.for_step(*batch.sampling_keys()))
        outcome = batch.commit(step)
        stats.record(outcome.num_draft, outcome.num_accepted, outcome.emitted, outcome.num_nodes)
        if outcome.done or rules.time_is_up():
            break
        seconds = time.perf_counter() - step_start
        speculator.commit(step, outcome, ranks.seconds(seconds) if speculator.timed else seconds)
    stats.wall_time = time.perf_counter() - start
    return stats
