"""Fused Triton tree verification: SpecInfer multi-candidate rejection over a token tree, equal to the reference.

Words: node 0 of a row's tree is the *root* (the last accepted token); every other node is a *draft* token whose
parent has a lower index. A walk from the root *accepts* one child per level; when every child of the current
node is rejected (or it is a leaf) the row emits a *recovered* token from the residual, or a *bonus* token
sampled from p at a leaf. Sampled rows follow SpecInfer (Miao et al. 2023, arXiv 2305.09781): children of node i
are tested in index order, child c accepted iff u_c q(c) < p(c), and after each rejection
p <- norm(max(p - q, 0)); greedy rows accept the child equal to the target argmax (vLLM/SGLang `verify_tree_greedy`).

One launch, grid over row tiles (one row per program on CUDA; many rows per program under the interpreter), no
host synchronisation. Per step of the walk, a program (`_verify_tree_kernel`):
1. streams the current node's logits in BLOCK_V chunks (`_kept_stats`): online max / sum of exp / first argmax,
   then, with top-k / top-p, the sort-free threshold search of `fastspec.kernels.sampling_filters` (16 pivots a
   pass, jumping onto data keys, exact after at most 8 passes per filter), the semantics of
   `fastspec.kernels.sampling` (top-k keeps z >= the k-th largest; top-p keeps z when the mass strictly above it
   is < top_p; min-p then keeps z >= max z + log(min_p), one more pass for the kept sum);
2. writes the node's p to a [B, V] fp32 workspace row (`_write_probs`: the residual r, with mass z = 1);
3. scans the children (`_scan_children`, `_test_child`): O(N) scalar loads each; a rejection (`_reject`) either
   zeroes r[c] (one-hot q) or rewrites the row as max(r / z - q, 0) in one pass over V (draft probabilities);
4. descends into the accepted child, or emits the argmax or the winner of the exponential race argmax_v r_v / E_v
   (p_v / E_v when r is all zero) over the row (`_final_token`) and stops; `_pad` writes the -1 padding at the end.
Traffic per visited node: (1 + up to 16 search passes with top-k and top-p) V logits reads, V workspace writes;
one V pass per rejection with draft probabilities; one race pass (V workspace + V noise + V logits) per row.

Importing this module imports Triton and defines the kernel: on a machine without CUDA set TRITON_INTERPRET=1
before that (`fastspec.verify` imports it on the first kernel call).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastspec.kernels._host import check_index, check_logits, check_verify_args, launch_for, ptr, walk_tiles
from fastspec.kernels.randomness import draw_randomness
from fastspec.kernels.sampling_filters import (
    _filter_params,
    _kept_stats,
    _load_z,
    _min_p_cut,
    _order_key,
    _temperature,
)

__all__ = ["verify_tree"]


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


@triton.jit
def _subtract_q(p_ws, p_q, reject, z, V, BLOCK_V: tl.constexpr):
    """SpecInfer residual against the siblings' common q, rows `reject`: r <- max(r / z - q, 0); returns sum(r)."""
    z_new = tl.zeros(z.shape, dtype=tl.float32)
    for v0 in range(0, V, BLOCK_V):
        o_v = v0 + tl.arange(0, BLOCK_V)
        m_v = reject[:, None] & (o_v < V)[None, :]
        b_r = tl.load(p_ws[:, None] + o_v[None, :], mask=m_v, other=0.0)
        b_q = tl.load(p_q[:, None] + o_v[None, :], mask=m_v, other=0.0).to(tl.float32)
        b_r = tl.maximum(tl.math.div_rn(b_r, z[:, None]) - b_q, 0.0)
        tl.store(p_ws[:, None] + o_v[None, :], b_r, mask=m_v)
        z_new += tl.sum(tl.where(m_v, b_r, 0.0), axis=1)
    return z_new


