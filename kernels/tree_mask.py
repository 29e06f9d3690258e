"""Tree-attention inputs in one Triton launch: ancestor mask (bit-packed and additive 4D), depths, position ids.

A token tree of N nodes (node 0 the root, parents[i] < i: topological order, as EAGLE, Medusa and vLLM's tree
attention require) is scored by the target in one forward: node i attends to the visible prefix columns, its
ancestors and itself. Hugging Face models take that as an additive float mask [B, 1, N, P+N] (0 or
finfo(dtype).min, the Medusa/EAGLE injection; transformers >= 4.5x returns a 4D mask as-is) with position ids
prefix length + depth.

Grid (B, node tiles): each program walks the parent chains of its BLOCK_I nodes in lockstep (SGLang's
`build_tree_efficient` walk, O(depth) gathers, no host `.tolist()`), so the ancestor rows, the depths and the
bit-packed words fall out of the same loop; then it streams its rows of the dense mask: the prefix part is the
prefix attention mask broadcast over the nodes (its real length is counted on the way), the tree part the
ancestor tile. Traffic: BN(P+N) mask writes dominate; the prefix mask (BP) is read once per node tile.

Importing this module imports Triton and defines the kernel: on a machine without CUDA set TRITON_INTERPRET=1
before that (`fastspec.verify` imports it on the first kernel call).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fastspec.kernels._host import check_device, unit_stride
from fastspec.kernels.records import TreeMask

__all__ = ["tree_mask"]

_MASK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit(do_not_specialize=["N", "P", "W", "prefix_len"])
def _tree_mask_kernel(
    parents_ptr,  # [B, N] int
    prefix_ptr,  # [B, P] int/bool/float attention mask, or unused
    bits_ptr,  # [B, N, W] int32 out
    mask_ptr,  # [B, 1, N, P+N] float out (contiguous)
    depth_ptr,  # [B, N] int64 out
    pos_ptr,  # [B, N] int64 out
    N,
    P,
    W,
    prefix_len,  # real prefix length when there is no prefix mask
    min_value,  # finfo(mask dtype).min
    stride_pb,
    stride_xb,
    HAS_PREFIX_MASK: tl.constexpr,
    BLOCK_I: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    i_b, i_t = tl.program_id(0), tl.program_id(1)
    i_b64 = i_b.to(tl.int64)
    o_i = i_t * BLOCK_I + tl.arange(0, BLOCK_I)  # this program's nodes (mask rows)
    o_j = tl.arange(0, BLOCK_N)  # every node (mask columns)
    m_i = o_i < N
    p_par = parents_ptr + i_b64 * stride_pb

    # walk every node's parent chain in lockstep; a parent outside [0, node) ends the chain (root or padding)
    b_anc = (o_j[None, :] == o_i[:, None]) & m_i[:, None]  # [BLOCK_I, BLOCK_N]
    depth = tl.zeros([BLOCK_I], dtype=tl.int64)
    cur = o_i
    alive = m_i
    while tl.max(alive.to(tl.int32), axis=0) > 0:
        par = tl.load(p_par + cur, mask=alive, other=-1).to(tl.int32)
        alive = alive & (par >= 0) & (par < cur)
        b_anc = b_anc | ((o_j[None, :] == par[:, None]) & alive[:, None])
        depth += alive.to(tl.int64)
        cur = tl.where(alive, par, cur)

    # bit-packed rows: word w holds columns [32w, 32w + 32); distinct powers of two sum to their bitwise or
    b_bit = tl.where(b_anc, tl.full([1, BLOCK_N], 1, tl.int64) << (o_j[None, :] % 32).to(tl.int64), 0)
    for w in range(0, W):
        word = tl.sum(tl.where((o_j // 32 == w)[None, :], b_bit, 0), axis=1)
        tl.store(bits_ptr + (i_b64 * N + o_i) * W + w, word.to(tl.int32), mask=m_i)

    # dense additive mask: prefix columns follow the prefix attention mask (same for every node)
    cols = P + N
    p_row = mask_ptr + (i_b64 * N + o_i.to(tl.int64)) * cols  # [BLOCK_I]
    length = tl.zeros([BLOCK_P], dtype=tl.int64)
    for p0 in range(0, P, BLOCK_P):
        o_p = p0 + tl.arange(0, BLOCK_P)
        m_p = o_p < P
        if HAS_PREFIX_MASK:
            visible = (tl.load(prefix_ptr + i_b64 * stride_xb + o_p, mask=m_p, other=0) != 0) & m_p
        else:
            visible = m_p
        length += visible.to(tl.int64)
        b_val = tl.where(visible, 0.0, min_value).to(mask_ptr.dtype.element_ty)
        b_val = tl.broadcast_to(b_val[None, :], (BLOCK_I, BLOCK_P))
        tl.store(p_row[:, None] + o_p[None, :], b_val, mask=m_i[:, None] & m_p[None, :])
    # tree columns: the ancestor tile
    b_val = tl.where(b_anc, 0.0, min_value).to(mask_ptr.dtype.element_ty)
    tl.store(p_row[:, None] + P + o_j[None, :], b_val, mask=m_i[:, None] & (o_j < N)[None, :])

    if HAS_PREFIX_MASK:
        real = tl.sum(length, axis=0)
    else:
        real = prefix_len.to(tl.int64)
    tl.store(depth_ptr + i_b64 * N + o_i, depth, mask=m_i)
    tl.store(pos_ptr + i_b64 * N + o_i, real + depth, mask=m_i)


def _tree_mask(parents: torch.Tensor, prefix: torch.Tensor | int, dtype: torch.dtype) -> TreeMask:
    """Host wrapper: allocate the outputs, pick the node tile and launch one kernel (no host sync)."""
    batch, n = parents.shape
    device = parents.device
    check_device(device)
    parents = unit_stride(parents)
    has_prefix_mask = isinstance(prefix, torch.Tensor)
    if has_prefix_mask:
        prefix = unit_stride(prefix)
        if prefix.dtype == torch.bool:
            prefix = prefix.to(torch.uint8)
        p = prefix.shape[1]
    else:
        p = int(prefix)
    words = triton.cdiv(n, 32)
    bits = torch.empty(batch, n, words, dtype=torch.int32, device=device)
    mask = torch.empty(batch, 1, n, p + n, dtype=dtype, device=device)
    depth = torch.empty(batch, n, dtype=torch.int64, device=device)
    position_ids = torch.empty(batch, n, dtype=torch.int64, device=device)
    block_n = triton.next_power_of_2(n)
    block_i = min(block_n, 16)  # ancestor tile [BLOCK_I, BLOCK_N] stays small in registers
    block_p = min(triton.next_power_of_2(max(p, 1)), max(16, 4096 // block_i))
    _tree_mask_kernel[(batch, triton.cdiv(n, block_i))](
        parents, prefix if has_prefix_mask else parents, bits, mask, depth, position_ids,
        n, p, words, 0 if has_prefix_mask else p, torch.finfo(dtype).min,
        parents.stride(0), prefix.stride(0) if has_prefix_mask else 0,
        HAS_PREFIX_MASK=has_prefix_mask, BLOCK_I=block_i, BLOCK_N=block_n, BLOCK_P=block_p,
        num_warps=4,
    )  # fmt: skip
    return TreeMask(bits, mask, depth, position_ids)


def tree_mask(parents: torch.Tensor, prefix: torch.Tensor | int, dtype: torch.dtype = torch.float32) -> TreeMask:
    """Ancestor mask (bit-packed and additive 4D), depths and position ids of a batch of token trees, one launch.

    Same arguments and results as `fastspec.kernels.reference.tree_mask`, bit for bit. Node i >= 1 is a tree node
    when 0 <= parents[b, i] < i; node 0 is the root; other nodes are padding (they see the prefix and themselves).

    Args:
        parents: [B, N] int32/int64 parent index of every node (root and padding: negative), N >= 1.
        prefix: [B, P] attention mask of the P cached columns (nonzero = real token; left padding 0), or an int
            P >= 0 when every prefix column is real.
        dtype: float32, bfloat16 or float16, the dtype of the additive mask (use the model's dtype).

    Returns:
        `TreeMask(bits [B, N, ceil(N/32)] int32, mask [B, 1, N, P+N] dtype, depth [B, N] int64,
        position_ids [B, N] int64)`: bit j % 32 of bits[b, i, j // 32] is set iff node j is node i or one of its
        ancestors; mask is 0 where node i may attend and finfo(dtype).min elsewhere (pass it to a Hugging Face
        model as `attention_mask`); position_ids = real prefix length + depth.

    Example:
        >>> parents = torch.tensor([[-1, 0, 0, 1]], device="cuda")  # root, two children, a grandchild
        >>> tm = tree_mask(parents, attention_mask)  # attention_mask: [1, P] of the cached columns
        >>> logits = model(input_ids=nodes, attention_mask=tm.mask, position_ids=tm.position_ids, ...).logits
    """
    if not isinstance(parents, torch.Tensor):
        raise TypeError(f"parents must be a torch.Tensor, got {type(parents).__name__}")
    if parents.dim() != 2 or parents.shape[1] < 1:
        raise ValueError(f"parents must have shape [B, N] with N >= 1, got {list(parents.shape)}")
    if parents.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"parents must have dtype int32 or int64, got {parents.dtype}")
    if dtype not in _MASK_DTYPES:
        raise ValueError(f"dtype must be one of {[str(d) for d in _MASK_DTYPES]}, got {dtype}")
    if isinstance(prefix, torch.Tensor):
        if prefix.dim() != 2 or prefix.shape[0] != parents.shape[0]:
            raise ValueError(f"prefix must be a [B, P] mask with B = {parents.shape[0]}, got {list(prefix.shape)}")
        if prefix.device != parents.device:
            raise ValueError(f"prefix is on {prefix.device} but parents is on {parents.device}")
    elif isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise ValueError(f"prefix must be a [B, P] attention mask or an int length >= 0, got {prefix!r}")
    return _tree_mask(parents, prefix, dtype)
