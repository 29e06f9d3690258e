"""Drafters: what proposes the draft tokens a speculator verifies (the interface is `fastspec.drafters.base`).

`build_drafter` is the one place `fastspec.generate` turns its `draft` / `prompt_lookup_ngram_size` arguments (and HF's
`assistant_model` / `prompt_lookup_num_tokens`, resolved by `fastspec.generation_config`) into a drafter;
a new kind of drafter is one module here plus one line there, or any `Drafter` passed as `draft=`.
"""

from __future__ import annotations

import torch

from fastspec.drafters.base import Drafter, DraftPlan, Drafts, DraftSetup, DraftTree, TreeDrafter
from fastspec.drafters.draft_model import DraftModelDrafter
from fastspec.drafters.head import HeadDrafter
from fastspec.drafters.lookup_then import LookupThenDrafter
from fastspec.drafters.medusa import MedusaDrafter
from fastspec.drafters.mtp import MtpDrafter, MtpHead
from fastspec.drafters.prompt_lookup import PromptLookupDrafter, lookup_ngram
from fastspec.drafters.tree import TreeBuilder
from fastspec.heads import DraftHeadBase, MedusaHead

__all__ = [
    "DraftModelDrafter",
    "DraftPlan",
    "DraftSetup",
    "DraftTree",
    "Drafter",
    "Drafts",
    "HeadDrafter",
    "LookupThenDrafter",
    "MedusaDrafter",
    "MtpDrafter",
    "PromptLookupDrafter",
    "TreeBuilder",
    "TreeDrafter",
    "build_drafter",
    "lookup_ngram",
]


def build_drafter(draft, prompt_lookup_ngram_size: int | None, setup: DraftSetup) -> Drafter | None:
    """The drafter of a generate call (arguments already checked): `draft` (a `Drafter`, a draft head, an HF model
    or None), behind prompt lookup when `prompt_lookup_ngram_size` is an n-gram size. None: normal decoding."""
    drafter = None
    if isinstance(draft, Drafter):
        drafter = draft
    elif isinstance(draft, MtpHead):  # the target's MTP layers (`use_mtp=True`), a head over its features
        drafter = MtpDrafter(draft, setup)
    elif isinstance(draft, DraftHeadBase):
        drafter = HeadDrafter(draft, setup)
    elif isinstance(draft, MedusaHead):
        drafter = MedusaDrafter(draft, setup)
    elif isinstance(draft, torch.nn.Module):
        drafter = DraftModelDrafter(draft, setup)
    if prompt_lookup_ngram_size is None:
        return drafter
    ngram = prompt_lookup_ngram_size
    return PromptLookupDrafter(ngram) if drafter is None else LookupThenDrafter(ngram, drafter)
