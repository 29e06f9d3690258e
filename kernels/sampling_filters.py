"""Triton building blocks of temperature, top-k, top-p and min-p, shared by the chain and tree verification kernels.

Logits are streamed in chunks as z = logits / temperature (fp32, `_load_z`); `_row_stats` gives the row max, sum
of exp and first argmax in one online pass. `_kept_stats` adds the top-k / top-p keep threshold, found without
sorting: z is mapped to order-preserving int keys (`_order_key`) and each pass over the row (`_pivot_pass`) tests
`_PIVOTS` pivot keys spread over the current bracket (`_pivots`), counting and summing exp over the keys above each
and finding the nearest data keys on both sides, so `_narrow` jumps the bracket onto data keys and the search stops
as soon as it is exact (at most `_SEARCH_PASSES` passes for 32-bit keys, ~log17(V) + 1 usually). The semantics are
those of `fastspec.kernels.sampling`: top-k keeps z >= the k-th largest z; top-p then keeps z iff the mass of the
tokens strictly more probable than z is < top_p; min-p then keeps z >= max z + log(min_p) (one fp32 addition, the
reference's, with the log taken on the host by `fastspec.kernels.sampling.min_p_log`), which raises the threshold and
costs one more pass over the row for the kept set's sum (`_kept_mass`).

Shapes: R rows per program (a row tile), P = `_PIVOTS`; p_z [R] are pointers to each row's V logits.
"""

from __future__ import annotations

import triton
import triton.language as tl

_PIVOTS = tl.constexpr(16)  # thresholds tested per search pass: each pass shrinks the key interval ~17x
_SEARCH_PASSES = tl.constexpr(8)  # 2**32 keys -> 1 in 8 passes of 16 pivots (test_search_passes_suffice)
_FAR = tl.constexpr(2**40)  # beyond every int key: "no key on that side"


@triton.jit
def _order_key(z):
    """Order-preserving int64 key of fp32 values; -0.0 and +0.0 share key 0."""
    bits = z.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return tl.where(z == 0.0, 0, key).to(tl.int64)


