"""transformers' `generate` arguments under their own names and precedence, resolved for one `fastspec.generate` call.

Precedence is HF's (`GenerationMixin._prepare_generation_config`): an explicit keyword beats the `generation_config`
passed, which beats the model's own `generation_config`, which beats the defaults. The defaults are transformers'
global ones (`GenerationConfig._get_default_generation_params`) except two that fastspec's public API fixed before:
`max_new_tokens=128` when neither `max_new_tokens` nor `max_length` is set anywhere (HF: `max_length=20`), and
`top_k=None` (HF: 50). Pass `top_k=50` (or a `generation_config`) for HF's.

What is built from the merged `GenerationConfig` is HF's own: the logits processors
(`model._get_logits_processor`, HF's order and classes, run over drafted positions by `fastspec.processors`) and the
stopping criteria (`model._get_stopping_criteria`, run per emitted token by `fastspec.stopping`).

HF's speculation arguments mean what they mean in HF: `assistant_model` is the draft; `prompt_lookup_num_tokens` turns
on prompt lookup and drafts that many tokens (n-gram size `max_matching_ngram_size`, HF's default 2);
`num_assistant_tokens` is the draft length; `num_assistant_tokens_schedule` "heuristic" grows / shrinks it as HF does
(`fastspec.hf_schedule`); `assistant_early_exit=N` drafts with the target's first N layers and its head
(`fastspec.drafters.early_exit`); `use_mtp=True` with its multi-token-prediction layers (`fastspec.drafters.mtp`).
fastspec's own n-gram size is `prompt_lookup_ngram_size` (its old name
`prompt_lookup` still works).

Arguments whose decoding cannot be speculated, or that fastspec does not implement, raise a ValueError naming the
argument and the reason (`REFUSED`); a keyword that is neither a `generate` argument nor a `GenerationConfig` field is a
TypeError, as for any Python function.
"""

from __future__ import annotations

import copy
import inspect

import torch
from transformers import GenerationConfig

from fastspec.drafters.early_exit import early_exit_draft
from fastspec.drafters.mtp import mtp_draft

__all__ = [
    "REFUSED",
    "builders",
    "check_supported",
    "check_types",
    "expand_for_return_sequences",
    "merged_config",
    "new_tokens",
    "refuse_generate_arguments",
    "speculation",
]

