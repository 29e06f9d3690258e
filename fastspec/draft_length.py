"""What `num_draft_tokens` means, decided in one place: a call's draft-length policy and its trees' depth.

`num_draft_tokens` (glossary: docs/glossary.md) is
- an int K >= 1: every step drafts K tokens, or a tree of depth K (`FixedDraftLength`; a tree given as a list of
  paths has its own depth);
- "auto": K (or the depth) chosen each step from measured acceptance and step cost, up to `AUTO_MAX_K`
  (`fastspec.adaptive.DraftLengthController`), and a tree drafted to its longest depth;
- a `DraftLengthController`: the same, keeping what it measured from call to call (its `max_k` must be the tree's
  depth);
- with HF's `num_assistant_tokens_schedule="heuristic"` (or "heuristic_transient") and an int: HF's +2 / -1 rule
  starting from it (`fastspec.hf_schedule.HeuristicDraftLength`), chains only.
Normal decoding (no drafter) drafts nothing. Every step's length is then capped by the rows' remaining tokens
(`fastspec.speculators`). The policy decides how much is drafted, never what is emitted.
"""

from __future__ import annotations

from transformers import GenerationConfig

from fastspec.adaptive import DraftLengthController, FixedDraftLength
from fastspec.hf_schedule import HeuristicDraftLength
from fastspec.tree import DynamicTree, StaticTree, resolve_tree

__all__ = ["AUTO_MAX_K", "DraftLength", "check_num_draft_tokens", "chain_length", "schedule", "tree_and_length"]

AUTO_MAX_K = DraftLengthController().max_k  # "auto"'s longest chain, or a tree's depth
DraftLength = FixedDraftLength | DraftLengthController | HeuristicDraftLength


def check_num_draft_tokens(value) -> None:
    """ValueError naming `num_draft_tokens` unless it is an int >= 1, "auto" or a `DraftLengthController`."""
    if value == "auto" or isinstance(value, DraftLengthController):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"num_draft_tokens must be an int >= 1, 'auto' or a DraftLengthController, got {value!r}")


def schedule(num_draft_tokens, config: GenerationConfig):
    """`num_draft_tokens`, or HF's heuristic schedule starting from it when the config asks for one."""
    if config.num_assistant_tokens_schedule in ("heuristic", "heuristic_transient"):
        if not isinstance(num_draft_tokens, int):
            raise ValueError(f"num_assistant_tokens_schedule={config.num_assistant_tokens_schedule!r} adapts a fixed "
                             f"draft length; num_draft_tokens={num_draft_tokens!r} adapts it already")  # fmt: skip
        return HeuristicDraftLength(num_draft_tokens)
    return num_draft_tokens


def chain_length(num_draft_tokens, drafting: bool) -> DraftLength:
    """The policy of a chain (`drafting` False: normal decoding, K = 0)."""
    if not drafting:
        return FixedDraftLength(0)
    if isinstance(num_draft_tokens, HeuristicDraftLength):
        return num_draft_tokens
    if _adaptive(num_draft_tokens):
        return _controller(num_draft_tokens, AUTO_MAX_K)
    return FixedDraftLength(num_draft_tokens)


def tree_and_length(tree, num_draft_tokens) -> tuple[StaticTree | DynamicTree, DraftLength]:
    """The tree of a call's `tree` argument with its depth set (K, or the longest "auto" depth), and its policy."""
    if isinstance(num_draft_tokens, HeuristicDraftLength):
        raise ValueError("num_assistant_tokens_schedule: HF's heuristic schedule sets a chain's length (tree=None)")
    adaptive = _adaptive(num_draft_tokens)
    longest = num_draft_tokens.max_k if isinstance(num_draft_tokens, DraftLengthController) else AUTO_MAX_K
    spec = resolve_tree(tree, longest if adaptive else num_draft_tokens)
    return spec, _controller(num_draft_tokens, spec.depth) if adaptive else FixedDraftLength(spec.depth)


def _adaptive(num_draft_tokens) -> bool:
    return num_draft_tokens == "auto" or isinstance(num_draft_tokens, DraftLengthController)


def _controller(num_draft_tokens, max_k: int) -> DraftLengthController:
    """A fresh controller for "auto"; the caller's, for its next call, when it drafts to `max_k`."""
    if not isinstance(num_draft_tokens, DraftLengthController):
        return DraftLengthController(max_k)
    if num_draft_tokens.max_k != max_k:
        raise ValueError(f"num_draft_tokens: the controller drafts up to {num_draft_tokens.max_k}, the tree is "
                         f"{max_k} deep")  # fmt: skip
    num_draft_tokens.new_call()
    return num_draft_tokens
