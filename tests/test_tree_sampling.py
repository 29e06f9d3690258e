"""Tree-verified sampling reproduces the target distribution (chi-square against exact probabilities).

1. Verifier level, V = 8: a target given by tables P(t1), P(t2 | t1), P(t3 | t1, t2) (after temperature, top-k and
   top-p) and a different draft Q. Each of 20,000 rows gets a two-level tree whose children are drawn i.i.d. from
   Q (SpecInfer: 4 then 2 per node, draft_probs given) or are Q's top tokens (deterministic: 2 then 3 per node,
   draft_probs None). A row emits num_accepted + 1 tokens; the rest of (t1, t2, t3) is completed from the target
   tables, as the next decoding steps would. The joint of (t1, t2, t3) must be P1 P2 P3: chi-square p > 1e-3 over
   512 cells (cells expected < 5 times pooled), through the eager reference and the Triton kernel alike.
2. End to end: `generate(tree=...)` on a tiny V = 8 model pair, first two tokens against the exact joint, for a
   static tree and a dynamic one (whose sampling rows draft the static tree of its node budget, i.i.d. children).
A correct sampler fails a 1e-3 test 0.1 % of the time at a given seed; seeds are fixed, so the tests are
deterministic.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules define their kernels

import pytest  # noqa: E402
from conftest import perturbed_copy, tiny_model  # noqa: E402

import fastspec  # noqa: E402
from fastspec.kernels import reference  # noqa: E402
from fastspec.kernels import verify_tree as vt  # noqa: E402
from fastspec.kernels.sampling import sampling_probs  # noqa: E402
from fastspec.tree import DynamicTree, default_choices  # noqa: E402

VOCAB = 8
TRIALS = 20_000


def chi_square_pvalue(codes: torch.Tensor, expected_probs: torch.Tensor) -> float:
    """codes [T] cell indices; expected_probs [cells]. Cells expected < 5 times are pooled into one."""
    observed = torch.bincount(codes, minlength=expected_probs.numel()).double()
    expected = expected_probs.double().flatten()
    expected = expected / expected.sum() * codes.numel()
    assert observed[expected == 0].sum() == 0, "sampled a sequence the target gives probability 0"
    big, small = expected >= 5, (expected > 0) & (expected < 5)
    observed = torch.cat([observed[big], observed[small].sum()[None]])
    expected = torch.cat([expected[big], expected[small].sum()[None]])
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    chisquare = pytest.importorskip("scipy.stats", reason="chi-square tests need scipy (a dev extra)").chisquare
    return chisquare(observed.numpy(), expected.numpy()).pvalue


def two_level_tree(first: int, second: int) -> torch.Tensor:
    """Parents of a root with `first` children, each with `second` children (node order by depth)."""
    parents = [-1] + [0] * first
    for a in range(1, first + 1):
        parents += [a] * second
    return torch.tensor(parents)


@pytest.mark.parametrize(
    "backend, children, temperature, top_k, top_p",
    [
        ("reference", "iid", 1.0, None, None),
        ("reference", "iid", 0.8, 5, 0.9),
        ("reference", "top", 1.0, None, None),
        ("reference", "top", 1.3, 6, 0.8),
        # the interpreted kernel costs 3-15 s a case at 20,000 rows: draft probs with both filters, one-hot plain
        ("triton", "iid", 0.8, 5, 0.9),
        ("triton", "top", 1.0, None, None),
    ],
    ids=["ref-iid-plain", "ref-iid-filtered", "ref-top-plain", "ref-top-filtered", "kernel-iid-filtered",
         "kernel-top-plain"],
)  # fmt: skip
def test_tree_verification_is_lossless(backend, children, temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    logits1, logits2, logits3 = (torch.randn((VOCAB,) * d, generator=gen) * 1.5 for d in (1, 2, 3))
    # the draft: the target's logits plus noise, so it agrees part of the time
    q1 = torch.softmax(logits1 + torch.randn(VOCAB, generator=gen), -1)
    q2 = torch.softmax(logits2 + torch.randn(VOCAB, VOCAB, generator=gen), -1)
    p1, p2, p3 = (sampling_probs(x, temperature, top_k, top_p) for x in (logits1, logits2, logits3))

    first, second = (4, 2) if children == "iid" else (2, 3)
    parents = two_level_tree(first, second)
    n, rows = parents.numel(), torch.arange(TRIALS)
    tokens = torch.zeros(TRIALS, n, dtype=torch.long)
    if children == "iid":  # i.i.d. draws from q (SpecInfer): repeated siblings allowed
        tokens[:, 1 : first + 1] = torch.multinomial(q1.expand(TRIALS, -1), first, True, generator=gen)
        level1 = tokens[:, 1 : first + 1]
        level2 = torch.multinomial(q2[level1.flatten()], second, True, generator=gen)
    else:  # deterministic: the draft's top tokens
        tokens[:, 1 : first + 1] = q1.topk(first).indices
        level1 = tokens[:, 1 : first + 1]
        level2 = q2[level1.flatten()].topk(second, dim=-1).indices
    tokens[:, first + 1 :] = level2.reshape(TRIALS, first * second)
    parent_tok = tokens[rows[:, None], parents[1:].expand(TRIALS, -1)]  # token of each node's parent
    target = torch.empty(TRIALS, n, VOCAB)
    target[:, 0] = logits1
    target[:, 1 : first + 1] = logits2[level1]
    target[:, first + 1 :] = logits3[parent_tok[:, first:], tokens[:, first + 1 :]]
    draft_probs = None
    if children == "iid":
        draft_probs = torch.zeros(TRIALS, n, VOCAB)
        draft_probs[:, 0] = q1
        draft_probs[:, 1 : first + 1] = q2[level1]

    uniforms, noise = reference.draw_randomness(TRIALS, n, VOCAB, 1, "cpu")
    verify = reference.verify_tree if backend == "reference" else vt.verify_tree
    # the kernel runs on CUDA tensors where there is CUDA, else on CPU tensors through the interpreter
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    args = [x if x is None else x.to(device) for x in (target, tokens, parents.expand(TRIALS, -1), draft_probs)]
    out, num_accepted, _ = verify(*args, temperature, top_k, top_p, uniforms.to(device), noise.to(device))
    out, num_accepted = out.cpu(), num_accepted.cpu()
    counts = torch.bincount(num_accepted, minlength=3)
    assert (counts > TRIALS // 50).all(), f"accepted-length histogram {counts.tolist()}: a path is barely exercised"

    # complete (t1, t2, t3) from the target tables where the row emitted fewer than three tokens
    t1 = out[:, 0]
    t2 = torch.where(num_accepted >= 1, out[:, 1], torch.multinomial(p2[t1], 1, generator=gen)[:, 0])
    t3 = torch.where(num_accepted >= 2, out[:, 2], torch.multinomial(p3[t1, t2], 1, generator=gen)[:, 0])
    joint = p1[:, None, None] * p2[:, :, None] * p3
    assert chi_square_pvalue((t1 * VOCAB + t2) * VOCAB + t3, joint) > 1e-3


@torch.no_grad()
def exact_two_token_distribution(target, prompt, temperature):
    first = sampling_probs(target(prompt).logits[0, -1], temperature)
    joint = torch.zeros(VOCAB, VOCAB)
    for t1 in range(VOCAB):
        extended = torch.cat([prompt, torch.tensor([[t1]])], dim=1)
        joint[t1] = first[t1] * sampling_probs(target(extended).logits[0, -1], temperature)
    return joint


@pytest.mark.parametrize(
    "tree",
    [[[0], [1], [2], [0, 0], [0, 1], [1, 0]], DynamicTree(top_k=3, num_nodes=6)],
    ids=["static-iid", "dynamic-iid"],
)
def test_generate_with_tree_follows_target(tree):
    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    draft = perturbed_copy(target, 0.25)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    out, stats = fastspec.generate(
        target, prompt.expand(TRIALS, -1), draft=draft, max_new_tokens=3, do_sample=True, temperature=0.9,
        num_draft_tokens=2, tree=tree, eos_token_id=None, seed=11, return_stats=True,
    )  # fmt: skip
    assert 0.1 < stats.per_position_acceptance[0] < 0.99
    codes = out[:, 5] * VOCAB + out[:, 6]
    assert chi_square_pvalue(codes, exact_two_token_distribution(target, prompt, 0.9)) > 1e-3


def test_sampled_dynamic_tree_drafts_iid_children_in_the_default_static_shape():
    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    draft = perturbed_copy(target, 0.25)
    prompt = torch.tensor([[3, 1, 4, 1, 5]]).expand(4, -1)
    kwargs = dict(draft=draft, max_new_tokens=12, do_sample=True, temperature=0.9, num_draft_tokens=3, seed=3,
                  eos_token_id=None, return_stats=True)  # fmt: skip
    dynamic = fastspec.generate(target, prompt, tree=DynamicTree(top_k=3, num_nodes=6), **kwargs)
    static = fastspec.generate(target, prompt, tree=default_choices(6, 3), **kwargs)
    assert torch.equal(dynamic[0], static[0]) and dynamic[1].drafted == static[1].drafted
