"""Draft heads: drafts that read the target's own features (`fastspec.heads.base.DraftHeadBase`), and their formats.

- `DraftHead` (`fastspec.heads.eagle1`): fastspec's EAGLE-1 style head over the target's last hidden state, also
  EAGLE-1 checkpoints;
- `Eagle3Head` (`fastspec.heads.eagle3`): the published EAGLE-3 architecture with a reduced draft vocabulary (the
  heads shipped for the shipped target, `fastspec/pair/head`, and for SmolLM2 are EAGLE-3 heads);
- `MedusaHead` (`fastspec.heads.medusa`): Medusa heads over the target's last hidden state;
- `load_head(path, target)` (`fastspec.heads.formats`): reads a head directory in any of those formats (fastspec's,
  EAGLE-3 official / SpecForge / vLLM speculators, EAGLE-1, Medusa); ``save_pretrained`` writes them.
"""

from fastspec.heads.base import DraftHeadBase
from fastspec.heads.eagle1 import DraftHead, DraftHeadConfig
from fastspec.heads.eagle3 import Eagle3Config, Eagle3Head
from fastspec.heads.formats import detect_format, load_head
from fastspec.heads.medusa import MedusaHead
from fastspec.pair import default_head_dir
from fastspec.runner import target_logits_and_features

__all__ = [
    "DraftHead",
    "DraftHeadBase",
    "DraftHeadConfig",
    "Eagle3Config",
    "Eagle3Head",
    "MedusaHead",
    "default_head_dir",
    "detect_format",
    "load_head",
    "target_logits_and_features",
]
