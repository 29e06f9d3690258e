"""The drafter interface (`fastspec.drafters.base`): a drafter defined outside the library decodes through the public
`fastspec.generate`, alone, behind prompt lookup and with sampling, losslessly; and the cache-column layout."""

import pytest
import torch
from conftest import hf_greedy, left_padded_batch, tiny_model

import fastspec
from fastspec.drafters import Drafter, DraftPlan, Drafts
from fastspec.layout import BufferLayout

MAX_NEW = 24


class RepeatLastToken(Drafter):
    """Drafts K copies of each row's newest token: no model, no cache, one-hot q (lossless at any temperature)."""

    source = "repeat"

    def propose(self, tokens: torch.Tensor, mask: torch.Tensor, plan: DraftPlan, num_tokens: int,
                sampler) -> Drafts:  # fmt: skip
        return Drafts(tokens[:, -1:].expand(-1, num_tokens), None, None)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("k", [1, 4, "auto"])
def test_a_drafter_defined_here_decodes_greedy_equal_to_hf(arch, k):
    target = tiny_model(arch, init=0.5)
    ids, mask = left_padded_batch(target.config.vocab_size, [11, 4, 8], seed=2)
    out, stats = fastspec.generate(target, ids, draft=RepeatLastToken(), attention_mask=mask,
                                   max_new_tokens=MAX_NEW, num_draft_tokens=k, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask))
    assert stats.drafted > 0
    if k != "auto":  # "auto" picks K from measured step times, so which steps draft (and hit a repeat) varies by load
        assert stats.accepted > 0  # tiny random models repeat tokens: some fixed-K drafts are accepted


def test_any_drafter_behind_prompt_lookup():
    target = tiny_model("llama", init=0.5)
    ids, mask = left_padded_batch(target.config.vocab_size, [12, 6], seed=4)
    out = fastspec.generate(target, ids, draft=RepeatLastToken(), prompt_lookup=2, attention_mask=mask,
                            max_new_tokens=MAX_NEW)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask))


def test_a_drafter_defined_here_samples_like_normal_decoding():
    """Same seed, same per-row random streams: a one-hot drafter's sampled output has the target's distribution;
    with a fixed seed both calls must at least produce valid, equally long rows (the distribution itself is tested
    for the library's drafters in test_generate_sampling.py)."""
    target = tiny_model("llama", init=0.5)
    ids = torch.randint(1, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    out = fastspec.generate(target, ids, draft=RepeatLastToken(), do_sample=True, temperature=0.8, seed=3,
                            max_new_tokens=MAX_NEW)  # fmt: skip
    assert out.shape == (2, 6 + MAX_NEW) and int(out.min()) >= 0 and int(out.max()) < 256


def test_a_chain_only_drafter_refuses_a_tree():
    target = tiny_model("llama")
    with pytest.raises(ValueError, match="tree"):
        fastspec.generate(target, torch.tensor([[1, 2, 3]]), draft=RepeatLastToken(), tree="small")


def test_buffer_layout_names_the_columns():
    layout = BufferLayout(10)
    assert (layout.root, layout.feature_end, layout.head_root) == (9, 9, 8)
    mask = torch.ones(2, 10, dtype=torch.long)
    assert layout.before_root(mask).shape == (2, 9) and layout.before_head_root(mask).shape == (2, 8)
    assert layout.node_positions(torch.tensor([[0, 2, -1]])).tolist() == [[9, 11, -1]]
    kept = layout.keep_buffer(torch.tensor([1, 3]))
    assert kept.prefix_len == 10 and kept.positions is None
    features = layout.keep_features(torch.tensor([1, 3]))
    assert features.prefix_len == 9 and features.num_kept.tolist() == [0, 0]
