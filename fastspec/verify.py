"""Verification dispatch: the fused Triton kernels for CUDA tensors, the eager reference otherwise.

`backend="auto"` picks Triton when the logits live on a CUDA device; "triton" forces the kernel (on CPU it
needs TRITON_INTERPRET=1), "reference" forces the eager PyTorch path.

Triton loads lazily: a kernel module (`fastspec.kernels.verify_chain`, `.verify_tree`, `.tree_mask`) is imported,
and its kernels defined, on the first call that takes the Triton path, so `import fastspec` never imports Triton.
Triton reads TRITON_INTERPRET when it defines the kernels: set it before the first kernel call.
"""

from __future__ import annotations

import torch

from fastspec.kernels import reference

__all__ = ["BACKENDS", "resolve_backend", "tree_mask", "verify_chain", "verify_tree"]

BACKENDS = ("auto", "triton", "reference")


def resolve_backend(backend: str, device: torch.device) -> str:
    """Return "triton" or "reference" for a requested backend and the device the logits live on."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" else "reference"
    return backend


def verify_chain(target_logits: torch.Tensor, draft_tokens: torch.Tensor, *args, backend: str = "auto", **kwargs):
    """Chain verification; same arguments and results as `fastspec.kernels.reference.verify_chain`."""
    if resolve_backend(backend, target_logits.device) == "triton":
        from fastspec.kernels.verify_chain import verify_chain as triton_verify_chain

        return triton_verify_chain(target_logits, draft_tokens, *args, **kwargs)
    return reference.verify_chain(target_logits, draft_tokens, *args, **kwargs)


def verify_tree(target_logits: torch.Tensor, tokens: torch.Tensor, *args, backend: str = "auto", **kwargs):
    """Tree verification; same arguments and results as `fastspec.kernels.reference.verify_tree`."""
    if resolve_backend(backend, target_logits.device) == "triton":
        from fastspec.kernels.verify_tree import verify_tree as triton_verify_tree

        return triton_verify_tree(target_logits, tokens, *args, **kwargs)
    return reference.verify_tree(target_logits, tokens, *args, **kwargs)


def tree_mask(parents: torch.Tensor, prefix: torch.Tensor | int, dtype: torch.dtype, backend: str = "auto"):
    """Tree-attention inputs; same arguments and results as `fastspec.kernels.reference.tree_mask`."""
    if resolve_backend(backend, parents.device) == "triton":
        from fastspec.kernels.tree_mask import tree_mask as triton_tree_mask

        return triton_tree_mask(parents, prefix, dtype)
    return reference.tree_mask(parents, prefix, dtype)
