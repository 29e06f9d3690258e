"""Fused Triton chain verification for speculative sampling, token for token equal to the eager reference.

Words (as in `fastspec.kernels.reference` and vLLM's rejection sampler): a row proposes up to K *draft* tokens;
the leading ones that survive verification are *accepted*; the first rejected position emits a *recovered* token
sampled from norm(max(p - q, 0)); a row that accepts all its drafts emits a *bonus* token sampled from p.
Chain speculative sampling: Leviathan et al. 2023 (arXiv 2211.17192), Chen et al. 2023 (arXiv 2302.01318).

Two launches, no host synchronisation, CUDA-graph capturable:

1. Row statistics, one row per target position j <= num_draft (later positions are never read):
   - without top-k/top-p, grid (row tiles, V chunks): the max, sum of exp and argmax of logits / temperature per
     chunk of V, upcast in registers. Reads B(K+1)V logits once.
   - with top-k/top-p, grid (row tiles,): the same over the whole row, then the sort-free threshold search of
     `fastspec.kernels.sampling_filters` (16 pivot keys a pass, jumping onto data keys, exact after at most 8
     passes, ~log17(V) + 1 usually); the normaliser of the kept set falls out of the same sums. top-k keeps z >=
     the k-th largest z; top-p then keeps z iff the mass of tokens strictly more probable than z is < top_p.
2. Accept and resample, grid (row tiles, V chunks): every program decides all K positions at once (O(K) gathers:
   accept x_j iff q(x_j) > 0 and u_j q(x_j) < p(x_j); greedy rows iff x_j == argmax; the accepted count is the
   run before the first rejection), then runs the exponential race argmax_v r_v / E_v over its chunk of the
   first rejected (or bonus) row only: reads BV logits, BV noise and, when rejected with draft probabilities,
   BV draft probs. The chunk winners meet in one int64 atomic max per row (key = [r > 0 | r/E or p/E | -index],
   so a degenerate residual, r == 0 everywhere, falls back to sampling p, and ties go to the lowest index as in
   torch.argmax); the last program of a row (atomic counter) decodes the key and writes the row. The positions
   are a power-of-two tile, so the kernel is compiled once per bucket of K + 1 (K itself is not specialised).

Total traffic at B=8, K=4, V=128256 fp32: 20.5 MB logits + 12.3 MB for the final rows, against the 37 MB the
eager reference reads once and the ~3x more it writes and re-reads as fp32 probabilities.

Host path: `ChainVerifier` does a layout's host work once (tiles, grids, warps, workspace) and launches both
kernels through their compiled launchers (`fastspec.kernels._host.Launcher`), skipping Triton's per-call
dispatch; `verify_chain` keeps one per layout and stream, so repeated calls of one shape cost a few microseconds
of checks on top of that.

Importing this module imports Triton and defines the kernels: on a machine without CUDA set TRITON_INTERPRET=1
before that (`fastspec.verify` imports it on the first kernel call).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fastspec.kernels._host import (
    _FLOATS,
    _INTS,
    _PARAM_FLOATS,
    INTERPRETED,
    Launcher,
    check_index,
    check_logits,
    check_verify_args,
    chunk_tiles,
    current_stream,
    device_index,
    expect,
    launch_for,
    num_warps,
    sampling_args,
    walk_tiles,
)
from fastspec.kernels.randomness import draw_randomness
from fastspec.kernels.sampling_filters import _PIVOTS, _filter_params, _kept_stats, _key_value, _load_z, _temperature

__all__ = ["ChainVerifier", "verify_chain"]

_F32 = (torch.float32,)
_I64 = (torch.int64,)
_PER_ROW = "per_row"

_INDEX_MASK = tl.constexpr(2**31 - 1)  # low 31 bits of a race key hold token index ^ _INDEX_MASK


@triton.jit
def _num_draft(num_draft_ptr, o_b, mask, K, HAS_NUM_DRAFT: tl.constexpr, BLOCK: tl.constexpr):
    """Valid draft count per row, clamped to [0, K]."""
    if HAS_NUM_DRAFT:
        n = tl.load(num_draft_ptr + o_b, mask=mask, other=0).to(tl.int32)
        return tl.minimum(tl.maximum(n, 0), K)
    return tl.zeros([BLOCK], dtype=tl.int32) + K


@triton.jit
def _combine_chunks(stats_ptr, amax_ptr, row, mask, NC, BLOCK_C: tl.constexpr):
    """Merge the per-chunk (max, sum exp, argmax) of rows `row` [R, J] into row max, sum exp and first argmax."""
    o_c = tl.arange(0, BLOCK_C)
    m_c = mask[:, :, None] & (o_c < NC)[None, None, :]
    o_s = row[:, :, None] * NC + o_c[None, None, :]
    b_m = tl.load(stats_ptr + 2 * o_s, mask=m_c, other=float("-inf"))
    b_s = tl.load(stats_ptr + 2 * o_s + 1, mask=m_c, other=0.0)
    b_a = tl.load(amax_ptr + o_s, mask=m_c, other=0)
    m = tl.max(b_m, axis=2)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    s = tl.sum(b_s * tl.exp(b_m - m_safe[:, :, None]), axis=2)
    s = tl.where(s > 0.0, s, 1.0)  # rows masked out: keep later divisions finite
    # chunks are in index order, so the lowest index among the chunks that hold the max is the first argmax
    amax = tl.min(tl.where(b_m == m[:, :, None], b_a, _INDEX_MASK), axis=2)
    return m_safe, s, amax


@triton.jit(do_not_specialize=["B", "K"])
def _chunk_stats_kernel(
    logits_ptr,  # [B, K+1, V] fp32/bf16/fp16, unit stride along V
    stats_ptr,  # [B*(K+1), NC, 2] fp32 out: max and sum of exp(z - max) of z = logits / temperature
    amax_ptr,  # [B*(K+1), NC] int32 out: first argmax
    ws_ptr,  # [B, 2] int64 workspace of the accept kernel, zeroed here
    num_draft_ptr,
    temp_ptr,
    temp_value,
    B,
    K,
    V,
    NC,
    stride_lb,
    stride_lk,
    HAS_NUM_DRAFT: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    i_r, i_c = tl.program_id(0), tl.program_id(1)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)  # flat row b * (K+1) + j
    i_b, i_j = o_r // (K + 1), o_r % (K + 1)
    m_r = o_r < B * (K + 1)
    if i_c == 0:
        tl.store(ws_ptr + (2 * i_b)[:, None] + tl.arange(0, 2)[None, :], 0, mask=(m_r & (i_j == 0))[:, None])
    # positions past a row's last draft are never read
    m_r = m_r & (i_j <= _num_draft(num_draft_ptr, i_b, m_r, K, HAS_NUM_DRAFT, BLOCK_R))
    _, t = _temperature(temp_ptr, temp_value, i_b, m_r, TEMP_PER_ROW, BLOCK_R)
    p_z = logits_ptr + i_b.to(tl.int64) * stride_lb + i_j.to(tl.int64) * stride_lk
    b_z, _ = _load_z(p_z, m_r, t, i_c * BLOCK_V, V, BLOCK_V)
    b_m = tl.max(b_z, axis=1)
    b_a = tl.argmax(b_z, axis=1)
    b_s = tl.sum(tl.exp(b_z - tl.where(b_m == float("-inf"), 0.0, b_m)[:, None]), axis=1)
    o_s = o_r * NC + i_c
    tl.store(stats_ptr + 2 * o_s, b_m, mask=m_r)
    tl.store(stats_ptr + 2 * o_s + 1, b_s, mask=m_r)
    tl.store(amax_ptr + o_s, i_c * BLOCK_V + b_a, mask=m_r)


@triton.jit(do_not_specialize=["B", "K", "top_k_value"])
def _filtered_stats_kernel(
    logits_ptr,  # [B, K+1, V]
    stats_ptr,  # [B*(K+1), 1, 2] fp32 out: max and sum of exp over the kept tokens
    amax_ptr,  # [B*(K+1), 1] int32 out: first argmax
    thr_ptr,  # [B*(K+1)] fp32 out: a token is kept iff z >= thr
    ws_ptr,  # [B, 2] int64, zeroed here
    num_draft_ptr,
    temp_ptr,
    temp_value,
    top_k_ptr,
    top_k_value,
    top_p_ptr,
    top_p_value,
    B,
    K,
    V,
    stride_lb,
    stride_lk,
    HAS_NUM_DRAFT: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    TOP_K_PER_ROW: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    TOP_P_PER_ROW: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    i_r = tl.program_id(0)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    i_b, i_j = o_r // (K + 1), o_r % (K + 1)
    m_r = o_r < B * (K + 1)
    tl.store(ws_ptr + (2 * i_b)[:, None] + tl.arange(0, 2)[None, :], 0, mask=(m_r & (i_j == 0))[:, None])
    m_r = m_r & (i_j <= _num_draft(num_draft_ptr, i_b, m_r, K, HAS_NUM_DRAFT, BLOCK_R))
    greedy, t = _temperature(temp_ptr, temp_value, i_b, m_r, TEMP_PER_ROW, BLOCK_R)
    k, top_p = _filter_params(top_k_ptr, top_k_value, top_p_ptr, top_p_value, i_b, m_r,
                              HAS_TOP_K, TOP_K_PER_ROW, HAS_TOP_P, TOP_P_PER_ROW, BLOCK_R)  # fmt: skip
    p_z = logits_ptr + i_b.to(tl.int64) * stride_lb + i_j.to(tl.int64) * stride_lk
    # greedy rows only need the argmax
    m, s, thr, amax = _kept_stats(p_z, m_r, m_r & ~greedy, t, k, top_p, V, HAS_TOP_K, HAS_TOP_P,
                                  BLOCK_R, BLOCK_V, BLOCK_S)  # fmt: skip
    tl.store(stats_ptr + 2 * o_r, m, mask=m_r)
    tl.store(stats_ptr + 2 * o_r + 1, s, mask=m_r)
    tl.store(amax_ptr + o_r, amax, mask=m_r)
    tl.store(thr_ptr + o_r, _key_value(thr), mask=m_r)


@triton.jit(do_not_specialize=["B", "K"])
def _accept_residual_kernel(
    logits_ptr,  # [B, K+1, V]
    draft_tokens_ptr,  # [B, K] int
    draft_probs_ptr,  # [B, K, V] or unused
    num_draft_ptr,  # [B] int or unused
    uniforms_ptr,  # [B, K] fp32 in (0, 1]
    noise_ptr,  # [B, V] fp32 > 0
    stats_ptr,
    amax_ptr,
    thr_ptr,
    ws_ptr,  # [B, 2] int64: race key, finished programs
    out_ptr,  # [B, K+1] int64 out
    num_accepted_ptr,  # [B] int64 out
    temp_ptr,
    temp_value,
    B,
    K,
    V,
    NC,  # chunks of the row statistics
    NC_RACE,  # chunks of this kernel (grid axis 1)
    stride_lb,
    stride_lk,
    stride_tb,
    stride_tk,
    stride_qb,
    stride_qk,
    stride_ub,
    stride_nb,
    HAS_DRAFT_PROBS: tl.constexpr,
    HAS_NUM_DRAFT: tl.constexpr,
    HAS_FILTER: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    i_bt, i_c = tl.program_id(0), tl.program_id(1)
    o_b = i_bt * BLOCK_B + tl.arange(0, BLOCK_B)
    m_b = o_b < B
    o_b64 = o_b.to(tl.int64)
    n = _num_draft(num_draft_ptr, o_b, m_b, K, HAS_NUM_DRAFT, BLOCK_B)
    greedy, t = _temperature(temp_ptr, temp_value, o_b, m_b, TEMP_PER_ROW, BLOCK_B)
    p_z = logits_ptr + o_b64 * stride_lb
    p_tok = draft_tokens_ptr + o_b64 * stride_tb

    # acceptance at every position at once (no load waits on an earlier decision); positions are [BB, BK]
    o_k = tl.arange(0, BLOCK_K)  # positions 0..K: the drafts, then the bonus position
    m_k = m_b[:, None] & (o_k[None, :] <= n[:, None])  # rows past num_draft are never read
    m_d = m_k & (o_k[None, :] < n[:, None])  # draft positions
    x = tl.load(p_tok[:, None] + o_k[None, :] * stride_tk, mask=m_d, other=-1)
    in_range = (x >= 0) & (x < V)
    x = tl.where(in_range, x, 0)
    row = o_b64[:, None] * (K + 1) + o_k[None, :]
    m_j, s_j, amax_j = _combine_chunks(stats_ptr, amax_ptr, row, m_k, NC, BLOCK_C)
    p_zk = p_z[:, None] + o_k[None, :] * stride_lk
    z_x = tl.math.div_rn(tl.load(p_zk + x, mask=m_d, other=0.0).to(tl.float32), t[:, None])
    p_x = tl.math.div_rn(tl.exp(z_x - m_j), s_j)
    if HAS_FILTER:
        thr_j = tl.load(thr_ptr + row, mask=m_k, other=0.0)
        p_x = tl.where(z_x >= thr_j, p_x, 0.0)
    if HAS_DRAFT_PROBS:
        p_qk = draft_probs_ptr + o_b64[:, None] * stride_qb + o_k[None, :] * stride_qk
        q_x = tl.load(p_qk + x, mask=m_d, other=0.0).to(tl.float32)
    else:
        q_x = tl.full([BLOCK_B, BLOCK_K], 1.0, tl.float32)
    u = tl.load(uniforms_ptr + o_b64[:, None] * stride_ub + o_k[None, :], mask=m_d, other=1.0)
    # strict comparison with u in (0, 1]: a token with p(x) = 0 is never accepted
    accept = tl.where(greedy[:, None], x == amax_j, (q_x > 0.0) & (u * q_x < p_x)) & in_range & m_d
    # accepted drafts: the run before the first rejection (positions >= num_draft count as rejections)
    n_acc = tl.min(tl.where(accept, BLOCK_K, o_k[None, :]), axis=1)
    rejected = m_b & (n_acc < n)
    at_f = o_k[None, :] == n_acc[:, None]  # the first rejected (recovered token) or the bonus position
    m_f = tl.sum(tl.where(at_f, m_j, 0.0), axis=1)
    s_f = tl.sum(tl.where(at_f, s_j, 0.0), axis=1)
    amax_f = tl.sum(tl.where(at_f, amax_j, 0), axis=1)
    x_f = tl.sum(tl.where(at_f, tl.where(in_range, x, -1), 0), axis=1)  # -1: no valid draft token there
    row_f = o_b64 * (K + 1) + n_acc

    # exponential race over this program's chunk of the final row
    o_v = i_c * BLOCK_V + tl.arange(0, BLOCK_V)
    m_bv = (m_b & ~greedy)[:, None] & (o_v < V)[None, :]
    b_z = tl.load((p_z + n_acc * stride_lk)[:, None] + o_v[None, :], mask=m_bv, other=float("-inf"))
    b_z = tl.math.div_rn(b_z.to(tl.float32), t[:, None])
    b_p = tl.math.div_rn(tl.exp(b_z - m_f[:, None]), s_f[:, None])
    if HAS_FILTER:
        b_p = tl.where(b_z >= tl.load(thr_ptr + row_f, mask=m_b, other=0.0)[:, None], b_p, 0.0)
    if HAS_DRAFT_PROBS:
        p_q = draft_probs_ptr + o_b64 * stride_qb + n_acc * stride_qk
        b_q = tl.load(p_q[:, None] + o_v[None, :], mask=m_bv & rejected[:, None], other=0.0).to(tl.float32)
    else:
        # one-hot q at the rejected draft token; an out-of-range token removes nothing (x_f = -1)
        b_q = tl.where(rejected[:, None] & (o_v[None, :] == x_f[:, None]), 1.0, 0.0)
    b_r = tl.where(rejected[:, None], tl.maximum(b_p - b_q, 0.0), b_p)
    b_e = tl.load(noise_ptr + (o_b64 * stride_nb)[:, None] + o_v[None, :], mask=m_bv, other=1.0)
    # exponential race: argmax r / E over r > 0, or p / E when the residual is all zero (p == q)
    has_r = b_r > 0.0
    b_score = tl.math.div_rn(tl.where(has_r, b_r, b_p), b_e)
    b_key = (
        (has_r.to(tl.int64) << 62)
        | (b_score.to(tl.int32, bitcast=True).to(tl.int64) << 31)
        | (o_v ^ _INDEX_MASK).to(tl.int64)
    )
    b_key = tl.max(tl.where(m_bv, b_key, -1), axis=1)
    tl.atomic_max(ws_ptr + 2 * o_b64, b_key, mask=m_b)
    tl.debug_barrier()  # every thread's atomic max is ordered before this program's arrival below
    arrived = tl.atomic_add(ws_ptr + 2 * o_b64 + 1, 1, mask=m_b)
    tl.debug_barrier()
    last = m_b & (arrived == NC_RACE - 1)
    race = tl.atomic_add(ws_ptr + 2 * o_b64, 0, mask=last)  # atomic read of the row's final key
    token = tl.where(greedy, amax_f.to(tl.int64), (race & _INDEX_MASK) ^ _INDEX_MASK)

    # the last program of a row writes it: accepted drafts, the recovered/bonus token, -1 padding
    m_o = last[:, None] & (o_k < K + 1)[None, :]
    b_out = tl.where(o_k[None, :] < n_acc[:, None], x, -1).to(tl.int64)
    b_out = tl.where(at_f, token[:, None], b_out)
    tl.store(out_ptr + o_b64[:, None] * (K + 1) + o_k[None, :], b_out, mask=m_o)
    tl.store(num_accepted_ptr + o_b, n_acc.to(tl.int64), mask=last)


class ChainVerifier:
    """`verify_chain` for one layout, with the host work done once: a few microseconds of Python a call.

    Built for batch B, draft length K, vocabulary V, the logits' dtype and device, whether draft probabilities and
    per-row draft counts are passed, and the sampling configuration (temperature, top_k and top_p each a number,
    None, or "per_row" for a [B] tensor passed with every call), it picks the tiles, grids and warps, allocates
    the workspace and binds both kernels to `fastspec.kernels._host.Launcher`s once. A call checks shapes,
    dtypes, devices and unit strides (ValueError naming the argument), reads no tensor value and launches the two
    kernels through their compiled launchers (no Triton dispatch); given `out=` it creates no tensor, so a CUDA
    graph can capture it. Results equal `verify_chain`'s token for token: `verify_chain` runs on these too.

    `verifier(target_logits, draft_tokens, draft_probs=None, num_draft=None, temperature=None, top_k=None,
    top_p=None, uniforms=None, noise=None, *, out=None) -> (out_tokens [B, K+1] int64, num_accepted [B] int64)`
    takes `verify_chain`'s arguments, held to the layout so that nothing needs converting: the built shapes,
    dtypes (draft_tokens and num_draft int32 / int64) and device, unit stride along the last axis; uniforms [B, K]
    and noise [B, V] fp32, not read (and may be None) when every row is greedy (scalar temperature 0); per-row
    parameters [B] fp32 (top_k int32 / int64). A scalar temperature, top_k or top_p left None takes its built value; a
    number replaces it unless it needs a filter the verifier was built without (ValueError; build with top_k /
    top_p set to run with and without them: top_k 0 and top_p 1.0 switch them off in a call). Without `out` a
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
        sampling = sampling_args(temperature, top_k, top_p, batch, vocab, device)
        self._per_row = (sampling.temperature is not None, sampling.top_k is not None, sampling.top_p is not None)
        self._built = (sampling.temperature_value, sampling.top_k_value, sampling.top_p_value)
        self.has_top_k, self.has_top_p = sampling.has_top_k, sampling.has_top_p

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
            self._stats_kernel = Launcher(
                _filtered_stats_kernel, (triton.cdiv(rows, block_r),), num_warps(block_r * _PIVOTS.value * block_s),
                **sampling.flags(), HAS_NUM_DRAFT=self.has_num_draft, BLOCK_R=block_r, BLOCK_V=block_v, BLOCK_S=block_s,
            )  # fmt: skip
        else:
            block_r, block_v = chunk_tiles(rows, vocab, max_block_v, launch)
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
        self._default = None if any(self._per_row) else self._sampling(None, None, None)

    def __repr__(self) -> str:
        return (
            f"ChainVerifier(B={self.batch}, K={self.num_draft_tokens}, V={self.vocab}, {self.dtype}, {self.device}, "
            f"draft_probs={self.probs_dtype}, num_draft={self.has_num_draft}, per_row={self._per_row}, "
            f"top_k={self.has_top_k}, top_p={self.has_top_p})"
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
        if self._default is not None and temperature is None and top_k is None and top_p is None:
            sampling = self._default
        else:
            sampling = self._sampling(temperature, top_k, top_p)
        s_u = s_e = None
        if not sampling[-1]:
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
        self._run(target_logits, s_l, draft_tokens, s_t, draft_probs, s_q, num_draft, *sampling[:-1], uniforms, s_u,
                  noise, s_e, *out)  # fmt: skip
        return out

    def _sampling(self, temperature, top_k, top_p) -> tuple:
        """(temperature [B] | None, its scalar, top_k [B] | None, scalar, top_p [B] | None, scalar, all greedy) of a
        call, checked against what the verifier was built for."""
        (t_rows, k_rows, p_rows), (t_built, k_built, p_built) = self._per_row, self._built
        t_t, t_v = self._param("temperature", temperature, t_rows, t_built, _F32)
        k_t, k_v = self._param("top_k", top_k, k_rows, k_built, _INTS)
        p_t, p_v = self._param("top_p", top_p, p_rows, p_built, _F32)
        if t_t is None and not t_v >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {t_v}")
        if p_t is None and not 0 < p_v <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {p_v}")
        sampled = t_t is not None or t_v > 0
        for name, tensor, on, built in (("top_k", k_t, 0 < k_v < self.vocab, self.has_top_k),
                                        ("top_p", p_t, p_v < 1.0, self.has_top_p)):  # fmt: skip
            if sampled and not built and (tensor is not None or on):
                raise ValueError(f"{name}: this ChainVerifier was built without {name} (or for greedy rows only); "
                                 f"build it with {name} set")  # fmt: skip
        return t_t, float(t_v), k_t, int(k_v), p_t, float(p_v), not sampled

    def _param(self, name: str, value, per_row: bool, built, dtypes: tuple[torch.dtype, ...]):
        """(tensor | None, scalar) of one sampling parameter of a call."""
        if per_row:
            expect(value, name, (self.batch,), dtypes, self._index)
            return value, 0
        if isinstance(value, torch.Tensor):
            raise ValueError(f"{name}: this ChainVerifier was built for a scalar {name}; build it with "
                             f"{name}={_PER_ROW!r} to pass a [B] tensor")  # fmt: skip
        return None, built if value is None else value

    def _launch(self, target_logits, draft_tokens, draft_probs, num_draft, temp_t, temp_v, top_k_t, top_k_v, top_p_t,
                top_p_v, uniforms, noise, out_tokens, num_accepted) -> None:  # fmt: skip
        """The two launches, on checked arguments (unit stride along the last axis; per-row parameters [B])."""
        self._run(
            target_logits, target_logits.stride(), draft_tokens, draft_tokens.stride(), draft_probs,
            None if draft_probs is None else draft_probs.stride(), num_draft, temp_t, temp_v, top_k_t, top_k_v,
            top_p_t, top_p_v, uniforms, None if uniforms is None else uniforms.stride(), noise,
            None if noise is None else noise.stride(), out_tokens, num_accepted,
        )  # fmt: skip

    def _run(self, logits, s_l, draft_tokens, s_t, draft_probs, s_q, num_draft, temp_t, temp_v, top_k_t, top_k_v,
             top_p_t, top_p_v, uniforms, s_u, noise, s_e, out_tokens, num_accepted) -> None:  # fmt: skip
        """`_launch` given the strides of the tensors (None for absent ones)."""
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
        top_k_v = min(max(top_k_v, 0), vocab)  # 0 and >= V both switch top-k off; keeps the argument 32-bit
        key = None
        if not INTERPRETED:  # what Triton specialises on beyond the fixed layout: strides, int dtypes, alignment
            ptrs = logits.data_ptr() | tokens.data_ptr() | q.data_ptr() | u.data_ptr() | e.data_ptr() | \
                nd.data_ptr() | temp.data_ptr() | top_k.data_ptr() | top_p.data_ptr() | out_tokens.data_ptr() | \
                num_accepted.data_ptr()  # fmt: skip
            aligned = ptrs % 16 == 0  # all 16-byte aligned (the usual case), else which are
            if not aligned:
                tensors = (logits, tokens, q, u, e, nd, temp, top_k, top_p, out_tokens, num_accepted)
                aligned = tuple(t.data_ptr() % 16 == 0 for t in tensors)
            key = (s_l, s_t, s_q, s_u, s_e, tokens.dtype, nd.dtype, top_k.dtype, aligned)
        if self._filtered:
            self._stats_kernel(key, logits, self._stats, self._amax, self._thr, self._ws, nd, temp, temp_v, top_k,
                               top_k_v, top_p, top_p_v, batch, k, vocab, s_l[0], s_l[1])  # fmt: skip
        else:
            self._stats_kernel(key, logits, self._stats, self._amax, self._ws, nd, temp, temp_v, batch, k, vocab, nc,
                               s_l[0], s_l[1])  # fmt: skip
        self._accept_kernel(
            key, logits, tokens, q, nd, u, e, self._stats, self._amax, self._thr, self._ws, out_tokens, num_accepted,
            temp, temp_v, batch, k, vocab, nc, nc_race, s_l[0], s_l[1], s_t[0], s_t[1], s_q[0], s_q[1], s_u, s_e,
        )  # fmt: skip


_VERIFIERS: dict[tuple, ChainVerifier] = {}  # `verify_chain`'s verifiers by layout and stream, oldest first
_MAX_VERIFIERS = 32


def _kinds(*params) -> tuple:
    """Sampling parameters as a `ChainVerifier` is built for them: scalars by value, [B] tensors as "per_row"."""
    return tuple(_PER_ROW if isinstance(v, torch.Tensor) else v for v in params)


def _layout(target_logits, draft_probs, num_draft, temperature, top_k, top_p, max_block_v) -> tuple:
    """`verify_chain`'s cache key: what a `ChainVerifier` is built for, and the current stream. AttributeError for
    arguments that are no tensors."""
    kinds = _kinds(temperature, top_k, top_p)
    index = target_logits.get_device()
    probs = None if draft_probs is None else draft_probs.dtype
    return target_logits.shape, target_logits.dtype, index, probs, num_draft is not None, kinds, max_block_v, \
        current_stream(index)  # fmt: skip


def _verify_chain(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft: torch.Tensor | None,
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor | None,
    top_p: float | torch.Tensor | None,
    uniforms: torch.Tensor | None,
    noise: torch.Tensor | None,
    max_block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host wrapper, on the cached `ChainVerifier` of the call's layout: its lean call when the arguments fit it
    as they are, else the full checks (errors name the argument) and conversions, then its launches. New output
    tensors either way; no tensor value is read on the host. uniforms / noise may be None only for a greedy scalar
    temperature. `max_block_v` caps the V chunk (tests use it to force many chunks)."""
    try:
        key = _layout(target_logits, draft_probs, num_draft, temperature, top_k, top_p, max_block_v)
        verifier = _VERIFIERS.get(key)
    except (AttributeError, TypeError):  # no tensors, unhashable parameters: the checks below say what is wrong
        key = verifier = None
    if verifier is not None:
        rows = [v if isinstance(v, torch.Tensor) else None for v in (temperature, top_k, top_p)]
        try:
            return verifier(target_logits, draft_tokens, draft_probs, num_draft, *rows, uniforms, noise)
        except (TypeError, ValueError):
            pass  # arguments to convert (strides, dtypes, [1]-shaped parameters), or bad ones: the checks below

    check_logits(target_logits, "[B, K+1, V] with K >= 0")
    batch, k_plus_1, vocab = target_logits.shape
    device = target_logits.device
    draft_tokens = check_index(draft_tokens, "draft_tokens", (batch, k_plus_1 - 1), device)
    if num_draft is not None:
        num_draft = check_index(num_draft, "num_draft", (batch,), device)
    if uniforms is None or noise is None:  # greedy: stand-ins, never read
        uniforms = torch.ones(batch, k_plus_1 - 1, device=device) if uniforms is None else uniforms
        noise = torch.ones(batch, vocab, device=device) if noise is None else noise
    target_logits, draft_probs, uniforms, noise, sampling = check_verify_args(
        target_logits, draft_probs, uniforms, noise, temperature, top_k, top_p, positions=k_plus_1 - 1
    )
    launch_for(device)
    out = torch.empty(batch, k_plus_1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return out, num_accepted
    if verifier is None:
        kinds = _kinds(temperature, top_k, top_p)
        verifier = ChainVerifier(
            batch, k_plus_1 - 1, vocab, dtype=target_logits.dtype, device=device,
            draft_probs=False if draft_probs is None else draft_probs.dtype, num_draft=num_draft is not None,
            temperature=kinds[0], top_k=kinds[1], top_p=kinds[2], max_block_v=max_block_v,
        )  # fmt: skip
        if key is not None:
            if len(_VERIFIERS) >= _MAX_VERIFIERS:
                del _VERIFIERS[next(iter(_VERIFIERS))]
            _VERIFIERS[key] = verifier
    verifier._launch(
        target_logits, draft_tokens, draft_probs, num_draft, sampling.temperature, sampling.temperature_value,
        sampling.top_k, sampling.top_k_value, sampling.top_p, sampling.top_p_value, uniforms, noise, out, num_accepted,
    )  # fmt: skip
    return out, num_accepted


def verify_chain(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    seed: int | torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of draft tokens against the target in two fused Triton launches.

    Same arguments (shapes, dtypes, semantics) and results as `fastspec.kernels.reference.verify_chain`, token for
    token given the same `uniforms` and `noise` (or the same `seed`, drawn with the same `draw_randomness`). Bad
    arguments raise TypeError / ValueError naming them (`kernels/_host.py`, shared with `verify_tree`). Logits
    and draft probabilities are upcast in registers and may have any strides with unit stride along V; fp64
    uniforms and noise are rounded to fp32. Per-row parameters should live on the logits' device; scalars are
    passed to the kernels as arguments (no fill launches). A greedy call (scalar temperature 0) reads no
    randomness: none is drawn for it (a `seed` generator is left as it is).

    The host work of a layout (tiles, grids, workspace, Triton's dispatch) is done once, by the `ChainVerifier`
    kept for it (one per layout, sampling scalars and CUDA stream, at most 32); arguments that fit it as they are
    (unit stride along the last axis, fp32 randomness, [B] fp32 per-row parameters) skip the conversions too.
    Each call returns new tensors. For the fewest microseconds a call, or preallocated outputs, use a
    `ChainVerifier` directly.

    Returns:
        out_tokens: [B, K+1] int64, the accepted draft tokens then the recovered or bonus token, padded with -1.
        num_accepted: [B] int64, accepted draft tokens per row (the row emits num_accepted + 1 tokens).

    Example:
        >>> logits = torch.randn(2, 4, 128256, device="cuda"); drafts = torch.randint(0, 128256, (2, 3), device="cuda")
        >>> out, n = verify_chain(logits, drafts, temperature=0.0)
    """
    if (uniforms is None or noise is None) and (isinstance(temperature, torch.Tensor) or temperature != 0):
        check_logits(target_logits, "[B, K+1, V] with K >= 0")
        batch, k_plus_1, vocab = target_logits.shape
        uniforms, noise = draw_randomness(batch, k_plus_1 - 1, vocab, seed, target_logits.device, uniforms, noise)
    return _verify_chain(
        target_logits, draft_tokens, draft_probs, num_draft, temperature, top_k, top_p, uniforms, noise
    )
