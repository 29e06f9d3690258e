"""`PositionPrefixes`: the token sequence each scored position of a speculation step conditions on.

A step scores P positions per row: a chain's K drafts plus the bonus position (P = K + 1), or a tree's N nodes. The
logits at position j predict the token after j's *prefix*: the row's history (its prompt as given, left padding
included, as transformers' `generate` sees `input_ids`, then every token it has generated) followed by the drafts on
the path to j (a chain: drafts 0..j-1; a tree: j's ancestors below the root, then j). Logits processors that read
the prefix (`fastspec.processors`) must see exactly that sequence at every position, drafted tokens included, for
speculation to stay lossless.

Everything is computed lazily and once per step, on the logits' device, without a Python loop over positions:
- `lengths` [R, P]: each prefix's length (what `input_ids.shape[-1]` would be in HF's loop);
- `token_ids(vocab, ignore)` [R, P, W + D]: every token id of each prefix, history columns shared by a row's
  positions (repetition penalty gathers and scatters at them);
- `sequences()` [R * P, L]: every prefix right-aligned in one tensor, filled with -1 on the left (-1 matches no
  token, so n-gram and sequence matching need no mask), L the longest prefix.

Shapes: R active rows, P positions, D the deepest path (K for a chain), W the history's width.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["PositionPrefixes"]

FILL = -1  # left fill of `sequences` and padding of `path`: no token id


class PositionPrefixes:
    """The prefixes of P scored positions of R rows (module docstring).

    Args:
        history: [R, W] int64, each active row's history in its first `history_lengths` columns.
        history_lengths: [R] int64, prompt width + tokens generated so far.
        path: [R, P, D] int64, the draft tokens on each position's path in order, FILL past `depth`.
        depth: [R, P] int64, drafts on each position's path.
    """

    def __init__(self, history: torch.Tensor, history_lengths: torch.Tensor, path: torch.Tensor, depth: torch.Tensor):
        self.history = history
        self.history_lengths = history_lengths
        self.path = path
        self.depth = depth

    @classmethod
    def chain(cls, history: torch.Tensor, history_lengths: torch.Tensor, drafts: torch.Tensor) -> PositionPrefixes:
        """Prefixes of a chain step: position j (0..K) follows the history and drafts [R, K] 0..j-1."""
        rows, k = drafts.shape
        positions = torch.arange(k + 1, device=drafts.device)
        before = torch.arange(k, device=drafts.device)[None, :] < positions[:, None]  # [P, K]: draft i precedes j
        path = torch.where(before, drafts[:, None, :].long(), FILL)
        return cls(history, history_lengths, path, positions.expand(rows, -1))

    @classmethod
    def tree(cls, history: torch.Tensor, history_lengths: torch.Tensor, tokens: torch.Tensor, ancestors: torch.Tensor,
             depth: torch.Tensor) -> PositionPrefixes:  # fmt: skip
        """Prefixes of a tree step from its nodes `tokens` [R, N] (node 0 the root, the history's last token), the
        ancestor-or-self matrix `ancestors` [R, N, N] bool (`fastspec.kernels.reference.tree_mask`'s, node i's row)
        and node depths [R, N] (root 0): node i's path holds ancestor j's token at column depth[j] - 1."""
        rows, n = tokens.shape
        width = max(int(depth.max()), 1) if depth.numel() else 1
        on_path = ancestors & (depth[:, None, :] >= 1)  # [R, N(i), N(j)]: the root is in the history already
        column = torch.where(on_path, depth[:, None, :] - 1, width)  # one ancestor per depth; the rest to a spare
        path = torch.full((rows, n, width + 1), FILL, dtype=torch.long, device=tokens.device)
        path.scatter_(2, column, tokens[:, None, :].long().expand(rows, n, n))
        path[..., width] = FILL
        return cls(history, history_lengths, path[..., :width], depth.long())

    @functools.cached_property
    def lengths(self) -> torch.Tensor:
        """[R, P] int64: each prefix's length."""
        return self.history_lengths[:, None] + self.depth

    def token_ids(self, vocab: int, ignore: torch.Tensor | int | None = None) -> torch.Tensor:
        """[R, P, W + D] int64: the ids of each position's prefix (the row's history columns, then its path), with
        `vocab` (a spare column) wherever a column holds no token of it, an id >= vocab, or one of its first `ignore`
        tokens (an int, or [R] per row: transformers' `prompt_ignore_length`, e.g. a row's left padding)."""
        positions, path_width = self.path.shape[1], self.path.shape[2]
        columns = torch.arange(self.history.shape[1], device=self.history.device)
        counted = columns[None, :] < self.history_lengths[:, None]  # [R, W]
        path_columns = self.history_lengths[:, None, None] + torch.arange(path_width, device=columns.device)
        on_path = self.path >= 0  # [R, P, D]
        if ignore is not None:
            skip = torch.as_tensor(ignore, device=columns.device)
            counted &= columns[None, :] >= (skip[:, None] if skip.dim() else skip)
            on_path &= path_columns >= (skip[:, None, None] if skip.dim() else skip)
        history = torch.where(counted & (self.history >= 0) & (self.history < vocab), self.history, vocab)
        path = torch.where(on_path & (self.path < vocab), self.path, vocab)
        return torch.cat([history[:, None, :].expand(-1, positions, -1), path], dim=2)

    def sequences(self) -> torch.Tensor:
        """[R * P, L] int64: each position's prefix right-aligned (row r's position j at r P + j), FILL on the left."""
        rows, positions = self.depth.shape
        history_width, path_width = self.history.shape[1], self.path.shape[2]
        lengths = self.lengths
        longest = int(lengths.max())
        # target column of history column c and path column i in a prefix right-aligned to `longest`
        shift = (longest - lengths)[..., None]  # [R, P, 1]
        hist_col = torch.arange(history_width, device=shift.device) + shift
        hist_col = torch.where(hist_col - shift < self.history_lengths[:, None, None], hist_col, longest)
        path_col = self.history_lengths[:, None, None] + torch.arange(path_width, device=shift.device) + shift
        path_col = torch.where(self.path >= 0, path_col, longest)
        out = torch.full((rows, positions, longest + 1), FILL, dtype=torch.long, device=shift.device)
        out.scatter_(2, hist_col, self.history[:, None, :].expand(-1, positions, -1))
        out.scatter_(2, path_col, self.path)
        return out[..., :longest].reshape(rows * positions, longest)