_BEAMS = "beam search keeps several hypotheses per row and reorders them; speculation verifies one continuation per row"
_NOT_HERE = "fastspec does not implement it (use the model's own generate)"
# GenerationConfig field -> (is the value a request fastspec cannot honour?, why)
REFUSED = {
    "num_beams": (lambda v: v > 1, _BEAMS),
    "num_beam_groups": (lambda v: v > 1, "group beam search: " + _BEAMS),
    "diversity_penalty": (lambda v: v != 0.0, "group beam search: " + _BEAMS),
    "constraints": (lambda v: True, "constrained beam search: " + _BEAMS),
    "force_words_ids": (lambda v: True, "constrained beam search: " + _BEAMS),
    "low_memory": (lambda v: v is True, "a beam-search option: " + _BEAMS),
    "penalty_alpha": (
        lambda v: v > 0,
        "contrastive search re-ranks top-k candidates by the target's hidden states, "
        "one token per forward: there is nothing to speculate",
    ),
    "dola_layers": (
        lambda v: True,
        "DoLa contrasts early layers' logits with the last layer's at every token; " + _NOT_HERE,
    ),
    "guidance_scale": (
        lambda v: v != 1.0,
        "classifier-free guidance runs a second, unconditional forward per token; " + _NOT_HERE,
    ),
    "use_cache": (lambda v: v is False, "speculation verifies drafts against the KV cache; fastspec always keeps one"),
    "cache_implementation": (
        lambda v: v not in ("dynamic", "static"),
        "fastspec's caches are dynamic or static (static_cache=True); other cache implementations are not available",
    ),
    "cache_config": (lambda v: True, "fastspec builds its own caches (static_cache=True for a static one)"),
    "max_cache_len": (lambda v: True, "fastspec sizes its static cache from the prompt and max_new_tokens"),
    "output_attentions": (
        lambda v: v is True,
        "fastspec returns no attentions (return_dict_in_generate gives sequences, scores and logits)",
    ),
    "output_hidden_states": (
        lambda v: v is True,
        "fastspec returns no hidden states (return_dict_in_generate gives sequences, scores and logits)",
    ),
    "encoder_repetition_penalty": (lambda v: v != 1.0, _NOT_HERE),
    "encoder_no_repeat_ngram_size": (lambda v: v > 0, _NOT_HERE),
    "token_healing": (lambda v: v is True, "token healing rewrites the prompt's last tokens; " + _NOT_HERE),
    "watermarking_config": (lambda v: True, "watermarking processors keep state across calls; " + _NOT_HERE),
    "assistant_ensemble_weight": (lambda v: True, "mixing the draft's distribution into the output is not lossless"),
    "speculation_type": (lambda v: True, "fastspec chooses chains or trees with num_draft_tokens / tree"),
    "compile_config": (lambda v: True, "fastspec compiles its own steps with compile=True"),
    "continuous_batching_config": (lambda v: True, "continuous batching is not implemented in fastspec"),
    "prefill_chunk_size": (lambda v: True, "fastspec prefills the prompt in one forward"),
}
# refused only when set by the caller (their HF defaults are not None and do nothing without their feature)
REFUSED_WHEN_SET = {
    "assistant_confidence_threshold": 'fastspec\'s draft length is num_draft_tokens ("auto" adapts it)',
    "assistant_lookbehind": "it serves drafts with another tokenizer, which fastspec does not implement",
    "target_lookbehind": "it serves drafts with another tokenizer, which fastspec does not implement",
}
# generate() arguments that are no GenerationConfig field
REFUSED_GENERATE_ARGUMENTS = {
    "prefix_allowed_tokens_fn": "it is called with each row's index in the batch, which speculation's per-position "
    "calls do not keep; pass a LogitsProcessor through logits_processor instead",
    "synced_gpus": "fastspec's sharded targets agree through fastspec.distributed, not synced_gpus",
    "negative_prompt_ids": "classifier-free guidance is not implemented in fastspec",
    "negative_prompt_attention_mask": "classifier-free guidance is not implemented in fastspec",
    "assistant_tokenizer": "a draft with another tokenizer (universal assisted generation) is not implemented: "
    "fastspec verifies the draft's token ids as the target's",
    "custom_generate": "fastspec.generate is the decoding loop itself; pass custom_generate=fastspec.custom_generate "
    "to the model's generate instead",
    "trust_remote_code": "it only loads custom_generate repositories",
}
# fastspec's defaults where its public API differs from transformers' global ones
_DROPPED_DEFAULTS = ("max_length", "top_k")


def merged_config(target: torch.nn.Module, generation_config: GenerationConfig | None,
                  explicit: dict) -> tuple[GenerationConfig, set[str]]:  # fmt: skip
    """(the call's GenerationConfig, the fields the caller or the model set): `explicit` (keywords given, None values
    left out) over `generation_config` over `target.generation_config` over the defaults (module docstring).
    TypeError for a keyword that is no GenerationConfig field; HF's own validation runs (ValueError / warnings)."""
    if generation_config is not None and not isinstance(generation_config, GenerationConfig):
        raise TypeError(f"generation_config must be a transformers GenerationConfig, got {type(generation_config)}")
    config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    config.update(**target.generation_config.to_dict(), defaults_only=True, allow_custom_entries=True)
    fields = set(GenerationConfig().to_dict())
    unknown = [key for key in explicit if key not in fields or key.startswith("_")]
    if unknown:
        raise TypeError(f"generate() got an unexpected keyword argument {unknown[0]!r}")
    config.update(**explicit)
    user_set = {key for key, value in config.to_dict().items() if value is not None}
    defaults = GenerationConfig._get_default_generation_params()
    for key in _DROPPED_DEFAULTS:
        defaults.pop(key)
    config.update(**defaults, defaults_only=True)
    return config, user_set


