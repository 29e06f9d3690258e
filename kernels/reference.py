"""Eager PyTorch reference of every fastspec kernel: the test oracle and the benchmark baseline.

Words (as in vLLM's rejection sampler):
- *draft tokens*: the K tokens the draft proposed for one row; a row may have fewer (`num_draft`).
- *accepted*: the leading draft tokens that survive verification.
- *recovered* token: sampled at the first rejected position from the residual norm(max(p - q, 0)).
- *bonus* token: sampled from p at position K when every draft token was accepted.

Chain speculative sampling: Leviathan et al. 2023 (arXiv 2211.17192), Chen et al. 2023 (arXiv 2302.01318).
Draft token x at position j is accepted when u_j * q_j(x) < p_j(x) (u_j uniform in (0, 1], strict, so a
token with p = 0 is never accepted), which accepts with probability min(1, p/q). Residual sampling uses the
exponential race: argmax_v r_v / E_v with E_v ~ Exp(1) draws v with probability r_v / sum(r), with no
normalising pass. A degenerate residual (p == q, sum r = 0) falls back to sampling p. Greedy rows
(temperature 0) compare the draft token with the target argmax, and emit the argmax.

Tree verification (`verify_tree`) generalises the chain to a token tree given by parent indices: SpecInfer's
multi-candidate recursive rejection (Miao et al. 2023, arXiv 2305.09781) for sampled rows, the deepest path of
argmax matches for greedy rows. `tree_mask` builds the tree-attention inputs (ancestor mask, depths, positions).

Randomness is an input (`uniforms`, `noise`) so the Triton kernels and this reference agree token for token;
`seed` draws both with `draw_randomness` (`fastspec.kernels.randomness`), the same function the kernel wrappers use.
`draw_randomness` and `TreeMask` (`fastspec.kernels.records`) are re-exported here.
"""

from __future__ import annotations

import torch

from fastspec.kernels.randomness import draw_randomness
from fastspec.kernels.records import TreeMask
from fastspec.kernels.sampling import as_row_param, sampling_probs

