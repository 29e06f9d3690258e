"""Verification dispatch: the fused Triton kernels for CUDA tensors, the eager reference otherwise.

`backend="auto"` picks Triton when the logits live on a CUDA device; "triton" forces the kernel (on CPU it
needs TRITON_INTERPRET=1), "reference" forces the eager PyTorch path.
"""

from __future__ import annotations

import torch

from fastspec.kernels import reference

__all__ = ["BACKENDS", "resolve_backend", "verify_chain"]

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
        from fastspec.kernels import verify_chain as triton_verify_chain

        return triton_verify_chain(target_logits, draft_tokens, *args, **kwargs)
    return reference.verify_chain(target_logits, draft_tokens, *args, **kwargs)