def check_supported(config: GenerationConfig, user_set: set[str] | None = None) -> None:
    """ValueError naming the first field of `config` that asks for what fastspec cannot do, and why. `user_set` (the
    fields the caller set; None: every field differing from transformers' defaults) limits `REFUSED_WHEN_SET`."""
    defaults = GenerationConfig._get_default_generation_params()
    for name, (refused, why) in REFUSED.items():
        value = getattr(config, name, None)
        if value is not None and refused(value):
            raise ValueError(f"{name}={value!r} is not supported by fastspec: {why}")
    for name, why in REFUSED_WHEN_SET.items():
        value = getattr(config, name, None)
        chosen = name in user_set if user_set is not None else value != defaults.get(name)
        if value is not None and chosen:
            raise ValueError(f"{name}={value!r} is not supported by fastspec: {why}")
    schedule = config.num_assistant_tokens_schedule
    if schedule not in (None, "constant", "heuristic", "heuristic_transient"):
        raise ValueError(f"num_assistant_tokens_schedule must be 'constant', 'heuristic' or 'heuristic_transient', "
                         f"got {schedule!r}")  # fmt: skip


def refuse_generate_arguments(target: torch.nn.Module, arguments: dict) -> dict:
    """The keywords of `arguments` that may be GenerationConfig fields; ValueError for a `generate()` argument or
    model input fastspec does not take (naming it and why), TypeError for any other unknown keyword is left to
    `merged_config`."""
    forward = set(inspect.signature(target.forward).parameters) - {"kwargs", "input_ids", "attention_mask"}
    fields = set(GenerationConfig().to_dict())
    for name, value in arguments.items():
        if name in REFUSED_GENERATE_ARGUMENTS and value is not None and value is not False:
            raise ValueError(f"{name} is not supported by fastspec: {REFUSED_GENERATE_ARGUMENTS[name]}")
        if name in forward and name not in fields and value is not None:
            raise ValueError(f"{name}: fastspec feeds the model input_ids and attention_mask only; other model "
                             f"inputs ({name}) are not supported")  # fmt: skip
    return {k: v for k, v in arguments.items() if k not in REFUSED_GENERATE_ARGUMENTS and not (k in forward and
            k not in fields)}  # fmt: skip


_INT_FIELDS = (
    "max_new_tokens",
    "max_length",
    "min_new_tokens",
    "min_length",
    "num_return_sequences",
    "no_repeat_ngram_size",
    "prompt_lookup_num_tokens",
    "num_assistant_tokens",
    "max_matching_ngram_size",
)


def builders(target: torch.nn.Module):
    """What builds HF's processors and criteria for `target` (`_prepare_special_tokens`, `_get_logits_processor`,
    `_get_stopping_criteria`): the model itself, or, for a model without transformers' `GenerationMixin` (a wrapper
    with a config), those methods bound to its config."""
    if hasattr(target, "_get_logits_processor"):
        return target
    from transformers.generation.utils import GenerationMixin  # imports torch._dynamo: not at `import fastspec`

    class ConfigOnly(GenerationMixin):
        def __init__(self, model: torch.nn.Module):
            self.config, self.generation_config = model.config, model.generation_config

    return ConfigOnly(target)


def check_types(explicit: dict) -> None:
    """TypeError naming an integer argument given as something else (before HF's validation compares it)."""
    for name in _INT_FIELDS:
        value = explicit.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "typical_p"):
        value = explicit.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")


