"""Input validation for `fastspec.generate`: every bad argument raises ValueError/TypeError naming it.

Nothing is silently clipped: a prompt that does not fit the model, a draft with another vocabulary, or a
sampling parameter out of range is an error, not a quiet change of behaviour.
"""

from __future__ import annotations

import torch

from fastspec.draft_length import check_num_draft_tokens
from fastspec.heads import DraftHeadBase, MedusaHead
from fastspec.runner import execution_device
from fastspec.verify import BACKENDS

__all__ = [
    "NonFiniteLogitsError",
    "check_finite_logits",
    "check_generate_args",
    "check_shared_vocabulary",
    "check_tree_fits_vocabulary",
    "context_length",
    "vocab_size",
]


def vocab_size(model: torch.nn.Module) -> int:
    """Number of output logits of a HF causal LM (its output embedding rows, else config.vocab_size)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


def context_length(model: torch.nn.Module) -> int | None:
    """Maximum number of positions the model accepts, from its config (None when it states none)."""
    config = model.config.get_text_config()
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_generate_args(
    *,
    target,
    input_ids,
    draft,
    attention_mask,
    max_new_tokens,
    do_sample,
    temperature,
    top_k,
    top_p,
    num_draft_tokens,
    tree,
    prompt_lookup,
    eos_token_id,
    pad_token_id,
    streamer,
    compile,  # noqa: A002 - generate's argument
    static_cache,
    verify_backend,
) -> None:
    """Validate the arguments of `fastspec.generate`; raise ValueError/TypeError that names the culprit. Only
    checks: nothing is bound, loaded or run (a draft head is checked against its target when its drafter is set
    up, `fastspec.drafters.HeadDrafter`)."""
    from fastspec.drafters.base import Drafter  # the drafters import this module's logits checks

    if not isinstance(target, torch.nn.Module) or not hasattr(target, "config"):
        raise TypeError(f"target must be a Hugging Face causal LM (torch.nn.Module with a config), got {type(target)}")
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.LongTensor [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be 2-D [B, T], got shape {tuple(input_ids.shape)}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)}): the prompt needs at least one token")
    target_vocab = vocab_size(target)
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= target_vocab:
        raise ValueError(f"input_ids holds ids outside the target's vocabulary [0, {target_vocab})")
    device = execution_device(target)
    if input_ids.device != device:
        raise ValueError(f"input_ids is on {input_ids.device} but target is on {device}")
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor):
            raise TypeError(f"attention_mask must be a tensor [B, T], got {type(attention_mask).__name__}")
        if attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} does not match input_ids {tuple(input_ids.shape)}"
            )
        if bool((attention_mask.sum(-1) == 0).any()):
            raise ValueError("attention_mask has a row with no real token: every prompt needs at least one")
        if bool((attention_mask[:, -1] == 0).any()):
            raise ValueError("attention_mask must describe left padding (the last column of every row must be 1)")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {type(max_new_tokens).__name__}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = context_length(target)
    if limit is not None and input_ids.shape[1] > limit:
        raise ValueError(f"input_ids has {input_ids.shape[1]} tokens, more than the target's context of {limit}")
    if limit is not None and input_ids.shape[1] + max_new_tokens > limit:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} with a prompt of {input_ids.shape[1]} tokens exceeds the target's "
            f"context of {limit} positions; lower max_new_tokens or shorten the prompt"
        )
    if do_sample:
        if not isinstance(temperature, int | float) or temperature <= 0:
            raise ValueError(f"temperature must be > 0 when do_sample=True, got {temperature}")
        if top_p is not None and not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0):
            raise ValueError(f"top_k must be a non-negative int or None, got {top_k}")
    check_num_draft_tokens(num_draft_tokens)
    if prompt_lookup is not None and (
        isinstance(prompt_lookup, bool) or not isinstance(prompt_lookup, int) or prompt_lookup < 1
    ):
        raise ValueError(f"prompt_lookup_ngram_size (prompt_lookup) must be an n-gram size >= 1 or None, got "
                         f"{prompt_lookup!r}")  # fmt: skip
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        ids = value if isinstance(value, list | tuple) else [value]
        if value is not None and not all(isinstance(i, int) and 0 <= i < target_vocab for i in ids):
            raise ValueError(f"{name} must be token id(s) in [0, {target_vocab}), got {value!r}")
    if draft is not None and not isinstance(draft, Drafter):  # a caller's Drafter makes its own checks
        is_head = isinstance(draft, DraftHeadBase | MedusaHead)
        if not is_head and (not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config")):
            kind = type(draft).__name__
            raise TypeError(
                f"draft must be a Hugging Face causal LM, a fastspec.heads draft head, a fastspec.drafters.Drafter "
                f"or None, got {kind}"
            )
        if execution_device(draft) != device:
            raise ValueError(f"draft is on {execution_device(draft)} but target is on {device}: put both on one device")
        if not is_head:
            check_shared_vocabulary(target, draft)
    if tree is not None and (draft is None or prompt_lookup is not None):
        raise ValueError(
            "tree: tree speculation drafts a token tree with a draft model or head; prompt lookup drafts a chain "
            "(pass draft=... and prompt_lookup=None, or tree=None)"
        )
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer supports batch size 1 only, got a batch of {input_ids.shape[0]}")
    if compile and static_cache is False:
        raise ValueError("static_cache: compiled steps need the static KV cache (pass static_cache=None or True)")
    if verify_backend not in BACKENDS:
        raise ValueError(f"verify_backend must be one of {BACKENDS}, got {verify_backend!r}")


def check_tree_fits_vocabulary(ranks: list[int], vocab: int) -> None:
    """ValueError naming `tree` when a static tree's child ranks need more tokens than the vocabulary has."""
    if max(ranks) >= vocab:
        raise ValueError(f"tree: child rank {max(ranks)} needs a vocabulary larger than {vocab} tokens")


