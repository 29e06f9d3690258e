"""The lean chain verifier (`fastspec.kernels.chain_verifier.ChainVerifier`) and the launch path under it.

Token for token equal to `verify_chain` and the reference for several layouts; independent results across calls
(new outputs each call, or the caller's `out=` buffers); greedy calls without randomness; argument errors that name
the argument; `verify_chain`'s cache of verifiers; `Launcher`'s direct launches (emulated on CPU: the compiled
kernel's launcher is stood in for by the interpreter, called the way a compiled launcher is). On a GPU: the direct
launches for real, inside a captured CUDA graph.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules define their kernels

import pytest  # noqa: E402
import triton  # noqa: E402
from test_verify_chain_kernel import CASES, DEVICE, assert_same_rows, gpu_only, make_inputs, per_row  # noqa: E402

from fastspec.kernels import _host, reference  # noqa: E402
from fastspec.kernels import chain_verifier as cv  # noqa: E402
from fastspec.kernels import verify_chain as vc  # noqa: E402
from fastspec.kernels import verify_chain_kernels as vck  # noqa: E402


def build_for(batch, k, vocab, kwargs, dtype=torch.float32, **extra):
    """A ChainVerifier for the layout of `make_inputs(...)`'s kwargs."""
    probs = kwargs["draft_probs"]

    def kind(value):
        return "per_row" if isinstance(value, torch.Tensor) else value

    return vc.ChainVerifier(
        batch, k, vocab, dtype=dtype, device=DEVICE, draft_probs=False if probs is None else probs.dtype,
        num_draft=kwargs["num_draft"] is not None, temperature=kind(kwargs["temperature"]), top_k=kind(kwargs["top_k"]),
        top_p=kind(kwargs["top_p"]), **extra,
    )  # fmt: skip


# the kernel tests' cases (every code path of the kernels), each through one verifier called twice
LAYOUTS = [pytest.param(dict(p.values[0], max_block_v=p.values[1]), id=p.id) for p in CASES]


@pytest.mark.parametrize("case", LAYOUTS)
def test_matches_verify_chain_and_reference(case):
    case = dict(case)
    max_block_v = case.pop("max_block_v")
    dtype = case.get("dtype", torch.float32)
    first = make_inputs(**case, seed=0)
    verifier = build_for(case["batch"], case["k"], case["vocab"], first[2], dtype=dtype, max_block_v=max_block_v)
    results = []
    for seed in (0, 1):  # a second call with other inputs must not disturb the first call's results
        logits, tokens, kwargs, uniforms, noise = make_inputs(**case, seed=seed)
        got = verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
        assert_same_rows(*got, *vc._verify_chain(logits, tokens, *kwargs.values(), uniforms, noise, max_block_v))
        want = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
        assert_same_rows(*got, *want)
        results.append((got, want))
    (got0, want0), (got1, _) = results
    assert got0[0] is not got1[0] and got0[1] is not got1[1]
    assert_same_rows(*got0, *want0)  # unchanged by the second call


def test_out_buffers_are_written_and_returned():
    logits, tokens, kwargs, uniforms, noise = make_inputs(4, 3, 700, top_k=30)
    verifier = build_for(4, 3, 700, kwargs)
    out = verifier.new_outputs()
    out[0].fill_(123)
    got = verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    assert_same_rows(*out, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))
    first = (out[0].clone(), out[1].clone())
    logits2, tokens2, _, uniforms2, noise2 = make_inputs(4, 3, 700, top_k=30, seed=5)
    verifier(logits2, tokens2, uniforms=uniforms2, noise=noise2, **kwargs, out=out)  # documented: overwrites `out`
    assert_same_rows(*out, *reference.verify_chain(logits2, tokens2, uniforms=uniforms2, noise=noise2, **kwargs))
    assert_same_rows(*first, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))


def test_greedy_needs_no_randomness():
    logits, tokens, kwargs, uniforms, noise = make_inputs(5, 4, 600, draft="one-hot", temperature=0.0)
    verifier = build_for(5, 4, 600, kwargs)
    got = verifier(logits, tokens, **kwargs)
    assert_same_rows(*got, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))


