"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", arXiv 2401.10774): K independent heads over the target's last hidden state (after its final norm, the
input of its lm_head). Head i is ``num_layers`` residual blocks ``x + SiLU(W x + b)`` then its own vocabulary
projection, and predicts the token at t + i + 2 from the state at t (the target itself predicts t + 1).

Drafts of all heads come from one state, so they are not autoregressive: a drafter takes head i's token (or top-k)
as the draft at depth i + 1. Medusa's own "typical acceptance" is not lossless at temperature > 0; fastspec
verifies Medusa drafts with standard rejection sampling like any draft.

Module names follow vLLM's layout (``blocks.{i}.layers.{j}.weight/bias``, ``lm_heads.{i}.weight``, optional
``token_map`` for a truncated vocabulary); `fastspec.heads.formats` also reads FasterDecoding's
``medusa_lm_head.pt`` (``{i}.{j}.linear.weight/bias``, ``{i}.{num_layers}.weight``).
"""

from __future__ import annotations

import torch
from torch import nn

from fastspec.heads.checkpoint import write_checkpoint

__all__ = ["MedusaHead"]


class _ResidualBlock(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int, bias: bool):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size, bias=bias) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(layer(x))
        return x


class MedusaHead(nn.Module):
    """``num_heads`` Medusa heads of ``num_layers`` residual blocks each.

    Args:
        hidden_size: the target's hidden size.
        vocab_size: the target's vocabulary size.
        num_heads, num_layers: Medusa's ``medusa_num_heads``, ``medusa_num_layers``.
        bias: residual blocks' linear bias (FasterDecoding: True).
        token_map: kept target ids of a truncated head vocabulary (vLLM's ``token_map``), or None (full).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1, bias: bool = True,
                 token_map: torch.Tensor | None = None):  # fmt: skip
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"draft: Medusa needs num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers, self.bias = num_heads, num_layers, bias
        head_vocab = vocab_size if token_map is None else int(token_map.numel())
        self.blocks = nn.ModuleList(_ResidualBlock(hidden_size, num_layers, bias) for _ in range(num_heads))
        self.lm_heads = nn.ModuleList(nn.Linear(hidden_size, head_vocab, bias=False) for _ in range(num_heads))
        if token_map is not None:
            self.register_buffer("token_map", torch.as_tensor(token_map).long().clone())
        else:
            self.token_map = None

    def forward(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., num_heads, vocab] from the target's last hidden state [..., H] (after its final norm): entry
        i scores the token at t + i + 2; -inf outside a truncated vocabulary (``token_map``)."""
        x = last_hidden.to(self.lm_heads[0].weight.dtype)
        logits = torch.stack([head(block(x)) for block, head in zip(self.blocks, self.lm_heads, strict=True)], dim=-2)
        if self.token_map is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.vocab_size), float("-inf"))
        return out.index_copy(-1, self.token_map, logits)

    def config_dict(self) -> dict:
        """``config.json`` fields: vLLM's (``num_heads``, ``num_hidden_layers``, ...) and FasterDecoding's names."""
        data = {
            "architectures": ["MedusaModel"],
            "model_type": "medusa",
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_heads": self.num_heads,
            "num_hidden_layers": self.num_layers,
            "medusa_num_heads": self.num_heads,
            "medusa_num_layers": self.num_layers,
            "medusa_fc_bias": self.bias,
        }
        if self.token_map is not None:
            data["truncated_vocab_size"] = int(self.token_map.numel())
        return data

    def save_pretrained(self, path, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` and ``model.safetensors`` in vLLM's Medusa layout."""
        state = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v)
                 for k, v in self.state_dict().items()}  # fmt: skip
        write_checkpoint(path, self.config_dict(), state)