def new_tokens(config: GenerationConfig, prompt_tokens: int) -> int:
    """Tokens to generate per row: max_new_tokens, else max_length minus the prompt (HF's rule), else 128."""
    if config.max_new_tokens is not None:
        return config.max_new_tokens
    if config.max_length is not None:
        if config.max_length <= prompt_tokens:
            raise ValueError(f"max_length={config.max_length} leaves no room after the prompt of {prompt_tokens} "
                             "tokens (max_length counts the prompt); raise it or set max_new_tokens")  # fmt: skip
        return config.max_length - prompt_tokens
    return 128


def expand_for_return_sequences(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                                count: int) -> tuple[torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """Each row repeated `count` times in place (HF's `_expand_inputs_for_generation`): rows b * count + i."""
    if count == 1:
        return input_ids, attention_mask
    mask = None if attention_mask is None else attention_mask.repeat_interleave(count, dim=0)
    return input_ids.repeat_interleave(count, dim=0), mask


def speculation(config: GenerationConfig, user_set: set[str] | None, target: torch.nn.Module, draft, assistant_model,
                ngram_size, old_ngram_size, num_draft_tokens):  # fmt: skip
    """(draft, prompt lookup n-gram size or None, draft length) of a call from fastspec's and HF's names.

    `user_set` names the fields the caller set (None: those differing from HF's defaults). HF's names: the draft is
    `assistant_model`, or `target`'s first `assistant_early_exit` layers; `prompt_lookup_num_tokens` turns lookup on
    and drafts that many tokens, with n-grams of up to `max_matching_ngram_size` (HF's default 2);
    `num_assistant_tokens` is the draft length. fastspec's own names win ties only when they agree: two names for one
    thing with different values is a ValueError naming both.
    """
    defaults = GenerationConfig._get_default_generation_params()

    def chosen(name: str):
        value = getattr(config, name, None)
        picked = name in user_set if user_set is not None else value != defaults.get(name)
        return value if picked else None

    if assistant_model is not None and draft is not None and assistant_model is not draft:
        raise ValueError("draft and assistant_model name the same thing (the draft model): pass one of them")
    draft = draft if draft is not None else assistant_model
    if config.assistant_early_exit is not None:
        if draft is not None:
            raise ValueError("assistant_early_exit drafts with the target's own first layers: pass it or a draft "
                             "(draft= / assistant_model=), not both")  # fmt: skip
        draft = early_exit_draft(target, config.assistant_early_exit)
    if config.use_mtp:
        if draft is not None:
            raise ValueError("use_mtp drafts with the target's own multi-token-prediction layers: pass it or a draft "
                             "(draft= / assistant_model= / assistant_early_exit=), not several")  # fmt: skip
        draft = mtp_draft(target)
    if old_ngram_size is not None and ngram_size is not None and old_ngram_size != ngram_size:
        raise ValueError("prompt_lookup is the old name of prompt_lookup_ngram_size: pass one of them")
    ngram = ngram_size if ngram_size is not None else old_ngram_size
    hf_ngram, lookup_tokens = chosen("max_matching_ngram_size"), chosen("prompt_lookup_num_tokens")
    if ngram is not None and hf_ngram is not None and ngram != hf_ngram:
        raise ValueError(f"prompt_lookup_ngram_size={ngram} and max_matching_ngram_size={hf_ngram} name the same "
                         "n-gram size: pass one of them")  # fmt: skip
    if lookup_tokens is not None and ngram is None:
        ngram = hf_ngram if hf_ngram is not None else 2
    length = lookup_tokens if lookup_tokens is not None else chosen("num_assistant_tokens")
    if num_draft_tokens is not None and length is not None and num_draft_tokens != length:
        raise ValueError(f"num_draft_tokens={num_draft_tokens!r} and HF's draft length ({length}, from "
                         "num_assistant_tokens or prompt_lookup_num_tokens) disagree: pass one of them")  # fmt: skip
    length = num_draft_tokens if num_draft_tokens is not None else (length if length is not None else 4)
    return draft, ngram, length