def test_scalar_overrides_within_the_built_filters():
    """Built with top-k and top-p, a call may change the scalars or switch the filters off (top_k 0, top_p 1)."""
    logits, tokens, kwargs, uniforms, noise = make_inputs(4, 3, 500, top_k=20, top_p=0.9)
    verifier = build_for(4, 3, 500, kwargs)
    for temperature, top_k, top_p in [(0.5, 0, 1.0), (1.3, 7, 0.5), (0.0, None, None)]:
        got = verifier(logits, tokens, kwargs["draft_probs"], None, temperature, top_k, top_p, uniforms, noise)
        want = reference.verify_chain(logits, tokens, kwargs["draft_probs"], None, temperature,
                                      20 if top_k is None else top_k, 0.9 if top_p is None else top_p,
                                      uniforms, noise)  # fmt: skip
        assert_same_rows(*got, *want)


def test_strided_logits_and_drafts():
    """Logits sliced out of a wider buffer and column-sliced int32 drafts: strides change between calls."""
    logits, tokens, kwargs, uniforms, noise = make_inputs(3, 3, 500)
    verifier = build_for(3, 3, 500, kwargs)
    big = torch.randn(3, 6, 500, device=DEVICE)
    big[:, 2:6] = logits
    wide = torch.zeros(3, 7, dtype=torch.int32, device=DEVICE)
    wide[:, 2:5] = tokens
    want = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    assert_same_rows(*verifier(big[:, 2:6], wide[:, 2:5], uniforms=uniforms, noise=noise, **kwargs), *want)
    assert_same_rows(*verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs), *want)


@pytest.mark.parametrize(
    "change, error, match",
    [
        (dict(target_logits=torch.zeros(2, 3, 9)), ValueError, "target_logits"),
        (dict(target_logits=torch.zeros(2, 3, 8, dtype=torch.bfloat16)), ValueError, "target_logits"),
        # strided views made on the device: `.to(device)` of a non-dense view would make it contiguous
        (dict(target_logits=torch.zeros(2, 8, 3, device=DEVICE).transpose(1, 2)), ValueError, "target_logits.*unit"),
        (dict(draft_tokens=torch.zeros(2, 2)), ValueError, "draft_tokens"),
        (dict(draft_probs=torch.zeros(2, 2, 8)), ValueError, "draft_probs"),
        (dict(num_draft=torch.zeros(2, dtype=torch.long)), ValueError, "num_draft"),
        (dict(uniforms=torch.ones(2, 2, dtype=torch.float64)), ValueError, "uniforms"),
        (dict(noise=None), TypeError, "noise"),
        (dict(temperature=-1.0), ValueError, "temperature"),
        (dict(temperature=torch.ones(2)), ValueError, "temperature.*per_row"),
        (dict(top_k=5), ValueError, "top_k.*built without"),
        (dict(top_p=0.5), ValueError, "top_p.*built without"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(out=(torch.zeros(2, 3, dtype=torch.int32), torch.zeros(2, dtype=torch.long))), ValueError, "out"),
        (
            dict(out=(torch.zeros(2, 4, dtype=torch.long, device=DEVICE)[:, :3], torch.zeros(2, dtype=torch.long))),
            ValueError,
            "contiguous",
        ),
    ],
)
def test_bad_call_names_the_argument(change, error, match):
    verifier = vc.ChainVerifier(2, 2, 8, device=DEVICE)
    args = dict(target_logits=torch.zeros(2, 3, 8), draft_tokens=torch.zeros(2, 2, dtype=torch.long),
                uniforms=torch.ones(2, 2), noise=torch.ones(2, 8))  # fmt: skip
    args.update(change)

    def put(v):
        return v.to(DEVICE) if isinstance(v, torch.Tensor) else v

    args = {name: tuple(map(put, v)) if isinstance(v, tuple) else put(v) for name, v in args.items()}
    with pytest.raises(error, match=match):
        verifier(**args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(batch=0), "batch"),
        (dict(vocab=0), "vocab"),
        (dict(dtype=torch.int64), "dtype"),
        (dict(temperature="rows"), "temperature"),
        (dict(top_p=0.0), "top_p"),
    ],
)
def test_bad_build_names_the_argument(kwargs, match):
    args = dict(batch=2, num_draft_tokens=2, vocab=8, device=DEVICE)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        vc.ChainVerifier(**args)


