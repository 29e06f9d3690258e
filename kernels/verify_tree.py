"""Fused Triton tree verification: SpecInfer multi-candidate rejection over a token tree, equal to the reference.

Words: node 0 of a row's tree is the *root* (the last accepted token); every other node is a *draft* token whose
parent has a lower index. A walk from the root *accepts* one child per level; when every child of the current
node is rejected (or it is a leaf) the row emits a *recovered* token from the residual, or a *bonus* token
sampled from p at a leaf. Sampled rows follow SpecInfer (Miao et al. 2023, arXiv 2305.09781): children of node i
are tested in index order, child c accepted iff u_c q(c) < p(c), and after each rejection
p <- norm(max(p - q, 0)); greedy rows accept the child equal to the target argmax (vLLM/SGLang `verify_tree_greedy`).

One launch, grid over row tiles (one row per program on CUDA; many rows per program under the interpreter), no
host synchronisation. Per step of the walk, a program:
1. streams the current node's logits in BLOCK_V chunks: online max / sum of exp / first argmax (the LSE), then,
   with top-k / top-p, a sort-free threshold search over order-preserving int keys (16 pivots a pass, 8 passes),
   the semantics of `fastspec.kernels.sampling` (top-k keeps z >= the k-th largest; top-p keeps z when the mass strictly
   above it is < top_p);
2. writes the node's p to a [B, V] fp32 workspace row (the residual r, with mass z = 1);
3. scans the children: O(N) scalar loads each; a rejection either zeroes r[c] (one-hot q) or rewrites the row as
   max(r / z - q, 0) in one pass over V (draft probabilities);
4. descends into the accepted child, or runs the exponential race argmax_v r_v / E_v (p_v / E_v when r is all
   zero) over the row and stops.
Traffic per visited node: (1 + 16 with top-k and top-p) V logits reads, V workspace writes; one V pass per
rejection with draft probabilities; one race pass (V workspace + V noise + V logits) per row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastspec.kernels._host import _FLOATS, _INTS, _check_logits, _check_tensor, _row_param_arg, _unit_stride
from fastspec.kernels.reference import draw_randomness
from fastspec.kernels.sampling_filters import (
    _PIVOTS,
    _SEARCH_PASSES,
    _load_z,
    _narrow,
    _order_key,
    _pivot_pass,
    _pivots,
    _row_param,
    _row_stats,
)

__all__ = ["verify_tree"]


@triton.jit
def _node_stats(
    p_z, m_r, search, t, k, top_p, V,
    HAS_TOP_K: tl.constexpr, HAS_TOP_P: tl.constexpr, PIVOTS: tl.constexpr, PASSES: tl.constexpr,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    """Max, kept-set sum of exp(z - max), keep threshold (int key) and first argmax of rows p_z [R].

    `search` [R] marks rows that need the top-k / top-p threshold (sampled rows); the kept set is key(z) >= thr.
    """
    m, s, amax, z_min = _row_stats(p_z, m_r, t, V, BLOCK_B, BLOCK_V)
    m = tl.where(m == float("-inf"), 0.0, m)
    key_max = _order_key(m)

    # top-k: the largest key kth with #{key >= kth} >= k, searched in [lo, hi); s_lo = sum exp over key >= lo
    key_min = _order_key(z_min)
    lo = key_min
    s_lo = s
    if HAS_TOP_K:
        hi = tl.where(search & (k > 0) & (k < V), key_max + 1, lo + 1)
        for _ in range(PASSES):
            active = hi - lo > 1
            piv = _pivots(lo, hi, PIVOTS)  # [R, P]
            cnt, mass, _up, _down = _pivot_pass(
                p_z, t, m, key_min, piv, active, V, False, False, PIVOTS, BLOCK_B, BLOCK_S
            )
            lo, s_lo, hi = _narrow(cnt >= k[:, None], active, lo, s_lo, hi, piv, piv, mass, PIVOTS)
    thr = lo

    # top-p on the top-k set: the smallest key thr with g(thr) = sum exp over kept keys > thr < top_p * sum,
    # searched in (lo, hi] with s_lo = g(lo); once hi = lo + 1, g(lo) is the sum over key >= thr
    if HAS_TOP_P:
        kth = thr
        target = top_p * s_lo
        lo = kth - 1
        hi = tl.where(search & (top_p < 1.0), key_max, kth)
        for _ in range(PASSES):
            active = hi - lo > 1
            piv = _pivots(lo, hi, PIVOTS)
            _cnt, mass, _up, _down = _pivot_pass(p_z, t, m, kth, piv, active, V, True, False, PIVOTS, BLOCK_B, BLOCK_S)
            lo, s_lo, hi = _narrow(mass >= target[:, None], active, lo, s_lo, hi, piv, piv, mass, PIVOTS)
        thr = hi
    return m, tl.where(s_lo > 0.0, s_lo, 1.0), thr, amax


@triton.jit
def _probs(b_z, m, s, thr):
    """p of a chunk: exp(z - max) / kept sum over the kept set (key >= thr), 0 elsewhere."""
    b_p = tl.math.div_rn(tl.exp(b_z - m[:, None]), s[:, None])
    return tl.where(_order_key(b_z) >= thr[:, None], b_p, 0.0)


@triton.jit
def _write_probs(p_ws, p_z, m_r, t, m, s, thr, V, BLOCK_V: tl.constexpr):
    """Workspace rows p_ws [R] <- p of the current node (rows m_r)."""
    for v0 in range(0, V, BLOCK_V):
        b_z, m_z = _load_z(p_z, m_r, t, v0, V, BLOCK_V)
        o_v = v0 + tl.arange(0, BLOCK_V)
        tl.store(p_ws[:, None] + o_v[None, :], _probs(b_z, m, s, thr), mask=m_z)


@triton.jit(do_not_specialize=["B", "N", "D"])
def _verify_tree_kernel(
    logits_ptr,  # [B, N, V] fp32/bf16/fp16, unit stride along V
    tokens_ptr,  # [B, N] int
    parents_ptr,  # [B, N] int
    q_ptr,  # [B, N, V] draft probabilities, or unused
    u_ptr,  # [B, N] fp32 in (0, 1]
    noise_ptr,  # [B, V] fp32 > 0
    ws_ptr,  # [B, V] fp32 workspace: the residual r of the current node
    out_ptr,  # [B, D+1] int64 out
    num_accepted_ptr,  # [B] int64 out
    accept_index_ptr,  # [B, max(D, 1)] int64 out, row stride stride_ab
    temp_ptr,
    temp_value,
    top_k_ptr,
    top_k_value,
    top_p_ptr,
    top_p_value,
    B,
    N,
    V,
    D,
    stride_lb,
    stride_ln,
    stride_tb,
    stride_pb,
    stride_qb,
    stride_qn,
    stride_ub,
    stride_eb,
    stride_ab,
    HAS_DRAFT_PROBS: tl.constexpr,
    TEMP_PER_ROW: tl.constexpr,
    HAS_TOP_K: tl.constexpr,
    TOP_K_PER_ROW: tl.constexpr,
    HAS_TOP_P: tl.constexpr,
    TOP_P_PER_ROW: tl.constexpr,
    PIVOTS: tl.constexpr,
    PASSES: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    i_bt = tl.program_id(0)
    o_b = i_bt * BLOCK_B + tl.arange(0, BLOCK_B)
    m_b = o_b < B
    o_b64 = o_b.to(tl.int64)
    temp = _row_param(temp_ptr, temp_value, o_b, m_b, TEMP_PER_ROW, tl.float32, BLOCK_B)
    greedy = temp <= 0.0
    t = tl.where(greedy, 1.0, temp)
    k = tl.zeros([BLOCK_B], dtype=tl.int32)
    top_p = tl.zeros([BLOCK_B], dtype=tl.float32)
    if HAS_TOP_K:
        k = _row_param(top_k_ptr, top_k_value, o_b, m_b, TOP_K_PER_ROW, tl.int32, BLOCK_B)
    if HAS_TOP_P:
        top_p = _row_param(top_p_ptr, top_p_value, o_b, m_b, TOP_P_PER_ROW, tl.float32, BLOCK_B)
    p_ws = ws_ptr + o_b64 * V
    p_tok = tokens_ptr + o_b64 * stride_tb
    p_par = parents_ptr + o_b64 * stride_pb
    p_e = noise_ptr + o_b64 * stride_eb

    cur = tl.zeros([BLOCK_B], dtype=tl.int32)  # current node
    n_acc = tl.zeros([BLOCK_B], dtype=tl.int32)  # accepted drafts so far
    n_fin = tl.zeros([BLOCK_B], dtype=tl.int32)  # accepted drafts of rows that stopped
    active = m_b
    while tl.max(active.to(tl.int32), axis=0) > 0:
        sampled = active & ~greedy
        p_z = logits_ptr + o_b64 * stride_lb + cur.to(tl.int64) * stride_ln
        m, s, thr, amax = _node_stats(
            p_z, active, sampled, t, k, top_p, V,
            HAS_TOP_K, HAS_TOP_P, PIVOTS, PASSES, BLOCK_B, BLOCK_V, BLOCK_S,
        )  # fmt: skip
        _write_probs(p_ws, p_z, sampled, t, m, s, thr, V, BLOCK_V)
        tl.debug_barrier()  # the workspace row is read by other threads below
        z = tl.full([BLOCK_B], 1.0, tl.float32)

        # scan the children of the current node in index order; stop at the first accepted one
        nxt = tl.full([BLOCK_B], -1, tl.int32)
        can_grow = active & (n_acc < D)
        for j in range(1, N):
            par = tl.load(p_par + j, mask=can_grow, other=-1).to(tl.int32)
            x = tl.load(p_tok + j, mask=can_grow, other=-1).to(tl.int32)
            child = can_grow & (nxt < 0) & (par == cur) & (cur < j) & (x >= 0) & (x < V)
            if tl.max(child.to(tl.int32), axis=0) > 0:
                x = tl.where(child, x, 0)
                test = child & ~greedy
                r_x = tl.load(p_ws + x, mask=test, other=0.0)
                if HAS_DRAFT_PROBS:
                    p_q = q_ptr + o_b64 * stride_qb + cur.to(tl.int64) * stride_qn
                    q_x = tl.load(p_q + x, mask=test, other=0.0).to(tl.float32)
                else:
                    q_x = tl.full([BLOCK_B], 1.0, tl.float32)
                u = tl.load(u_ptr + o_b64 * stride_ub + j, mask=test, other=1.0)
                # strict comparison with u in (0, 1]: a token with p(x) = 0 is never accepted
                accept = child & tl.where(greedy, x == amax, (q_x > 0.0) & (u * q_x < tl.math.div_rn(r_x, z)))
                nxt = tl.where(accept, j, nxt)
                reject = test & ~accept
                if tl.max(reject.to(tl.int32), axis=0) > 0:
                    if HAS_DRAFT_PROBS:
                        # SpecInfer residual against the siblings' common q: r <- max(r / z - q, 0)
                        z_new = tl.zeros([BLOCK_B], dtype=tl.float32)
                        for v0 in range(0, V, BLOCK_V):
                            o_v = v0 + tl.arange(0, BLOCK_V)
                            m_v = reject[:, None] & (o_v < V)[None, :]
                            b_r = tl.load(p_ws[:, None] + o_v[None, :], mask=m_v, other=0.0)
                            b_q = tl.load(p_q[:, None] + o_v[None, :], mask=m_v, other=0.0).to(tl.float32)
                            b_r = tl.maximum(tl.math.div_rn(b_r, z[:, None]) - b_q, 0.0)
                            tl.store(p_ws[:, None] + o_v[None, :], b_r, mask=m_v)
                            z_new += tl.sum(tl.where(m_v, b_r, 0.0), axis=1)
                    else:  # one-hot q: zero the rejected token
                        tl.store(p_ws + x, 0.0, mask=reject)
                        z_new = z - r_x
                    # nothing left: fall back to p
                    degenerate = reject & (z_new <= 0.0)
                    z = tl.where(reject, tl.where(degenerate, 1.0, z_new), z)
                    tl.debug_barrier()
                    if tl.max(degenerate.to(tl.int32), axis=0) > 0:
                        _write_probs(p_ws, p_z, degenerate, t, m, s, thr, V, BLOCK_V)
                        tl.debug_barrier()

        # an accepted child becomes the current node
        grow = nxt >= 0
        x_acc = tl.load(p_tok + tl.maximum(nxt, 0), mask=grow, other=-1).to(tl.int64)
        tl.store(out_ptr + o_b64 * (D + 1) + n_acc, x_acc, mask=grow)
        tl.store(accept_index_ptr + o_b64 * stride_ab + n_acc, nxt.to(tl.int64), mask=grow)

        # the other rows emit the final token: argmax, or the exponential race over r (p when r is all zero)
        stop = active & ~grow
        final = amax
        race = stop & ~greedy
        if tl.max(race.to(tl.int32), axis=0) > 0:
            best_r = tl.full([BLOCK_B], -1.0, tl.float32)
            best_p = tl.full([BLOCK_B], -1.0, tl.float32)
            idx_r = tl.zeros([BLOCK_B], dtype=tl.int32)
            idx_p = tl.zeros([BLOCK_B], dtype=tl.int32)
            for v0 in range(0, V, BLOCK_V):
                b_z, m_v = _load_z(p_z, race, t, v0, V, BLOCK_V)
                o_v = v0 + tl.arange(0, BLOCK_V)
                b_e = tl.load(p_e[:, None] + o_v[None, :], mask=m_v, other=1.0)
                b_r = tl.load(p_ws[:, None] + o_v[None, :], mask=m_v, other=0.0)
                v_r = tl.where(m_v, tl.math.div_rn(b_r, b_e), -1.0)
                v_p = tl.where(m_v, tl.math.div_rn(_probs(b_z, m, s, thr), b_e), -1.0)
                c_r = tl.max(v_r, axis=1)
                c_p = tl.max(v_p, axis=1)
                idx_r = tl.where(c_r > best_r, v0 + tl.argmax(v_r, axis=1), idx_r)
                idx_p = tl.where(c_p > best_p, v0 + tl.argmax(v_p, axis=1), idx_p)
                best_r = tl.maximum(best_r, c_r)
                best_p = tl.maximum(best_p, c_p)
            final = tl.where(greedy, amax, tl.where(best_r > 0.0, idx_r, idx_p))
        tl.store(out_ptr + o_b64 * (D + 1) + n_acc, final.to(tl.int64), mask=stop)
        tl.store(num_accepted_ptr + o_b, n_acc.to(tl.int64), mask=stop)
        n_fin = tl.where(stop, n_acc, n_fin)

        n_acc += grow.to(tl.int32)
        cur = tl.where(grow, nxt, cur)
        active = grow
        tl.debug_barrier()  # the next node's probabilities overwrite the workspace

    # -1 padding after each row's final token (and after its accepted path in accept_index)
    for c0 in range(0, D + 1, BLOCK_O):
        o_c = c0 + tl.arange(0, BLOCK_O)
        pad = m_b[:, None] & (o_c[None, :] > n_fin[:, None]) & (o_c < D + 1)[None, :]
        tl.store(out_ptr + o_b64[:, None] * (D + 1) + o_c[None, :], -1, mask=pad)
        pad = m_b[:, None] & (o_c[None, :] >= n_fin[:, None]) & (o_c < D)[None, :]
        tl.store(accept_index_ptr + o_b64[:, None] * stride_ab + o_c[None, :], -1, mask=pad)


def _verify_tree(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: float | torch.Tensor,
    top_k: int | torch.Tensor | None,
    top_p: float | torch.Tensor | None,
    uniforms: torch.Tensor,
    noise: torch.Tensor,
    max_depth: int,
    max_block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host wrapper: validate, pick the tiles and launch the kernel. Reads no tensor value on the host.

    `max_block_v` caps the V chunk (tests use it to force many chunks).
    """
    batch, n, vocab = target_logits.shape
    device = target_logits.device
    _check_tensor(tokens, "tokens", (batch, n), _INTS, device)
    _check_tensor(parents, "parents", (batch, n), _INTS, device)
    if draft_probs is not None:
        _check_tensor(draft_probs, "draft_probs", (batch, n, vocab), _FLOATS, device)
        draft_probs = _unit_stride(draft_probs)
    _check_tensor(uniforms, "uniforms", (batch, n), _FLOATS + (torch.float64,), device)
    _check_tensor(noise, "noise", (batch, vocab), _FLOATS + (torch.float64,), device)
    target_logits, tokens, parents = _unit_stride(target_logits), _unit_stride(tokens), _unit_stride(parents)
    uniforms, noise = _unit_stride(uniforms.float()), _unit_stride(noise.float())
    temp_t, temp_v = _row_param_arg(temperature, "temperature", batch, device, torch.float32)
    k_t, k_v = _row_param_arg(top_k, "top_k", batch, device, torch.int32)
    p_t, p_v = _row_param_arg(top_p, "top_p", batch, device, torch.float32)

    workspace = torch.empty(batch, vocab, dtype=torch.float32, device=device)
    out = torch.empty(batch, max_depth + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    accept_index = torch.empty(batch, max(max_depth, 1), dtype=torch.int64, device=device)
    interpreted = not isinstance(_verify_tree_kernel, triton.runtime.JITFunction)
    block_v = min(triton.next_power_of_2(vocab), max_block_v or (4096 if interpreted else 1024))
    # CUDA: one row per program (the walk is serial); the interpreter vectorises many rows with numpy
    block_b = min(triton.next_power_of_2(batch), max(1, 16384 // block_v)) if interpreted else 1
    # search tiles [BLOCK_B, PIVOTS, BLOCK_S]: register-sized on CUDA, whole rows for numpy
    block_s = block_v if interpreted else min(block_v, 8192 // _PIVOTS)
    q = draft_probs if draft_probs is not None else target_logits

    def ptr(x):
        return x if x is not None else target_logits

    _verify_tree_kernel[(triton.cdiv(batch, block_b),)](
        target_logits, tokens, parents, q, uniforms, noise, workspace, out, num_accepted, accept_index,
        ptr(temp_t), float(temp_v), ptr(k_t), int(k_v or 0), ptr(p_t), float(p_v if p_v is not None else 1.0),
        batch, n, vocab, max_depth,
        target_logits.stride(0), target_logits.stride(1), tokens.stride(0), parents.stride(0),
        q.stride(0), q.stride(1), uniforms.stride(0), noise.stride(0), accept_index.stride(0),
        HAS_DRAFT_PROBS=draft_probs is not None, TEMP_PER_ROW=temp_t is not None,
        HAS_TOP_K=top_k is not None, TOP_K_PER_ROW=k_t is not None,
        HAS_TOP_P=top_p is not None, TOP_P_PER_ROW=p_t is not None,
        PIVOTS=_PIVOTS, PASSES=_SEARCH_PASSES, BLOCK_B=block_b, BLOCK_V=block_v, BLOCK_S=block_s, BLOCK_O=16,
        num_warps=4,
    )  # fmt: skip
    return out, num_accepted, accept_index[:, :max_depth]


def verify_tree(
    target_logits: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    temperature: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
    seed: int | torch.Generator | None = None,
    max_depth: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a token tree against the target in one fused Triton launch.

    Same arguments and results as `fastspec.kernels.reference.verify_tree`, token for token given the same
    `uniforms` and `noise` (or the same `seed`, drawn with the same `draw_randomness`).

    Args:
        target_logits: [B, N, V] fp32/bf16/fp16 target logits at every node (row i scores node i's children);
            upcast in registers, any strides with unit stride along V.
        tokens: [B, N] int32/int64 node tokens (the root's is not read); out of [0, V) marks a padded node.
        parents: [B, N] int32/int64 parent per node, < the node's index; the root and padded nodes: negative.
        draft_probs: [B, N, V] fp32/bf16/fp16, draft_probs[b, i] the distribution node i's children were drawn
            from (i.i.d.), or None for deterministic children (the draft's top-k, greedy trees).
        temperature: float >= 0 or [B]; 0 marks a greedy row (argmax matches, argmax emitted).
        top_k: int, [B] or None; <= 0 or >= V keeps every token.
        top_p: float in (0, 1], [B] or None; >= 1 keeps every token.
        uniforms: [B, N] in (0, 1], one acceptance coin per node (fp32; fp64 is rounded to fp32).
        noise: [B, V] > 0, Exp(1) noise for the exponential race (fp32; fp64 is rounded to fp32).
        seed: int, torch.Generator or None, used to draw `uniforms` and `noise` when either is missing.
        max_depth: D >= 0, the most drafts a row may accept (None: N - 1); sizes the outputs without a host sync.

    Returns:
        out_tokens: [B, D+1] int64, accepted path tokens then the recovered or bonus token, padded with -1.
        num_accepted: [B] int64, accepted drafts per row (the row emits num_accepted + 1 tokens).
        accept_index: [B, D] int64, node index of each accepted draft, padded with -1.

    Example:
        >>> logits = torch.randn(2, 7, 151936, device="cuda")
        >>> parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]] * 2, device="cuda")
        >>> out, n, path = verify_tree(logits, tokens, parents, temperature=0.0)
    """
    _check_logits(target_logits, "[B, N, V] with N >= 1")
    batch, n, vocab = target_logits.shape
    if max_depth is None:
        max_depth = n - 1
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be an int >= 0 or None, got {max_depth!r}")
    if uniforms is None or noise is None:
        uniforms, noise = draw_randomness(batch, n, vocab, seed, target_logits.device)
    return _verify_tree(
        target_logits, tokens, parents, draft_probs, temperature, top_k, top_p, uniforms, noise, max_depth
    )
