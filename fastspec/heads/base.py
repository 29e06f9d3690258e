"""`DraftHeadBase`: what a drafter needs of an autoregressive draft head (EAGLE-1, EAGLE-3), and what heads share.

A head drafts from the target's own features: at position p it reads a feature of column p and the token of column
p + 1, and predicts a feature of column p + 1 and the logits of the token at p + 2 (the words: docs/glossary.md). Its
first draft step reads the *target's* features (`feature_layers`, mapped by `target_features`), later steps its own
predicted feature (`step`'s first output), as EAGLE does. The drafter (`fastspec.drafters.HeadDrafter`) runs it over
its own one-layer KV cache (`new_cache`; `fastspec.runner.HeadRunner`).

The base class holds what every head does the same way:
- `bind(target)`: the checks that the head fits the target (a causal LM with an lm_head, the model type the head was
  trained for, its hidden size and vocabulary, feature layers inside the target), once per target the check that the
  target's logits are its lm_head of the features, then attaching what the head shares with it (the input embedding
  and lm_head, never saved with the head); ValueError naming ``draft`` when it does not fit;
- `forward`: `step` with the checks and the default causal mask of a head forward;
- `new_cache`: the empty KV cache of the head's one decoder layer.

Subclasses have a ``config`` (with ``vocab_size`` and ``target_model_type``, None when unknown) and a one-layer
``_llama_config``, and implement:
- `feature_layers`: the target hidden states the head reads, in transformers' `hidden_states` numbering (0 = the
  embeddings, i = the input of decoder layer i, i.e. the output of layer i - 1), with -1 for the last hidden state
  (after the final norm: the input of the target's lm_head); the target's runner keeps them concatenated in this
  order (`fastspec.runner.target_logits_and_features`);
- `target_hidden_size`: the hidden size of the target the head reads;
- `target_features(features [R, n, F]) -> [R, n, H]`: the first step's feature from the target's;
- `step(features, input_ids, position_ids, attention_mask, cache) -> (hidden [R, n, H], logits [R, n, V_draft])`;
- `to_target_logits(logits [..., V_draft]) -> [..., V_target]`: draft logits over the target's vocabulary, -inf for
  tokens outside a reduced draft vocabulary (q = 0 there: verification stays lossless, the residual covers them).
"""

from __future__ import annotations

import torch
from torch import nn

from fastspec.heads.common import cache_length, check_logits_are_lm_head_of_features, default_step_mask

__all__ = ["DraftHeadBase"]


class DraftHeadBase(nn.Module):
    """An autoregressive draft head (module docstring)."""

    kind = "draft head"  # the head's name in binding errors

    def __init__(self):
        super().__init__()
        # not submodules: shared with the target, so they are not in parameters(), state_dict() or save_pretrained()
        object.__setattr__(self, "_embed", None)
        object.__setattr__(self, "_target_lm_head", None)

    @property
    def feature_layers(self) -> list[int]:
        raise NotImplementedError

    @property
    def target_hidden_size(self) -> int:
        raise NotImplementedError

    @property
    def is_bound(self) -> bool:
        return self._embed is not None

    # ------------------------------------------------------------------ binding
    def bind(self, target) -> DraftHeadBase:
        """Check that the head fits ``target`` and attach ``target``'s input embedding and lm_head (module docstring);
        ValueError (naming ``draft``) if it does not fit. Binding to the target it is bound to returns at once
        (`fastspec.generate` binds on every call)."""
        embed, lm_head = self._fitting_parts(target)
        if embed is self._embed and lm_head is self._target_lm_head:
            return self
        check_logits_are_lm_head_of_features(target, self.feature_layers)
        object.__setattr__(self, "_embed", embed)
        object.__setattr__(self, "_target_lm_head", lm_head)
        return self

    def _fitting_parts(self, target) -> tuple[nn.Module, nn.Module]:
        """``target``'s (input embedding, lm_head) after the checks that the head fits it."""
        cfg, kind = self.config, self.kind
        tcfg = getattr(target, "config", None)
        if tcfg is None or not hasattr(target, "get_input_embeddings"):
            raise ValueError(f"draft: a draft head needs a Hugging Face causal LM target, got {type(target).__name__}")
        tcfg = tcfg.get_text_config() if hasattr(tcfg, "get_text_config") else tcfg
        model_type = getattr(tcfg, "model_type", None)
        if cfg.target_model_type is not None and model_type != cfg.target_model_type:
            raise ValueError(f"draft: this {kind} was trained for a {cfg.target_model_type!r} target, but the target "
                             f"is {model_type!r}")  # fmt: skip
        hidden = getattr(tcfg, "hidden_size", None)
        if hidden != self.target_hidden_size:
            raise ValueError(f"draft: this {kind} reads features of hidden size {self.target_hidden_size}, the "
                             f"target's hidden size is {hidden}")  # fmt: skip
        embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
        if lm_head is None:
            raise ValueError("draft: the target has no lm_head (output embeddings); a draft head needs one")
        vocab_sizes = {getattr(tcfg, "vocab_size", None), embed.weight.shape[0], lm_head.weight.shape[0]}
        if vocab_sizes != {cfg.vocab_size}:
            raise ValueError(f"draft: {kind} vocabulary size {cfg.vocab_size} != target vocabulary size "
                             f"{sorted(v for v in vocab_sizes if v is not None)}")  # fmt: skip
        if embed.weight.shape[1] != hidden or lm_head.weight.shape[1] != hidden:
            raise ValueError(f"draft: the target's embedding / lm_head width does not match its hidden size {hidden}")
        layers = getattr(tcfg, "num_hidden_layers", None)
        if layers is not None and any(i >= layers for i in self.feature_layers):
            raise ValueError(
                f"draft: {kind} feature_layers {self.feature_layers} must index the target's hidden states "
                f"0..{layers - 1} (0 = the embeddings, i = the input of decoder layer i; -1 = the last hidden state)"
            )
        return embed, lm_head

    # ------------------------------------------------------------------ cache and forward
    def new_cache(self):
        """An empty KV cache for the head's single decoder layer (a transformers ``DynamicCache``)."""
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self._llama_config)
        except TypeError:  # older signatures
            return DynamicCache()

    def forward(self, features, input_ids, position_ids, attention_mask=None, cache=None):
        """One head step over ``n`` positions at once.

        ``features`` ``[R, n, H]``: the feature of position ``p`` (the target's through `target_features`, or the
        head's own previous ``hidden`` when drafting); ``input_ids`` ``[R, n]``: the token at position ``p + 1``;
        ``position_ids`` ``[R, n]``: the rotary position of each entry (use ``p``; RoPE is relative, so a constant
        offset changes nothing but rounding); ``attention_mask``: additive float 4D mask ``[R, 1, n, cache_len + n]``
        (0 = attend, large negative = masked) over the cache entries followed by the new ones, or None for plain
        causal attention with no padding; ``cache``: the head's KV cache (`new_cache`) its layer appends to, or None.

        Returns ``(hidden [R, n, H], logits [R, n, V_draft])``: the predicted feature of position ``p + 1`` and the
        logits of the token at ``p + 2``.
        """
        if not self.is_bound:
            raise ValueError("draft: the draft head is not bound to a target; call head.bind(target) first")
        n = input_ids.shape[1]
        dtype = next(self.parameters()).dtype
        mask = default_step_mask(attention_mask, n, cache_length(cache), dtype, input_ids.device)
        return self.step(features, input_ids, position_ids, mask, cache)

    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, features, input_ids, position_ids, attention_mask, cache) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Identity for a head whose lm_head covers the target's whole vocabulary."""
        return logits
