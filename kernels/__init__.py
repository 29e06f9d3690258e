"""Triton kernels of fastspec, installed as `fastspec.kernels`; eager twins live in `fastspec.kernels.reference`.

Importing this package imports Triton and defines the kernels, so on a machine without CUDA set
TRITON_INTERPRET=1 before the first import of `fastspec.kernels` (or of anything that imports it).
"""

from fastspec.kernels.tree_mask import tree_mask
from fastspec.kernels.verify_chain import verify_chain
from fastspec.kernels.verify_tree import verify_tree

__all__ = ["tree_mask", "verify_chain", "verify_tree"]
