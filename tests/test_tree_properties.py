"""Property-based tests (hypothesis) of the tree kernels: invariants of the reference, and kernel == reference."""

import pytest
import torch

pytest.importorskip("hypothesis", reason="property tests need hypothesis (a dev extra)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_tree_kernels import SHAPES, make_tree_inputs, vt

from fastspec.kernels import reference
from fastspec.kernels.sampling import sampling_probs
from fastspec.kernels.tree_mask import tree_mask

tree_cases = st.fixed_dictionaries(
    {
        "batch": st.integers(1, 3),
        "n": st.integers(1, 9),
        "vocab": st.sampled_from([1, 2, 5, 33]),
        "shape": st.sampled_from(SHAPES),
        "draft": st.sampled_from(["probs", "one-hot"]),
        "seed": st.integers(0, 2**20),
        "temperature": st.sampled_from([0.0, 0.7, 1.5]),
        "top_k": st.sampled_from([None, 2]),
        "top_p": st.sampled_from([None, 0.8]),
    }
)


def run(verify, case):
    logits, tokens, parents, q, uniforms, noise = make_tree_inputs(
        case["batch"], case["n"], case["vocab"], case["shape"], draft=case["draft"], seed=case["seed"]
    )
    args = (logits, tokens, parents, q, case["temperature"], case["top_k"], case["top_p"], uniforms, noise)
    return args, verify(*args)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tree_cases)
def test_reference_tree_invariants(case):
    (logits, tokens, parents, *_), (out, num_accepted, accept_index) = run(reference.verify_tree, case)
    vocab = logits.shape[-1]
    probs = sampling_probs(logits, case["temperature"], case["top_k"], case["top_p"])  # greedy rows: one-hot
    for b in range(logits.shape[0]):
        a = int(num_accepted[b])
        path = accept_index[b, :a].tolist()
        assert all(i >= 1 for i in path) and bool((accept_index[b, a:] == -1).all())
        previous = 0  # the accepted nodes form a root-to-node path
        for node in path:
            assert int(parents[b, node]) == previous
            previous = node
        emitted = out[b, : a + 1]
        assert bool((emitted >= 0).all()) and bool((emitted < vocab).all())
        assert bool((out[b, a + 1 :] == -1).all())
        assert emitted[:a].tolist() == [int(tokens[b, i]) for i in path]
        for node, token in zip([0, *path], emitted.tolist(), strict=True):  # nonzero target probability each step
            assert probs[b, node, token] > 0


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(tree_cases)
def test_tree_kernels_equal_reference(case):
    args, got = run(vt.verify_tree, case)
    want = reference.verify_tree(*args)
    for name, g, w in zip(("out_tokens", "num_accepted", "accept_index"), got, want, strict=True):
        assert torch.equal(g, w), f"{name}: kernel {g} reference {w}"
    parents = args[2]
    prefix = torch.ones(parents.shape[0], 3, dtype=torch.long, device=parents.device)  # CUDA where the kernels run
    for g, w in zip(tree_mask(parents, prefix), reference.tree_mask(parents, prefix), strict=True):
        assert torch.equal(g, w)