@triton.jit
def _reject(reject, x, r_x, z, p_ws, p_z, p_q, t, m, s, thr, V, HAS_DRAFT_PROBS: tl.constexpr,
            BLOCK_V: tl.constexpr):  # fmt: skip
    """Residual after rejecting token x [R] of rows `reject`: r <- max(r / z - q, 0) with draft probabilities,
    else r[x] <- 0 (one-hot q); a residual with nothing left falls back to p. Returns the new mass z [R]."""
    if HAS_DRAFT_PROBS:
        z_new = _subtract_q(p_ws, p_q, reject, z, V, BLOCK_V)
    else:
        tl.store(p_ws + x, 0.0, mask=reject)
        z_new = z - r_x
    degenerate = reject & (z_new <= 0.0)
    z = tl.where(reject, tl.where(degenerate, 1.0, z_new), z)
    tl.debug_barrier()
    if tl.max(degenerate.to(tl.int32), axis=0) > 0:
        _write_probs(p_ws, p_z, degenerate, t, m, s, thr, V, BLOCK_V)
        tl.debug_barrier()
    return z


@triton.jit
def _test_child(j, x, child, nxt, z, p_u, p_ws, p_z, p_q, greedy, amax, t, m, s, thr, V,
                HAS_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """Test child j (token x [R], rows `child`) against the residual r / z; an accepted child becomes `nxt`, a
    rejected one updates the residual. Returns (nxt, z)."""
    test = child & ~greedy
    r_x = tl.load(p_ws + x, mask=test, other=0.0)
    if HAS_DRAFT_PROBS:
        q_x = tl.load(p_q + x, mask=test, other=0.0).to(tl.float32)
    else:
        q_x = tl.full(z.shape, 1.0, tl.float32)
    u = tl.load(p_u + j, mask=test, other=1.0)
    # strict comparison with u in (0, 1]: a token with p(x) = 0 is never accepted
    accept = child & tl.where(greedy, x == amax, (q_x > 0.0) & (u * q_x < tl.math.div_rn(r_x, z)))
    reject = test & ~accept
    if tl.max(reject.to(tl.int32), axis=0) > 0:
        z = _reject(reject, x, r_x, z, p_ws, p_z, p_q, t, m, s, thr, V, HAS_DRAFT_PROBS, BLOCK_V)
    return tl.where(accept, j, nxt), z


@triton.jit
def _scan_children(p_tok, p_par, p_u, p_ws, p_z, p_q, can_grow, greedy, cur, amax, t, m, s, thr, N, V,
                   HAS_DRAFT_PROBS: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The accepted child of node `cur` [R] (-1: none) of rows `can_grow`: children tested in index order, the
    first accepted one wins. The residual starts as the node's p in the workspace rows p_ws, with mass 1."""
    nxt = tl.full(cur.shape, -1, tl.int32)
    z = tl.full(cur.shape, 1.0, tl.float32)
    for j in range(1, N):
        par = tl.load(p_par + j, mask=can_grow, other=-1).to(tl.int32)
        x = tl.load(p_tok + j, mask=can_grow, other=-1).to(tl.int32)
        child = can_grow & (nxt < 0) & (par == cur) & (cur < j) & (x >= 0) & (x < V)
        if tl.max(child.to(tl.int32), axis=0) > 0:
            x = tl.where(child, x, 0)
            nxt, z = _test_child(j, x, child, nxt, z, p_u, p_ws, p_z, p_q, greedy, amax, t, m, s, thr, V,
                                 HAS_DRAFT_PROBS, BLOCK_V)  # fmt: skip
    return nxt


@triton.jit
def _race(p_z, p_ws, p_e, race, t, m, s, thr, V, BLOCK_V: tl.constexpr):
    """Exponential race of rows `race`: argmax_v r_v / E_v over the residual r, or p_v / E_v when r is all zero."""
    best_r = tl.full(race.shape, -1.0, tl.float32)
    best_p = tl.full(race.shape, -1.0, tl.float32)
    idx_r = tl.zeros(race.shape, dtype=tl.int32)
    idx_p = tl.zeros(race.shape, dtype=tl.int32)
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
    return tl.where(best_r > 0.0, idx_r, idx_p)


@triton.jit
def _final_token(p_z, p_ws, p_e, stop, greedy, amax, t, m, s, thr, V, BLOCK_V: tl.constexpr):
    """The token rows `stop` emit at the current node: the argmax (greedy rows) or the race's winner."""
    final = amax
    race = stop & ~greedy
    if tl.max(race.to(tl.int32), axis=0) > 0:
        final = tl.where(greedy, amax, _race(p_z, p_ws, p_e, race, t, m, s, thr, V, BLOCK_V))
    return final


@triton.jit
def _pad(p_out, p_idx, m_b, n_fin, D, BLOCK_O: tl.constexpr):
    """-1 after each row's final token in out [R, D+1] and after its accepted path in accept_index [R, D]."""
    for c0 in range(0, D + 1, BLOCK_O):
        o_c = c0 + tl.arange(0, BLOCK_O)
        pad = m_b[:, None] & (o_c[None, :] > n_fin[:, None]) & (o_c < D + 1)[None, :]
        tl.store(p_out[:, None] + o_c[None, :], -1, mask=pad)
        pad = m_b[:, None] & (o_c[None, :] >= n_fin[:, None]) & (o_c < D)[None, :]
        tl.store(p_idx[:, None] + o_c[None, :], -1, mask=pad)


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
    min_p_ptr,  # [B] fp32 log(min_p), or unused
    min_p_value,  # log(min_p) of every row
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
    HAS_MIN_P: tl.constexpr,
    MIN_P_PER_ROW: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_O: tl.constexpr,
):
    i_bt = tl.program_id(0)
    o_b = i_bt * BLOCK_B + tl.arange(0, BLOCK_B)
    m_b = o_b < B
    o_b64 = o_b.to(tl.int64)
    greedy, t = _temperature(temp_ptr, temp_value, o_b, m_b, TEMP_PER_ROW, BLOCK_B)
    k, top_p = _filter_params(top_k_ptr, top_k_value, top_p_ptr, top_p_value, o_b, m_b,
                              HAS_TOP_K, TOP_K_PER_ROW, HAS_TOP_P, TOP_P_PER_ROW, BLOCK_B)  # fmt: skip
    p_ws = ws_ptr + o_b64 * V
    p_tok = tokens_ptr + o_b64 * stride_tb
    p_out = out_ptr + o_b64 * (D + 1)
    p_idx = accept_index_ptr + o_b64 * stride_ab

    cur = tl.zeros([BLOCK_B], dtype=tl.int32)  # current node
    n_acc = tl.zeros([BLOCK_B], dtype=tl.int32)  # accepted drafts so far
    n_fin = tl.zeros([BLOCK_B], dtype=tl.int32)  # accepted drafts of rows that stopped
    active = m_b
    while tl.max(active.to(tl.int32), axis=0) > 0:
        # the current node's p (temperature, top-k, top-p) into the workspace: the residual r, with mass 1
        p_z = logits_ptr + o_b64 * stride_lb + cur.to(tl.int64) * stride_ln
        p_q = q_ptr + o_b64 * stride_qb + cur.to(tl.int64) * stride_qn
        sampled = active & ~greedy
        m, s, thr, amax = _kept_stats(p_z, active, sampled, t, k, top_p, V, HAS_TOP_K, HAS_TOP_P,
                                      BLOCK_B, BLOCK_V, BLOCK_S)  # fmt: skip
        if HAS_MIN_P:
            s, thr = _min_p_cut(p_z, sampled, t, m, s, thr, min_p_ptr, min_p_value, o_b, m_b, V, MIN_P_PER_ROW,
                                BLOCK_B, BLOCK_V)  # fmt: skip
        _write_probs(p_ws, p_z, sampled, t, m, s, thr, V, BLOCK_V)
        tl.debug_barrier()  # the workspace row is read by other threads below

        nxt = _scan_children(p_tok, parents_ptr + o_b64 * stride_pb, u_ptr + o_b64 * stride_ub, p_ws, p_z, p_q,
                             active & (n_acc < D), greedy, cur, amax, t, m, s, thr, N, V,
                             HAS_DRAFT_PROBS, BLOCK_V)  # fmt: skip
        # an accepted child becomes the current node; the other rows emit the final token and stop
        grow = nxt >= 0
        stop = active & ~grow
        final = _final_token(p_z, p_ws, noise_ptr + o_b64 * stride_eb, stop, greedy, amax, t, m, s, thr, V, BLOCK_V)
        x_acc = tl.load(p_tok + tl.maximum(nxt, 0), mask=grow, other=-1)
        tl.store(p_out + n_acc, tl.where(grow, x_acc.to(tl.int64), final.to(tl.int64)), mask=active)
        tl.store(p_idx + n_acc, nxt.to(tl.int64), mask=grow)
        tl.store(num_accepted_ptr + o_b, n_acc.to(tl.int64), mask=stop)
        n_fin = tl.where(stop, n_acc, n_fin)
        n_acc += grow.to(tl.int32)
        cur = tl.where(grow, nxt, cur)
        active = grow
        tl.debug_barrier()  # the next node's probabilities overwrite the workspace

    _pad(p_out, p_idx, m_b, n_fin, D, BLOCK_O)


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
    min_p: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Host wrapper: validate, pick the tiles and launch the kernel. Reads no tensor value on the host.

    `max_block_v` caps the V chunk (tests use it to force many chunks).
    """
    batch, n, vocab = target_logits.shape
    device = target_logits.device
    tokens = check_index(tokens, "tokens", (batch, n), device)
    parents = check_index(parents, "parents", (batch, n), device)
    target_logits, draft_probs, uniforms, noise, sampling = check_verify_args(
        target_logits, draft_probs, uniforms, noise, temperature, top_k, top_p, positions=n, min_p=min_p
    )
    launch = launch_for(device)

    workspace = torch.empty(batch, vocab, dtype=torch.float32, device=device)
    out = torch.empty(batch, max_depth + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    accept_index = torch.empty(batch, max(max_depth, 1), dtype=torch.int64, device=device)
    if batch == 0:
        return out, num_accepted, accept_index[:, :max_depth]
    # CUDA: one row per program (the walk is serial); the interpreter vectorises many rows with numpy
    max_block_v = max_block_v or (4096 if launch.interpreted else 512)
    block_b, block_v, block_s = walk_tiles(batch, vocab, max_block_v, launch, pack=False)
    q = ptr(draft_probs, target_logits)
    # the top-k / top-p search's [rows, P, BLOCK_S] pivot tiles take up to ~250 registers a thread: 4 warps (8 cap
    # a thread at 128 under Triton 3.9 and spill); without them 8 warps (4 spilled a few bytes under Triton 3.6)
    warps = 4 if sampling.has_filter else 8
    _verify_tree_kernel[(triton.cdiv(batch, block_b),)](
        target_logits, tokens, parents, q, uniforms, noise, workspace, out, num_accepted, accept_index,
        *sampling.temperature_args(target_logits), *sampling.filter_args(target_logits),
        batch, n, vocab, max_depth,
        target_logits.stride(0), target_logits.stride(1), tokens.stride(0), parents.stride(0),
        q.stride(0), q.stride(1), uniforms.stride(0), noise.stride(0), accept_index.stride(0),
        HAS_DRAFT_PROBS=draft_probs is not None, **sampling.flags(),
        BLOCK_B=block_b, BLOCK_V=block_v, BLOCK_S=block_s, BLOCK_O=16, num_warps=warps,
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
    *,
    min_p: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a token tree against the target in one fused Triton launch.

    Same arguments (shapes, dtypes, semantics) and results as `fastspec.kernels.reference.verify_tree`, token for
    token given the same `uniforms` and `noise` (or the same `seed`, drawn with the same `draw_randomness`). Bad
    arguments raise TypeError / ValueError naming them (`kernels/_host.py`, shared with `verify_chain`). Logits
    and draft probabilities are upcast in registers and may have any strides with unit stride along V; fp64
    uniforms and noise are rounded to fp32. `max_depth` sizes the outputs without a host sync.

    Returns:
        out_tokens: [B, D+1] int64, accepted path tokens then the recovered or bonus token, padded with -1.
        num_accepted: [B] int64, accepted drafts per row (the row emits num_accepted + 1 tokens).
        accept_index: [B, D] int64, node index of each accepted draft, padded with -1.

    Example:
        >>> logits = torch.randn(2, 7, 151936, device="cuda")
        >>> parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]] * 2, device="cuda")
        >>> out, n, path = verify_tree(logits, tokens, parents, temperature=0.0)
    """
    check_logits(target_logits, "[B, N, V] with N >= 1")
    batch, n, vocab = target_logits.shape
    if max_depth is None:
        max_depth = n - 1
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be an int >= 0 or None, got {max_depth!r}")
    uniforms, noise = draw_randomness(batch, n, vocab, seed, target_logits.device, uniforms, noise)
    return _verify_tree(
        target_logits, tokens, parents, draft_probs, temperature, top_k, top_p, uniforms, noise, max_depth, min_p=min_p
    )
