"""Draft heads in `fastspec.generate` (EAGLE-style, `fastspec.drafters.HeadDrafter`): lossless like any draft.

- Greedy: output equals `target.generate(do_sample=False)` on a ragged batch with a chain, adaptive K, prompt
  lookup then head, and the static cache; the head's features stay aligned with the buffer through ragged
  acceptance, finished rows and dropped padding (any misalignment would only cost acceptance, so the shipped
  head's acceptance is checked too). For Llama, Qwen2 and GPT-2 targets a head fitted to the target's greedy
  continuations of the test prompts accepts about half its drafts, so accepted and rejected drafts both occur in
  every row, and its acceptance is checked (a head reading misaligned features would accept next to nothing).
- Sampling: the joint distribution of the first two tokens (the second one drafted by the head) matches the
  target's exactly (chi-square, as tests/test_generate_sampling.py).
- Static and dynamic trees drafted by the head (EAGLE-2: node c reads its parent's head hidden) are lossless too.
- With `compile=True` the head's step is compiled too (over its own static cache), equal to eager, each shape
  compiled once per process; with an EAGLE-3 head (several target layers) the target's compiled step returns those
  layers' states through transformers' hidden-state hooks.
- A head for another target is refused naming the argument.
"""

import logging

import pytest
import torch
import torch.nn.functional as F
from conftest import ARCHITECTURES, hf_greedy, left_padded_batch, perturbed_copy, tiny_model
from test_generate_sampling import VOCAB, N, chi_square_pvalue, exact_two_token_distribution

import fastspec
from fastspec.heads import DraftHead, DraftHeadConfig, Eagle3Head, target_logits_and_features


def random_head(target, seed: int = 0) -> DraftHead:
    """A random EAGLE-1 head over the target's last hidden state."""
    torch.manual_seed(seed)
    return DraftHead(DraftHeadConfig.from_target_config(target.config)).bind(target).eval()


def random_eagle3_head(target, feature_layers, seed: int = 0) -> Eagle3Head:
    """A random EAGLE-3 head reading the target's `feature_layers` (hidden_states indices), full vocabulary."""
    torch.manual_seed(seed)
    return Eagle3Head.from_target(target, aux_layers=list(feature_layers)).eval()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_draft_tokens=3),
        dict(num_draft_tokens="auto"),
        dict(prompt_lookup=2),
        dict(static_cache=True),
        dict(tree="dynamic", num_draft_tokens=3),
        dict(tree="small", num_draft_tokens=3),
        dict(tree="dynamic", num_draft_tokens="auto", static_cache=True),
    ],
    ids=["chain", "auto", "lookup_then_head", "static", "dynamic_tree", "static_tree", "auto_tree_static"],
)
def test_head_greedy_equals_hf(kwargs):
    target = tiny_model("llama", init=0.5)
    ids, mask = left_padded_batch(256, [9, 5, 12])
    out = fastspec.generate(target, ids, draft=random_head(target), attention_mask=mask, max_new_tokens=20,
                            eos_token_id=None, **kwargs)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=20))


def fitted_head(target, ids, mask, new_tokens: int = 24, steps: int = 100) -> DraftHead:
    """A random head trained (teacher-forced cross-entropy on the target's argmax) on the target's greedy
    continuations of the prompts `ids` [B, T] (left-padded, `mask`): it drafts those continuations well."""
    head = random_head(target).train()
    examples = []  # per prompt: (sequence [1, L], target features [1, L, H], target argmax [1, L])
    with torch.no_grad():
        for row, real in zip(ids, mask.bool(), strict=True):
            seq = hf_greedy(target, row[real][None], max_new_tokens=new_tokens)
            logits, features = target_logits_and_features(target, 0, (-1,), input_ids=seq)
            examples.append((seq, features, logits.argmax(-1)))
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = 0.0
        for seq, features, argmax in examples:
            # entry p reads feature p and token p + 1, and predicts token p + 2 (the target's argmax at p + 1)
            _, logits = head(features[:, :-1], seq[:, 1:], torch.arange(seq.shape[1] - 1)[None])
            loss = loss + F.cross_entropy(logits[0, :-1], argmax[0, 1:-1])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return head.eval()


@pytest.fixture(scope="module", params=ARCHITECTURES)
def target_and_fitted_head(request):
    """(target, its fitted head, prompts, mask) for each architecture."""
    target = tiny_model(request.param, init=0.5)
    ids, mask = left_padded_batch(256, [9, 5, 12])
    return target, fitted_head(target, ids, mask), ids, mask


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_draft_tokens=3), dict(num_draft_tokens="auto"), dict(static_cache=True),
     dict(tree="dynamic", num_draft_tokens=3)],
    ids=["chain", "auto", "static", "dynamic_tree"],
)  # fmt: skip
def test_fitted_head_greedy_equals_hf_and_accepts(target_and_fitted_head, kwargs):
    target, head, ids, mask = target_and_fitted_head
    out, stats = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=20,
                                   eos_token_id=None, return_stats=True, **kwargs)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=20))
    assert stats.mean_accepted_length > 1.6  # measured 1.9-2.7 (random heads: 1.0-1.1)


@pytest.mark.parametrize("max_new_tokens", [7, 20])
def test_fitted_head_stops_at_eos_and_max_new_tokens_like_hf(target_and_fitted_head, max_new_tokens):
    """EOS: the 6th token row 0 generates (a row that emits it stops there and is padded after it, as HF pads);
    7 new tokens end in the middle of a K=3 draft."""
    target, head, ids, mask = target_and_fitted_head
    eos = int(hf_greedy(target, ids, mask, max_new_tokens=20)[0, ids.shape[1] + 5])
    out = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=max_new_tokens,
                            num_draft_tokens=3, eos_token_id=eos)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=max_new_tokens, eos_token_id=eos))