__all__ = ["TreeMask", "draw_randomness", "tree_mask", "verify_chain", "verify_tree"]


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
    *,
    min_p: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of draft tokens against the target, eagerly.

    Memory traffic: reads B(K+1)V target logits and BKV draft probs, materialises the fp32 probabilities
    (B(K+1)V written and read again) and one residual row per request.

    Args:
        target_logits: [B, K+1, V] fp32/bf16/fp16, target logits at the K draft positions and the bonus position.
        draft_tokens: [B, K] int32/int64, proposed tokens; entries at positions >= num_draft are ignored, and an
            out-of-range token is rejected.
        draft_probs: [B, K, V] fp32/bf16/fp16 probabilities the draft tokens were sampled from (after the same
            temperature, top-k and top-p), or None for a one-hot draft (greedy draft model, n-gram lookup).
        num_draft: [B] int32/int64, valid draft tokens per row (clamped to 0..K); None means K for every row.
        temperature: float >= 0 or [B]; 0 marks a greedy row (argmax comparison, argmax emitted).
        top_k: int, [B] or None; <= 0 or >= V keeps every token.
        top_p: float in (0, 1], [B] or None; >= 1 keeps every token.
        uniforms: [B, K] in (0, 1], acceptance coins.
        noise: [B, V] > 0, Exp(1) noise for the exponential race.
        seed: int, torch.Generator or None, used to draw what is missing of `uniforms` and `noise`.
        min_p: float in [0, 1], [B] or None (keyword only); tokens with p < min_p * max p are dropped after top-p
            (`fastspec.kernels.sampling`); None or 0 keeps every token.

    Returns:
        out_tokens: [B, K+1] int64, the accepted draft tokens then the recovered or bonus token, padded with -1.
        num_accepted: [B] int64, number of accepted draft tokens (the row emits num_accepted + 1 tokens).

    Example:
        >>> logits = torch.randn(2, 4, 16); drafts = torch.randint(0, 16, (2, 3))
        >>> out, n = verify_chain(logits, drafts, temperature=0.0)
    """
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    device = target_logits.device
    uniforms, noise = draw_randomness(batch, k, vocab, seed, device, uniforms, noise)
    temp = as_row_param(temperature, (batch,), device, torch.float32)
    greedy = temp <= 0  # [B]
    n = torch.full((batch,), k, device=device) if num_draft is None else num_draft.to(device).long().clamp(0, k)
    rows = torch.arange(batch, device=device)

    target_argmax = target_logits.float().argmax(-1)  # [B, K+1]
    positions = torch.arange(k, device=device)
    in_range = (draft_tokens >= 0) & (draft_tokens < vocab)
    valid = (positions[None, :] < n[:, None]) & in_range
    x = torch.where(in_range, draft_tokens, 0).long()  # [B, K]
    greedy_accept = x == target_argmax[:, :k]
    if not isinstance(temperature, torch.Tensor) and temperature <= 0:  # all rows greedy: no probabilities needed
        num_accepted = torch.cumprod((greedy_accept & valid).long(), dim=-1).sum(-1)
        final_token = target_argmax[rows, num_accepted]
    else:
        num_accepted, sampled_token = _sampled_verdict(
            target_logits,
            x,
            in_range,
            valid,
            draft_probs,
            n,
            temp,
            top_k,
            top_p,
            min_p,
            uniforms,
            noise,
            greedy_accept,
            greedy,
        )
        final_token = torch.where(greedy, target_argmax[rows, num_accepted], sampled_token)

    out = torch.full((batch, k + 1), -1, dtype=torch.long, device=device)
    out[:, :k] = torch.where(positions[None, :] < num_accepted[:, None], draft_tokens.long(), -1)
    out[rows, num_accepted] = final_token
    return out, num_accepted


def _sampled_verdict(target_logits, x, in_range, valid, draft_probs, n, temp, top_k, top_p, min_p, uniforms, noise,
                     greedy_accept, greedy):  # fmt: skip
    """Accepted counts [B] and the sampled recovered/bonus token [B] of `verify_chain` (rows with temperature > 0)."""
    batch, k_plus_1, vocab = target_logits.shape
    k = k_plus_1 - 1
    rows = torch.arange(batch, device=target_logits.device)
    # read B(K+1)V logits; write and read B(K+1)V fp32 probabilities
    probs = sampling_probs(target_logits, temp, top_k, top_p, min_p)  # [B, K+1, V]

    # accept/reject every position; a row's accepted count is its run of leading accepts
    p_x = probs[:, :k].gather(-1, x[..., None])[..., 0]
    q_x = torch.ones_like(p_x) if draft_probs is None else draft_probs.float().gather(-1, x[..., None])[..., 0]
    sampled_accept = (q_x > 0) & (uniforms * q_x < p_x)
    accept = torch.where(greedy[:, None], greedy_accept, sampled_accept) & valid
    num_accepted = torch.cumprod(accept.long(), dim=-1).sum(-1)  # [B]

    # recovered token (first rejection) or bonus token (all accepted), one row per request
    p_final = probs[rows, num_accepted]  # [B, V]
    rejected = num_accepted < n
    j_rej = num_accepted.clamp(max=max(k - 1, 0))
    if k == 0:
        q_final = torch.zeros_like(p_final)
    elif draft_probs is None:  # one-hot q at the rejected token; an out-of-range draft removes nothing
        q_final = torch.nn.functional.one_hot(x[rows, j_rej], vocab).float() * in_range[rows, j_rej, None]
    else:
        q_final = draft_probs[rows, j_rej].float()
    residual = torch.where(rejected[:, None], (p_final - q_final).clamp_min(0.0), p_final)
    degenerate = residual.sum(-1) <= 0  # p == q: resample p itself
    residual = torch.where(degenerate[:, None], p_final, residual)
    return num_accepted, (residual / noise).argmax(-1)


def _tree_prefix(prefix: torch.Tensor | int, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(visible [B, P] bool, real length [B] int64) of a prefix given as a [B, P] attention mask or a length."""
    if isinstance(prefix, torch.Tensor):
        visible = prefix.to(device) != 0
    else:
        visible = torch.ones(batch, int(prefix), dtype=torch.bool, device=device)
    return visible, visible.sum(-1)


