"""min-p inside the fused verification kernels (chain, lean `ChainVerifier`, tree) against the eager reference.

The transform is `fastspec.kernels.sampling`'s: after temperature, top-k and top-p, keep z >= max z + log(min_p)
(z = logits / temperature; one fp32 addition with `min_p_log`'s value, so kernel and reference make the same keep
decision bit for bit). Levels: the kernels equal the reference token for token with the same injected randomness
(scalar and per-row min_p, with and without the other filters, greedy rows, bf16 ties, many V chunks), and each case
first shows that min_p changes the reference's result (a kernel ignoring it would fail); the transform keeps what
transformers' `MinPLogitsWarper` keeps; the first emitted token follows p (chi-square, p-value > 1e-3 at a fixed
seed); every min-p kernel specialisation compiles for sm_90a / sm_80 without spills (when Triton has ptxas).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel modules define their kernels

import pytest  # noqa: E402
from test_verify_chain_kernel import assert_same_rows, chisquare, make_inputs  # noqa: E402
from transformers.generation.logits_process import MinPLogitsWarper, TopKLogitsWarper  # noqa: E402

from fastspec.kernels import reference  # noqa: E402
from fastspec.kernels import verify_chain as vc  # noqa: E402
from fastspec.kernels.chain_verifier import ChainVerifier  # noqa: E402
from fastspec.kernels.sampling import min_p_log, sampling_probs, transform_logits  # noqa: E402
from fastspec.kernels.verify_tree import verify_tree  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = Path(__file__).resolve().parent.parent


def run_chain(case: dict, min_p, max_block_v=None):
    logits, tokens, kwargs, uniforms, noise = make_inputs(**case)
    args = (kwargs["draft_probs"], kwargs["num_draft"], kwargs["temperature"], kwargs["top_k"], kwargs["top_p"])
    got = vc._verify_chain(logits, tokens, *args, uniforms, noise, max_block_v=max_block_v, min_p=min_p)
    expected = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, min_p=min_p, **kwargs)
    without = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs)
    return got, expected, without


def rows(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype, device=DEVICE)


# (inputs, min_p, max_block_v); each comment names the code path
CHAIN_CASES = [
    # min-p alone: the filtered statistics kernel with only the min-p pass
    pytest.param(dict(batch=16, k=3, vocab=800, scale=1.0), 0.3, None, id="min-p-probs"),
    pytest.param(dict(batch=16, k=3, vocab=900, draft="one-hot", scale=1.0), 0.3, None, id="min-p-one-hot"),
    # after the top-k / top-p searches: the threshold only rises where min-p cuts deeper
    pytest.param(dict(batch=16, k=3, vocab=800, top_k=40, temperature=1.5, scale=2.0), 0.3, None, id="top-k-min-p"),
    pytest.param(dict(batch=16, k=2, vocab=600, top_p=0.9, scale=1.0), 0.3, None, id="top-p-min-p"),
    # per row: min_p 0 (off), 1 (only the max), greedy rows in the batch
    pytest.param(
        dict(
            batch=8,
            k=2,
            vocab=300,
            scale=1.0,
            temperature=rows([1.0, 0.0, 0.7, 1.5, 1.0, 1.0, 2.0, 1.0]),
            top_k=rows([0, 5, 300, 40, 7, 0, 0, 100], torch.long),
        ),
        rows([0.0, 0.3, 1.0, 0.05, 0.5, 0.4, 0.6, 0.2]),
        None,
        id="per-row",
    ),  # fmt: skip
    # the kept-mass pass over three 256-wide blocks; bf16 ties at the threshold
    pytest.param(dict(batch=16, k=2, vocab=700, dtype=torch.bfloat16, scale=1.0), 0.3, 256, id="multi-block-bf16"),
    pytest.param(dict(batch=16, k=0, vocab=400, scale=1.0), 0.3, None, id="k0-bonus-only"),
]


@pytest.mark.parametrize("case, min_p, max_block_v", CHAIN_CASES)
def test_chain_kernel_matches_reference(case, min_p, max_block_v):
    got, expected, without = run_chain(case, min_p, max_block_v)
    assert_same_rows(*got, *expected)
    assert not (torch.equal(expected[0], without[0]) and torch.equal(expected[1], without[1])), "min_p had no effect"


@pytest.mark.parametrize("min_p", [0.1, "per_row"])
def test_lean_verifier_takes_min_p(min_p):
    case = dict(batch=4, k=3, vocab=500, scale=3.0, temperature=0.8)
    logits, tokens, kwargs, uniforms, noise = make_inputs(**case)
    values = rows([0.1, 0.0, 0.5, 0.2]) if min_p == "per_row" else min_p
    verifier = ChainVerifier(4, 3, 500, device=DEVICE, draft_probs=True, temperature=0.8, min_p=min_p)
    got = verifier(logits, tokens, kwargs["draft_probs"], uniforms=uniforms, noise=noise,
                   min_p=values if min_p == "per_row" else None)  # fmt: skip
    expected = reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, min_p=values, **kwargs)
    assert_same_rows(*got, *expected)
    off = verifier(logits, tokens, kwargs["draft_probs"], uniforms=uniforms, noise=noise,
                   min_p=torch.zeros(4, device=DEVICE) if min_p == "per_row" else 0.0)  # fmt: skip
    assert_same_rows(*off, *reference.verify_chain(logits, tokens, uniforms=uniforms, noise=noise, **kwargs))


def test_verifier_built_without_min_p_refuses_it():
    verifier = ChainVerifier(2, 1, 64, device=DEVICE, temperature=1.0)
    logits, tokens = torch.randn(2, 2, 64, device=DEVICE), torch.zeros(2, 1, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="min_p"):
        verifier(logits, tokens, uniforms=torch.rand(2, 1, device=DEVICE), noise=torch.ones(2, 64, device=DEVICE),
                 min_p=0.2)  # fmt: skip
    with pytest.raises(ValueError, match="min_p"):
        vc.verify_chain(logits, tokens, temperature=1.0, seed=0, min_p=1.5)


@pytest.mark.parametrize("draft", ["one-hot", "probs"])
@pytest.mark.parametrize("top_k, min_p", [(None, 0.1), (30, 0.3), (None, rows([0.2, 0.0, 0.6]))])
def test_tree_kernel_matches_reference(draft, top_k, min_p):
    g = torch.Generator().manual_seed(3)
    batch, vocab = 3, 300
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3]] * batch, device=DEVICE)
    logits = (torch.randn(batch, 7, vocab, generator=g) * 3).to(DEVICE)
    probs = None
    if draft == "probs":
        probs = torch.softmax(torch.randn(batch, 7, vocab, generator=g) * 3, -1).to(DEVICE)
        tokens = torch.multinomial(probs[:, parents[0].clamp_min(0)].reshape(-1, vocab), 1, generator=None)
        tokens = tokens.reshape(batch, 7)
    else:  # the target argmax of the parent half the time
        argmax = logits.argmax(-1).gather(1, parents.clamp_min(0))
        tokens = torch.where(torch.rand(batch, 7, generator=g).to(DEVICE) < 0.5, argmax, argmax.roll(1, dims=1))
    uniforms, noise = reference.draw_randomness(batch, 7, vocab, 5, DEVICE)
    args = (logits, tokens, parents, probs, 0.9, top_k, None, uniforms, noise)
    got = verify_tree(*args, min_p=min_p)
    expected = reference.verify_tree(*args, min_p=min_p)
    without = reference.verify_tree(*args)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b), (a, b)
    assert not all(torch.equal(a, b) for a, b in zip(expected, without, strict=True)), "min_p had no effect"


@pytest.mark.parametrize("min_p, temperature", [(0.05, 1.0), (0.3, 0.7), (1.0, 1.3)])
def test_transform_keeps_what_transformers_keeps(min_p, temperature):
    logits = torch.randn(64, 500, generator=torch.Generator().manual_seed(1)) * 3
    ours = transform_logits(logits, temperature, 40, None, min_p)
    hf = MinPLogitsWarper(min_p)(None, TopKLogitsWarper(40)(None, logits / temperature))
    assert torch.equal(ours.isfinite(), hf.isfinite())
    assert min_p_log(0.0) == float("-inf") and min_p_log(min_p) == torch.tensor(min_p).log().item()


def test_first_token_follows_min_p_distribution():
    vocab, n = 16, 20_000
    base = torch.randn(1, 2, vocab, generator=torch.Generator().manual_seed(7)) * 1.5
    logits = base.expand(n, -1, -1).contiguous().to(DEVICE)
    tokens = torch.full((n, 1), int(base[0, 0].argmax()), device=DEVICE)  # one-hot draft of the argmax
    uniforms, noise = reference.draw_randomness(n, 1, vocab, 11, DEVICE)
    out, _ = vc.verify_chain(logits, tokens, None, None, 0.8, None, None, uniforms, noise, min_p=0.15)
    p = sampling_probs(base[0, 0], 0.8, None, None, 0.15).double()
    assert (p == 0).any() and (p > 0).sum() > 2  # min-p removed some tokens, not all
    observed = torch.bincount(out[:, 0].cpu(), minlength=vocab).double()
    assert observed[p == 0].sum() == 0
    keep = p > 0
    expected = p[keep] / p[keep].sum() * observed.sum()
    assert chisquare(observed[keep].numpy(), expected.numpy()).pvalue > 1e-3


COMPILE_SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1] + "/bench/kernels")
import compile_table as ct
import torch

unavailable = ct.unavailable()
if unavailable:
    print("skip: " + unavailable); sys.exit(3)
original = ct.run_case

def run_case(case):
    if not case.mode.startswith("min_p"):
        return original(case)
    from fastspec.kernels.chain_verifier import ChainVerifier
    from fastspec.kernels.verify_chain import verify_chain
    from fastspec.kernels.verify_tree import verify_tree
    b, k, v, dtype = case.batch, case.k, case.vocab, ct._DTYPES[case.dtype]
    extra = dict(top_k=50) if case.mode == "min_p_top_k" else {}
    if case.family == "tree":
        n = 2 * k
        verify_tree(torch.empty(b, n, v, dtype=dtype), torch.empty(b, n, dtype=torch.int64),
                    torch.empty(b, n, dtype=torch.int64), torch.empty(b, n, v), 0.7, uniforms=torch.empty(b, n),
                    noise=torch.empty(b, v), max_depth=k, min_p=0.05, **extra)
    elif case.family == "lean":
        verifier = ChainVerifier(b, k, v, dtype=dtype, device="cpu", draft_probs=True, temperature=0.7, min_p=0.05)
        verifier(torch.empty(b, k + 1, v, dtype=dtype), torch.empty(b, k, dtype=torch.int32),
                 torch.empty(b, k, v, dtype=dtype), uniforms=torch.empty(b, k), noise=torch.empty(b, v),
                 out=verifier.new_outputs())
    else:
        verify_chain(torch.empty(b, k + 1, v, dtype=dtype), torch.empty(b, k, dtype=torch.int64),
                     torch.empty(b, k, v), None, 0.7, uniforms=torch.empty(b, k), noise=torch.empty(b, v),
                     min_p=0.05, **extra)

ct.run_case = run_case
cases = [ct.Case("chain", 1, 4, 128256, "bf16", "min_p"), ct.Case("chain", 8, 4, 32000, "fp32", "min_p_top_k"),
         ct.Case("lean", 1, 4, 128256, "bf16", "min_p"), ct.Case("tree", 1, 4, 32000, "bf16", "min_p_top_k")]
specs, errors = ct.collect(cases, list(ct.ARCHES))
rows = ct.compile_all(specs, 2)
json.dump(dict(rows=rows, problems=ct.problems(rows, errors)), open(sys.argv[2], "w"))
"""


def test_min_p_kernels_compile_for_gpus_without_spills(tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, "-c", COMPILE_SCRIPT, str(ROOT), str(out)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=3000)  # fmt: skip
    if proc.returncode == 3:
        pytest.skip(proc.stdout.strip().removeprefix("skip: "))
    assert proc.returncode == 0 and out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert not result["problems"], "\n".join(result["problems"])
    kernels = {row["kernel"] for row in result["rows"]}
    assert {"_filtered_stats_kernel", "_accept_residual_kernel", "_verify_tree_kernel"} <= kernels
    assert any("HAS_MIN_P" in row["variant"] for row in result["rows"])
    for row in result["rows"]:
        assert row["spill_stores"] == row["spill_loads"] == 0, row
