"""The eager reference `fastspec.kernels.reference.verify_chain` on its own: it is the oracle of the kernels.

Exact ±100 one-hot cases (p is exactly one-hot in fp32), the degenerate residual p == q, tokens with p(x) = 0,
and the distribution of the first emitted token (chi-square against p after temperature, top-k and top-p).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the backend="triton" case defines the kernels on first call

import pytest  # noqa: E402

from fastspec.kernels.reference import draw_randomness, verify_chain  # noqa: E402
from fastspec.kernels.sampling import sampling_probs  # noqa: E402


def chisquare(observed, expected):
    """scipy's chi-square test; the calling test skips where scipy is missing (the GPU image may lack it)."""
    return pytest.importorskip("scipy.stats").chisquare(observed, expected)


def one_hot_logits(hot: torch.Tensor, vocab: int) -> torch.Tensor:
    """±100 logits [..., V]: softmax is exactly one-hot at `hot` in fp32 (exp(-200) underflows to 0)."""
    return torch.full((*hot.shape, vocab), -100.0).scatter(-1, hot[..., None], 100.0)


def expected_rows(hot: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
    """hot[:, :n] then hot[:, n] (recovered or bonus), then -1, for n = accepted per row."""
    positions = torch.arange(hot.shape[1])
    return torch.where(positions[None, :] <= accepted[:, None], hot, -1)


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("with_probs", [True, False])
def test_all_accepted(k, with_probs):
    batch, vocab = 6, 50
    hot = torch.randint(0, vocab, (batch, k + 1))
    probs = torch.softmax(one_hot_logits(hot[:, :k], vocab), -1) if with_probs else None
    out, n = verify_chain(one_hot_logits(hot, vocab), hot[:, :k], probs, seed=0)
    assert n.tolist() == [k] * batch
    assert out.tolist() == hot.tolist()  # every draft, then the bonus token from position K


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("with_probs", [True, False])
def test_reject_at_each_position(k, with_probs):
    batch, vocab = k, 50
    hot = torch.randint(0, vocab, (batch, k + 1))
    drafts = hot[:, :k].clone()
    rows = torch.arange(batch)
    drafts[rows, rows] = (hot[rows, rows] + 1) % vocab  # row j disagrees first at position j, where p(x) = 0
    probs = torch.softmax(one_hot_logits(drafts, vocab), -1) if with_probs else None
    out, n = verify_chain(one_hot_logits(hot, vocab), drafts, probs, seed=1)
    assert n.tolist() == rows.tolist()
    assert out.tolist() == expected_rows(hot, rows).tolist()  # residual max(p - q, 0) is p: its hot token


def test_ragged_num_draft():
    batch, k, vocab = 4, 3, 40
    hot = torch.randint(0, vocab, (batch, k + 1))
    num_draft = torch.tensor([0, 1, 3, 2])
    out, n = verify_chain(one_hot_logits(hot, vocab), hot[:, :k], num_draft=num_draft, seed=2)
    assert n.tolist() == num_draft.tolist()  # num_draft 0: only the bonus token, sampled at position 0
    assert out.tolist() == expected_rows(hot, num_draft).tolist()


def test_greedy_rows():
    batch, k, vocab = 5, 3, 30
    logits = torch.randn(batch, k + 1, vocab)
    argmax = logits.argmax(-1)
    drafts = argmax[:, :k].clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % vocab  # row 1 disagrees at 0, row 2 at 2, the others agree everywhere
    drafts[2, 2] = (drafts[2, 2] + 1) % vocab
    out, n = verify_chain(logits, drafts, temperature=0.0, seed=3)
    assert n.tolist() == [3, 0, 2, 3, 3]
    assert out.tolist() == expected_rows(argmax, n).tolist()


def test_mixed_greedy_and_sampled_rows():
    batch, k, vocab = 4, 2, 30
    hot = torch.randint(0, vocab, (batch, k + 1))
    drafts = hot[:, :k].clone()
    drafts[0, 1] = (drafts[0, 1] + 1) % vocab
    drafts[3, 0] = (drafts[3, 0] + 1) % vocab
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.7])
    out, n = verify_chain(one_hot_logits(hot, vocab), drafts, temperature=temperature, seed=4)
    assert n.tolist() == [1, 2, 2, 0]
    assert out.tolist() == expected_rows(hot, n).tolist()


