"""Host-side argument checks and conversions shared by the Triton kernel wrappers; no tensor value is read."""

from __future__ import annotations

import torch

_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
_INTS = (torch.int32, torch.int64)


def _check_logits(target_logits, layout: str) -> None:
    """target_logits: a float tensor of `layout` (e.g. "[B, N, V] with N >= 1") with fewer than 2**31 - 1 tokens."""
    if not isinstance(target_logits, torch.Tensor):
        raise TypeError(f"target_logits must be a torch.Tensor, got {type(target_logits).__name__}")
    if target_logits.dim() != 3 or target_logits.shape[1] < 1 or target_logits.shape[2] < 1:
        raise ValueError(f"target_logits must have shape {layout}, got {list(target_logits.shape)}")
    if target_logits.dtype not in _FLOATS:
        raise ValueError(f"target_logits must have dtype in {[str(d) for d in _FLOATS]}, got {target_logits.dtype}")
    if target_logits.shape[2] >= 2**31 - 1:
        raise ValueError(f"target_logits vocabulary must be < 2**31 - 1, got {target_logits.shape[2]}")


def _check_tensor(x, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...], device: torch.device):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")
    if x.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {x.dtype}")
    if x.device != device:
        raise ValueError(f"{name} is on {x.device} but target_logits is on {device}")


def _row_param_arg(
    value, name: str, batch: int, device: torch.device, dtype: torch.dtype, dtypes: tuple[torch.dtype, ...] = ()
):
    """(tensor [B] or None, scalar) for a sampling parameter given as a Python number or a [B] tensor; the tensor
    is converted to `dtype`, after checking its dtype is one of `dtypes` when given."""
    if not isinstance(value, torch.Tensor):
        return None, value
    if value.dim() > 1 or value.numel() not in (1, batch):
        raise ValueError(f"{name} must be a number or a [B] = [{batch}] tensor, got shape {list(value.shape)}")
    if dtypes and value.dtype not in dtypes:
        raise ValueError(f"{name} must have dtype in {[str(d) for d in dtypes]}, got {value.dtype}")
    if value.device != device:
        raise ValueError(f"{name} is on {value.device} but target_logits is on {device}")
    return value.reshape(-1).expand(batch).to(dtype).contiguous(), 0


def _unit_stride(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()
