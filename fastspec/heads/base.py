"""`DraftHeadBase`: what a drafter needs of an autoregressive draft head (EAGLE-1, EAGLE-3), whatever its format.

A head drafts from the target's own features: at position p it reads a feature of column p and the token of column
p + 1, and predicts a feature of column p + 1 and the logits of the token at p + 2. Its first draft step reads the
*target's* features (`feature_layers`, mapped by `target_features`), later steps its own predicted feature
(`step`'s first output), as EAGLE does. The drafter (`fastspec.drafters.HeadDrafter`) runs it over its own
one-layer KV cache (`fastspec.runner.HeadRunner`).

Subclasses implement:
- `feature_layers`: the target hidden states the head reads, in transformers' `hidden_states` numbering (0 = the
  embeddings, i = the input of decoder layer i, i.e. the output of layer i - 1), with -1 for the last hidden state
  (after the final norm: the input of the target's lm_head); the target's runner keeps them concatenated in this
  order (`fastspec.runner.target_logits_and_features`);
- `bind(target)`: check the head fits the target and attach what it shares with it (embedding, lm_head); ValueError
  naming `draft` when it does not fit;
- `target_features(features [R, n, F]) -> [R, n, H]`: the first step's feature from the target's;
- `step(features, input_ids, position_ids, attention_mask, cache) -> (hidden [R, n, H], logits [R, n, V_draft])`;
- `to_target_logits(logits [..., V_draft]) -> [..., V_target]`: draft logits over the target's vocabulary, -inf for
  tokens outside a reduced draft vocabulary (q = 0 there: verification stays lossless, the residual covers them).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["DraftHeadBase"]


class DraftHeadBase(nn.Module):
    """An autoregressive draft head (module docstring)."""

    @property
    def feature_layers(self) -> list[int]:
        raise NotImplementedError

    def bind(self, target) -> DraftHeadBase:
        raise NotImplementedError

    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step(self, features, input_ids, position_ids, attention_mask, cache) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Identity for a head whose lm_head covers the target's whole vocabulary."""
        return logits
