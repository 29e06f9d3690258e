"""Chain verification for speculative sampling, `verify_chain`: fused Triton kernels, token for token equal to the
eager reference (`fastspec.kernels.reference.verify_chain`).

Words (as in the reference and vLLM's rejection sampler): a row proposes up to K *draft* tokens; the leading ones
that survive verification are *accepted*; the first rejected position emits a *recovered* token sampled from
norm(max(p - q, 0)); a row that accepts all its drafts emits a *bonus* token sampled from p. Chain speculative
sampling: Leviathan et al. 2023 (arXiv 2211.17192), Chen et al. 2023 (arXiv 2302.01318).

Two launches, no host synchronisation, CUDA-graph capturable: row statistics, then accept and resample (the
kernels and their algorithm: `fastspec.kernels.verify_chain_kernels`). Host path: a `ChainVerifier`
(`fastspec.kernels.chain_verifier`) does a layout's host work once (tiles, grids, warps, workspace) and launches
both kernels through their compiled launchers, skipping Triton's per-call dispatch; `verify_chain` keeps one per
layout and stream, so repeated calls of one shape cost only the checks on top of that.

Importing this module imports Triton and defines the kernels: on a machine without CUDA set TRITON_INTERPRET=1
before that (`fastspec.verify` imports it on the first kernel call).
"""

from __future__ import annotations

import torch

from fastspec.kernels._host import check_index, check_logits, check_verify_args, current_stream, launch_for
from fastspec.kernels.chain_verifier import _PER_ROW, ChainLaunch, ChainSampling, ChainVerifier
from fastspec.kernels.randomness import draw_randomness

__all__ = ["ChainVerifier", "verify_chain"]


_VERIFIERS: dict[tuple, ChainVerifier] = {}  # `verify_chain`'s verifiers by layout and stream, oldest first
_MAX_VERIFIERS = 32


def _kinds(*params) -> tuple:
    """Sampling parameters as a `ChainVerifier` is built for them: scalars by value, [B] tensors as "per_row"."""
    return tuple(_PER_ROW if isinstance(v, torch.Tensor) else v for v in params)


def _layout(target_logits, draft_probs, num_draft, temperature, top_k, top_p, min_p, max_block_v) -> tuple:
    """`verify_chain`'s cache key: what a `ChainVerifier` is built for, and the current stream. AttributeError for
    arguments that are no tensors."""
    kinds = _kinds(temperature, top_k, top_p, min_p)
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
    min_p: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Host wrapper, on the cached `ChainVerifier` of the call's layout: its lean call when the arguments fit it
    as they are, else the full checks (errors name the argument) and conversions, then its launches. New output
    tensors either way; no tensor value is read on the host. uniforms / noise may be None only for a greedy scalar
    temperature. `max_block_v` caps the V chunk (tests use it to force many chunks)."""
    try:
        key = _layout(target_logits, draft_probs, num_draft, temperature, top_k, top_p, min_p, max_block_v)
        verifier = _VERIFIERS.get(key)
    except (AttributeError, TypeError):  # no tensors, unhashable parameters: the checks below say what is wrong
        key = verifier = None
    if verifier is not None:
        rows = [v if isinstance(v, torch.Tensor) else None for v in (temperature, top_k, top_p, min_p)]
        try:
            return verifier(target_logits, draft_tokens, draft_probs, num_draft, *rows[:3], uniforms, noise,
                            min_p=rows[3])  # fmt: skip
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
        target_logits, draft_probs, uniforms, noise, temperature, top_k, top_p, positions=k_plus_1 - 1, min_p=min_p
    )
    launch_for(device)
    out = torch.empty(batch, k_plus_1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return out, num_accepted
    if verifier is None:
        kinds = _kinds(temperature, top_k, top_p, min_p)
        verifier = ChainVerifier(
            batch, k_plus_1 - 1, vocab, dtype=target_logits.dtype, device=device,
            draft_probs=False if draft_probs is None else draft_probs.dtype, num_draft=num_draft is not None,
            temperature=kinds[0], top_k=kinds[1], top_p=kinds[2], max_block_v=max_block_v, min_p=kinds[3],
        )  # fmt: skip
        if key is not None:
            if len(_VERIFIERS) >= _MAX_VERIFIERS:
                del _VERIFIERS[next(iter(_VERIFIERS))]
            _VERIFIERS[key] = verifier
    s = sampling
    launch = ChainLaunch(
        logits=target_logits,
        logits_stride=target_logits.stride(),
        draft_tokens=draft_tokens,
        draft_tokens_stride=draft_tokens.stride(),
        draft_probs=draft_probs,
        draft_probs_stride=None if draft_probs is None else draft_probs.stride(),
        num_draft=num_draft,
        sampling=ChainSampling(
            s.temperature, s.temperature_value, s.top_k, s.top_k_value, s.top_p, s.top_p_value, s.min_p, s.min_p_value
        ),
        uniforms=uniforms,
        uniforms_stride=uniforms.stride(),
        noise=noise,
        noise_stride=noise.stride(),
        out_tokens=out,
        num_accepted=num_accepted,
    )
    verifier._launch(launch)
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
    *,
    min_p: float | torch.Tensor | None = None,
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
        target_logits, draft_tokens, draft_probs, num_draft, temperature, top_k, top_p, uniforms, noise, min_p=min_p
    )
