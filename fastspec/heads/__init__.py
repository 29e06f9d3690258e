"""Draft heads: drafts that read the target's own features (`fastspec.heads.base.DraftHeadBase`), and their formats.

`DraftHead` is fastspec's EAGLE-1 style head (`fastspec.heads.eagle1`); `load_head(path, target)` loads a head
directory.
"""

from fastspec.heads.base import DraftHeadBase
from fastspec.heads.eagle1 import DraftHead, DraftHeadConfig, default_head_dir, load_head
from fastspec.runner import target_logits_and_features

__all__ = [
    "DraftHead",
    "DraftHeadBase",
    "DraftHeadConfig",
    "default_head_dir",
    "load_head",
    "target_logits_and_features",
]
