"""Host side of chain verification: `ChainVerifier`, one layout's launches of the two chain kernels.

A `ChainVerifier` works out a layout's tiles, grids, warps and workspace once, checks each call's arguments
against the layout and launches the kernels of `fastspec.kernels.verify_chain_kernels` through their compiled
launchers (`fastspec.kernels._host.Launcher`), skipping Triton's per-call dispatch. One call's checked arguments
travel to the launch as a `ChainLaunch` record (its sampling parameters as a `ChainSampling`).
`fastspec.kernels.verify_chain.verify_chain` keeps one `ChainVerifier` per layout and stream.

Importing this module imports Triton and defines the kernels: on a machine without CUDA set TRITON_INTERPRET=1
before that (`fastspec.verify` imports it on the first kernel call).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton

from fastspec.kernels._host import (
    _FLOATS,
    _INTS,
    _PARAM_FLOATS,
    INTERPRETED,
    Launcher,
    chunk_tiles,
    device_index,
    expect,
    launch_for,
    num_warps,
    sampling_args,
    walk_tiles,
)
from fastspec.kernels.sampling import min_p_log
from fastspec.kernels.verify_chain_kernels import _accept_residual_kernel, _chunk_stats_kernel, _filtered_stats_kernel

__all__ = ["ChainLaunch", "ChainSampling", "ChainVerifier"]

_F32 = (torch.float32,)
_I64 = (torch.int64,)
_MAX_STAT_CHUNKS = 32  # V chunks of the row statistics that the accept kernel merges (see `__init__`)
_PER_ROW = "per_row"  # a sampling parameter a `ChainVerifier` is built to take as a [B] tensor with every call


class ChainSampling(NamedTuple):
    """One call's temperature, top-k, top-p and min-p as kernel arguments: a [B] tensor for a parameter given per
    row (its scalar then unused), else None and the scalar. Min-p travels as log(min_p)."""

    temperature: torch.Tensor | None  # [B] fp32 per row, or None: temperature_value (0 = greedy) for every row
    temperature_value: float
    top_k: torch.Tensor | None  # [B] int32/int64 per row, or None: top_k_value for every row (0 or >= V: off)
    top_k_value: int
    top_p: torch.Tensor | None  # [B] fp32 per row, or None: top_p_value for every row (1.0: off)
    top_p_value: float
    min_p: torch.Tensor | None = None  # [B] fp32 log(min_p) per row, or None: min_p_value for every row
    min_p_value: float = float("-inf")  # log(min_p); -inf: off


class ChainLaunch(NamedTuple):
    """The arguments of one `ChainVerifier` launch, checked against its layout (batch B, draft length K, vocabulary
    V, dtypes, device) with unit stride along each tensor's last axis. The strides are the tensors' `.stride()`
    (the checks return them), None for an absent tensor."""

    logits: torch.Tensor  # [B, K+1, V] fp32/bf16/fp16 target logits
    logits_stride: tuple[int, int, int]
    draft_tokens: torch.Tensor  # [B, K] int32/int64
    draft_tokens_stride: tuple[int, int]
    draft_probs: torch.Tensor | None  # [B, K, V] fp32/bf16/fp16 draft distributions q, or None: one-hot drafts
    draft_probs_stride: tuple[int, int, int] | None
    num_draft: torch.Tensor | None  # [B] int32/int64 valid drafts per row, or None: K for every row
    sampling: ChainSampling
    uniforms: torch.Tensor | None  # [B, K] fp32 in (0, 1] acceptance coins, or None when every row is greedy
    uniforms_stride: tuple[int, int] | None
    noise: torch.Tensor | None  # [B, V] fp32 > 0 race noise, or None when every row is greedy
    noise_stride: tuple[int, int] | None
    out_tokens: torch.Tensor  # [B, K+1] int64, contiguous: written
    num_accepted: torch.Tensor  # [B] int64: written


class ChainVerifier:
    """`verify_chain` for one layout, with the host work done once: a few microseconds of Python a call.

    Built for batch B, draft length K, vocabulary V, the logits' dtype and device, whether draft probabilities and
    per-row draft counts are passed, and the sampling configuration (temperature, top_k, top_p and min_p each a
    number, None, or "per_row" for a [B] tensor passed with every call), it picks the tiles, grids and warps, allocates
    the workspace and binds both kernels to `fastspec.kernels._host.Launcher`s once. A call checks shapes,
    dtypes, devices and unit strides (ValueError naming the argument), reads no tensor value and launches the two
    kernels through their compiled launchers (no Triton dispatch); given `out=` it creates no tensor, so a CUDA
    graph can capture it. Results equal `verify_chain`'s token for token: `verify_chain` runs on these too.

    `verifier(target_logits, draft_tokens, draft_probs=None, num_draft=None, temperature=None, top_k=None,
    top_p=None, uniforms=None, noise=None, *, min_p=None, out=None) -> (out_tokens [B, K+1] int64, num_accepted [B]
    int64)`
    takes `verify_chain`'s arguments, held to the layout so that nothing needs converting: the built shapes,
    dtypes (draft_tokens and num_draft int32 / int64) and device, unit stride along the last axis; uniforms [B, K]
    and noise [B, V] fp32, not read (and may be None) when every row is greedy (scalar temperature 0); per-row
    parameters [B] fp32 (top_k int32 / int64). A scalar temperature, top_k, top_p or min_p left None takes its built
    value; a number replaces it unless it needs a filter the verifier was built without (ValueError; build with
    top_k / top_p / min_p set to run with and without them: top_k 0, top_p 1.0 and min_p 0 switch them off in a
    call). Without `out` a
    call returns new tensors; with `out=(out_tokens, num_accepted)` (contiguous int64 [B, K+1] and [B]) it
    overwrites and returns those, so the caller decides when results may be overwritten.

    The workspace belongs to the verifier: its calls must be ordered on the device (one CUDA stream, or streams
    synchronised in between), as in a decoding loop or a captured graph. `verify_chain` keeps one per layout and
    stream.

    Example:
        >>> verifier = ChainVerifier(8, 4, 128256, dtype=torch.bfloat16, device="cuda", temperature=0.0)
        >>> out = verifier.new_outputs()  # preallocated once, overwritten by every call given them
        >>> tokens, accepted = verifier(logits, drafts, out=out)  # greedy: no uniforms or noise needed
    """

    def __init__(
        self,
        batch: int,
        num_draft_tokens: int,
        vocab: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cuda",
        draft_probs: bool | torch.dtype = False,
        num_draft: bool = False,
        temperature: float | str = 1.0,
        top_k: int | str | None = None,
        top_p: float | str | None = None,
        max_block_v: int | None = None,
        min_p: float | str | None = None,
    ):
        if batch < 1 or num_draft_tokens < 0 or not 0 < vocab < 2**31 - 1:
            raise ValueError(f"ChainVerifier needs batch >= 1, num_draft_tokens >= 0 and 0 < vocab < 2**31 - 1, got "
                             f"{batch}, {num_draft_tokens}, {vocab}")  # fmt: skip
        probs_dtype = dtype if draft_probs is True else (draft_probs or None)
        for name, value in (("dtype", dtype), ("draft_probs", probs_dtype)):
            if value is not None and value not in _FLOATS:
                raise ValueError(f"{name} must be one of {[str(d) for d in _FLOATS]}, got {value}")
        device = torch.device(device)
        launch = launch_for(device)
        index = device_index(device)
        self.device = torch.device("cuda", index) if device.type == "cuda" else device
        self.batch, self.num_draft_tokens, self.vocab = batch, num_draft_tokens, vocab
        self.dtype, self.probs_dtype, self.has_num_draft = dtype, probs_dtype, bool(num_draft)
        self._index = index

        def example(name, value, param_dtype):  # a per-row parameter is built from a [B] stand-in
            if not isinstance(value, str):
                return value
            if value != _PER_ROW:
                raise ValueError(f"{name} must be a number, None or {_PER_ROW!r}, got {value!r}")
            return torch.zeros(batch, dtype=param_dtype, device=device)

        temperature = example("temperature", temperature, torch.float32)
        top_k, top_p = example("top_k", top_k, torch.int32), example("top_p", top_p, torch.float32)
        min_p = example("min_p", min_p, torch.float32)
        sampling = sampling_args(temperature, top_k, top_p, batch, vocab, device, min_p)
        self._per_row = (sampling.temperature is not None, sampling.top_k is not None, sampling.top_p is not None,
                         sampling.min_p is not None)  # fmt: skip
        self._built = (sampling.temperature_value, sampling.top_k_value, sampling.top_p_value,
                       None if isinstance(min_p, torch.Tensor) else min_p)  # fmt: skip
        self.has_top_k, self.has_top_p, self.has_min_p = sampling.has_top_k, sampling.has_top_p, sampling.has_min_p

        # the interpreter pays per program, the GPU per register: smaller V chunks by default on CPU
        max_block_v = max_block_v or (1024 if launch.interpreted else 8192)
        k = num_draft_tokens
        rows = batch * (k + 1)
        flags = dict(HAS_NUM_DRAFT=self.has_num_draft, **sampling.temperature_flags())
        if sampling.has_filter:
            # one program streams whole rows; on CUDA 512-wide chunks keep the [rows, P, V] pivot tiles in registers
            cap = min(max_block_v, 1024 if launch.interpreted else 512)
            block_r, block_v, block_s = walk_tiles(rows, vocab, cap, launch, pack=True)
            nc = 1
            # 4 warps: the [rows, P, BLOCK_S] pivot tiles take up to ~250 registers a thread, and with 8 warps Triton
            # 3.9's ptxas caps a thread at 128 and spills (tests/test_gpu_compile.py)
            self._stats_kernel = Launcher(
                _filtered_stats_kernel, (triton.cdiv(rows, block_r),), 4,
                **sampling.flags(), HAS_NUM_DRAFT=self.has_num_draft, BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_S=block_s,
            )  # fmt: skip
        else:
            # the accept kernel merges every row's per-chunk statistics in [K+1, chunks] tiles: at most
            # _MAX_STAT_CHUNKS chunks (128 spilled ~3.6 KB a thread at batch 1 with Triton 3.6's ptxas; see
            # tests/test_gpu_compile.py)
            block_r, block_v = chunk_tiles(rows, vocab, max_block_v, launch, max_chunks=_MAX_STAT_CHUNKS)
            nc = triton.cdiv(vocab, block_v)
            self._stats_kernel = Launcher(
                _chunk_stats_kernel, (triton.cdiv(rows, block_r), nc), num_warps(block_r * block_v), **flags,
                BLOCK_R=block_r, BLOCK_V=block_v,
            )  # fmt: skip
        block_b, block_race = chunk_tiles(batch, vocab, min(max_block_v, 4096), launch)
        nc_race = triton.cdiv(vocab, block_race)
        self._accept_kernel = Launcher(
            _accept_residual_kernel, (triton.cdiv(batch, block_b), nc_race), num_warps(block_b * block_race), **flags,
            HAS_DRAFT_PROBS=probs_dtype is not None, HAS_FILTER=sampling.has_filter, BLOCK_B=block_b,
            BLOCK_V=block_race, BLOCK_K=triton.next_power_of_2(k + 1), BLOCK_C=triton.next_power_of_2(nc),
        )  # fmt: skip
        self._filtered = sampling.has_filter
        self._sizes = (batch, k, vocab, nc, nc_race)
        # workspace: [B, 2] race keys and arrival counters (zeroed by the statistics kernel), per-row statistics
        self._ws = torch.empty(batch, 2, dtype=torch.int64, device=device)
        self._stats = torch.empty(rows, nc, 2, dtype=torch.float32, device=device)
        self._amax = torch.empty(rows, nc, dtype=torch.int32, device=device)
        self._thr = torch.empty(rows, dtype=torch.float32, device=device) if sampling.has_filter else self._stats
        self._default = None if any(self._per_row) else self._sampling(None, None, None, None)

    def __repr__(self) -> str:
        return (
            f"ChainVerifier(B={self.batch}, K={self.num_draft_tokens}, V={self.vocab}, {self.dtype}, {self.device}, "
            f"draft_probs={self.probs_dtype}, num_draft={self.has_num_draft}, per_row={self._per_row}, "
            f"top_k={self.has_top_k}, top_p={self.has_top_p}, min_p={self.has_min_p})"
        )

    def new_outputs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh (out_tokens [B, K+1], num_accepted [B]) int64 buffers for `out=`."""
        batch, k = self.batch, self.num_draft_tokens
        empty = functools.partial(torch.empty, dtype=torch.int64, device=self.device)
        return empty(batch, k + 1), empty(batch)

    def __call__(
        self,
        target_logits: torch.Tensor,
        draft_tokens: torch.Tensor,
        draft_probs: torch.Tensor | None = None,
        num_draft: torch.Tensor | None = None,
        temperature: float | torch.Tensor | None = None,
        top_k: int | torch.Tensor | None = None,
        top_p: float | torch.Tensor | None = None,
        uniforms: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
        *,
        min_p: float | torch.Tensor | None = None,
        out: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, k, vocab, index = self.batch, self.num_draft_tokens, self.vocab, self._index
        s_l = expect(target_logits, "target_logits", (batch, k + 1, vocab), (self.dtype,), index)
        s_t = expect(draft_tokens, "draft_tokens", (batch, k), _INTS, index)
        if (draft_probs is None) != (self.probs_dtype is None):
            raise ValueError(f"draft_probs: this ChainVerifier was built for draft_probs={self.probs_dtype}")
        s_q = None
        if draft_probs is not None:
            s_q = expect(draft_probs, "draft_probs", (batch, k, vocab), (self.probs_dtype,), index)
        if (num_draft is None) == self.has_num_draft:
            raise ValueError(f"num_draft: this ChainVerifier was built with num_draft={self.has_num_draft}")
        if num_draft is not None:
            expect(num_draft, "num_draft", (batch,), _INTS, index)
        if self._default is not None and temperature is None and top_k is None and top_p is None and min_p is None:
            sampling, greedy = self._default
        else:
            sampling, greedy = self._sampling(temperature, top_k, top_p, min_p)
        s_u = s_e = None
        if not greedy:
            s_u = expect(uniforms, "uniforms", (batch, k), _F32, index)
            s_e = expect(noise, "noise", (batch, vocab), _F32, index)
        else:  # greedy rows read neither: never passed to the kernels, any float dtype will do
            if uniforms is not None:
                expect(uniforms, "uniforms", (batch, k), _PARAM_FLOATS, index)
            if noise is not None:
                expect(noise, "noise", (batch, vocab), _PARAM_FLOATS, index)
            uniforms = noise = None
        if out is None:
            out = self.new_outputs()
        else:
            if expect(out[0], "out[0] (out_tokens)", (batch, k + 1), _I64, index)[0] != k + 1:
                raise ValueError("out[0] (out_tokens) must be contiguous")
            expect(out[1], "out[1] (num_accepted)", (batch,), _I64, index)
        # positional, as keyword construction is slower on this hot path: the fields of `ChainLaunch`, in order
        self._launch(ChainLaunch(target_logits, s_l, draft_tokens, s_t, draft_probs, s_q, num_draft, sampling,
                                 uniforms, s_u, noise, s_e, *out))  # fmt: skip
        return out

    def _sampling(self, temperature, top_k, top_p, min_p) -> tuple[ChainSampling, bool]:
        """(the sampling parameters of a call, whether every row is greedy), checked against what the verifier was
        built for."""
        (t_rows, k_rows, p_rows, m_rows), (t_built, k_built, p_built, m_built) = self._per_row, self._built
        t_t, t_v = self._param("temperature", temperature, t_rows, t_built, _F32)
        k_t, k_v = self._param("top_k", top_k, k_rows, k_built, _INTS)
        p_t, p_v = self._param("top_p", top_p, p_rows, p_built, _F32)
        m_t, m_v = self._param("min_p", min_p, m_rows, m_built, _F32)
        if t_t is None and not t_v >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {t_v}")
        if p_t is None and not 0 < p_v <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p_v}")
        if m_t is None and m_v is not None and not 0 <= m_v <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {m_v}")
        sampled = t_t is not None or t_v > 0
        for name, tensor, on, built in (("top_k", k_t, 0 < k_v < self.vocab, self.has_top_k),
                                        ("top_p", p_t, p_v < 1.0, self.has_top_p),
                                        ("min_p", m_t, bool(m_v), self.has_min_p)):  # fmt: skip
            if sampled and not built and (tensor is not None or on):
                raise ValueError(f"{name}: this ChainVerifier was built without {name} (or for greedy rows only); "
                                 f"build it with {name} set")  # fmt: skip
        log_t = None if m_t is None else min_p_log(m_t)
        log_v = min_p_log(m_v) if m_v is not None else float("-inf")
        return ChainSampling(t_t, float(t_v), k_t, int(k_v), p_t, float(p_v), log_t, log_v), not sampled

    def _param(self, name: str, value, per_row: bool, built, dtypes: tuple[torch.dtype, ...]):
        """(tensor | None, scalar) of one sampling parameter of a call."""
        if per_row:
            expect(value, name, (self.batch,), dtypes, self._index)
            return value, 0
        if isinstance(value, torch.Tensor):
            raise ValueError(f"{name}: this ChainVerifier was built for a scalar {name}; build it with "
                             f"{name}={_PER_ROW!r} to pass a [B] tensor")  # fmt: skip
        return None, built if value is None else value

    def _launch(self, args: ChainLaunch) -> None:
        """The two kernel launches of one call, on arguments checked against the layout."""
        (logits, s_l, draft_tokens, s_t, draft_probs, s_q, num_draft, sampling, uniforms, s_u, noise, s_e, out_tokens,
         num_accepted) = args  # fmt: skip
        temp_t, temp_v, top_k_t, top_k_v, top_p_t, top_p_v, min_p_t, min_p_v = sampling
        batch, k, vocab, nc, nc_race = self._sizes
        spare = self._stats  # never-read stand-in of every unused pointer
        tokens = draft_tokens if k else self._ws
        q, s_q = (spare, (0, 0)) if draft_probs is None else (draft_probs, s_q)
        u, s_u = (spare, k) if uniforms is None or not k else (uniforms, s_u[0])
        e, s_e = (spare, 0) if noise is None else (noise, s_e[0])
        nd = spare if num_draft is None else num_draft
        temp = spare if temp_t is None else temp_t
        top_k = spare if top_k_t is None else top_k_t
        top_p = spare if top_p_t is None else top_p_t
        min_p = spare if min_p_t is None else min_p_t
        top_k_v = min(max(top_k_v, 0), vocab)  # 0 and >= V both switch top-k off; keeps the argument 32-bit
        key = None
        if not INTERPRETED:  # what Triton specialises on beyond the fixed layout: strides, int dtypes, alignment
            ptrs = logits.data_ptr() | tokens.data_ptr() | q.data_ptr() | u.data_ptr() | e.data_ptr() | \
                nd.data_ptr() | temp.data_ptr() | top_k.data_ptr() | top_p.data_ptr() | min_p.data_ptr() | \
                out_tokens.data_ptr() | num_accepted.data_ptr()  # fmt: skip
            aligned = ptrs % 16 == 0  # all 16-byte aligned (the usual case), else which are
            if not aligned:
                tensors = (logits, tokens, q, u, e, nd, temp, top_k, top_p, min_p, out_tokens, num_accepted)
                aligned = tuple(t.data_ptr() % 16 == 0 for t in tensors)
            key = (s_l, s_t, s_q, s_u, s_e, tokens.dtype, nd.dtype, top_k.dtype, aligned)
        if self._filtered:
            self._stats_kernel(key, logits, self._stats, self._amax, self._thr, self._ws, nd, temp, temp_v, top_k,
                               top_k_v, top_p, top_p_v, min_p, min_p_v, batch, k, vocab, s_l[0], s_l[1])  # fmt: skip
        else:
            self._stats_kernel(key, logits, self._stats, self._amax, self._ws, nd, temp, temp_v, batch, k, vocab, nc,
                               s_l[0], s_l[1])  # fmt: skip
        self._accept_kernel(
            key, logits, tokens, q, nd, u, e, self._stats, self._amax, self._thr, self._ws, out_tokens, num_accepted,
            temp, temp_v, batch, k, vocab, nc, nc_race, s_l[0], s_l[1], s_t[0], s_t[1], s_q[0], s_q[1], s_u, s_e,
        )  # fmt: skip
