"""Triton tree kernels (`tree_mask`, `verify_tree`) against their eager references, plus exact hand-made cases.

Bit-exact against the reference with the same injected uniforms and noise (every output equal), on trees of every
awkward shape: a chain, a star, depth 1, a lone root, random trees and ragged rows (padded nodes, padded tokens).
Without CUDA the kernels run in Triton's interpreter, so shapes stay small (a few hundred ms per call).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules define their kernels

import inspect  # noqa: E402

import pytest  # noqa: E402

from fastspec.kernels import reference  # noqa: E402
from fastspec.kernels import tree_mask as tmask  # noqa: E402
from fastspec.kernels import verify_tree as vt  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SHAPES = ("chain", "star", "binary", "random", "ragged", "root")


def make_parents(batch: int, n: int, shape: str, gen: torch.Generator) -> torch.Tensor:
    """Parents [B, N] of a tree shape; "ragged" pads each row's tail (parent -2) after a random node count."""
    if shape == "root":
        n = 1
    nodes = torch.arange(n)
    if shape == "chain":
        parents = nodes - 1
    elif shape == "star":  # depth 1: every draft a child of the root
        parents = torch.where(nodes > 0, 0, -1)
    elif shape == "binary":
        parents = torch.where(nodes > 0, (nodes - 1) // 2, -1)
    else:
        parents = torch.stack([torch.randint(0, max(i, 1), (batch,), generator=gen) for i in range(n)], dim=1)
        parents[:, 0] = -1
        if shape == "ragged":
            count = torch.randint(1, n + 1, (batch, 1), generator=gen)
            parents = parents.masked_fill(nodes[None, :] >= count, -2)
        return parents
    return parents.expand(batch, -1).clone()


def make_tree_inputs(batch, n, vocab, shape, *, draft="probs", seed=0, scale=2.0, dtype=torch.float32):
    """Target logits, a tree, its tokens (often the target argmax, so paths get accepted) and draft q."""
    gen = torch.Generator().manual_seed(seed)
    parents = make_parents(batch, n, shape, gen)
    n = parents.shape[1]
    logits = torch.randn(batch, n, vocab, generator=gen) * scale
    rows = torch.arange(batch)[:, None]
    parent_argmax = logits.argmax(-1)[rows, parents.clamp_min(0)]
    if draft == "probs":  # children of node i drawn i.i.d. from q[i]
        q = torch.softmax(torch.randn(batch, n, vocab, generator=gen) * scale, -1)
        q_parent = q[rows, parents.clamp_min(0)].reshape(-1, vocab)
        tokens = torch.multinomial(q_parent, 1, generator=gen).reshape(batch, n)
    else:  # deterministic children: the parent's argmax half of the time
        q = None
        tokens = torch.randint(0, vocab, (batch, n), generator=gen)
    tokens = torch.where(torch.rand(batch, n, generator=gen) < 0.5, parent_argmax, tokens)
    if shape == "ragged":  # some padded tokens too: they must be skipped, never read out of bounds
        tokens = tokens.masked_fill(torch.rand(batch, n, generator=gen) < 0.1, -1)
    uniforms, noise = reference.draw_randomness(batch, n, vocab, seed + 1, "cpu")
    put = [x.to(DEVICE) if x is not None else None for x in (logits.to(dtype), tokens, parents, q, uniforms, noise)]
    return tuple(put)


def assert_same(got, want, names):
    for g, w, name in zip(got, want, names, strict=True):
        assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{name}: {g.dtype}{list(g.shape)}, {w.dtype}{list(w.shape)}"
        bad = (g != w).reshape(g.shape[0], -1).any(-1).nonzero().flatten().tolist()
        assert not bad, f"{name}: {len(bad)} rows differ; row {bad[0]}: kernel {g[bad[0]]} reference {w[bad[0]]}"


def test_exports_and_reference_twins():
    for module, name in ((tmask, "tree_mask"), (vt, "verify_tree")):
        assert module.__all__ == [name]
        kernel, twin = getattr(module, name), getattr(reference, name)
        assert list(inspect.signature(kernel).parameters) == list(inspect.signature(twin).parameters), name


# ------------------------------------------------------------------------------------------------ tree_mask


def test_tree_mask_hand_made():
    # root, two children, a grandchild under node 2, a padded node; prefix [pad, real, real]
    parents = torch.tensor([[-1, 0, 0, 2, -2]], device=DEVICE)
    tm = tmask.tree_mask(parents, torch.tensor([[0, 1, 1]], device=DEVICE))
    assert tm.bits.flatten().tolist() == [0b1, 0b11, 0b101, 0b1101, 0b10000]
    assert tm.depth.tolist() == [[0, 1, 1, 2, 0]]
    assert tm.position_ids.tolist() == [[2, 3, 3, 4, 2]]
    visible = tm.mask[0, 0] == 0
    assert visible[:, 0].sum() == 0 and visible[:, 1:3].all()  # left padding masked, real prefix visible
    assert visible[3, 3:].tolist() == [True, False, True, True, False]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "n, prefix",
    [(7, "mask"), (40, "int"), (70, "empty")],
    ids=["n7-leftpad", "n40-twowords-int", "n70-threewords-noprefix"],
)
def test_tree_mask_matches_reference(shape, n, prefix):
    gen = torch.Generator().manual_seed(n)
    parents = make_parents(3, n, shape, gen).to(DEVICE)
    if prefix == "mask":  # left padding of different lengths per row
        prefix_arg = (torch.arange(9)[None, :] >= torch.tensor([[0], [3], [8]])).long().to(DEVICE)
    else:
        prefix_arg = 5 if prefix == "int" else 0
    # the mask dtypes on the small case only: the interpreter walks a 69-deep chain slowly
    for dtype in (torch.float32, torch.bfloat16, torch.float16) if n < 10 else (torch.float32,):
        got = tmask.tree_mask(parents, prefix_arg, dtype)
        want = reference.tree_mask(parents, prefix_arg, dtype)
        assert_same(got, want, got._fields)
    # the dense tree block is the unpacked bit mask
    cols = torch.arange(parents.shape[1], device=DEVICE)
    unpacked = (got.bits[..., cols // 32] >> (cols % 32)) & 1
    assert torch.equal(unpacked.bool(), got.mask[:, 0, :, -parents.shape[1] :] == 0)


# ---------------------------------------------------------------------------------------------- verify_tree

NAMES = ("out_tokens", "num_accepted", "accept_index")


def test_verify_tree_greedy_hand_made():
    # ±100 one-hot logits: argmax at root 5, node 1: 7, node 2: 3, node 3: 9, node 4: 1
    logits = torch.full((1, 5, 16), -100.0)
    logits[0, torch.arange(5), torch.tensor([5, 7, 3, 9, 1])] = 100.0
    parents = torch.tensor([[-1, 0, 0, 2, 2]])
    tokens = torch.tensor([[0, 4, 5, 8, 3]])  # node 2 (5) matches the root; node 4 (3) matches node 2
    for fn in (reference.verify_tree, vt.verify_tree):
        out, n, path = fn(logits.to(DEVICE), tokens.to(DEVICE), parents.to(DEVICE), temperature=0.0)
        assert out.tolist() == [[5, 3, 1, -1, -1]] and n.tolist() == [2] and path.tolist() == [[2, 4, -1, -1]]


def test_verify_tree_sampled_one_hot_targets():
    # p is (numerically) one-hot: a child equal to the argmax is accepted, any other rejected, whatever the coins
    logits = torch.full((2, 4, 8), -100.0)
    logits[:, torch.arange(4), torch.tensor([2, 6, 1, 4])] = 100.0
    parents = torch.tensor([[-1, 0, 0, 1], [-1, 0, 0, 1]])
    tokens = torch.tensor([[0, 3, 2, 6], [0, 2, 3, 5]])  # row 0: node 2 (a leaf); row 1: node 1, then not node 3
    for fn in (reference.verify_tree, vt.verify_tree):
        out, n, path = fn(logits.to(DEVICE), tokens.to(DEVICE), parents.to(DEVICE), seed=0)
        assert out.tolist() == [[2, 1, -1, -1], [2, 6, -1, -1]] and n.tolist() == [1, 1]
        assert path.tolist() == [[2, -1, -1], [1, -1, -1]]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("draft", ["probs", "one-hot"])
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_verify_tree_matches_reference(shape, draft, temperature):
    inputs = make_tree_inputs(6, 9, 24, shape, draft=draft, seed=len(shape))
    logits, tokens, parents, q, uniforms, noise = inputs
    # V = 24 in three chunks of 8: the online LSE and the race across chunks
    got = vt._verify_tree(
        logits, tokens, parents, q, temperature, None, None, uniforms, noise, parents.shape[1] - 1, max_block_v=8
    )
    want = reference.verify_tree(logits, tokens, parents, q, temperature, None, None, uniforms, noise)
    assert_same(got, want, NAMES)


@pytest.mark.parametrize(
    "temperature, top_k, top_p, draft",
    [
        (0.7, 5, None, "probs"),  # top-k threshold search
        (1.3, None, 0.8, "one-hot"),  # top-p threshold search
        ("rows", 6, 0.9, "probs"),  # per-row temperatures (greedy and sampled rows mixed), both filters
    ],
)
def test_verify_tree_filters_match_reference(temperature, top_k, top_p, draft):
    logits, tokens, parents, q, uniforms, noise = make_tree_inputs(4, 8, 40, "random", draft=draft, seed=3)
    if temperature == "rows":
        temperature = torch.tensor([0.0, 1.0, 0.5, 2.0], device=DEVICE)
    got = vt.verify_tree(logits, tokens, parents, q, temperature, top_k, top_p, uniforms, noise)
    want = reference.verify_tree(logits, tokens, parents, q, temperature, top_k, top_p, uniforms, noise)
    assert_same(got, want, NAMES)


@pytest.mark.parametrize("draft", ["probs", "one-hot"])
def test_verify_tree_per_row_filters_many_chunks(draft):
    # per-row top-k and top-p with disabled entries (top_k 0 and >= V, top_p 1) and a greedy row; V = 300 in
    # chunks of 64: the threshold search jumps across chunks, and rows of one program finish it at different passes
    logits, tokens, parents, q, uniforms, noise = make_tree_inputs(5, 8, 300, "random", draft=draft, seed=4)
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.5, 1.0], device=DEVICE)
    top_k = torch.tensor([0, 5, 300, 40, 7], device=DEVICE)
    top_p = torch.tensor([0.5, 1.0, 0.9, 0.3, 0.95], device=DEVICE)
    args = (logits, tokens, parents, q, temperature, top_k, top_p, uniforms, noise)
    got = vt._verify_tree(*args, parents.shape[1] - 1, max_block_v=64)
    assert_same(got, reference.verify_tree(*args), NAMES)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_verify_tree_half_logits_and_seed(dtype):
    # half-precision logits and draft probs are upcast in registers; a seed draws the same randomness in both
    logits, tokens, parents, q, _, _ = make_tree_inputs(3, 7, 20, "binary", seed=5, dtype=dtype)
    q = q.to(dtype)
    got = vt.verify_tree(logits, tokens, parents, q, 0.9, seed=17)
    want = reference.verify_tree(logits, tokens, parents, q, 0.9, seed=17)
    assert_same(got, want, NAMES)