class NonFiniteLogitsError(RuntimeError):
    """A model produced NaN or +-inf logits, or a row with no finite logit: no token can be drawn losslessly."""


def check_finite_logits(logits: torch.Tensor, model_name: str, step: int) -> None:
    """Raise NonFiniteLogitsError when a row of logits [..., V] has a NaN, a +inf, or no finite entry.

    -inf entries are allowed (masked vocabulary) as long as every row keeps one finite logit; top-k and top-p
    always keep the most probable token, so a row that passes here stays samplable after them. One reduction
    over V (the row max propagates NaN), one host sync.
    """
    bad = ~torch.isfinite(logits.amax(-1))  # amax propagates NaN; +inf and all -inf rows are not finite either
    if bool(bad.any()):
        rows = sorted({int(i) for i in bad.reshape(bad.shape[0], -1).any(-1).nonzero()[:, 0]})
        raise NonFiniteLogitsError(
            f"{model_name} produced NaN/inf logits (or a fully masked row) at step {step}, batch rows {rows}; "
            "check the model's dtype and weights, or pass check_logits=False to skip this check"
        )


def _special_ids(model: torch.nn.Module) -> dict[str, object]:
    config = model.config.get_text_config()
    return {name: getattr(config, name, None) for name in ("bos_token_id", "eos_token_id")}


def check_shared_vocabulary(target: torch.nn.Module, draft: torch.nn.Module) -> None:
    """Raise ValueError unless the draft's token ids mean the same as the target's.

    Equal vocabulary sizes pass. Different sizes pass only when they look like one tokenizer with a padded
    embedding matrix: the same BOS/EOS ids and sizes within 10 % of each other (the draft's extra ids are then
    masked, and target ids beyond the draft's vocabulary get q = 0; see `DraftVocabulary` in fastspec.drafters).
    """
    v_draft, v_target = vocab_size(draft), vocab_size(target)
    if v_draft == v_target:
        return
    padded = _special_ids(draft) == _special_ids(target) and min(v_draft, v_target) >= 0.9 * max(v_draft, v_target)
    if not padded:
        raise ValueError(
            f"draft has a vocabulary of {v_draft} logits but target has {v_target}, with different special tokens "
            "or sizes too far apart for a padded embedding matrix: the tokenizers differ. Use a draft trained on the "
            "target's tokenizer, or drop the draft and pass prompt_lookup=n (n-gram drafting from the prompt)"
        )
