"""Triton chain verification (`fastspec.kernels.verify_chain`) against the eager reference.

Three levels, as in vLLM's rejection-sampler tests: bit-exact against the reference with the same injected
uniforms and noise (tokens and counts equal), exact ±100 one-hot cases, and the distribution of the first emitted
token (chi-square against p after temperature, top-k and top-p). Without CUDA the kernels run in Triton's
interpreter, so shapes stay small; the large-vocabulary cases run only on a GPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules define their kernels

import ast  # noqa: E402
import inspect  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import triton  # noqa: E402

from fastspec.kernels import reference  # noqa: E402
from fastspec.kernels import sampling_filters as sf  # noqa: E402
from fastspec.kernels import verify_chain as vc  # noqa: E402
from fastspec.kernels import verify_chain_kernels as vck  # noqa: E402
from fastspec.kernels.sampling import sampling_probs  # noqa: E402


def chisquare(observed, expected):
    """scipy's chi-square test; the calling test skips where scipy is missing (the GPU image may lack it)."""
    return pytest.importorskip("scipy.stats").chisquare(observed, expected)


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def make_inputs(batch, k, vocab, *, dtype=torch.float32, draft="probs", num_draft=None, temperature=1.0,
                top_k=None, top_p=None, scale=2.0, seed=0, device=DEVICE):  # fmt: skip
    """Random target logits, drafts and randomness; `draft` is "probs" (tokens sampled from q) or "one-hot"."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, k + 1, vocab, generator=g) * scale).to(dtype)
    if draft == "probs":
        draft_probs = torch.softmax(torch.randn(batch, k, vocab, generator=g) * scale, -1)
        tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=g).reshape(batch, k)
        draft_probs = draft_probs.to(dtype)
    else:  # one-hot draft: the target argmax half the time, so some drafts are accepted
        draft_probs = None
        tokens = torch.where(
            torch.rand(batch, k, generator=g) < 0.5,
            logits[:, :k].float().argmax(-1),
            torch.randint(0, vocab, (batch, k), generator=g),
        )
    uniforms, noise = reference.draw_randomness(batch, k, vocab, seed + 1, "cpu")
    kwargs = dict(draft_probs=draft_probs, num_draft=num_draft, temperature=temperature, top_k=top_k, top_p=top_p)
    kwargs = {name: v.to(device) if isinstance(v, torch.Tensor) else v for name, v in kwargs.items()}
    return logits.to(device), tokens.to(device), kwargs, uniforms.to(device), noise.to(device)


def assert_same_rows(out, n, ref_out, ref_n):
    """Tokens and accepted counts equal; on failure show the first mismatching row."""
    bad = ((out != ref_out).any(-1) | (n != ref_n)).nonzero().flatten().tolist()
    if bad:
        r = bad[0]
        raise AssertionError(
            f"{len(bad)}/{len(out)} rows differ; first is row {r}: kernel {out[r].tolist()} (accepted {n[r].item()}),"
            f" reference {ref_out[r].tolist()} (accepted {ref_n[r].item()})"
        )


def run_both(logits, tokens, kwargs, uniforms, noise, max_block_v=None):
    out, n = vc._verify_chain(
        logits, tokens, kwargs["draft_probs"], kwargs["num_draft"], kwargs["temperature"], kwargs["top_k"],
        kwargs["top_p"], uniforms, noise, max_block_v=max_block_v,
    )  # fmt: skip
    ref_out, ref_n = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    return out, n, ref_out, ref_n


def per_row(values, dtype):
    return torch.tensor(values, dtype=dtype)


# (shape and inputs, max_block_v); each comment names the code path the case exercises
CASES = [
    # statistics in one chunk per row, several rows per program; race in one chunk
    pytest.param(dict(batch=4, k=3, vocab=1000), None, id="probs-one-chunk"),
    # V = 2500 is not a multiple of the 1024 chunk: three chunks merged per row, last one partial
    pytest.param(dict(batch=3, k=4, vocab=2500), None, id="probs-ragged-chunks"),
    # 64-wide chunks: 5 statistics chunks and 5 race programs per row meeting in the atomic max
    pytest.param(dict(batch=2, k=2, vocab=300), 64, id="probs-tiny-chunks"),
    # ragged rows: num_draft 0 emits only a bonus token from position 0; later positions are never read
    pytest.param(
        dict(batch=6, k=4, vocab=500, num_draft=per_row([0, 1, 4, 2, 0, 3], torch.long)), None, id="ragged-num-draft"
    ),
    pytest.param(dict(batch=5, k=1, vocab=700), None, id="k1"),
    # K = 0: no drafts at all, every row samples the bonus token
    pytest.param(dict(batch=3, k=0, vocab=400), None, id="k0-bonus-only"),
    # one-hot draft (draft_probs None): accept with p(x), residual is p without x
    pytest.param(dict(batch=6, k=3, vocab=900, draft="one-hot"), None, id="one-hot"),
    pytest.param(
        dict(batch=4, k=3, vocab=1500, draft="one-hot", num_draft=per_row([3, 0, 2, 1], torch.int32)),
        512,
        id="one-hot-ragged-int32",
    ),
    # all rows greedy: argmax comparison, no race loads
    pytest.param(dict(batch=4, k=3, vocab=800, draft="one-hot", temperature=0.0), None, id="greedy"),
    # greedy and sampled rows in one batch, per-row temperature
    pytest.param(
        dict(batch=6, k=3, vocab=600, temperature=per_row([0.0, 1.0, 0.5, 0.0, 2.0, 0.7], torch.float32)),
        None,
        id="mixed-greedy",
    ),
    # bf16 / fp16 logits and draft probs upcast in registers; bf16 logits tie often (argmax takes the lowest index)
    pytest.param(dict(batch=4, k=3, vocab=1000, dtype=torch.bfloat16), None, id="bf16"),
    pytest.param(
        dict(batch=4, k=3, vocab=1000, dtype=torch.bfloat16, draft="one-hot", temperature=0.0),
        None,
        id="bf16-greedy-ties",
    ),
    pytest.param(dict(batch=4, k=2, vocab=1300, dtype=torch.float16), None, id="fp16"),
    # filtered statistics kernel: scalar top-k threshold search
    pytest.param(dict(batch=4, k=3, vocab=800, top_k=20), None, id="top-k"),
    # scalar top-p search with a one-hot draft
    pytest.param(dict(batch=4, k=3, vocab=800, draft="one-hot", top_p=0.8), None, id="top-p"),
    # both filters per row, including disabled entries (top_k 0 and >= V, top_p 1) and a greedy row
    pytest.param(
        dict(
            batch=5,
            k=2,
            vocab=300,
            top_k=per_row([0, 5, 300, 40, 7], torch.long),
            top_p=per_row([0.5, 1.0, 0.9, 0.3, 0.95], torch.float32),
            temperature=per_row([1.0, 0.0, 0.7, 1.5, 1.0], torch.float32),
        ),
        None,
        id="top-k-top-p-per-row",
    ),
    # the threshold search loops over three 256-wide blocks of V per pass; bf16 ties at the threshold
    pytest.param(
        dict(batch=2, k=1, vocab=700, top_k=50, top_p=0.9, dtype=torch.bfloat16), 256, id="filters-multi-block-bf16"
    ),
]


@pytest.mark.parametrize("case, max_block_v", CASES)
def test_matches_reference(case, max_block_v):
    assert_same_rows(*run_both(*make_inputs(**case), max_block_v=max_block_v))


def test_strided_inputs():
    """Logits sliced out of a larger tensor (batch and position strides) and column-sliced int32 drafts."""
    logits, tokens, kwargs, uniforms, noise = make_inputs(3, 3, 500)
    big = torch.randn(3, 6, 500, device=DEVICE)
    big[:, 2:6] = logits
    wide_tokens = torch.zeros(3, 7, dtype=torch.int32, device=DEVICE)
    wide_tokens[:, 1:7:2] = tokens
    out, n = vc.verify_chain(big[:, 2:6], wide_tokens[:, 1:7:2], uniforms=uniforms, noise=noise, **kwargs)
    assert_same_rows(out, n, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))


def test_same_seed_same_tokens():
    logits, tokens, kwargs, _, _ = make_inputs(4, 3, 600, top_k=30)
    out, n = vc.verify_chain(logits, tokens, seed=7, **kwargs)
    assert_same_rows(out, n, *reference.verify_chain(logits, tokens, seed=7, **kwargs))


def one_hot_logits(hot, vocab):
    """±100 logits: p is exactly one-hot at `hot` [..] in fp32."""
    return torch.full((*hot.shape, vocab), -100.0).scatter(-1, hot[..., None], 100.0)


@pytest.mark.parametrize("draft", ["probs", "one-hot"])
def test_all_accepted_exact(draft):
    # target one-hot at the drafts and at the bonus token; the drafts are all accepted, the bonus is the hot token
    batch, k, vocab = 5, 4, 300
    hot = torch.randint(0, vocab, (batch, k + 1))
    probs = torch.softmax(one_hot_logits(hot[:, :k], vocab), -1) if draft == "probs" else None
    uniforms, noise = reference.draw_randomness(batch, k, vocab, 0, "cpu")
    args = [one_hot_logits(hot, vocab), hot[:, :k], probs]
    out, n = vc.verify_chain(*[a if a is None else a.to(DEVICE) for a in args], uniforms=uniforms.to(DEVICE),
                             noise=noise.to(DEVICE))  # fmt: skip
    assert out.tolist() == hot.tolist() and n.tolist() == [k] * batch


def test_all_rejected_exact():
    # p(x) = 0 at every draft (even with tiny uniforms): rejected at position 0, recovered token = target's hot token
    batch, k, vocab = 5, 3, 300
    hot = torch.randint(0, vocab, (batch, k + 1))
    tokens = (hot[:, :k] + 1) % vocab
    probs = torch.softmax(one_hot_logits(tokens, vocab), -1)
    uniforms, noise = torch.full((batch, k), 1e-30), reference.draw_randomness(batch, k, vocab, 0, "cpu")[1]
    out, n = vc.verify_chain(*(t.to(DEVICE) for t in (one_hot_logits(hot, vocab), tokens, probs)),
                             uniforms=uniforms.to(DEVICE), noise=noise.to(DEVICE))  # fmt: skip
    expected = torch.full((batch, k + 1), -1)
    expected[:, 0] = hot[:, 0]
    assert out.tolist() == expected.tolist() and n.tolist() == [0] * batch


def test_degenerate_residual_samples_p():
    # p == q (uniform, exact in fp32 for V = 256) and u = 1: rejected with an all-zero residual -> sample p itself
    batch, k, vocab = 4, 2, 256
    logits = torch.zeros(batch, k + 1, vocab, device=DEVICE)
    probs = torch.full((batch, k, vocab), 1.0 / vocab, device=DEVICE)
    tokens = torch.randint(0, vocab, (batch, k), device=DEVICE)
    uniforms = torch.ones(batch, k, device=DEVICE)
    noise = reference.draw_randomness(batch, k, vocab, 0, DEVICE)[1]
    out, n = vc.verify_chain(logits, tokens, probs, uniforms=uniforms, noise=noise)
    assert n.tolist() == [0] * batch
    assert out[:, 0].tolist() == noise.argmin(-1).tolist()  # argmax of (1/V) / E
    assert_same_rows(out, n, *reference.verify_chain(logits, tokens, probs, uniforms=uniforms, noise=noise))


def test_invalid_draft_tokens_rejected():
    # out-of-range drafts inside num_draft are rejected, never read out of bounds
    logits, tokens, kwargs, uniforms, noise = make_inputs(4, 3, 400, num_draft=torch.tensor([3, 3, 2, 3]))
    tokens[0, 0], tokens[1, 1], tokens[3, 2] = -1, 400, 10**6
    assert_same_rows(*run_both(logits, tokens, kwargs, uniforms, noise))


@pytest.mark.parametrize(
    "draft, top_k, top_p",
    [
        ("probs", None, None),  # unfiltered chunk statistics, q sampled
        ("probs", 8, 0.9),  # threshold search, q after the same transform
        ("one-hot", 8, 0.9),  # greedy draft: q one-hot at the draft argmax
    ],
)
def test_first_token_distribution(draft, top_k, top_p):
    trials, k, vocab, temperature = 20_000, 1, 12, 0.8
    g = torch.Generator().manual_seed(3)
    target = torch.randn(1, k + 1, vocab, generator=g) * 1.5
    draft_logits = torch.randn(1, k, vocab, generator=g) * 1.5
    p = sampling_probs(target, temperature, top_k, top_p)[0, 0]
    q = sampling_probs(draft_logits, temperature, top_k, top_p)[0]  # [K, V]
    if draft == "probs":
        tokens = torch.multinomial(q, trials, replacement=True, generator=g).T  # [trials, K]
        probs = q.expand(trials, k, vocab).to(DEVICE)
    else:
        tokens, probs = draft_logits.argmax(-1).expand(trials, k), None
    out, _ = vc.verify_chain(
        target.expand(trials, k + 1, vocab).to(DEVICE), tokens.to(DEVICE), probs,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=11,
    )  # fmt: skip
    counts = torch.bincount(out[:, 0].cpu(), minlength=vocab).double()
    support = p > 0
    assert counts[~support].sum() == 0, f"tokens outside the support of p emitted: {counts.tolist()}"
    expected = p[support].double() / p[support].double().sum() * trials
    pvalue = chisquare(counts[support].numpy(), expected.numpy()).pvalue
    assert pvalue > 1e-3, f"first-token counts {counts.tolist()} vs expected {(p * trials).tolist()}: p={pvalue:.2e}"


def test_dispatch_uses_the_kernel():
    """`fastspec.verify.verify_chain(backend="triton")` reaches this kernel with the same arguments."""
    from fastspec.verify import verify_chain as dispatch

    logits, tokens, kwargs, uniforms, noise = make_inputs(3, 2, 300, top_p=0.9)
    out, n = dispatch(logits, tokens, uniforms=uniforms, noise=noise, backend="triton", **kwargs)
    assert_same_rows(out, n, *vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))


def test_search_passes_suffice():
    """8 passes of 16 pivots shrink any interval of 2**32 int keys to adjacent keys (an exact threshold)."""
    d = 2**32 + 1
    pivots = sf._PIVOTS.value
    for _ in range(sf._SEARCH_PASSES.value):
        cuts = [(d * i) // (pivots + 1) for i in range(pivots + 1)] + [d]
        d = max(b - a for a, b in zip(cuts, cuts[1:], strict=False))
    assert d == 1


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(target_logits=torch.zeros(2, 8)), "target_logits"),
        (dict(target_logits=torch.zeros(2, 3, 8, dtype=torch.long)), "target_logits"),
        (dict(draft_tokens=torch.zeros(2, 3, dtype=torch.long)), "draft_tokens"),
        (dict(draft_tokens=torch.zeros(2, 2)), "draft_tokens"),
        (dict(draft_probs=torch.zeros(2, 2, 7)), "draft_probs"),
        (dict(num_draft=torch.zeros(3, dtype=torch.long)), "num_draft"),
        (dict(num_draft=torch.zeros(2)), "num_draft"),
        (dict(temperature=torch.ones(3)), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=torch.ones(2)), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(uniforms=torch.ones(2, 3), noise=torch.ones(2, 8)), "uniforms"),
        (dict(uniforms=torch.ones(2, 2), noise=torch.ones(2, 9)), "noise"),
    ],
)
def test_bad_input_names_the_argument(change, match):
    args = dict(target_logits=torch.zeros(2, 3, 8), draft_tokens=torch.zeros(2, 2, dtype=torch.long))
    args.update(change)
    args = {name: v.to(DEVICE) if isinstance(v, torch.Tensor) else v for name, v in args.items()}
    with pytest.raises(ValueError, match=match):
        vc.verify_chain(**args)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="target_logits"):
        vc.verify_chain([[[0.0]]], torch.zeros(1, 0, dtype=torch.long))


def test_interpreter_flag_matches_the_kernels():
    """One flag (kernels/_host.py) tells every wrapper whether Triton defined the kernels for its interpreter."""
    from fastspec.kernels import _host

    assert _host.INTERPRETED == (not isinstance(vck._accept_residual_kernel, triton.runtime.JITFunction))


def test_exports_and_signature():
    from fastspec.kernels import chain_verifier

    assert vc.__all__ == ["ChainVerifier", "verify_chain"] and callable(vc.verify_chain)
    assert vc.ChainVerifier is chain_verifier.ChainVerifier
    kernel, ref = inspect.signature(vc.verify_chain), inspect.signature(reference.verify_chain)
    assert [(p.name, p.default) for p in kernel.parameters.values()] == [
        (p.name, p.default) for p in ref.parameters.values()
    ]


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [128256, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "extra",
    [
        dict(),  # chunked statistics, 8192-wide chunks
        dict(draft="one-hot", temperature=per_row([0.0, 1.0, 0.7, 0.0, 1.0, 1.3, 1.0, 0.0], torch.float32)),
        dict(top_k=50, top_p=0.9),  # threshold search over the full vocabulary
        dict(num_draft=per_row([4, 0, 2, 4, 1, 3, 4, 4], torch.long), top_p=0.95),
    ],
)
def test_large_vocab_matches_reference_gpu(vocab, dtype, extra):
    assert_same_rows(*run_both(*make_inputs(8, 4, vocab, dtype=dtype, **extra)))


@gpu_only
@pytest.mark.gpu
def test_cuda_graph_replay_gpu():
    logits, tokens, kwargs, uniforms, noise = make_inputs(8, 4, 128256, dtype=torch.bfloat16)
    eager = vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up (compiles) outside the capture
        vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    graph.replay()
    graph.replay()  # the workspace is re-zeroed by every replay
    torch.cuda.synchronize()
    assert_same_rows(*captured, *eager)


def test_kernels_do_not_import_the_reference():
    """The eager reference is the kernels' test oracle: no production module of kernels/ imports it."""
    folder = Path(vc.__file__).parent
    for path in sorted(folder.glob("*.py")):
        if path.name == "reference.py":
            continue
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
        assert "fastspec.kernels.reference" not in imported, f"{path.name} imports the reference"
