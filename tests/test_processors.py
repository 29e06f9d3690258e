"""transformers' logits processors over speculated positions (`fastspec.processors`, `fastspec.prefixes`): lossless.

- Every position of a step, chain or tree, gets exactly what HF's processor list gives when called on that
  position's own prefix (history with its left padding, then the drafts on its path): the vectorised stages and the
  per-position calls against HF's classes called position by position, bit for bit.
- Which processors the kernel fuses, which run vectorised, which per position.
- Sampling with repetition penalty + temperature + top-k + min-p (min-p fused in the verification kernel): the joint
  distribution of the first two tokens, the second drafted, equals the processed target distribution (chi-square
  as tests/test_generate_sampling.py, p-value > 1e-3 at fixed seeds, N = 20 000 rows), for a draft model chain, a
  tree, prompt lookup and normal decoding, with the reference and the Triton verifier.
"""

import pytest
import torch
from conftest import perturbed_copy, tiny_model
from test_generate_sampling import VOCAB, N, chi_square_pvalue
from transformers import LogitsProcessor, LogitsProcessorList
from transformers.generation import logits_process as hf

import fastspec
from fastspec.kernels.reference import tree_mask
from fastspec.prefixes import PositionPrefixes
from fastspec.processors import LogitsPipeline

V = 40


class ParityBan(LogitsProcessor):
    """A user processor reading the whole prefix: bans token (sum of the prefix) mod 7 + 2."""

    def __call__(self, input_ids, scores):
        banned = input_ids.sum(-1) % 7 + 2
        return scores.scatter(1, banned[:, None], -float("inf"))


def history(rows: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(history [R, width + 8] with left padding id 0 in its first columns, lengths [R], padding [R]): tokens drawn
    from a small range so that n-grams and repeated tokens occur."""
    g = torch.Generator().manual_seed(seed)
    padding = torch.randint(0, 4, (rows,), generator=g)
    lengths = torch.randint(width - 4, width + 1, (rows,), generator=g)
    hist = torch.randint(2, 9, (rows, width + 8), generator=g)
    cols = torch.arange(width + 8)
    hist = torch.where(cols[None, :] < padding[:, None], 0, hist)
    hist = torch.where(cols[None, :] < lengths[:, None], hist, -1)
    return hist, lengths, padding


def penalty_ignoring_padding(padding: torch.Tensor):
    """The repetition penalty HF's generate builds for a left-padded batch (transformers >= 5.2x: per-row ignored
    prefix); older transformers take an int only."""
    try:
        return hf.RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=padding)
    except ValueError:
        return hf.RepetitionPenaltyLogitsProcessor(1.7, prompt_ignore_length=int(padding.max()))


def processors(prompt_width: int, padding: torch.Tensor) -> list:
    """HF processors of every kind, configured to fire on these prefixes."""
    eos = torch.tensor([3, 4])
    return [
        hf.SequenceBiasLogitsProcessor([[[5], 2.0], [[2, 3], -4.0], [[4, 4, 5], 6.0]]),
        penalty_ignoring_padding(padding),
        hf.RepetitionPenaltyLogitsProcessor(0.8, prompt_ignore_length=3),
        hf.NoRepeatNGramLogitsProcessor(2),
        hf.NoRepeatNGramLogitsProcessor(1),
        hf.NoBadWordsLogitsProcessor([[6], [7, 8], [2, 2, 3]], eos_token_id=eos),
        hf.MinLengthLogitsProcessor(prompt_width + 3, eos),
        hf.MinNewTokensLengthLogitsProcessor(prompt_width, 2, eos),
        hf.ForcedBOSTokenLogitsProcessor(1),
        hf.ForcedEOSTokenLogitsProcessor(prompt_width + 5, eos),
        hf.ExponentialDecayLengthPenalty((2, 1.5), eos, prompt_width),
        hf.SuppressTokensLogitsProcessor([9, 10]),
        hf.SuppressTokensAtBeginLogitsProcessor([11], prompt_width + 1),
        ParityBan(),
        hf.TemperatureLogitsWarper(0.7),
        hf.TopKLogitsWarper(25),
        hf.TopPLogitsWarper(0.95),
        hf.MinPLogitsWarper(0.01),
        hf.TypicalLogitsWarper(0.99),
        hf.LogitNormalization(),
    ]


def for_row(procs: list, r: int) -> LogitsProcessorList:
    """`procs` as HF would build them for a batch of row r alone (per-row settings sliced to it)."""
    alone = []
    for p in procs:
        if isinstance(getattr(p, "prompt_ignore_length", None), torch.Tensor):
            p = hf.RepetitionPenaltyLogitsProcessor(p.penalty, prompt_ignore_length=p.prompt_ignore_length[r : r + 1])
        alone.append(p)
    return LogitsProcessorList(alone)


def assert_identical(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Bit for bit, NaN where HF gives NaN (older transformers' length penalty makes some)."""
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