def tree_mask(parents: torch.Tensor, prefix: torch.Tensor | int, dtype: torch.dtype = torch.float32) -> TreeMask:
    """Ancestor mask (bit-packed and additive 4D), depths and position ids of a batch of token trees, eagerly.

    Node i >= 1 is a tree node when 0 <= parents[b, i] < i (topological order); node 0 is the root (parent -1).
    Any other node is padding: it sees the prefix and itself only, at depth 0. Every node sees the visible prefix
    columns, its ancestors and itself, so the 4D mask can be handed to a Hugging Face model as `attention_mask`
    with the N nodes as the new tokens after P cached columns.

    Memory traffic: reads BN parents and BP prefix entries; writes BN(P+N) mask entries (the bulk) and BN words.

    Args:
        parents: [B, N] int, parent index of every node (the root and padded nodes: any negative value).
        prefix: [B, P] attention mask of the cached columns (1 real, 0 left padding), or an int P (all real).
        dtype: float dtype of the additive mask (the model's dtype).

    Returns:
        `TreeMask(bits [B, N, ceil(N/32)] int32, mask [B, 1, N, P+N] dtype, depth [B, N] int64,
        position_ids [B, N] int64)`.

    Example:
        >>> tm = tree_mask(torch.tensor([[-1, 0, 0, 1]]), 5)  # root, two children, a grandchild
        >>> tm.position_ids  # tensor([[5, 6, 6, 7]])
    """
    batch, n = parents.shape
    device = parents.device
    rows = torch.arange(batch, device=device)
    par = parents.long()
    valid = (par >= 0) & (par < torch.arange(n, device=device))
    ancestors = torch.zeros(batch, n, n, dtype=torch.bool, device=device)
    depth = torch.zeros(batch, n, dtype=torch.long, device=device)
    for i in range(n):  # topological order: the parent's row is final before its children read it
        p = par[:, i].clamp(0, n - 1)
        ancestors[:, i] = ancestors[rows, p] & valid[:, i, None]
        ancestors[:, i, i] = True
        depth[:, i] = torch.where(valid[:, i], depth[rows, p] + 1, 0)

    words = (n + 31) // 32
    shifts = torch.arange(32, device=device)
    padded = torch.nn.functional.pad(ancestors, (0, 32 * words - n)).view(batch, n, words, 32).long()
    bits = (padded << shifts).sum(-1)  # distinct powers of two: the sum is the bitwise or
    bits = torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)

    visible, length = _tree_prefix(prefix, batch, device)
    allowed = torch.cat([visible[:, None, :].expand(batch, n, -1), ancestors], dim=-1)
    zero = torch.zeros((), dtype=dtype, device=device)
    mask = torch.where(allowed, zero, torch.finfo(dtype).min)[:, None]
    return TreeMask(bits, mask, depth, length[:, None] + depth)


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
    """Verify a token tree against the target, eagerly: accept a root-to-node path and emit one more token.

    Node 0 is the root (the last accepted token, not a draft); node j >= 1 is a draft token whose parent is
    parents[b, j] < j. target_logits[b, i] scores the children of node i. The walk starts at the root; at the
    current node i its children are scanned in index order:
    - greedy rows (temperature 0): child c is accepted iff tokens[c] == argmax of target_logits[b, i];
    - sampled rows (SpecInfer, arXiv 2305.09781): with p the target distribution at i (temperature, top-k, top-p,
      min-p as in `fastspec.kernels.sampling`), child c is accepted iff u_c * q(c) < p(c) (u_c = uniforms[b, c] in
      (0, 1], strict). After a rejection p <- norm(max(p - q, 0)) for the next sibling, where q = draft_probs[b, i] (the
      distribution the children of i were drawn from, i.i.d.) or, with draft_probs None (deterministic children,
      e.g. the draft's top-k), the one-hot of the rejected token (p(c) zeroed and renormalised).
    An accepted child becomes the current node. When no child of the current node is accepted (or it is a leaf,
    or max_depth tokens were accepted) the row emits a final token: the argmax (greedy) or a sample of the
    current p by the exponential race argmax_v p_v / noise_v. With distinct sibling tokens the greedy walk is
    the deepest path of argmax matches.

    Unnormalised bookkeeping shared with the Triton kernel: the residual r starts as p with mass z = 1; a
    rejection sets r <- max(r / z - q, 0), z <- sum(r) (draft probabilities) or r[c] <- 0, z <- z - r[c]
    (one-hot), and the test reads p(c) = r[c] / z. A residual with z <= 0 falls back to p; a final race over an
    all-zero residual samples p. Nothing divides by zero, nothing is NaN.

    Memory traffic: reads BNV target logits, writes and reads BNV fp32 probabilities, reads one row of
    draft_probs per rejection, plus one residual row per step of the walk.

    Args:
        target_logits: [B, N, V] fp32/bf16/fp16, target logits at every node (row i scores node i's children).
        tokens: [B, N] int32/int64, node tokens (tokens[:, 0], the root, is not read); a token outside [0, V) marks
            padding, as does a node j >= 1 whose parent is not in [0, j).
        parents: [B, N] int32/int64, parent index per node; -1 for the root, any negative value for padded nodes.
        draft_probs: [B, N, V] fp32/bf16/fp16 or None (see above); rows of nodes without children are not read.
        temperature: float >= 0 or [B]; 0 marks a greedy row (argmax matches, argmax emitted).
        top_k: int, [B] or None; <= 0 or >= V keeps every token.
        top_p: float in (0, 1], [B] or None; >= 1 keeps every token.
        uniforms: [B, N] in (0, 1], the acceptance coin of each node.
        noise: [B, V] > 0, Exp(1) noise for the final exponential race.
        seed: int, torch.Generator or None, used to draw what is missing of `uniforms` and `noise`.
        max_depth: D >= 0, the most draft tokens a row may accept (None: N - 1).
        min_p: float in [0, 1], [B] or None (keyword only), as in `verify_chain`.

    Returns:
        out_tokens: [B, D+1] int64, the accepted path's tokens then the final (recovered or bonus) token, padded -1.
        num_accepted: [B] int64, accepted draft tokens (the row emits num_accepted + 1 tokens).
        accept_index: [B, D] int64, node index of each accepted token, padded -1 (for KV-cache compaction).

    Example:
        >>> logits = torch.randn(1, 4, 16); parents = torch.tensor([[-1, 0, 0, 1]])
        >>> out, n, path = verify_tree(logits, torch.randint(0, 16, (1, 4)), parents, temperature=0.0)
    """
    batch, n, vocab = target_logits.shape
    depth_cap = n - 1 if max_depth is None else int(max_depth)
    device = target_logits.device
    uniforms, noise = draw_randomness(batch, n, vocab, seed, device, uniforms, noise)
    temp = as_row_param(temperature, (batch,), device, torch.float32)
    greedy = temp <= 0  # [B]
    rows = torch.arange(batch, device=device)

    # read BNV logits; write and read BNV fp32 probabilities
    probs = sampling_probs(target_logits, temp, top_k, top_p, min_p)  # [B, N, V]
    target_argmax = target_logits.float().argmax(-1)  # [B, N]
    q_all = None if draft_probs is None else draft_probs.float()

    par = parents.long()
    tok = tokens.long()
    in_vocab = (tok >= 0) & (tok < vocab)
    is_node = in_vocab & (par >= 0) & (par < torch.arange(n, device=device))
    tok_safe = torch.where(in_vocab, tok, 0)

    out = torch.full((batch, depth_cap + 1), -1, dtype=torch.long, device=device)
    accept_index = torch.full((batch, depth_cap), -1, dtype=torch.long, device=device)
    num_accepted = torch.zeros(batch, dtype=torch.long, device=device)
    cur = torch.zeros(batch, dtype=torch.long, device=device)
    n_acc = torch.zeros(batch, dtype=torch.long, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    while bool(active.any()):
        p_cur = probs[rows, cur]  # [B, V]
        r, z = p_cur, torch.ones(batch, device=device)
        nxt = torch.full((batch,), -1, dtype=torch.long, device=device)
        can_grow = active & (n_acc < depth_cap)
        for j in range(1, n):
            child = can_grow & (nxt < 0) & is_node[:, j] & (par[:, j] == cur)
            if not bool(child.any()):
                continue
            x = tok_safe[:, j]
            r_x = r[rows, x]
            q_x = torch.ones_like(r_x) if q_all is None else q_all[rows, cur, x]
            sampled = (q_x > 0) & (uniforms[:, j] * q_x < r_x / z)
            accept = child & torch.where(greedy, x == target_argmax[rows, cur], sampled)
            nxt = torch.where(accept, j, nxt)
            reject = child & ~accept & ~greedy
            if not bool(reject.any()):
                continue
            if q_all is None:  # one-hot q: zero the rejected token
                r_new = r.scatter(1, x[:, None], 0.0)
                z_new = z - r_x
            else:  # SpecInfer residual against the siblings' common q
                r_new = (r / z[:, None] - q_all[rows, cur]).clamp_min(0.0)
                z_new = r_new.sum(-1)
            degenerate = z_new <= 0  # nothing left: fall back to p
            r_new = torch.where(degenerate[:, None], p_cur, r_new)
            z_new = torch.where(degenerate, 1.0, z_new)
            r = torch.where(reject[:, None], r_new, r)
            z = torch.where(reject, z_new, z)

        grow = nxt >= 0
        col = n_acc.clamp(max=max(depth_cap - 1, 0))
        node = nxt.clamp_min(0)
        if depth_cap > 0:
            accept_index[rows, col] = torch.where(grow, nxt, accept_index[rows, col])
            out[rows, col] = torch.where(grow, tok_safe[rows, node], out[rows, col])
        # rows that stop here emit the final token from the current node
        stop = active & ~grow
        residual = torch.where((r > 0).any(-1, keepdim=True), r, p_cur)
        final = torch.where(greedy, target_argmax[rows, cur], (residual / noise).argmax(-1))
        out[rows, n_acc] = torch.where(stop, final, out[rows, n_acc])
        num_accepted = torch.where(stop, n_acc, num_accepted)
        n_acc = n_acc + grow.long()
        cur = torch.where(grow, nxt, cur)
        active = grow
    return out, num_accepted, accept_index
