"""fastspec: lossless speculative decoding for Hugging Face causal LMs, with fused Triton verification kernels."""

from fastspec.generate import autoregressive_generate, generate, speculative_generate
from fastspec.stats import SpecStats

__all__ = ["SpecStats", "autoregressive_generate", "generate", "speculative_generate"]
__version__ = "0.1.0"
