"""`custom_generate`: fastspec's decoding loop plugged into transformers' own `model.generate`.

    out = target.generate(input_ids, custom_generate=fastspec.custom_generate, draft=draft, max_new_tokens=64,
                          repetition_penalty=1.1, stop_strings=[...], ...)

transformers (5.x) prepares a call as usual, the merged `GenerationConfig`, the logits processors and stopping
criteria it built (HF's order, the caller's lists merged in), inputs expanded for `num_return_sequences`, then hands
them to the callable instead of its own decoding loop (`GenerationMixin.generate`, step 9). This module takes them as
they come and runs `fastspec.generate.decode` on them, so an existing call site changes by one argument and
decodes exactly as `fastspec.generate` would with the same arguments.

What reaches the callable (transformers 5.25, `_extract_generation_mode_kwargs`): the keywords its signature adds to
`GenerationMixin._sample`'s, so `draft=`, `num_draft_tokens=`, `tree=`, `prompt_lookup_ngram_size=`, `seed=`,
`return_stats=`, `compile=`, `static_cache=`, `verify_backend=`, `check_logits=` do; HF's `prompt_lookup_num_tokens`,
`num_assistant_tokens(_schedule)` arrive in the config. What does not: `assistant_model=`, `streamer=` and
`tokenizer=` are dropped by `generate` before the call. A decode without the draft the caller named would be
silently slow, never wrong, but it is refused anyway: the caller frame (`generate`'s) is read for `assistant_model`
and `streamer`, and either one raises a ValueError saying what to pass instead. `stop_strings` need a tokenizer that
transformers 5.25 does not pass on to a callable, so its own criteria builder raises first; call
`fastspec.generate` directly for stop strings.
"""

from __future__ import annotations

import sys

import torch

from fastspec.checks import check_generate_args
from fastspec.generate import decode
from fastspec.generation_config import check_supported, speculation

__all__ = ["custom_generate"]

# model inputs `generate` prepares for every decoding loop: fastspec builds its own positions and caches
_PREPARED = {"attention_mask", "position_ids", "use_cache", "logits_to_keep", "cache", "past_key_values",
             "cache_position"}  # fmt: skip


def custom_generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    draft: torch.nn.Module | None = None,
    num_draft_tokens=None,
    tree=None,
    prompt_lookup_ngram_size: int | None = None,
    seed: int | list[int] | torch.Tensor | None = None,
    return_stats: bool = False,
    compile: bool = False,  # noqa: A002 - fastspec.generate's name
    static_cache: bool | None = None,
    verify_backend: str = "auto",
    check_logits: bool = True,
    **model_kwargs,
):
    """The decoding loop `model.generate(..., custom_generate=fastspec.custom_generate)` calls (module docstring).

    Args:
        model: the target (transformers passes the model `generate` was called on).
        input_ids: [B * num_return_sequences, T], as `generate` prepared them.
        logits_processor, stopping_criteria, generation_config: what `generate` built and merged.
        draft, num_draft_tokens, tree, prompt_lookup_ngram_size, seed, return_stats, compile, static_cache,
            verify_backend, check_logits: as in `fastspec.generate`.
        model_kwargs: the model inputs `generate` prepared (attention_mask, position ids, a fresh cache, ...); any
            other model input is refused.

    Returns:
        what `fastspec.generate` returns for these arguments (sequences, or a `GenerateDecoderOnlyOutput` with
        `return_dict_in_generate=True`; with `return_stats` also a `SpecStats`).
    """
    _refuse_dropped_arguments(draft)
    attention_mask = model_kwargs.get("attention_mask")
    for name, value in model_kwargs.items():
        if name not in _PREPARED and value is not None:
            raise ValueError(f"{name}: fastspec feeds the model input_ids and attention_mask only; other model "
                             f"inputs ({name}) are not supported")  # fmt: skip
    for name in ("cache", "past_key_values"):
        cache = model_kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length") and cache.get_seq_length() > 0:
            raise ValueError(f"{name}: fastspec decodes from the prompt with its own caches; a filled cache is not "
                             "supported")  # fmt: skip
    check_supported(generation_config)
    draft, ngram, num_draft_tokens = speculation(generation_config, None, model, draft, None, prompt_lookup_ngram_size,
                                                 None, num_draft_tokens)  # fmt: skip
    new = generation_config.max_length - input_ids.shape[1]
    check_generate_args(
        target=model, input_ids=input_ids, draft=draft, attention_mask=attention_mask, max_new_tokens=new,
        do_sample=bool(generation_config.do_sample), temperature=generation_config.temperature,
        top_k=generation_config.top_k, top_p=generation_config.top_p, num_draft_tokens=num_draft_tokens, tree=tree,
        prompt_lookup=ngram, eos_token_id=generation_config.eos_token_id, pad_token_id=generation_config.pad_token_id,
        streamer=None, compile=compile, static_cache=static_cache, verify_backend=verify_backend,
    )  # fmt: skip
    return decode(
        model, input_ids, attention_mask, generation_config, logits_processor, stopping_criteria, draft=draft,
        num_draft_tokens=num_draft_tokens, tree=tree, prompt_lookup_ngram_size=ngram, seed=seed,
        return_stats=return_stats, compile=compile, static_cache=static_cache, verify_backend=verify_backend,
        check_logits=check_logits,
    )  # fmt: skip


def _refuse_dropped_arguments(draft) -> None:
    """ValueError when the `generate` call that called us was given `assistant_model` or `streamer`, which it does
    not pass to a custom_generate callable (read from its frame: the caller of this function's caller)."""
    frame = sys._getframe(2)
    if frame.f_code.co_name != "generate" or "assistant_model" not in frame.f_locals:
        return
    if frame.f_locals.get("assistant_model") is not None:
        also = "" if draft is None else " (and draft= is given: pass the draft model once, as draft=)"
        raise ValueError("assistant_model: transformers' generate does not pass assistant_model to a custom_generate "
                         f"callable; pass the draft model as draft= instead{also}")  # fmt: skip
    if frame.f_locals.get("streamer") is not None:
        raise ValueError("streamer: transformers' generate does not pass streamer to a custom_generate callable; call "
                         "fastspec.generate(..., streamer=...) directly")  # fmt: skip
