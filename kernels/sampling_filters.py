"""Triton building blocks of temperature, top-k and top-p, shared by the chain and tree verification kernels.

Logits are streamed in chunks as z = logits / temperature (fp32, `_load_z`); `_row_stats` gives the row max, sum
of exp and first argmax in one online pass. The top-k / top-p thresholds are found without sorting: z is mapped
to order-preserving int keys (`_order_key`) and each pass over the row (`_pivot_pass`) tests `_PIVOTS` pivot keys
spread over the current bracket (`_pivots`), which `_narrow` then shrinks around the threshold. The semantics are
those of `fastspec.kernels.sampling`: top-k keeps z >= the k-th largest z; top-p then keeps z iff the mass of the tokens
strictly more probable than z is < top_p.
"""

from __future__ import annotations

import triton
import triton.language as tl

_PIVOTS = 16  # thresholds tested per search pass: each pass shrinks the key interval ~17x
_SEARCH_PASSES = 8  # bound: 2**32 keys -> 1 in 8 passes of 16 pivots (test_search_passes_suffice); usually fewer


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
def _pivots(lo, hi, PIVOTS: tl.constexpr):
    """PIVOTS keys [R, P] spread evenly over [lo, hi), ascending."""
    o_p = tl.arange(0, PIVOTS)
    return lo[:, None] + ((hi - lo)[:, None] * (o_p[None, :] + 1)) // (PIVOTS + 1)


@triton.jit
def _pivot_pass(p_z, t, m_safe, floor, piv, active, V, TOP_P: tl.constexpr, NEAREST: tl.constexpr,
                PIVOTS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """One pass over rows p_z [R] (z = logits / t) against pivots piv [R, P]. For each pivot: the sum of
    exp(z - m) (keys below `floor` weigh 0) of the keys >= piv, or > piv for TOP_P, and for top-k (not TOP_P)
    their count. With NEAREST also the smallest such key and the largest key not above it, which let the search
    jump to keys and stop as soon as it is exact (else these are returned as +-2**40)."""
    cnt = tl.zeros([BLOCK_R, PIVOTS], dtype=tl.int32)
    mass = tl.zeros([BLOCK_R, PIVOTS], dtype=tl.float32)
    up = tl.full([BLOCK_R, PIVOTS], 2**40, tl.int64)
    down = tl.full([BLOCK_R, PIVOTS], -(2**40), tl.int64)
    for v0 in range(0, V, BLOCK_V):
        b_z, m_z = _load_z(p_z, active, t, v0, V, BLOCK_V)
        b_key = tl.where(m_z, _order_key(b_z), -(2**40))
        b_e = tl.where(b_key >= floor[:, None], tl.exp(b_z - m_safe[:, None]), 0.0)
        if TOP_P:
            above = b_key[:, None, :] > piv[:, :, None]  # [R, P, BV]
        else:
            above = b_key[:, None, :] >= piv[:, :, None]
            cnt += tl.sum(above.to(tl.int32), axis=2)
        mass += tl.sum(tl.where(above, b_e[:, None, :], 0.0), axis=2)
        if NEAREST:
            up = tl.minimum(up, tl.min(tl.where(above, b_key[:, None, :], 2**40), axis=2))
            down = tl.maximum(down, tl.max(tl.where(above, -(2**40), b_key[:, None, :]), axis=2))
    return cnt, mass, up, down


@triton.jit
def _narrow(ok, active, lo, s_lo, hi, lo_at, hi_at, mass, PIVOTS: tl.constexpr):
    """One bracket step of rows `active`: `ok` [R, P] holds for a prefix of the pivots (counts and masses fall as
    pivots rise). lo moves to lo_at [R, P] and s_lo to mass [R, P] of the last pivot that holds, hi to hi_at of
    the first that does not; rows where no pivot holds (or all do) keep lo (hi). Returns lo, s_lo, hi."""
    o_p = tl.arange(0, PIVOTS)
    n_ok = tl.sum(ok.to(tl.int32), axis=1)
    at_lo = o_p[None, :] == (n_ok - 1)[:, None]
    at_hi = o_p[None, :] == n_ok[:, None]
    move_lo = active & (n_ok > 0)
    lo_new = tl.where(move_lo, tl.sum(tl.where(at_lo, lo_at, 0), axis=1), lo)
    s_new = tl.where(move_lo, tl.sum(tl.where(at_lo, mass, 0.0), axis=1), s_lo)
    hi_new = tl.where(active & (n_ok < PIVOTS), tl.sum(tl.where(at_hi, hi_at, 0), axis=1), hi)
    return lo_new, s_new, hi_new