def test_verify_chain_reuses_one_verifier_per_layout():
    vc._VERIFIERS.clear()
    logits, tokens, kwargs, uniforms, noise = make_inputs(3, 2, 300, top_p=0.8)
    first = vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    logits2, tokens2, _, uniforms2, noise2 = make_inputs(3, 2, 300, top_p=0.8, seed=3)
    second = vc.verify_chain(logits2, tokens2, uniforms=uniforms2, noise=noise2, **kwargs)
    assert len(vc._VERIFIERS) == 1
    assert_same_rows(*first, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))
    assert_same_rows(*second, *reference.verify_chain(logits2, tokens2, uniforms=uniforms2, noise=noise2, **kwargs))
    vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **dict(kwargs, top_p=None))  # another layout
    assert len(vc._VERIFIERS) == 2


def test_verify_chain_converts_what_the_lean_call_refuses():
    """After the layout's verifier exists, arguments it would refuse (fp64 randomness, strided drafts, int64 top_k
    given as a [1] tensor) still go through verify_chain's conversions, with the same results."""
    logits, tokens, kwargs, uniforms, noise = make_inputs(3, 3, 400, top_k=per_row([5, 50, 0], torch.long))
    want = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    assert_same_rows(*vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs), *want)
    wide = torch.zeros(3, 6, dtype=torch.long, device=DEVICE)
    wide[:, ::2] = tokens
    got = vc.verify_chain(logits, wide[:, ::2], uniforms=uniforms.double(), noise=noise.double(), **kwargs)
    assert_same_rows(*got, *want)
    one_k = dict(kwargs, top_k=torch.tensor([5], device=DEVICE))
    got = vc.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **one_k)
    assert_same_rows(*got, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **one_k))


class _EmulatedCompiled:
    """Stands in for a `CompiledKernel`: `[grid]` gives a launcher taking every argument positionally."""

    def __init__(self, kernel, log):
        self.kernel, self.log, self.function = kernel, log, object()

    def __getitem__(self, grid):
        assert len(grid) == 3, "Triton's CompiledKernel[grid] reads grid[0], grid[1] and grid[2]"

        def launch(*args):
            self.log.append("direct")
            self.kernel[grid](*args)

        return launch


class _EmulatedJIT:
    """Stands in for a `JITFunction`: launches through the interpreter and returns an `_EmulatedCompiled`."""

    def __init__(self, kernel, log):
        self.kernel, self.log, self.arg_names = kernel, log, kernel.arg_names

    def __getitem__(self, grid):
        def launch(*args, num_warps):
            self.log.append("jit")
            self.kernel[grid](*args, num_warps=num_warps)
            return _EmulatedCompiled(self.kernel, self.log)

        return launch


@pytest.mark.skipif(not _host.INTERPRETED, reason="emulates compiled launchers with the interpreter")
def test_direct_launches_emulated(monkeypatch):
    """Compiled-launcher calls (arguments in signature order, constexprs last) give the interpreter's results; one
    JIT launch per kernel and specialisation key, direct launches after; a failing launcher falls back to the JIT."""
    log = []
    for name in ("_chunk_stats_kernel", "_filtered_stats_kernel", "_accept_residual_kernel"):
        monkeypatch.setattr(cv, name, _EmulatedJIT(getattr(vck, name), log))  # as the verifiers launch them
    monkeypatch.setattr(cv, "INTERPRETED", False)  # compute the specialisation keys
    monkeypatch.setattr(_host, "_direct_launches", True)
    cases = [
        dict(draft="one-hot", temperature=0.0),
        dict(top_k=9, top_p=0.9),
        dict(num_draft=per_row([2, 0, 1], torch.long)),
    ]
    for case in cases:
        logits, tokens, kwargs, uniforms, noise = make_inputs(3, 2, 300, **case)
        verifier = build_for(3, 2, 300, kwargs)
        log.clear()
        for _ in range(3):
            got = verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
            assert_same_rows(*got, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))
        assert log == ["jit", "jit"] + ["direct"] * 4
        wide = torch.zeros(3, 5, dtype=torch.long, device=DEVICE)
        wide[:, 1:3] = tokens
        log.clear()  # other strides: another specialisation key, so through the JIT once more
        verifier(logits, wide[:, 1:3], uniforms=uniforms, noise=noise, **kwargs)
        assert log == ["jit", "jit"]
        shifted = torch.zeros(logits.numel() + 1, device=DEVICE)[1:].view(logits.shape)  # 4 bytes off alignment
        shifted.copy_(logits)
        log.clear()
        got = verifier(shifted, tokens, uniforms=uniforms, noise=noise, **kwargs)
        assert log == ["jit", "jit"]
        assert_same_rows(*got, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))

    def broken(*args):
        raise TypeError("launcher takes other arguments")

    launcher = verifier._accept_kernel
    launcher.direct = dict.fromkeys(launcher.direct, broken)
    log.clear()
    with pytest.warns(RuntimeWarning, match="direct kernel launch failed"):
        got = verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    assert_same_rows(*got, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))
    assert log == ["direct", "jit"] and not _host._direct_launches


