"""Triton kernels of chain verification (`fastspec.kernels.verify_chain`): device code only, launched by
`fastspec.kernels.chain_verifier.ChainVerifier`, token for token equal to the eager reference.

Words (as in `fastspec.kernels.reference` and vLLM's rejection sampler): a row proposes up to K *draft* tokens;
the leading ones that survive verification are *accepted*; the first rejected position emits a *recovered* token
sampled from norm(max(p - q, 0)); a row that accepts all its drafts emits a *bonus* token sampled from p.
Chain speculative sampling: Leviathan et al. 2023 (arXiv 2211.17192), Chen et al. 2023 (arXiv 2302.01318).

Two launches, no host synchronisation, CUDA-graph capturable:

1. Row statistics, one row per target position j <= num_draft (later positions are never read):
   - without top-k/top-p (`_chunk_stats_kernel`), grid (row tiles, V chunks): the max, sum of exp and argmax of
     logits / temperature per chunk of V, upcast in registers. Reads B(K+1)V logits once.
   - with top-k/top-p/min-p (`_filtered_stats_kernel`), grid (row tiles,): the same over the whole row, then the
     sort-free threshold search of `fastspec.kernels.sampling_filters` (16 pivot keys a pass, jumping onto data
     keys, exact after at most 8 passes, ~log17(V) + 1 usually); the normaliser of the kept set falls out of the
     same sums. top-k keeps z >= the k-th largest z; top-p then keeps z iff the mass of tokens strictly more
     probable than z is < top_p; min-p then keeps z >= max z + log(min_p) (one more pass for the kept sum).
2. Accept and resample (`_accept_residual_kernel`), grid (row tiles, V chunks): every program decides all K
   positions at once (O(K) gathers: accept x_j iff q(x_j) > 0 and u_j q(x_j) < p(x_j); greedy rows iff
   x_j == argmax; the accepted count is the run before the first rejection), then runs the exponential race
   argmax_v r_v / E_v over its chunk of the first rejected (or bonus) row only: reads BV logits, BV noise and,
   when rejected with draft probabilities, BV draft probs. The chunk winners meet in one int64 atomic max per row
   (key = [r > 0 | r/E or p/E | -index], so a degenerate residual, r == 0 everywhere, falls back to sampling p,
   and ties go to the lowest index as in torch.argmax); the last program of a row (atomic counter) decodes the
   key and writes the row. The positions are a power-of-two tile, so the kernel is compiled once per bucket of
   K + 1 (K itself is not specialised).

Traffic: the B(K+1)V logits once, then BV logits, BV noise and (rejected rows with draft probabilities) BV draft
probabilities of each row's final position; no probabilities are written, where the eager reference writes and
re-reads [B, K+1, V] fp32 probabilities.

Importing this module imports Triton and defines the kernels: on a machine without CUDA set TRITON_INTERPRET=1
before that (`fastspec.verify` imports it on the first kernel call).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fastspec.kernels.sampling_filters import (
    _filter_params,
    _kept_stats,
    _key_value,
    _load_z,
    _min_p_cut,
    _temperature,
)

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
    min_p_ptr,  # [B] fp32 log(min_p), or unused
    min_p_value,  # log(min_p) of every row
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
    HAS_MIN_P: tl.constexpr,
    MIN_P_PER_ROW: tl.constexpr,
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
    if HAS_MIN_P:
        s, thr = _min_p_cut(p_z, m_r & ~greedy, t, m, s, thr, min_p_ptr, min_p_value, i_b, m_r, V, MIN_P_PER_ROW,
                            BLOCK_R, BLOCK_V)  # fmt: skip
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