def expected_scores(procs, hist, lengths, paths, logits):
    """HF's list called once per position on that position's prefix: [R, P, V]."""
    out = torch.empty_like(logits)
    for r in range(logits.shape[0]):
        for j in range(logits.shape[1]):
            path = paths[r][j]
            ids = torch.cat([hist[r, : lengths[r]], torch.tensor(path, dtype=torch.long)])[None]
            out[r, j] = for_row(procs, r)(ids, logits[r, j][None].clone())[0]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chain_positions_get_hf_processing_of_their_prefix(seed):
    rows, k, width = 3, 4, 9
    hist, lengths, padding = history(rows, width, seed)
    g = torch.Generator().manual_seed(seed + 10)
    drafts = torch.randint(2, 9, (rows, k), generator=g)
    logits = torch.randn(rows, k + 1, V, generator=g) * 2
    procs = processors(width, padding)
    prefixes = PositionPrefixes.chain(hist, lengths, drafts)
    pipeline = LogitsPipeline(procs, do_sample=False)
    got = pipeline.apply(logits, prefixes, torch.arange(rows))
    paths = [[drafts[r, :j].tolist() for j in range(k + 1)] for r in range(rows)]
    # the final LogitNormalization changes no argmax nor probability: applied to output scores only
    assert_identical(got, expected_scores(procs[:-1], hist, lengths, paths, logits))
    assert_identical(pipeline.output_scores(got[0]), expected_scores(procs, hist, lengths, paths, logits)[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_nodes_get_hf_processing_of_their_path(seed):
    rows, width = 2, 8
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 6], [-1, 0, 1, 2, 0, 4, 4, 5]])
    hist, lengths, padding = history(rows, width, seed)
    g = torch.Generator().manual_seed(seed + 20)
    tokens = torch.randint(2, 9, (rows, 8), generator=g)
    tokens[:, 0] = hist[torch.arange(rows), lengths - 1]  # the root is the history's last token
    logits = torch.randn(rows, 8, V, generator=g) * 2
    tm = tree_mask(parents, lengths.max().item())
    ancestors = tm.mask[:, 0, :, -8:] == 0
    prefixes = PositionPrefixes.tree(hist, lengths, tokens, ancestors, tm.depth)
    procs = processors(width, padding)
    got = LogitsPipeline(procs[:-1], do_sample=False).apply(logits, prefixes, torch.arange(rows))
    paths = []
    for r in range(rows):
        row_paths = []
        for i in range(8):
            path, node = [], i
            while node > 0:
                path.insert(0, int(tokens[r, node]))
                node = int(parents[r, node])
            row_paths.append(path)
        paths.append(row_paths)
    assert_identical(got, expected_scores(procs[:-1], hist, lengths, paths, logits))


def test_each_processor_kind():
    procs = processors(9, torch.zeros(3, dtype=torch.long))
    kinds = dict(LogitsPipeline(procs, do_sample=False).describe())
    assert kinds["RepetitionPenaltyLogitsProcessor"] == "vectorised"
    assert kinds["NoRepeatNGramLogitsProcessor"] == kinds["MinLengthLogitsProcessor"] == "vectorised"
    assert kinds["ExponentialDecayLengthPenalty"] == kinds["ParityBan"] == "per position"
    assert kinds["MinPLogitsWarper"] == "vectorised"  # greedy: nothing is fused
    sampled = LogitsPipeline(procs[:-2] + [procs[-1]], do_sample=True)  # ... TopP, MinP, LogitNormalization
    tail = [name for name, kind in sampled.describe() if kind == "fused"]
    assert tail == ["TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper", "MinPLogitsWarper",
                    "LogitNormalization"]  # fmt: skip
    assert sampled.kernel == (0.7, 25, 0.95, 0.01)
    # a warper after min-p (typical) is not the kernel's: every warper before it runs here
    unfused = LogitsPipeline(procs, do_sample=True)
    assert unfused.kernel == (1.0, None, None, None)
    assert dict(unfused.describe())["TopKLogitsWarper"] == "vectorised"


@torch.no_grad()
def processed_two_token_distribution(target, prompt, procs):
    """P(t1, t2 | prompt) [V, V] under HF's processors (each with its own prefix), softmax of the result."""

    def probs(ids):
        return torch.softmax(LogitsProcessorList(procs)(ids, target(ids).logits[:, -1].float())[0], -1)

    first = probs(prompt)
    joint = torch.zeros(VOCAB, VOCAB)
    for t1 in range(VOCAB):
        if first[t1] > 0:
            joint[t1] = first[t1] * probs(torch.cat([prompt, torch.tensor([[t1]])], dim=1))
    return joint.double()


SAMPLED = dict(do_sample=True, repetition_penalty=1.3, temperature=0.8, top_k=6, min_p=0.08)


@pytest.mark.parametrize(
    "method, backend",
    [("chain", "reference"), ("chain", "triton"), ("tree", "reference"), ("lookup", "reference"),
     ("normal", "reference")],
)  # fmt: skip
def test_sampled_processors_keep_the_processed_distribution(method, backend):
    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    draft = perturbed_copy(target, 0.25)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    kwargs = {"chain": dict(draft=draft, num_draft_tokens=2), "tree": dict(draft=draft, tree=[[0], [1], [0, 0]]),
              "lookup": dict(prompt_lookup_ngram_size=1, num_draft_tokens=2), "normal": {}}[method]  # fmt: skip
    out = fastspec.generate(target, prompt.expand(N, -1), max_new_tokens=3, seed=123, verify_backend=backend,
                            **SAMPLED, **kwargs)  # fmt: skip
    procs = [hf.RepetitionPenaltyLogitsProcessor(1.3), hf.TemperatureLogitsWarper(0.8), hf.TopKLogitsWarper(6),
             hf.MinPLogitsWarper(0.08)]  # fmt: skip
    expected = processed_two_token_distribution(target, prompt, procs)
    plain = processed_two_token_distribution(target, prompt, procs[1:])
    assert (expected - plain).abs().max() > 0.02  # the penalty changes the distribution on this prompt
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3