def test_launcher_checks_the_constexprs():
    with pytest.raises(ValueError, match="trailing"):
        _host.Launcher(vck._chunk_stats_kernel, (1,), 4, BLOCK_R=1, HAS_NUM_DRAFT=False)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [dict(draft="one-hot", temperature=0.0), dict(top_k=50, top_p=0.9), dict()])
def test_cuda_graph_capture_gpu(dtype, case):
    """Captured with preallocated inputs and outputs, replayed on new inputs copied in: the reference's results."""
    batch, k, vocab = 8, 4, 128256
    logits, tokens, kwargs, uniforms, noise = make_inputs(batch, k, vocab, dtype=dtype, **case)
    verifier = build_for(batch, k, vocab, kwargs, dtype=dtype)
    out = verifier.new_outputs()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # compile and take the direct launchers outside the capture
        for _ in range(2):
            verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs, out=out)
    torch.cuda.current_stream().wait_stream(stream)
    assert _host._direct_launches and verifier._accept_kernel.direct, "the direct launch path was not taken"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs, out=out)
    for seed in (1, 2):
        new = make_inputs(batch, k, vocab, dtype=dtype, seed=seed, **case)
        for static, fresh in zip((logits, tokens, uniforms, noise), (new[0], new[1], new[3], new[4]), strict=True):
            static.copy_(fresh)
        if kwargs["draft_probs"] is not None:
            kwargs["draft_probs"].copy_(new[2]["draft_probs"])
        graph.replay()
        torch.cuda.synchronize()
        assert_same_rows(*out, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))


H100 = _host.Launch(False, tile=8192, search_tile=8192, min_programs=4 * 132)  # what launch_for gives on a GPU


@pytest.mark.parametrize("batch, k", [(1, 1), (1, 4), (1, 8), (4, 8), (8, 4)])
def test_gpu_tiles_merge_at_most_32_statistics_chunks_per_row(batch, k):
    """The accept kernel merges every row's chunk statistics in a [K+1, chunks] tile: batch-1 rows used to get 126
    chunks at V = 128256 (a 128-wide tile that spilled ~3.6 KB a thread under Triton 3.6, tests/test_gpu_compile.py)."""
    for vocab in (4096, 32000, 128256, 151936, 262144):
        _, block_v = _host.chunk_tiles(batch * (k + 1), vocab, 8192, H100, max_chunks=cv._MAX_STAT_CHUNKS)
        assert triton.cdiv(vocab, block_v) <= cv._MAX_STAT_CHUNKS and block_v <= 8192


@pytest.mark.skipif(not _host.INTERPRETED, reason="runs the GPU's tiles through the interpreter")
@pytest.mark.parametrize("case", [dict(draft="one-hot", temperature=0.0, dtype=torch.bfloat16), dict(draft="probs")],
                         ids=["greedy-bf16", "probs-fp32"])  # fmt: skip
def test_gpu_tiles_at_batch_1_equal_the_reference(monkeypatch, case):
    """A verifier built with the tiles, grids and warps it gets on an H100 (batch 1, K = 4, V = 128256: 32 chunks of
    4096 statistics, 126 race chunks of 1024), run through the interpreter, equals the reference token for token."""
    monkeypatch.setattr(cv, "launch_for", lambda device: H100)
    logits, tokens, kwargs, uniforms, noise = make_inputs(1, 4, 128256, **case, seed=3)
    verifier = build_for(1, 4, 128256, kwargs, dtype=logits.dtype)
    assert verifier._sizes[3:] == (32, 126)  # statistics chunks, race chunks
    for seed in (3, 4):
        logits, tokens, kwargs, uniforms, noise = make_inputs(1, 4, 128256, **case, seed=seed)
        got = verifier(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
        assert_same_rows(*got, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))