@pytest.mark.parametrize("max_depth", [0, 1, 2])
def test_verify_tree_max_depth(max_depth):
    logits, tokens, parents, q, uniforms, noise = make_tree_inputs(4, 8, 16, "chain", draft="one-hot", seed=2)
    tokens[:, 1:] = logits.argmax(-1)[:, :-1]  # greedy accepts the whole chain unless capped
    for temperature in (0.0, 1.0):
        got = vt.verify_tree(logits, tokens, parents, None, temperature, uniforms=uniforms, noise=noise,
                             max_depth=max_depth)  # fmt: skip
        want = reference.verify_tree(logits, tokens, parents, None, temperature, uniforms=uniforms, noise=noise,
                                     max_depth=max_depth)  # fmt: skip
        assert_same(got, want, NAMES)
        assert got[0].shape == (4, max_depth + 1) and got[2].shape == (4, max_depth)
    assert (got[1] <= max_depth).all()


def test_verify_tree_degenerate_residual():
    # p uniform over V = 8 (exactly 1/8 in both implementations), coins of exactly 1: u q < p is false for every
    # child, so q == p leaves a zero residual after the first rejection, and one-hot q zeroes all 8 tokens one by
    # one (a repeated token is rejected again); both fall back to sampling p: no NaN, a valid token
    vocab, batch = 8, 3
    logits = torch.zeros(batch, vocab + 2, vocab, device=DEVICE)
    parents = torch.tensor([[-1] + [0] * (vocab + 1)] * batch, device=DEVICE)
    perm = torch.stack([torch.randperm(vocab, generator=torch.Generator().manual_seed(r)) for r in range(batch)])
    tokens = torch.cat([torch.zeros(batch, 1, dtype=torch.long), perm, perm[:, :1]], dim=1).to(DEVICE)
    uniforms = torch.ones(batch, vocab + 2, device=DEVICE)
    noise = reference.draw_randomness(batch, 1, vocab, 0, "cpu")[1].to(DEVICE)
    for q in (torch.full_like(logits, 1 / vocab), None):
        got = vt.verify_tree(logits, tokens, parents, q, 1.0, uniforms=uniforms, noise=noise)
        want = reference.verify_tree(logits, tokens, parents, q, 1.0, uniforms=uniforms, noise=noise)
        assert_same(got, want, NAMES)
        assert got[1].tolist() == [0] * batch
        assert torch.equal(got[0][:, 0], (1.0 / noise).argmax(-1))  # the race over p itself


def test_verify_tree_bad_input():
    logits = torch.randn(2, 3, 8, device=DEVICE)
    parents = torch.tensor([[-1, 0, 0]] * 2, device=DEVICE)
    with pytest.raises(ValueError, match="tokens"):
        vt.verify_tree(logits, torch.zeros(2, 4, dtype=torch.long, device=DEVICE), parents)
    with pytest.raises(ValueError, match="max_depth"):
        vt.verify_tree(logits, torch.zeros(2, 3, dtype=torch.long, device=DEVICE), parents, max_depth=-1)
    # the sampling parameters are checked as the chain kernel checks them
    tokens = torch.zeros(2, 3, dtype=torch.long, device=DEVICE)
    for bad, match in [
        (dict(temperature=-1.0), "temperature"),
        (dict(temperature=torch.ones(2, dtype=torch.long, device=DEVICE)), "temperature"),
        (dict(top_k=torch.ones(2, device=DEVICE)), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
    ]:
        with pytest.raises(ValueError, match=match):
            vt.verify_tree(logits, tokens, parents, **bad)
    with pytest.raises(ValueError, match="prefix"):
        tmask.tree_mask(parents, torch.ones(3, 4, device=DEVICE))