@pytest.mark.parametrize("one_hot", [True, False])
def test_degenerate_residual_samples_p(one_hot):
    # p == q and u = 1: the draft is rejected and max(p - q, 0) is all zero -> fall back to sampling p
    batch, k, vocab = 6, 2, 40
    logits = (
        one_hot_logits(torch.randint(0, vocab, (batch, k + 1)), vocab) if one_hot else torch.randn(batch, k + 1, vocab)
    )
    p = sampling_probs(logits)
    drafts = p[:, :k].argmax(-1)
    uniforms, noise = torch.ones(batch, k), draw_randomness(batch, k, vocab, 5, "cpu")[1]
    out, n = verify_chain(logits, drafts, p[:, :k].clone(), uniforms=uniforms, noise=noise)
    assert n.tolist() == [0] * batch
    assert ((out[:, 0] >= 0) & (out[:, 0] < vocab)).all()
    assert out[:, 0].tolist() == (p[:, 0] / noise).argmax(-1).tolist()  # the race over p itself, no NaN


@pytest.mark.parametrize("with_probs", [True, False])
def test_zero_probability_draft_never_accepted(with_probs):
    # top-k removes the drafts (p(x) = 0) while q(x) > 0; even the smallest uniforms must reject them
    batch, k, vocab = 64, 3, 20
    logits = torch.randn(batch, k + 1, vocab)
    drafts = logits[:, :k].argsort(-1)[..., 0]  # the least likely token, outside the top 5
    probs = torch.full((batch, k, vocab), 1.0 / vocab) if with_probs else None
    uniforms = torch.full((batch, k), torch.finfo(torch.float32).tiny)
    noise = draw_randomness(batch, k, vocab, 6, "cpu")[1]
    out, n = verify_chain(logits, drafts, probs, top_k=5, uniforms=uniforms, noise=noise)
    assert n.tolist() == [0] * batch
    top5 = logits[:, 0].topk(5).indices
    assert (out[:, :1] == top5).any(-1).all()  # the recovered token is inside the top-k set


@pytest.mark.parametrize("draft", ["one-hot", "sampled"])
@pytest.mark.parametrize("top_k, top_p", [(None, None), (10, 0.9)])
def test_first_token_distribution(draft, top_k, top_p):
    trials, k, vocab, temperature = 20_000, 2, 16, 0.9
    g = torch.Generator().manual_seed(8)
    target = torch.randn(1, k + 1, vocab, generator=g) * 1.5
    draft_logits = torch.randn(1, k, vocab, generator=g) * 1.5
    p = sampling_probs(target, temperature, top_k, top_p)[0, 0].double()
    if draft == "sampled":  # q is exactly the distribution the drafts were sampled from, after the same transform
        q = sampling_probs(draft_logits, temperature, top_k, top_p)[0]
        drafts = torch.multinomial(q, trials, replacement=True, generator=g).T
        probs = q.expand(trials, k, vocab)
    else:  # greedy draft model: q is one-hot at its argmax
        drafts, probs = draft_logits.argmax(-1).expand(trials, k), None
    out, _ = verify_chain(
        target.expand(trials, k + 1, vocab), drafts, probs, temperature=temperature, top_k=top_k, top_p=top_p, seed=9
    )
    counts = torch.bincount(out[:, 0], minlength=vocab).double()
    support = p > 0
    assert counts[~support].sum() == 0, f"tokens outside the support of p emitted: {counts.tolist()}"
    expected = p[support] / p[support].sum() * trials
    pvalue = chisquare(counts[support].numpy(), expected.numpy()).pvalue
    assert pvalue > 1e-3, f"first-token counts {counts.tolist()} vs expected {(p * trials).tolist()}: p={pvalue:.2e}"


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_out_of_range_draft_is_rejected_without_touching_token_zero(backend):
    """An invalid one-hot draft (-5) is rejected and the recovered token is sampled from p itself."""
    from fastspec.verify import verify_chain

    trials, vocab = 20_000, 4
    # the Triton backend needs CUDA tensors where there is CUDA (the interpreter takes CPU tensors only without it)
    device = "cuda" if backend == "triton" and torch.cuda.is_available() else "cpu"
    probs = torch.tensor([0.4, 0.3, 0.2, 0.1])
    logits = probs.log().expand(trials, 2, vocab).contiguous().to(device)
    drafts = torch.full((trials, 1), -5, device=device)
    out, n = verify_chain(logits, drafts, None, None, 1.0, None, None, seed=3, backend=backend)
    assert int(n.max()) == 0
    counts = torch.bincount(out[:, 0].cpu(), minlength=vocab).double()
    expected = probs.double() / probs.double().sum() * trials
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3


def test_top_p_one_keeps_every_token():
    """top_p = 1.0 is a no-op even where an fp32 cumulative sum reaches 1 before the tail."""
    from fastspec.kernels.sampling import transform_logits

    logits = torch.cat([torch.full((1, 1), 30.0), torch.randn(1, 50_000)], dim=1)
    assert torch.equal(transform_logits(logits, 1.0, None, 1.0), transform_logits(logits, 1.0, None, None))