@triton.jit
def _key_value(key):
    """Inverse of `_order_key`."""
    bits = key.to(tl.int32)
    bits = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _row_param(ptr, value, o_b, mask, PER_ROW: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    """A sampling parameter for rows o_b: loaded from ptr [B] when PER_ROW, else the scalar `value`."""
    if PER_ROW:
        return tl.load(ptr + o_b, mask=mask, other=value).to(DTYPE)
    return tl.zeros([BLOCK], dtype=DTYPE) + value


@triton.jit
def _temperature(temp_ptr, temp_value, o_b, mask, PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    """(greedy [R], t [R]) of rows o_b: greedy rows have temperature <= 0 and divide by t = 1 (as the reference)."""
    temp = _row_param(temp_ptr, temp_value, o_b, mask, PER_ROW, tl.float32, BLOCK)
    return temp <= 0.0, tl.where(temp > 0.0, temp, 1.0)


@triton.jit
def _filter_params(top_k_ptr, top_k_value, top_p_ptr, top_p_value, o_b, mask,
                   HAS_TOP_K: tl.constexpr, TOP_K_PER_ROW: tl.constexpr,
                   HAS_TOP_P: tl.constexpr, TOP_P_PER_ROW: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """(top_k [R] int32, top_p [R] fp32) of rows o_b; a filter that is not compiled in reads as 0."""
    k = tl.zeros([BLOCK], dtype=tl.int32)
    top_p = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_TOP_K:
        k = _row_param(top_k_ptr, top_k_value, o_b, mask, TOP_K_PER_ROW, tl.int32, BLOCK)
    if HAS_TOP_P:
        top_p = _row_param(top_p_ptr, top_p_value, o_b, mask, TOP_P_PER_ROW, tl.float32, BLOCK)
    return k, top_p


@triton.jit
def _load_z(p_z, m_r, t, v0, V, BLOCK_V: tl.constexpr):
    """Chunk [v0, v0 + BLOCK_V) of logits / temperature of rows p_z [R] (fp32; -inf outside the row)."""
    o_v = v0 + tl.arange(0, BLOCK_V)
    m_z = m_r[:, None] & (o_v < V)[None, :]
    b_z = tl.load(p_z[:, None] + o_v[None, :], mask=m_z, other=float("-inf")).to(tl.float32)
    return tl.math.div_rn(b_z, t[:, None]), m_z


@triton.jit
def _row_stats(p_z, m_r, t, V, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """One online pass over rows p_z [R]: max (-inf for an empty row), sum of exp(z - max), first argmax, min."""
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_R], dtype=tl.float32)
    amax = tl.zeros([BLOCK_R], dtype=tl.int32)
    z_min = tl.full([BLOCK_R], float("inf"), tl.float32)
    for v0 in range(0, V, BLOCK_V):
        b_z, m_z = _load_z(p_z, m_r, t, v0, V, BLOCK_V)
        b_m = tl.max(b_z, axis=1)
        amax = tl.where(b_m > m, v0 + tl.argmax(b_z, axis=1), amax)
        m_new = tl.maximum(m, b_m)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - m_safe) + tl.sum(tl.exp(b_z - m_safe[:, None]), axis=1)
        m = m_new
        z_min = tl.minimum(z_min, tl.min(tl.where(m_z, b_z, float("inf")), axis=1))
    return m, s, amax, z_min


@triton.jit
def _pivots(lo, hi):
    """`_PIVOTS` keys [R, P] spread evenly over [lo, hi), ascending."""
    o_p = tl.arange(0, _PIVOTS)
    return lo[:, None] + ((hi - lo)[:, None] * (o_p[None, :] + 1)) // (_PIVOTS + 1)


@triton.jit
def _pivot_pass(p_z, t, m, floor, piv, active, V, TOP_P: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_S: tl.constexpr):  # fmt: skip
    """One pass over rows p_z [R] (z = logits / t) against pivots piv [R, P]. For each pivot: the sum of
    exp(z - m) (keys below `floor` weigh 0) of the keys >= piv, or > piv for TOP_P, and for top-k (not TOP_P)
    their count; the smallest such key and the largest key not above it (+-_FAR where there is none)."""
    cnt = tl.zeros([BLOCK_R, _PIVOTS], dtype=tl.int32)
    mass = tl.zeros([BLOCK_R, _PIVOTS], dtype=tl.float32)
    up = tl.full([BLOCK_R, _PIVOTS], _FAR, tl.int64)
    down = tl.full([BLOCK_R, _PIVOTS], -_FAR, tl.int64)
    for v0 in range(0, V, BLOCK_S):
        b_z, m_z = _load_z(p_z, active, t, v0, V, BLOCK_S)
        b_key = tl.where(m_z, _order_key(b_z), -_FAR)
        b_e = tl.where(b_key >= floor[:, None], tl.exp(b_z - m[:, None]), 0.0)
        if TOP_P:
            above = b_key[:, None, :] > piv[:, :, None]  # [R, P, BS]
        else:
            above = b_key[:, None, :] >= piv[:, :, None]
            cnt += tl.sum(above.to(tl.int32), axis=2)
        mass += tl.sum(tl.where(above, b_e[:, None, :], 0.0), axis=2)
        up = tl.minimum(up, tl.min(tl.where(above, b_key[:, None, :], _FAR), axis=2))
        down = tl.maximum(down, tl.max(tl.where(above, -_FAR, b_key[:, None, :]), axis=2))
    return cnt, mass, up, down


@triton.jit
def _narrow(ok, active, lo, s_lo, hi, lo_at, hi_at, mass):
    """One bracket step of rows `active`: `ok` [R, P] holds for a prefix of the pivots (counts and masses fall as
    pivots rise). lo moves to lo_at [R, P] and s_lo to mass [R, P] of the last pivot that holds, hi to hi_at of
    the first that does not; rows where no pivot holds (or all do) keep lo (hi). Returns lo, s_lo, hi."""
    o_p = tl.arange(0, _PIVOTS)
    n_ok = tl.sum(ok.to(tl.int32), axis=1)
    at_lo = o_p[None, :] == (n_ok - 1)[:, None]
    at_hi = o_p[None, :] == n_ok[:, None]
    move_lo = active & (n_ok > 0)
    lo_new = tl.where(move_lo, tl.sum(tl.where(at_lo, lo_at, 0), axis=1), lo)
    s_new = tl.where(move_lo, tl.sum(tl.where(at_lo, mass, 0.0), axis=1), s_lo)
    hi_new = tl.where(active & (n_ok < _PIVOTS), tl.sum(tl.where(at_hi, hi_at, 0), axis=1), hi)
    return lo_new, s_new, hi_new


@triton.jit
def _top_k_key(p_z, t, m, s, key_min, key_max, k, search, V, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """(kth, sum of exp(z - m) over key >= kth): the largest key kth with #{key >= kth} >= k, for rows `search`
    (else kth = key_min, the sum s). Invariant: lo is a key with count >= k (s_lo its sum), hi - 1 a key with
    count < k at hi; the search ends when they meet."""
    lo = key_min
    s_lo = s
    hi = tl.where(search & (k > 0) & (k < V), key_max + 1, lo + 1)
    i_pass = 0
    while (tl.max(hi - lo, axis=0) > 1) & (i_pass < _SEARCH_PASSES):
        active = hi - lo > 1
        piv = _pivots(lo, hi)  # [R, P] in [lo, hi)
        cnt, mass, up, down = _pivot_pass(p_z, t, m, key_min, piv, active, V, False, BLOCK_R, BLOCK_S)
        lo, s_lo, hi = _narrow(cnt >= k[:, None], active, lo, s_lo, hi, up, down + 1, mass)
        i_pass += 1
    return lo, s_lo


@triton.jit
def _top_p_key(p_z, t, m, s_kth, kth, key_max, top_p, search, V, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):
    """(thr, sum of exp(z - m) over kth <= key, thr <= key) for the top-k set key >= kth of sum s_kth: the smallest
    key thr with g(thr) = sum exp over kept keys > thr < top_p * s_kth, for rows `search` with top_p < 1 (else
    thr = kth). Invariant: g(lo) >= target (s_lo = g(lo)) and lo + 1 is a key; hi is a key with g(hi) < target."""
    target = tl.maximum(top_p * s_kth, 1e-30)  # top_p <= 0 keeps the most probable token(s)
    lo = kth - 1
    s_lo = s_kth
    hi = tl.where(search & (top_p < 1.0), key_max, kth)
    i_pass = 0
    while (tl.max(hi - lo, axis=0) > 1) & (i_pass < _SEARCH_PASSES):
        active = hi - lo > 1
        piv = _pivots(lo, hi)
        _, mass, up, down = _pivot_pass(p_z, t, m, kth, piv, active, V, True, BLOCK_R, BLOCK_S)
        lo, s_lo, hi = _narrow(mass >= target[:, None], active, lo, s_lo, hi, up - 1, down, mass)
        i_pass += 1
    return hi, s_lo


@triton.jit
def _kept_mass(p_z, m_r, t, m, thr, V, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Sum of exp(z - m) over the keys >= thr of rows p_z [R] (rows m_r)."""
    s = tl.zeros([BLOCK_R], dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        b_z, m_z = _load_z(p_z, m_r, t, v0, V, BLOCK_V)
        kept = m_z & (_order_key(b_z) >= thr[:, None])
        s += tl.sum(tl.where(kept, tl.exp(b_z - m[:, None]), 0.0), axis=1)
    return s


@triton.jit
def _kept_stats(p_z, m_r, search, t, k, top_p, V, HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    """Max m (0 for an empty row), sum of exp(z - m) over the kept set (1 when it is empty), keep threshold thr
    (int key: z is kept iff key(z) >= thr) and first argmax of rows p_z [R] (rows m_r, z = logits / t).

    `search` [R] marks the rows that need the top-k / top-p threshold (sampled rows); k and top_p are [R]. The
    statistics stream V in BLOCK_V chunks, each search pass in BLOCK_S chunks ([R, P, BLOCK_S] tiles). Min-p is
    `_min_p_cut`, after this.
    """
    m, s, amax, z_min = _row_stats(p_z, m_r, t, V, BLOCK_R, BLOCK_V)
    key_max = _order_key(m)
    m = tl.where(m == float("-inf"), 0.0, m)
    thr = _order_key(z_min)
    if HAS_TOP_K:
        thr, s = _top_k_key(p_z, t, m, s, thr, key_max, k, search, V, BLOCK_R, BLOCK_S)
    if HAS_TOP_P:
        thr, s = _top_p_key(p_z, t, m, s, thr, key_max, top_p, search, V, BLOCK_R, BLOCK_S)
    return m, tl.where(s > 0.0, s, 1.0), thr, amax


@triton.jit
def _min_p_cut(p_z, search, t, m, s, thr, min_p_ptr, min_p_value, o_b, mask, V, MIN_P_PER_ROW: tl.constexpr,
               BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """(s, thr) of `_kept_stats` after min-p: rows `search` keep z >= m + log(min_p) too (top-k and top-p keep the
    max, so this is the min-p of their output); where that raises the threshold, the kept sum is recomputed in one
    pass (unconditional: a branch around it made ptxas spill in the tree kernel; rows it does not raise load
    nothing). log(min_p) is read here (per row from min_p_ptr, else the argument min_p_value), after the searches, so it
    holds no register through them."""
    # p >= min_p * max p  <=>  z >= max z + log(min_p); a scalar stays a kernel argument (no register)
    if MIN_P_PER_ROW:
        thr_min = _order_key(m + tl.load(min_p_ptr + o_b, mask=mask, other=float("-inf")))
    else:
        thr_min = _order_key(m + min_p_value)
    raised = search & (thr_min > thr)
    thr = tl.where(raised, thr_min, thr)
    s = tl.where(raised, _kept_mass(p_z, raised, t, m, thr, V, BLOCK_R, BLOCK_V), s)
    return s, thr
