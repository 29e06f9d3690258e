"""Recurrent and convolution state of linear-attention / state-space layers, rolled back per row.

A linear-attention or SSM layer (Mamba, Mamba-2, gated delta-net, LFM2's short convolutions, ...) keeps no entry per
position: it keeps a *state*, the summary of every token it has read. transformers 5.x stores it in a cache layer of
`transformers.cache_utils.LinearAttentionLayer` form, which models read and write through the `Cache` API
(`get_conv_state` / `update_conv_state`, `get_recurrent_state` / `update_recurrent_state`), per layer and state index:
- a *conv state* [B, C, k]: the inputs of the layer's causal depthwise convolution at the last k positions (k its
  kernel size, `conv1d.kernel_size`);
- a *recurrent state* [B, ...] (e.g. [B, heads, d_k, d_v] or [B, heads, head_dim, d_state]): the scan's state.

Speculative decoding feeds drafts that may be rejected, and every row of a batch accepts its own number of them, so
after a verification forward of n positions each row must go back to the state after *its* last kept position.
`RecurrentStateLayer` keeps what that needs, between two calls of `keep` (fastspec's compaction after a step):
- conv: a tape [B, C, k + m] of the convolution inputs of columns [base - k, base + m) (base: the columns covered at
  the last `keep`; m: the columns fed since), from which the window of any column in [base - 1, base + m) is a slice;
- recurrent: the states after columns base - 1 (the committed one), base, ..., base + m - 1, where computed. A model
  computes those of a multi-position forward when the cache asks for them (`is_recording_past` True and
  `get_recurrent_states_to_keep` > 0, the rollback protocol of transformers' assisted generation): it runs that many
  last positions one by one after a chunked scan of the others, so each kept state costs a sequential scan step
  (measured in docs/results.md, "Hybrid and state-space targets"). How many a forward computes is the
  cache's `StateRecording` (shared by its layers): the runner sets it before each forward to the positions whose
  logits it asks for, plus one (`fastspec.runner`); unset, every position's.
`keep(last, length)` then gives row b the state after column `last[b]` (its newest kept token; rows realigned to the
right pick an earlier one) and drops the rest. A state after a column never fed, or older than the last `keep`, does
not exist: that raises RuntimeError (callers refuse such paths up front, `fastspec.cache_kinds`); so does a tree path,
whose kept columns are not the ones fed in order (`fastspec.cache.DynamicKVCache.gather_positions` checks).

`RecurrentAttentionLayer` is the same plus the growing key/value entries of an attention block sharing the layer
(transformers' "hybrid" kind: Falcon-H1, Zamba-2), whose positions `fastspec.cache.DynamicKVCache` gathers like any
attention layer's. Neither class sets `_layer_type`, so transformers' layer-type mappings stay untouched.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

__all__ = ["RecurrentAttentionLayer", "RecurrentStateLayer", "StateRecording"]

_ALL = 1 << 30  # "every position" (the models take min(this, positions fed))


class StateRecording:
    """How many of the next forward's last positions a cache's recurrent layers compute and keep the state after
    (`positions`; None: all of them). One object shared by a cache and its layers."""

    def __init__(self):
        self.positions: int | None = None


class RecurrentStateLayer(LinearAttentionLayer):
    """One linear-attention / SSM layer's conv and recurrent states, with the per-position history since the last
    `keep` (module docstring).

    Args:
        number_of_states: conv / recurrent state pairs of the layer (`config.number_of_conv_states`, usually 1).

    Attributes:
        length: columns fed (every row alike; what `get_seq_length` answers, as the attention layers do).
        base: columns covered at the last `keep` (or `drop_leading`): the committed state is the one after column
            base - 1.
    """

    def __init__(self, number_of_states: int = 1, **kwargs):
        super().__init__(number_of_states=number_of_states)
        self.record_past = True  # the models then hand every conv input to the cache and compute per-position states
        self.recording = StateRecording()  # replaced by the cache's shared one
        self._reset_states()

    def _reset_states(self) -> None:
        """Back to the state before any forward (zero states, nothing fed)."""
        states = range(self.number_of_states)
        self.length = self.base = 0
        self.widths: dict[int, int | None] = dict.fromkeys(states)  # conv kernel size k per state
        self.tapes: dict[int, torch.Tensor | None] = dict.fromkeys(states)  # [B, C, k + length - base]
        self.history: dict[int, list[torch.Tensor | None]] = {i: [] for i in states}  # after base - 1, ..., length - 1
        self.conv_states = dict.fromkeys(states)
        self.recurrent_states = dict.fromkeys(states)
        self.is_conv_states_initialized = dict.fromkeys(states, False)
        self.is_recurrent_states_initialized = dict.fromkeys(states, False)
        self.has_previous_state = dict.fromkeys(states, False)
        self.conv_kernel_size = dict.fromkeys(states)
        self._fed: int | None = None  # positions of the forward in progress (its first conv update says)

    @property
    def recurrent_states_to_keep(self) -> int:
        """How many of a forward's last positions the model computes the state after (it takes the min with the
        positions fed): the cache's `StateRecording`."""
        positions = self.recording.positions
        return _ALL if positions is None else positions

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, conv_kernel_size: int | None = None,
                          **kwargs) -> torch.Tensor:  # fmt: skip
        """Append the convolution inputs [B, C, n] of n new positions; return the inputs the causal convolution reads
        [B, C, k + n] (the k before them, zeros before the first position, then the new ones)."""
        tape = self.tapes[state_idx]
        if tape is None:
            if conv_kernel_size is None:
                raise RuntimeError("fastspec's recurrent cache needs the conv kernel size in update_conv_state")
            self.widths[state_idx] = self.conv_kernel_size[state_idx] = conv_kernel_size
            tape = conv_states.new_zeros(*conv_states.shape[:-1], conv_kernel_size)
            self.is_conv_states_initialized[state_idx] = True
            self.device, self.dtype = conv_states.device, conv_states.dtype
        new = conv_states.shape[-1]
        tape = torch.cat([tape, conv_states.to(tape.dtype)], dim=-1)
        self.tapes[state_idx] = self.conv_states[state_idx] = tape
        self.has_previous_state[state_idx] = True
        if state_idx == 0:
            self.length += new
            self._fed = new
        return tape[..., -(self.widths[state_idx] + new) :]

    def update_recurrent_state(self, recurrent_states: torch.Tensor | list[torch.Tensor], state_idx: int = 0,
                               **kwargs) -> torch.Tensor:  # fmt: skip
        """Record the states after the last positions of the forward in progress: a list of them (the last
        `recurrent_states_to_keep` positions) or one tensor (the last position only). Returns the newest state."""
        states = [recurrent_states] if isinstance(recurrent_states, torch.Tensor) else list(recurrent_states)
        fed = self._fed
        if fed is None:
            raise RuntimeError("fastspec's recurrent cache counts positions from the conv state: this layer has none")
        if len(states) > fed:
            raise RuntimeError(f"{len(states)} recurrent states for a forward of {fed} positions")
        history = self.history[state_idx]
        if not self.is_recurrent_states_initialized[state_idx]:
            history.append(torch.zeros_like(states[-1]))  # the state before the first position
            self.is_recurrent_states_initialized[state_idx] = True
        history.extend([None] * (fed - len(states)))  # positions whose state the model did not compute
        history.extend(state.clone() for state in states)  # clones: a model may update its working state in place
        if len(history) != self.length - self.base + 1:
            raise RuntimeError("recurrent states out of step with the positions fed")
        self.recurrent_states[state_idx] = states[-1].clone()
        return self.recurrent_states[state_idx]

    def get_seq_length(self) -> int:
        return self.length

    def keep(self, last: torch.Tensor, length: int) -> None:
        """Row b keeps the state after column `last[b]` [R] (its newest kept column, in the columns fed so far); the
        layer then covers `length` columns (the cache's new length: realigned rows sit further right). `length` 0
        empties it. RuntimeError where a row asks for a state that was not kept (module docstring)."""
        self._fed = None
        if length == 0:
            self._reset_states()
            return
        if not any(self.has_previous_state.values()):
            self.length = self.base = length  # nothing fed yet (a layer a model skipped): nothing to keep
            return
        offset = last.cpu().long() - (self.base - 1)  # index into each state's history (host: one copy at most)
        low, high = int(offset.min()), int(offset.max())
        if low < 0 or high > self.length - self.base:
            raise RuntimeError(
                f"recurrent state: a row keeps column {int(last.min()) if low < 0 else int(last.max())}, but only the "
                f"states after columns {self.base - 1}..{self.length - 1} are kept (a state cannot be rolled back "
                "past the last compaction)"
            )
        for i, tape in self.tapes.items():
            if tape is None:
                continue
            window = offset.to(tape.device)[:, None] + torch.arange(self.widths[i], device=tape.device)
            tape = tape.gather(-1, window.view(window.shape[0], *[1] * (tape.dim() - 2), -1).expand(
                *tape.shape[:-1], -1))  # fmt: skip
            self.tapes[i] = self.conv_states[i] = tape
        rows = offset.tolist()
        for i, history in self.history.items():
            if not history:
                continue
            if any(history[j] is None for j in rows):
                raise RuntimeError(
                    "recurrent state: the model computed no per-position state for a column a row keeps "
                    f"(kept columns {last.tolist()}; the forward kept the last {self.recording.positions}); it "
                    "cannot be rolled back there"
                )
            if len(set(rows)) == 1:
                state = history[rows[0]]
            else:
                state = torch.stack([history[j][b] for b, j in enumerate(rows)])
            self.history[i] = [state]
            self.recurrent_states[i] = state.clone()
        self.length = self.base = length

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep batch rows `rows` [R'] (indices) of every state and history entry."""

        def take(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x.index_select(0, rows.to(x.device))

        for i in range(self.number_of_states):
            self.tapes[i] = self.conv_states[i] = take(self.tapes[i])
            self.history[i] = [take(state) for state in self.history[i]]
            self.recurrent_states[i] = take(self.recurrent_states[i])

    def drop_leading(self, count: int) -> None:
        """The cache's first `count` columns were dropped: column numbers shift down; states are unchanged."""
        self.length -= count
        self.base -= count

    # transformers' own Cache API, in the same terms
    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative count of tokens to remove")
        length = self.length + tokens_to_remove
        self.keep(torch.full((self._rows(),), length - 1), length)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_rows(beam_idx)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_rows(indices)

    def reset(self) -> None:
        self._reset_states()

    @property
    def batch_size(self) -> int:
        return self._rows()

    def _rows(self) -> int:
        tensors = [t for t in (*self.tapes.values(), *self.recurrent_states.values()) if t is not None]
        return tensors[0].shape[0] if tensors else 0


class RecurrentAttentionLayer(RecurrentStateLayer, DynamicLayer):
    """A layer with both a recurrent block and an attention block (transformers' "hybrid" and "hybrid_sliding"
    kinds): `RecurrentStateLayer` for the states, `DynamicLayer` keys / values [B, H, L, D] for the attention (full:
    fastspec masks any window itself)."""

    is_compileable = False

    def __init__(self, number_of_states: int = 1, **kwargs):
        DynamicLayer.__init__(self)
        RecurrentStateLayer.__init__(self, number_of_states=number_of_states)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        DynamicLayer.lazy_initialization(self, key_states, value_states)

    def get_seq_length(self) -> int:
        """The attention block's cached positions, as transformers' hybrid layers count (the recurrent block of the
        same layer may already have counted the positions being fed: Inkling's query offset and position bias read
        this during the forward)."""
        return DynamicLayer.get_seq_length(self)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return DynamicLayer.get_mask_sizes(self, query_length)

    def keep(self, last: torch.Tensor, length: int) -> None:
        RecurrentStateLayer.keep(self, last, length)
        if length == 0:
            self.keys = self.values = None
            self.is_initialized = False

    def reset(self) -> None:
        RecurrentStateLayer.reset(self)
        DynamicLayer.reset(self)