@pytest.mark.parametrize(
    "kwargs",
    [dict(num_draft_tokens=3), dict(tree="dynamic", num_draft_tokens=3), dict(static_cache=True)],
    ids=["chain", "dynamic_tree", "static"],
)
def test_several_layers_head_greedy_equals_hf(kwargs):
    """A head that reads several target layers (EAGLE-3): the target's runner keeps all of them."""
    target = tiny_model("llama", layers=3, init=0.5)
    ids, mask = left_padded_batch(256, [9, 5, 12])
    head = random_eagle3_head(target, (0, 1, 2))
    out = fastspec.generate(target, ids, draft=head, attention_mask=mask, max_new_tokens=20, eos_token_id=None,
                            **kwargs)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=20))


@pytest.mark.parametrize("tree", [None, "small"])
def test_head_first_two_tokens_follow_target(tree):
    target = tiny_model("llama", vocab=VOCAB, hidden=32, init=0.5)
    prompt = torch.tensor([[3, 1, 4, 1, 5]])
    expected = exact_two_token_distribution(target, prompt, 1.0, None, None)
    # step 1 is the prefill (no features yet); step 2 drafts token 2 with the head and verifies it
    out, stats = fastspec.generate(target, prompt.expand(N, -1), draft=random_head(target, 3), max_new_tokens=3,
                                   do_sample=True, num_draft_tokens=2, tree=tree, eos_token_id=None, seed=7,
                                   return_stats=True)  # fmt: skip
    assert 0.05 < stats.acceptance_rate < 0.95  # head drafts are accepted and rejected
    assert chi_square_pvalue(out[:, 5:7], expected) > 1e-3


def test_head_for_another_target_is_refused():
    target = tiny_model("llama")
    other = tiny_model("llama", hidden=32)
    with pytest.raises(ValueError, match="draft"):
        fastspec.generate(target, torch.tensor([[3, 4, 5]]), draft=random_head(other), max_new_tokens=4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["last_state", "eagle3"])
def test_compiled_head_equals_eager_and_compiles_each_shape_once(caplog, kind):
    target = tiny_model("llama", layers=1 if kind == "last_state" else 3, init=0.5)
    # EAGLE-3: the target's compiled step returns 3 states
    head = random_head(target) if kind == "last_state" else random_eagle3_head(target, (0, 1, 2))
    ids, mask = left_padded_batch(256, [9, 5])
    kwargs = dict(draft=head, attention_mask=mask, max_new_tokens=16, num_draft_tokens=3, eos_token_id=None)
    eager = fastspec.generate(target, ids, **kwargs)
    with caplog.at_level(logging.WARNING, logger="fastspec"):
        first = fastspec.generate(target, ids, compile=True, **kwargs)
    compiles = [r.getMessage() for r in caplog.records if "compiling" in r.getMessage()]
    assert torch.equal(first, eager) and torch.equal(eager, hf_greedy(target, ids, mask, max_new_tokens=16))
    assert any("draft head's 1-token step for 2 rows" in message for message in compiles)  # each drafted token
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastspec"):
        second = fastspec.generate(target, ids, compile=True, **kwargs)
    assert torch.equal(second, eager)
    assert not [r for r in caplog.records if "compiling" in r.getMessage()]  # shapes of the first call reused


class _CompiledOutput(torch.Tensor):
    """A compiled step's output, valid until the step's next call (as under CUDA graphs): any torch op that reads it,
    or a view of it, afterwards raises. Views of it stay `_CompiledOutput`s of the same call; other results are
    plain tensors (they were computed while the output was valid)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        calls = [a._call for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, _CompiledOutput)]
        if any(call["overwritten"] for call in calls):
            raise RuntimeError(f"{func.__name__}: read a compiled step's output after its next call (CUDA graphs "
                               "overwrite it)")  # fmt: skip
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and calls and out._base is not None:  # a view: valid as long as its base
            out = out.as_subclass(_CompiledOutput)
            out._call = calls[0]
        elif isinstance(out, _CompiledOutput):
            out = out.as_subclass(torch.Tensor)
        return out


def test_compiled_head_tree_consumes_outputs_before_the_next_compiled_call(target_and_fitted_head, monkeypatch):
    """Under CUDA graphs ("reduce-overhead") each compiled call overwrites the outputs of the previous one, and torch
    refuses any later access to them. Here every "compiled" step (the eager step, so no compile time) hands out
    outputs that refuse any read after its next call, so a drafter that touches a compiled output after the next
    compiled call fails here as it would on a GPU."""
    from fastspec import compiled as compiled_module

    def expiring(step):
        last = {"overwritten": False}

        def replay(**inputs):
            nonlocal last
            last["overwritten"] = True
            last = {"overwritten": False}
            outputs = []
            for out in step(**inputs):
                if isinstance(out, torch.Tensor):
                    out = out.as_subclass(_CompiledOutput)
                    out._call = last
                outputs.append(out)
            return tuple(outputs)

        return replay

    monkeypatch.setattr(compiled_module, "_compiled_step", lambda model, key, step, device: (expiring(step), set()))
    target, head, ids, mask = target_and_fitted_head
    model = perturbed_copy(target, 0.05)
    for draft, kwargs in ((head, dict(tree="dynamic", num_draft_tokens=5)), (head, dict(tree="small")),
                          (head, dict(num_draft_tokens=3)), (model, dict(tree="dynamic", num_draft_tokens=5)),
                          (model, dict(tree="small")), (model, dict(num_draft_tokens="auto"))):  # fmt: skip
        out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=20, eos_token_id=None,
                                compile=True, **kwargs)  # fmt: skip
        assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=20)), kwargs
