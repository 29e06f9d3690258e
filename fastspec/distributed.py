"""Sharded targets: every rank of a tensor-parallel target must take the same data-dependent decisions.

A target loaded with transformers' tensor parallelism (`from_pretrained(..., tp_plan="auto")` under `torchrun`)
runs each forward as collectives across its ranks, so every rank must feed it the same tokens: the same drafts, the
same accepted prefix, the same number of new positions. Verification is deterministic given the logits (identical
on every rank after the all-reduce), the draft and the per-row random streams, so what can differ between ranks is
only what comes from outside: a seed drawn from local randomness (`seed=None`) and the wall-clock step times that
adaptive K (`num_draft_tokens="auto"`, depth of adaptive trees) learns from. `RankAgreement` makes both rank 0's:
the seed is broadcast once per call, each step's time once per step (one 8-byte broadcast). Draft models and heads
run replicated on every rank (loaded whole on each), so they draft alike from the same inputs.

Single-process use, and several processes that each decode with their own unsharded model (data parallel), issue no
collective: agreement is active only when the target's parameters are sharded (`DTensor`s, or `tp_size` > 1).
"""

from __future__ import annotations

import torch

__all__ = ["RankAgreement"]


def _sharded(model: torch.nn.Module) -> bool:
    """Whether `model` is sharded across ranks (tensor parallel)."""
    if (getattr(model, "tp_size", None) or 1) > 1:
        return True
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor runs no tensor parallelism either
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


class RankAgreement:
    """Rank 0's seed and step times for every rank of a sharded target's process group (see the module docstring).

    Args:
        target: the target model; agreement is active when torch.distributed is initialised with more than one
            rank and the target is sharded. The group is the target's device mesh's (transformers' `_device_mesh`),
            else the default group.
    """

    def __init__(self, target: torch.nn.Module):
        dist = torch.distributed
        self.active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and _sharded(target)
        self.group = None
        self.source = 0
        self.device = torch.device("cpu")
        if self.active:
            mesh = getattr(target, "_device_mesh", None)
            self.group = mesh.get_group() if mesh is not None and mesh.ndim == 1 else None
            self.source = dist.get_global_rank(self.group, 0) if self.group is not None else 0
            # NCCL broadcasts device tensors; gloo host tensors
            self.device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(self.group) == "nccl" \
                else torch.device("cpu")  # fmt: skip

    def _broadcast(self, value: torch.Tensor) -> torch.Tensor:
        value = value.to(self.device)
        torch.distributed.broadcast(value, src=self.source, group=self.group)
        return value

    def seed(self, seed: int) -> int:
        """Rank 0's `seed` (an int drawn locally on every rank)."""
        if not self.active:
            return seed
        return int(self._broadcast(torch.tensor([seed], dtype=torch.int64)).item())

    def seconds(self, seconds: float) -> float:
        """Rank 0's measured step time."""
        if not self.active:
            return seconds
        return float(self._broadcast(torch.tensor([seconds], dtype=torch.float64)).item())
