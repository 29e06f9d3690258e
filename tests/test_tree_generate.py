"""Tree speculation end to end: tree attention in HF models, greedy equality with `target.generate`, KV compaction.

- Tree attention: one forward over N tree nodes with the 4D additive mask of `tree_mask` and position ids
  prefix length + depth gives, at every node, the logits of running its root-to-node path on its own (Llama,
  Qwen2 with GQA, GPT-2 with absolute positions; eager and SDPA attention; left-padded prefixes).
- Greedy tree speculation (static and dynamic trees) emits exactly `target.generate(do_sample=False)`.
- With the draft equal to the target, every step accepts the full rank-0 path: the draft's cache compaction (not
  visible in the output, only in the acceptance) keeps the right entries.
"""

import pytest
import torch
from conftest import ARCHITECTURES, hf_greedy, left_padded_batch, perturbed_copy, tiny_model

import fastspec
from fastspec.kernels import reference
from fastspec.runner import CachedModel
from fastspec.tree import DynamicTree, resolve_tree

MAX_NEW = 24


def root_to_node(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("arch", ARCHITECTURES)
@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize(
    "dtype, atol",
    [(torch.float32, 1e-4), (torch.bfloat16, 1e-1)],  # measured worst: 1.2e-5 (fp32), 0.047 (bf16) on logits ~6.5
    ids=["fp32", "bf16"],
)
def test_tree_attention_matches_paths(arch, impl, dtype, atol):
    model = tiny_model(arch).to(dtype)
    model.set_attn_implementation(impl)
    ids, mask = left_padded_batch(256, [10, 6])
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2, 3, 6, 0], [-1, 0, 1, 2, 0, 4, 4, 1, 7]])
    nodes = torch.randint(3, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    nodes[:, 0] = ids[:, -1]  # the root is the last prompt token
    runner = CachedModel(model)
    runner.forward(ids[:, :-1], mask[:, :-1])  # the prefix, cached
    tm = reference.tree_mask(parents, mask[:, :-1], dtype)
    logits = runner.forward_tree(nodes, tm.mask, tm.position_ids)
    for b in range(2):
        for i in range(9):
            path = root_to_node(parents[b].tolist(), i)
            seq = torch.cat([ids[b, :-1], nodes[b, path]])[None]
            seq_mask = torch.cat([mask[b, :-1], torch.ones(len(path), dtype=torch.long)])[None]
            positions = (seq_mask.cumsum(-1) - 1).clamp_min(0)
            alone = model(input_ids=seq, attention_mask=seq_mask, position_ids=positions).logits[0, -1]
            torch.testing.assert_close(logits[b, i].float(), alone.float(), atol=atol, rtol=0, msg=f"row {b} node {i}")


@pytest.mark.parametrize("tree", ["small", "dynamic"])
@pytest.mark.parametrize("lengths", [[9], [12, 5, 8]], ids=["batch1", "padded3"])
def test_greedy_tree_equals_hf(target_and_draft, tree, lengths):
    arch, target, draft = target_and_draft
    ids, mask = left_padded_batch(target.config.vocab_size, lengths)
    out, stats = fastspec.generate(
        target, ids, draft=draft, attention_mask=mask, max_new_tokens=MAX_NEW, num_draft_tokens=4, tree=tree,
        eos_token_id=None, return_stats=True,
    )  # fmt: skip
    expected = hf_greedy(target, ids, mask)
    assert torch.equal(out, expected), f"{arch} {tree}: first mismatching row {(out != expected).any(1).nonzero()[0]}"
    assert 0.0 < stats.acceptance_rate < 1.0 and stats.mean_accepted_length > 1.0
    assert len(stats.per_position_acceptance) <= 4  # per depth


def test_explicit_choices_budget_and_eos():
    target = tiny_model("gpt2")
    draft = perturbed_copy(target, 0.02)
    ids, mask = left_padded_batch(256, [5, 9, 3])
    choices = [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]
    for max_new in (1, 2, 7):  # the budget ends inside a tree: the tree is cut to the remaining depth
        out = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=max_new, tree=choices,
                                eos_token_id=None)  # fmt: skip
        assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=max_new))
    eos = int(hf_greedy(target, ids, mask, max_new_tokens=12)[1, 9 + 4])  # a token row 1 emits mid-generation
    out = fastspec.generate(target, ids, draft=target, attention_mask=mask, max_new_tokens=12, tree=choices,
                            eos_token_id=eos)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=12, eos_token_id=eos))


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_draft_equal_to_target_accepts_full_depth(arch):
    target = tiny_model(arch)
    ids, mask = left_padded_batch(256, [7, 11, 4], seed=2)
    # max_new_tokens a multiple of depth + 1, so no step is shortened by the budget
    out, stats = fastspec.generate(
        target, ids, draft=target, attention_mask=mask, max_new_tokens=20, num_draft_tokens=4, tree="small",
        eos_token_id=None, return_stats=True,
    )  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=20))
    assert stats.mean_accepted_length == 5.0 and stats.steps == 4
    assert stats.per_position_acceptance == [1.0] * 4
    assert stats.drafted == 3 * 4 * 16  # rows x steps x tree nodes


