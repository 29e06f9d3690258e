"""Property-based tests (hypothesis) of the chain verifier: the reference's invariants, and kernel == reference.

Inputs cover awkward vocabularies (V = 1, 2, not a multiple of any block), ragged draft counts, mixed greedy and
sampled rows, temperature / top-k / top-p, masked vocabulary (-inf logits), huge magnitudes and bf16 ties.
"""

import pytest
import torch

pytest.importorskip("hypothesis", reason="property tests need hypothesis (a dev extra)")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastspec.kernels import reference
from fastspec.kernels.sampling import sampling_probs
from fastspec.kernels.verify_chain import verify_chain as triton_verify_chain


@st.composite
def chain_inputs(draw):
    batch = draw(st.integers(1, 3))
    k = draw(st.integers(0, 4))
    vocab = draw(st.sampled_from([1, 2, 3, 7, 33, 130]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    scale = draw(st.sampled_from([0.1, 3.0, 1e4]))  # flat, ordinary, and huge-magnitude logits
    logits = torch.randn(batch, k + 1, vocab, generator=gen) * scale
    if draw(st.booleans()):  # masked vocabulary: -inf entries, one finite logit kept per row
        masked = torch.rand(batch, k + 1, vocab, generator=gen) < 0.4
        masked[..., 0] = False
        logits = logits.masked_fill(masked, float("-inf"))
    if draw(st.booleans()):  # bf16 logits: many exact ties
        logits = logits.bfloat16()
    drafts = torch.randint(-1, vocab + 1, (batch, k), generator=gen)  # includes invalid ids -1 and V
    draft_probs = None
    if draw(st.booleans()) and k > 0:
        draft_probs = torch.softmax(torch.randn(batch, k, vocab, generator=gen), -1)
    num_draft = torch.randint(0, k + 1, (batch,), generator=gen)
    temperature = torch.tensor([draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])) for _ in range(batch)])
    top_k = draw(st.sampled_from([None, 1, 3]))
    top_p = draw(st.sampled_from([None, 0.5, 0.95, 1.0]))
    uniforms, noise = reference.draw_randomness(batch, k, vocab, seed, "cpu")
    return logits, drafts, draft_probs, num_draft, temperature, top_k, top_p, uniforms, noise


def check_invariants(args, out, num_accepted):
    logits, drafts, _, num_draft, temperature, top_k, top_p, _, _ = args
    batch, k_plus_1, vocab = logits.shape
    probs = sampling_probs(logits, temperature, top_k, top_p)
    for b in range(batch):
        a = int(num_accepted[b])
        assert 0 <= a <= int(num_draft[b])  # never more accepted than drafted
        emitted = out[b, : a + 1]
        assert bool((emitted >= 0).all()) and bool((emitted < vocab).all())  # no -1 inside the emitted prefix
        assert bool((out[b, a + 1 :] == -1).all())
        assert torch.equal(emitted[:a], drafts[b, :a])
        for j, token in enumerate(emitted.tolist()):
            assert probs[b, j, token] > 0, f"row {b} emitted token {token} with target probability 0 at {j}"


@settings(max_examples=100, deadline=None, derandomize=True)
@given(chain_inputs())
def test_reference_invariants(args):
    check_invariants(args, *reference.verify_chain(*args))


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(chain_inputs())
def test_kernel_equals_reference(args):
    expected = reference.verify_chain(*args)
    # the kernel runs on CUDA tensors where there is CUDA, else on CPU tensors through the interpreter
    device = "cuda" if torch.cuda.is_available() else "cpu"
    got = [t.cpu() for t in triton_verify_chain(*[a.to(device) if isinstance(a, torch.Tensor) else a for a in args])]
    check_invariants(args, *got)
    assert torch.equal(got[1], expected[1]), (got[1], expected[1])
    assert torch.equal(got[0], expected[0]), (got[0], expected[0])
