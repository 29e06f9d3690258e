"""`fastspec train-head` as an API: train a draft head (EAGLE-3 by default) for any HF causal LM on its own answers.

- `train_head(TrainConfig(...))`: the whole run (`fastspec.training.trainer`);
- `read_prompts`, `encode_prompts`, `stdlib_prompts`, `stdlib_windows`, `interleave_prompts`, `regenerate`,
  `RegenCache`: prompts and the target's own answers, cached and extended (`fastspec.training.data`);
- `select_draft_vocab`, `token_counts`, `vocab_maps`: the reduced draft vocabulary (`fastspec.training.vocab`);
- `unroll`, `ttt_mask`, `eagle3_loss`, `eagle1_loss`, `feature_regression`: the training-time test and its loss
  (`fastspec.training.ttt`);
- `heldout_acceptance`: greedy K=4 acceptance of a head on held-out prompts; `head_from_checkpoint`: the head of
  a run's checkpoint, measured while the run goes on.
"""

from fastspec.training.data import (
    RegenCache,
    encode_prompts,
    interleave_prompts,
    read_prompts,
    regenerate,
    stdlib_prompts,
    stdlib_windows,
)
from fastspec.training.trainer import TrainConfig, head_from_checkpoint, heldout_acceptance, load_target, train_head
from fastspec.training.ttt import eagle1_loss, eagle3_loss, feature_regression, ttt_mask, unroll
from fastspec.training.vocab import select_draft_vocab, token_counts, vocab_maps

__all__ = [
    "RegenCache",
    "TrainConfig",
    "eagle1_loss",
    "eagle3_loss",
    "encode_prompts",
    "feature_regression",
    "head_from_checkpoint",
    "heldout_acceptance",
    "interleave_prompts",
    "load_target",
    "read_prompts",
    "regenerate",
    "select_draft_vocab",
    "stdlib_prompts",
    "stdlib_windows",
    "token_counts",
    "train_head",
    "ttt_mask",
    "unroll",
    "vocab_maps",
]