@pytest.mark.parametrize("rank_temperature", [1.0, 0.25])
def test_dynamic_tree_options(rank_temperature):
    target = tiny_model("qwen2")
    draft = perturbed_copy(target, 0.005)
    ids, mask = left_padded_batch(256, [6, 10])
    tree = DynamicTree(top_k=2, num_nodes=6, rank_temperature=rank_temperature)
    out, stats = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=16,
                                   num_draft_tokens=3, tree=tree, eos_token_id=None, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=16))
    # 6 nodes per tree, fewer once the budget cuts the depth (depth 1 keeps the root's top 2)
    assert stats.drafted <= 6 * stats.row_steps and len(stats.per_position_acceptance) == 3


def test_rank_temperature_sharpens_the_dynamic_tree_toward_depth():
    """A lower rank temperature spends the node budget deeper: with a near-copy draft every level's top-1 is the
    target's argmax, so deep chains are accepted and the sharper tree emits more tokens per target forward."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.005)
    ids = torch.tensor([[5, 6, 7, 8]])
    per_forward = {}
    for temp in (1.0, 0.05):
        tree = DynamicTree(top_k=3, num_nodes=6, depth=5, rank_temperature=temp)
        out, stats = fastspec.generate(target, ids, draft=draft, max_new_tokens=24, num_draft_tokens=5, tree=tree,
                                       eos_token_id=None, return_stats=True)  # fmt: skip
        assert torch.equal(out, hf_greedy(target, ids, None, max_new_tokens=24))
        per_forward[temp] = stats.mean_accepted_length
    assert per_forward[0.05] > per_forward[1.0]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), True, "0.5"])
def test_rank_temperature_must_be_positive(value):
    with pytest.raises(ValueError, match="tree: DynamicTree.rank_temperature"):
        DynamicTree(rank_temperature=value)


def test_dynamic_tree_depth_from_num_draft_tokens_keeps_its_options():
    tree = resolve_tree(DynamicTree(top_k=3, num_nodes=9, rank_temperature=0.5), 5)
    assert tree == DynamicTree(top_k=3, num_nodes=9, depth=5, rank_temperature=0.5)


@pytest.mark.parametrize("tree", ["small", "dynamic"])
def test_sampled_tree_is_reproducible(tree):
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.005)
    ids, mask = left_padded_batch(256, [6, 9])
    kwargs = dict(draft=draft, attention_mask=mask, max_new_tokens=12, do_sample=True, temperature=0.8, top_k=50,
                  tree=tree, eos_token_id=None, seed=5)  # fmt: skip
    first, second = fastspec.generate(target, ids, **kwargs), fastspec.generate(target, ids, **kwargs)
    assert torch.equal(first, second)
    assert first.shape == (2, 9 + 12) and int(first.min()) >= 0 and int(first.max()) < 256


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tree="small"), "draft"),  # no draft model
        (dict(tree="huge"), "tree"),
        (dict(tree=[[0], [0, 0], [1, 1]]), "parent path"),
        (dict(tree=[[0], [0]]), "twice"),
        (dict(tree=[[0], [-1]]), "ranks"),
        (dict(tree=[[0], [300]]), "vocabulary"),
        (dict(tree="small", prompt_lookup=2), "prompt_lookup"),  # lookup drafts a chain
    ],
)
def test_tree_bad_input(kwargs, match):
    target = tiny_model("llama")
    draft = None if kwargs.get("tree") == "small" and "num_draft_tokens" not in kwargs else target
    with pytest.raises(ValueError, match=match):
        fastspec.generate(target, torch.tensor([[5, 6, 7]]), draft=draft, max_new_tokens=4, **kwargs)


@pytest.mark.parametrize("tree", ["small", "dynamic", [[0], [1], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0, 0]]])
def test_adaptive_tree_depth_is_greedy_equal_and_varies(tree):
    """num_draft_tokens="auto" with a tree: the depth is chosen per step (the controller's first two timed steps
    draft the deepest tree, then half of it), the output stays the target's greedy output."""
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.02)
    ids, mask = left_padded_batch(256, [7, 11, 4], seed=3)
    out, stats = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=30, tree=tree,
                                   num_draft_tokens="auto", eos_token_id=None, return_stats=True)  # fmt: skip
    assert torch.equal(out, hf_greedy(target, ids, mask, max_new_tokens=30))
    _, fixed = fastspec.generate(target, ids, draft=draft, attention_mask=mask, max_new_tokens=30, tree=tree,
                                 num_draft_tokens=8, eos_token_id=None, return_stats=True)  # fmt: skip

    def mean_depth(s):
        return sum(s.drafted_per_position) / s.row_steps

    assert mean_depth(stats) < mean_depth(fixed)  # some steps drafted shallower trees
