"""`fastspec train-head` / `fastspec.training`: regeneration cache, draft vocabulary, training-time test, loss, the
command end to end (a loadable head, resume), and data parallelism under torchrun (2 CPU processes, gloo)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import hf_greedy, tiny_model

from fastspec.heads import load_head
from fastspec.heads.eagle3 import Eagle3Head
from fastspec.runner import target_logits_and_features
from fastspec.training import data as data_module
from fastspec.training import (
    eagle3_loss,
    regenerate,
    select_draft_vocab,
    token_counts,
    ttt_mask,
    unroll,
    vocab_maps,
)
from fastspec.training.cli import main as train_head_main

AUX = [1, 2, 3]  # a 4-layer target's inputs of layers 1..3 (EAGLE-3's default {2, L//2, L-3} needs L >= 8)


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", layers=4)


def random_prompts(count: int, seed: int = 0, vocab: int = 256) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(3, 9, (1,), generator=gen)),), generator=gen).tolist()
            for _ in range(count)]  # fmt: skip


def test_regeneration_cache_extends_and_never_regenerates(target, tmp_path, monkeypatch):
    import fastspec

    prompts = random_prompts(7)
    calls = []
    real = fastspec.autoregressive_generate

    def counting(model, ids, **kwargs):
        calls.append(ids.shape[0])
        return real(model, ids, **kwargs)

    monkeypatch.setattr(fastspec, "autoregressive_generate", counting)
    first = regenerate(target, prompts[:4], tmp_path, max_new_tokens=6, batch_size=3)
    assert calls == [3, 1] and first.generated_now == 4
    more = regenerate(target, prompts, tmp_path, max_new_tokens=6, batch_size=3)  # 3 more prompts: only those
    assert calls == [3, 1, 3] and more.generated_now == 3
    again = regenerate(target, prompts[:5], tmp_path, max_new_tokens=6, batch_size=3)  # fewer: all cached
    assert calls == [3, 1, 3] and again.generated_now == 0
    for i in range(4):
        assert torch.equal(more.answers[i], first.answers[i])
    for i, prompt in enumerate(prompts):  # the answers are the target's own greedy continuations
        ids = torch.tensor([prompt])
        assert more.prompts[i].tolist() == prompt
        assert more.answers[i].tolist() == hf_greedy(target, ids, max_new_tokens=6)[0, len(prompt) :].tolist()
    assert more.generated_tokens == 7 * 6 and more.tokens_per_second > 0
    # another order with new prompts mixed in (a source interleaved with the cached ones): answers are found by
    # prompt, the new prompts are generated together in one batch, a repeated prompt is answered once
    new = random_prompts(3, seed=9)
    mixed = [new[0], prompts[6], new[1], prompts[0], new[2], prompts[3], new[0]]
    reordered = regenerate(target, mixed, tmp_path, max_new_tokens=6, batch_size=3)
    assert calls == [3, 1, 3, 3] and reordered.generated_now == 3
    assert torch.equal(reordered.answers[1], more.answers[6]) and torch.equal(reordered.answers[3], more.answers[0])
    assert torch.equal(reordered.answers[6], reordered.answers[0])
    greedy = hf_greedy(target, torch.tensor([new[1]]), max_new_tokens=6)
    assert reordered.answers[2].tolist() == greedy[0, len(new[1]) :].tolist()
    with pytest.raises(ValueError, match="another target or other settings"):
        regenerate(target, prompts, tmp_path, max_new_tokens=8)
    with pytest.raises(ValueError, match="another target or other settings"):
        regenerate(tiny_model("llama", layers=4, seed=5), prompts, tmp_path, max_new_tokens=6)


def test_sampled_regeneration_does_not_depend_on_batching(target, tmp_path):
    prompts = random_prompts(5, seed=1)
    a = regenerate(target, prompts, tmp_path / "a", max_new_tokens=5, temperature=1.0, seed=3, batch_size=5)
    b = regenerate(target, prompts, tmp_path / "b", max_new_tokens=5, temperature=1.0, seed=3, batch_size=2)
    assert all(torch.equal(x, y) for x, y in zip(a.answers, b.answers, strict=True))


def test_read_regen_cache_reads_a_complete_cache_and_refuses_others(target, tmp_path):
    from fastspec.training.data import read_regen_cache

    prompts = random_prompts(5, seed=2)
    made = regenerate(target, prompts, tmp_path / "t1", max_new_tokens=5, temperature=1.0, seed=3, batch_size=2)
    data, header = read_regen_cache(target, prompts, tmp_path / "t1")
    assert header["temperature"] == 1.0 and header["max_new_tokens"] == 5 and data.generated_now == 0
    assert all(torch.equal(x, y) for x, y in zip(data.answers, made.answers, strict=True))
    assert [p.tolist() for p in data.prompts] == prompts
    with pytest.raises(ValueError, match="answers 5 of the 6 training prompts"):
        read_regen_cache(target, [*prompts, [7, 8, 9]], tmp_path / "t1")
    shuffled, _ = read_regen_cache(target, prompts[::-1], tmp_path / "t1")  # found by prompt, in any order
    assert all(torch.equal(x, y) for x, y in zip(shuffled.answers, made.answers[::-1], strict=True))
    with pytest.raises(ValueError, match="made for another target"):
        read_regen_cache(tiny_model("llama", layers=4, seed=5), prompts, tmp_path / "t1")
    with pytest.raises(ValueError, match="no cache.json"):
        read_regen_cache(target, prompts, tmp_path)


def test_read_prompts_jsonl_and_text(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    turns = [("user", "hi"), ("assistant", "yo"), ("user", "again"), ("assistant", "old answer")]
    chat = {"messages": [{"role": r, "content": c} for r, c in turns]}
    jsonl.write_text(json.dumps({"prompt": "def f():"}) + "\n\n" + json.dumps(chat) + "\n")
    text = tmp_path / "p.txt"
    text.write_text("first line\n\nsecond\\nline\n")
    prompts = data_module.read_prompts([jsonl, text])
    assert prompts[0] == "def f():" and prompts[2:] == ["first line", "second\nline"]
    assert [m["content"] for m in prompts[1]] == ["hi", "yo", "again"]  # up to the last user turn
    assert data_module.read_prompts([text], text_mode="file") == ["first line\n\nsecond\\nline\n"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        data_module.read_prompts([bad])


def test_draft_vocab_selection_invariants():
    gen = torch.Generator().manual_seed(0)
    answers = [torch.randint(0, 50, (40,), generator=gen) ** 2 % 300 for _ in range(6)]
    counts = token_counts(answers, 300)
    assert int(counts.sum()) == 240
    for size in (1, 7, 20, 300):
        kept = select_draft_vocab(counts, size)
        assert kept.numel() == size and bool((kept[1:] > kept[:-1]).all())  # distinct, ascending
        threshold = counts[kept].min()
        assert bool((counts[~torch.isin(torch.arange(300), kept)] <= threshold).all())  # the most frequent
        d2t, t2d = vocab_maps(kept, 300)
        assert torch.equal(t2d.nonzero().flatten(), torch.arange(size) + d2t)
        assert int(t2d.sum()) == size and torch.equal(torch.arange(size) + d2t, kept)
    tie = select_draft_vocab(torch.tensor([0, 5, 5, 0, 5, 1]), 2)  # equal counts: lower ids first
    assert tie.tolist() == [1, 2]
    assert select_draft_vocab(torch.tensor([0, 0, 3, 0]), 3).tolist() == [0, 1, 2]  # unseen: by ascending id
    with pytest.raises(ValueError, match="draft_vocab"):
        select_draft_vocab(counts, 301)


def test_eagle3_loss_equals_hand_computation():
    """Two unrolled steps over one row of 4 tokens, a vocabulary of 5 with kept ids {1, 3, 4}."""
    gen = torch.Generator().manual_seed(0)
    t_logits = torch.randn(1, 4, 5, generator=gen)
    t_logits[0, 2, 0] = 9.0  # the target's argmax at position 2 is token 0: not kept, not counted
    kept = torch.tensor([1, 3, 4])
    outs = [(None, torch.randn(1, 3, 3, generator=gen)), (None, torch.randn(1, 2, 3, generator=gen))]
    loss_mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    loss, stats = eagle3_loss(outs, t_logits, loss_mask, kept, decay=0.8)
    expected = 0.0
    for s, (_, logits) in enumerate(outs, start=1):
        total, count, agree, counted = 0.0, 0, 0, 0
        for i in range(logits.shape[1]):
            p = s + i  # the target position that teaches entry i of step s
            if loss_mask[0, p] == 0:
                continue
            count += 1
            row = t_logits[0, p].tolist()
            agree += int(kept[int(logits[0, i].argmax())] == max(range(5), key=row.__getitem__))
            if max(range(5), key=row.__getitem__) not in kept.tolist():
                continue
            counted += 1
            z = sum(math.exp(row[k]) for k in kept.tolist())
            q = logits[0, i].tolist()
            zq = sum(math.exp(v) for v in q)
            total += -sum(math.exp(row[k]) / z * math.log(math.exp(q[j]) / zq) for j, k in enumerate(kept.tolist()))
        expected += 0.8 ** (s - 1) * total / count
        assert stats[s - 1]["agree"] == pytest.approx(agree / count)
        assert stats[s - 1]["kept"] == pytest.approx(counted / count)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats[0]["kept"] < 1  # position 2's argmax is dropped


@pytest.mark.parametrize("kept", [torch.tensor([0, 3, 5, 6, 9]), None])
def test_eagle3_loss_of_bf16_teacher_logits_equals_their_fp32_copy(kept):
    """bf16 training hands the target's logits over in bf16; the loss reads them without an fp32 copy of every
    column (the kept ones are cast), which must give exactly the loss and agreement of the fp32 copy."""
    gen = torch.Generator().manual_seed(1)
    t_logits = (4 * torch.randn(2, 6, 10, generator=gen)).bfloat16()
    t_logits[0, 2, :2] = t_logits[0, 2].max()  # a tie for the argmax: the first index in both dtypes
    width = 10 if kept is None else len(kept)
    outs = [(None, torch.randn(2, 6 - s, width, generator=gen)) for s in (1, 2)]
    loss_mask = torch.ones(2, 6)
    loss, stats = eagle3_loss(outs, t_logits, loss_mask, kept)
    loss32, stats32 = eagle3_loss(outs, t_logits.float(), loss_mask, kept)
    assert torch.equal(loss, loss32) and stats == stats32


def test_feature_regression_equals_hand_computation():
    """Two unrolled steps over one row of 4 tokens, H = 2: entry i of step s is held to the target's last hidden state
    at position s + i, smooth-L1 (beta 1) averaged over H, over the loss positions, steps weighted 0.8^(s-1)."""
    from fastspec.training import feature_regression

    gen = torch.Generator().manual_seed(1)
    last = torch.randn(1, 4, 2, generator=gen) * 2
    outs = [(torch.randn(1, 3, 2, generator=gen) * 2, None), (torch.randn(1, 2, 2, generator=gen) * 2, None)]
    loss_mask = torch.tensor([[0.0, 1.0, 0.0, 1.0]])

    def smooth_l1(d: float) -> float:
        return 0.5 * d * d if abs(d) < 1 else abs(d) - 0.5

    expected, per_step = 0.0, []
    for s, (hidden, _) in enumerate(outs, start=1):
        terms = [sum(smooth_l1(float(hidden[0, i, h] - last[0, s + i, h])) for h in range(2)) / 2
                 for i in range(hidden.shape[1]) if loss_mask[0, s + i] == 1]  # fmt: skip
        per_step.append(sum(terms) / len(terms))
        expected += 0.8 ** (s - 1) * per_step[-1]
    loss, values = feature_regression(outs, last, loss_mask, decay=0.8)
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert values == pytest.approx(per_step, rel=1e-6)


def test_eagle3_feature_regression_reads_the_targets_last_state(target):
    """With a regression weight the trainer reads the head's layers plus the last hidden state (after the final
    norm: what `output_hidden_states` ends with) and the loss is EAGLE-3's plus the weight times the regression."""
    from fastspec.training import feature_regression
    from fastspec.training.trainer import _Unrolled

    torch.manual_seed(0)
    head = Eagle3Head.from_target(target, None, aux_layers=AUX)
    ids = torch.randint(3, 200, (2, 10))
    logits, feats = target_logits_and_features(target, 0, [*AUX, -1], input_ids=ids)
    hidden = target.config.hidden_size
    with torch.no_grad():
        states = target(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(feats[..., -hidden:], states[-1])
    mask = torch.ones(2, 10)
    loss, stats = _Unrolled(head, "eagle3", None, 3, 0.8, regression=0.5)(feats, ids, logits, mask)
    outs = unroll(head, feats[..., :-hidden], ids, 3)
    plain, _ = eagle3_loss(outs, logits, mask, None, 0.8)
    reg, values = feature_regression(outs, feats[..., -hidden:], mask, 0.8)
    torch.testing.assert_close(loss, plain + 0.5 * reg)
    assert [entry["reg"] for entry in stats] == pytest.approx(values)


def test_ttt_mask_diagonal():
    mask = ttt_mask([3, 2], 1) == 0  # step 3 of 4-token rows: one entry over 3 + 2 + 1 keys
    assert mask[0, 0].tolist() == [[True, False, False, True, False, True]]
    step2 = ttt_mask([3], 2) == 0
    assert step2[0, 0].tolist() == [[True, False, False, True, False], [True, True, False, False, True]]


def test_unroll_equals_drafting_from_every_position(target):
    """Unrolled step s at entry i == the head drafting s tokens after position i, each step fed its own hidden."""
    kept = torch.arange(0, 256, 2)
    head = Eagle3Head.from_target(target, kept, aux_layers=AUX)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(3, 256, (1, 9), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, feats = target_logits_and_features(target, 0, head.feature_layers, input_ids=ids)
        outs = unroll(head, feats, ids, 3)
        assert [o[1].shape[1] for o in outs] == [8, 7, 6]
        for base in range(ids.shape[1] - 3):
            cache = head.new_cache()
            n = base + 1
            h, lg = head(head.target_features(feats[:, :n]), ids[:, 1 : n + 1], torch.arange(n)[None], None, cache)
            h, lg = h[:, -1:], lg[:, -1:]
            for s in range(1, 4):
                torch.testing.assert_close(outs[s - 1][1][:, base], lg[:, 0], rtol=1e-4, atol=1e-5)
                if s < 3:
                    tok = ids[:, base + s + 1 : base + s + 2]
                    h, lg = head(h, tok, torch.tensor([[base + s]]), None, cache)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny Llama target saved with the shipped pair's tokenizer (4096 tokens)."""
    from transformers import AutoTokenizer

    from fastspec.pair import default_target_dir

    path = tmp_path_factory.mktemp("tiny_target")
    model = tiny_model("llama", vocab=4096, layers=4)
    model.generation_config.eos_token_id = 0
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(default_target_dir()).save_pretrained(path)
    prompts = path / "prompts.txt"
    words = "def class return import for while if else print self value None True".split()
    gen = torch.Generator().manual_seed(0)
    lines = [" ".join(words[int(j)] for j in torch.randint(0, len(words), (6,), generator=gen)) for _ in range(14)]
    prompts.write_text("\n".join(lines) + "\n")
    return path


def cli_args(model_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", str(model_dir), "--prompts", str(model_dir / "prompts.txt"), "--out", str(out),
            "--regen-tokens", "16", "--draft-vocab", "512", "--aux-layers", *map(str, AUX), "--unroll", "3",
            "--batch-size", "4", "--heldout-count", "2", "--heldout-tokens", "12", "--device", "cpu",
            "--no-progress", *extra]  # fmt: skip


def test_train_head_cli_writes_a_loadable_head_and_resumes(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "head"
    from fastspec.cli import main as fastspec_main

    fastspec_main(["train-head", *cli_args(model_dir, out, "--max-steps", "3")])  # the `fastspec` command
    first = json.loads((out / "training.json").read_text())
    record = json.loads((out / "training.json").read_text())
    assert record["steps"] == 3 and record["command"].startswith("fastspec train-head --target ")
    assert "--max-steps 3" in record["command"] and "--no-progress" in record["command"]
    assert record["draft_vocab"] == 512 and record["data"]["training_prompts"] == 12
    assert record["heldout_acceptance"]["greedy_equal_to_target"] is True
    assert record["throughput"]["regeneration_tokens_per_s"] > 0 and record["throughput"]["training_tokens_per_s"] > 0
    assert first["steps"] == 3
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 512

    target = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    head = load_head(out, target)
    import fastspec

    ids = torch.tensor([[5, 17, 300, 2000, 9]])
    expected = hf_greedy(target, ids, max_new_tokens=20)
    assert torch.equal(fastspec.generate(target, ids, draft=head, num_draft_tokens=4, max_new_tokens=20), expected)

    work = Path(str(out) + ".work")
    chunks = {p: p.stat().st_mtime_ns for p in (work / "regen").glob("chunk_*")}
    ckpt = torch.load(work / "checkpoint.pt", weights_only=True)
    assert ckpt["step"] == 3
    resumed = train_head_main(cli_args(model_dir, out, "--max-steps", "5", "--resume"))
    assert resumed["steps"] == 5 and json.loads((out / "training.json").read_text())["steps"] == 5
    assert torch.load(work / "checkpoint.pt", weights_only=True)["step"] == 5
    assert {p: p.stat().st_mtime_ns for p in (work / "regen").glob("chunk_*")} == chunks  # nothing regenerated
    assert resumed["draft_vocab"] == 512
    runs = resumed["runs"]  # both invocations, in order
    assert [(r["from_step"], r["to_step"]) for r in runs] == [(0, 3), (3, 5)]
    assert runs[0]["command"] == first["command"] and runs[1]["command"] == resumed["command"]
    assert "--resume" in runs[1]["command"] and runs[1]["training_prompts"] == 12
    assert resumed["throughput"]["training_tokens_per_s"] > 0  # counted over both runs
    assert "over every run" in resumed["throughput"]["training_tokens_per_s_note"]


def test_train_head_eagle1_kind(model_dir, tmp_path):
    out = tmp_path / "head1"
    args = cli_args(model_dir, out, "--max-steps", "2", "--kind", "eagle1")
    with pytest.raises(ValueError, match="for --kind eagle3"):  # no reduced vocabulary or aux layers for EAGLE-1
        train_head_main(args)
    args[args.index("--aux-layers") : args.index("--aux-layers") + 4] = []
    args[args.index("--draft-vocab") : args.index("--draft-vocab") + 2] = []
    record = train_head_main(args)
    assert record["kind"] == "eagle1" and record["steps"] == 2
    assert record["heldout_acceptance"]["greedy_equal_to_target"] is True
    with pytest.raises(ValueError, match="feature_regression: a weight >= 0 for --kind eagle3"):
        train_head_main([*args, "--feature-regression", "1"])  # EAGLE-1's loss has it already


def test_train_head_eagle3_with_feature_regression(model_dir, tmp_path):
    out = tmp_path / "head_reg"
    record = train_head_main(cli_args(model_dir, out, "--max-steps", "2", "--feature-regression", "0.5"))
    assert record["steps"] == 2 and "plus 0.5 x the smooth-L1" in record["loss"]
    assert record["heldout_acceptance"]["greedy_equal_to_target"] is True
    from transformers import AutoModelForCausalLM

    assert isinstance(load_head(out, AutoModelForCausalLM.from_pretrained(model_dir)), Eagle3Head)
    with pytest.raises(ValueError, match="feature_regression: a weight >= 0"):
        train_head_main(cli_args(model_dir, tmp_path / "neg", "--max-steps", "1", "--feature-regression", "-1"))


DDP_SCRIPT = """
import json, sys
import torch
torch.set_num_threads(1)
from fastspec.training.cli import main
args = json.loads(sys.argv[1])
main(args)
"""


def test_data_parallel_two_processes_gloo(model_dir, tmp_path):
    """torchrun with 2 CPU processes (gloo): ranks split the batches, gradients are averaged (weights stay equal on
    both ranks, which the checkpoint of rank 0 and the saved head share), rank 0 writes the head."""
    out = tmp_path / "ddp_head"
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    args = cli_args(model_dir, out, "--max-steps", "3")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script),
           json.dumps(args)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads((out / "training.json").read_text())
    assert record["processes"] == 2 and record["steps"] == 3
    assert record["throughput"]["training_tokens_per_s"] > 0
    assert (out / "model.safetensors").is_file()
    sums = dict(re.findall(r"rank (\d)\] parameter checksum ([0-9.e+-]+)", proc.stderr))  # lines may interleave
    assert sorted(sums) == ["0", "1"] and sums["0"] == sums["1"], proc.stderr[-2000:]


def test_train_head_bf16_autocast_on_cpu(model_dir, tmp_path):
    """--bf16 on CPU: features and training step under bf16 autocast, fp32 master weights, a head that loads and
    decodes greedy-equal (the held-out measurement runs in fp32)."""
    out = tmp_path / "head_bf16"
    record = train_head_main(cli_args(model_dir, out, "--max-steps", "2", "--bf16", "--save-dtype", "bfloat16"))
    assert record["autocast"] == "bfloat16" and record["config"]["bf16"] is True and "--bf16" in record["command"]
    assert record["heldout_acceptance"]["greedy_equal_to_target"] is True
    ckpt = torch.load(Path(str(out) + ".work") / "checkpoint.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for k, v in ckpt["head"].items() if v.is_floating_point())
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["draft_vocab_size"] == 512


def test_epoch_order_batches_rows_of_similar_length():
    """Each rank's epoch: its share of the rows once, batches cut from length-sorted windows of 16 batches."""
    from fastspec.training.trainer import epoch_order

    lengths = torch.randint(10, 500, (300,), generator=torch.Generator().manual_seed(0)).tolist()
    shares = [epoch_order(lengths, 4, seed=7, rank=r, world=2) for r in (0, 1)]
    assert sorted(shares[0] + shares[1]) == list(range(300)) and len(shares[0]) == len(shares[1]) == 150
    order = shares[0]
    batches = [order[i : i + 4] for i in range(0, len(order), 4)]
    assert all([lengths[i] for i in b] == sorted(lengths[i] for i in b) for b in batches)
    spread = sum(lengths[b[-1]] - lengths[b[0]] for b in batches) / len(batches)
    random_spread = sum(max(lengths[i : i + 4]) - min(lengths[i : i + 4]) for i in range(0, 300, 4)) / 75
    assert spread < random_spread / 5  # far less padding than random batches
    assert epoch_order(lengths, 4, seed=7) == epoch_order(lengths, 4, seed=7) != epoch_order(lengths, 4, seed=8)


def test_stdlib_prompts_end_after_a_signature_and_never_come_from_held_out_modules():
    """`--prompts stdlib` (the shipped head's training prompts): whole lines of a training module that end just after
    a function's signature and docstring, where the bench's held-out prompts end; none from a held-out module; the
    first n do not depend on how many are asked for (a longer run extends the regeneration cache)."""
    import ast

    from transformers import AutoTokenizer

    from fastspec.pair import default_target_dir
    from fastspec.prompts import heldout_sources
    from fastspec.training import stdlib_prompts

    tokenizer = AutoTokenizer.from_pretrained(default_target_dir())
    prompts = stdlib_prompts(tokenizer, 12, prompt_tokens=64)
    assert stdlib_prompts(tokenizer, 5, prompt_tokens=64) == prompts[:5]
    held_out = "\n".join(heldout_sources().values())
    for prompt in prompts:
        assert len(tokenizer.encode(prompt, add_special_tokens=False)) <= 64
        assert prompt.endswith("\n") and prompt not in held_out
        lines = prompt.splitlines()
        last_def = max(i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def ")))
        # the prompt's tail from its last def, closed by a body, parses as one function: the cut is after its header
        tail = "\n".join(lines[last_def:])
        indent = len(tail) - len(tail.lstrip())
        body = textwrap.dedent(tail) + "\n" + " " * 4 + "pass\n"
        tree = ast.parse(body)
        assert isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef) and indent % 4 == 0, prompt


def test_stdlib_windows_are_whole_lines_of_training_modules_and_prefix_stable():
    """`--prompts stdlib-windows`: whole lines of one training module ending at a random line, within the token budget,
    never from a held-out module, the first n independent of how many are asked for."""
    from transformers import AutoTokenizer

    from fastspec.pair import default_target_dir
    from fastspec.prompts import heldout_sources, training_files
    from fastspec.training import stdlib_windows

    tokenizer = AutoTokenizer.from_pretrained(default_target_dir())
    prompts = stdlib_windows(tokenizer, 10, prompt_tokens=48)
    assert stdlib_windows(tokenizer, 4, prompt_tokens=48) == prompts[:4]
    assert stdlib_windows(tokenizer, 4, prompt_tokens=48, seed=1) != prompts[:4]
    training = [p.read_text(encoding="utf-8", errors="replace") for p in training_files()]
    held_out = list(heldout_sources().values())
    for prompt in prompts:
        assert prompt.strip() and prompt.endswith("\n")
        assert len(tokenizer.encode(prompt, add_special_tokens=False)) <= 48
        assert any(prompt in text for text in training) and not any(prompt in text for text in held_out)


def test_interleave_prompts_takes_one_of_each_source_in_turn_and_extends():
    from fastspec.training import interleave_prompts

    a, b, c = ["a0", "a1", "a2", "a3"], ["b0"], ["c0", "c1", "c2"]
    assert interleave_prompts([a, b, c]) == ["a0", "b0", "c0", "a1", "c1", "a2", "c2", "a3"]
    assert interleave_prompts([a[:2], b, c[:2]]) == interleave_prompts([a, b, c])[:5]  # longer lists extend shorter
    assert interleave_prompts([a]) == a and interleave_prompts([]) == []


def test_train_head_mixes_prompt_sources_before_cutting(model_dir, tmp_path):
    """Two prompt files and --max-prompts: both give prompts (interleaved), so the held-out tail mixes them too."""
    second = tmp_path / "second.txt"
    second.write_text("".join(f"import value {i}\n" for i in range(14)))
    out = tmp_path / "mixed"
    args = cli_args(model_dir, out, "--max-steps", "1", "--max-prompts", "8")
    args[args.index("--prompts") + 1 : args.index("--prompts") + 2] = [str(model_dir / "prompts.txt"), str(second)]
    record = train_head_main(args)
    assert record["data"]["training_prompts"] == 6 and record["data"]["heldout_prompts"] == 2
    from transformers import AutoTokenizer

    from fastspec.training.data import RegenCache, prompt_hash

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    first = (model_dir / "prompts.txt").read_text().splitlines()
    pairs = zip(first, second.read_text().splitlines(), strict=True)
    expected = [tokenizer(t).input_ids for pair in pairs for t in pair][:8]
    cache = RegenCache(Path(str(out) + ".work") / "regen")
    found, _, _ = cache.load([prompt_hash(ids) for ids in expected[:6]])
    assert sorted(found) == list(range(6))  # the training prompts, interleaved
    found, _, _ = cache.load([prompt_hash(tokenizer(t).input_ids) for t in first[:6]])
    assert sorted(found) == [0, 1, 2]  # of the first file's prompts, the three trained on (the others held out or cut)


def test_train_head_trains_on_extra_regen_caches_beside_its_own(model_dir, tmp_path):
    """Sampled answers made by one run (--max-steps 0) train beside a greedy run's own: one row per prompt and cache,
    every answer token counted, the extra cache's settings recorded; its chunks are read, never written."""
    sampled = tmp_path / "sampled_regen"
    made = train_head_main(cli_args(model_dir, tmp_path / "s", "--max-steps", "0", "--regen-temperature", "1.0",
                                    "--regen-cache", str(sampled)))  # fmt: skip
    chunks = {p: p.stat().st_mtime_ns for p in sampled.glob("chunk_*")}
    greedy = train_head_main(cli_args(model_dir, tmp_path / "g", "--max-steps", "0"))
    both = train_head_main(cli_args(model_dir, tmp_path / "m", "--max-steps", "1", "--extra-regen-caches",
                                    str(sampled)))  # fmt: skip
    data = both["data"]
    assert data["training_prompts"] == 12 and data["training_rows"] == 24
    assert data["answer_tokens"] == greedy["data"]["answer_tokens"] + made["data"]["answer_tokens"]
    assert data["prompt_tokens"] == 2 * greedy["data"]["prompt_tokens"]
    (extra,) = data["extra_regen_caches"]
    assert extra["cache"] == str(sampled) and extra["temperature"] == 1.0
    assert extra["answer_tokens"] == made["data"]["answer_tokens"]
    assert "--extra-regen-caches" in both["command"] and both["steps"] == 1
    assert {p: p.stat().st_mtime_ns for p in sampled.glob("chunk_*")} == chunks
    short = tmp_path / "short_regen"  # answers to the first 4 prompts only: refused, not half used
    train_head_main(cli_args(model_dir, tmp_path / "x", "--max-steps", "0", "--max-prompts", "6", "--regen-cache",
                             str(short)))  # fmt: skip
    with pytest.raises(ValueError, match="answers 4 of the 12 training prompts"):
        train_head_main(cli_args(model_dir, tmp_path / "y", "--max-steps", "1", "--extra-regen-caches", str(short)))


def test_loss_mask_covers_answers_or_every_next_token():
    """Position p predicts token p + 1: by default the positions from the last prompt token to the one before the
    last answer token; with prompt_loss every position but the last (padding never)."""
    from fastspec.training.trainer import _batch

    seqs = [torch.tensor([5, 6, 7, 8, 9, 10]), torch.tensor([5, 6, 7, 8])]
    ids, mask = _batch(seqs, [3, 2], [0, 1], max_len=16, pad=0)
    assert ids.tolist() == [[5, 6, 7, 8, 9, 10], [5, 6, 7, 8, 0, 0]]
    assert mask.tolist() == [[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 0, 0]]
    _, mask = _batch(seqs, [3, 2], [0, 1], max_len=16, pad=0, prompt_loss=True)
    assert mask.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]


def test_init_head_starts_a_new_run_from_a_heads_weights(model_dir, tmp_path):
    first = tmp_path / "first"
    train_head_main(cli_args(model_dir, first, "--max-steps", "2"))
    second = tmp_path / "second"
    record = train_head_main(cli_args(model_dir, second, "--max-steps", "1", "--lr", "0", "--init-head", str(first),
                                      "--prompt-loss"))  # fmt: skip
    assert record["steps"] == 1 and record["init_head"] == str(first)  # a new run: its own step count
    assert record["data"]["loss_positions"] == "prompt and answer tokens"
    assert "--init-head" in record["command"] and "--prompt-loss" in record["command"]
    earlier = json.loads((first / "training.json").read_text())  # the starting head's record travels with it
    assert record["init_head_training"]["command"] == earlier["command"] and record["init_head_training"]["steps"] == 2
    assert record["init_head_training"]["init_head_training"] is None
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # lr 0: the initial weights, unchanged
    args = cli_args(model_dir, tmp_path / "third", "--max-steps", "1", "--init-head", str(first))
    args[args.index("--draft-vocab") + 1] = "256"
    with pytest.raises(ValueError, match="init_head: .* draft vocabulary of 512 tokens, draft_vocab asks for 256"):
        train_head_main(args)
    args = cli_args(model_dir, tmp_path / "fourth", "--max-steps", "1", "--kind", "eagle1", "--init-head", str(first))
    args[args.index("--aux-layers") : args.index("--aux-layers") + 4] = []
    args[args.index("--draft-vocab") : args.index("--draft-vocab") + 2] = []
    with pytest.raises(ValueError, match="init_head: .* class Eagle3Head; a --kind eagle1 run starts from a DraftHead"):
        train_head_main(args)


def test_corpus_stream_and_windows(model_dir, tmp_path):
    """corpus_stream: each document's tokens then the separator, in order; corpus_windows: [count, length] slices
    of the stream that depend on the seed alone; missing files and too short streams refused naming the option."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("def f(x):\n    return x\n")
    b.write_text("class C:\n    pass\n")
    stream = data_module.corpus_stream(tokenizer, [str(a), str(b)], separator=0)
    enc = [tokenizer.encode(p.read_text(), add_special_tokens=False) for p in (a, b)]
    assert stream.tolist() == enc[0] + [0] + enc[1] + [0]
    windows = data_module.corpus_windows(stream, 5, 4, seed=7)
    assert windows.shape == (5, 4)
    text = stream.tolist()
    assert all(any(text[s : s + 4] == w.tolist() for s in range(len(text) - 3)) for w in windows)
    assert torch.equal(windows, data_module.corpus_windows(stream, 5, 4, seed=7))
    assert not torch.equal(windows, data_module.corpus_windows(stream, 5, 4, seed=8))
    with pytest.raises(ValueError, match="corpus: .*missing.txt is neither 'stdlib' nor a text file"):
        data_module.corpus_stream(tokenizer, [str(tmp_path / "missing.txt")], separator=0)
    with pytest.raises(ValueError, match=f"corpus: {len(stream)} tokens, shorter than one window of corpus_tokens"):
        data_module.corpus_windows(stream, 1, len(stream) + 1, seed=0)


def test_batch_puts_corpus_windows_after_the_answers_trained_at_every_position():
    from fastspec.training.trainer import _batch

    seqs, plens = [torch.tensor([1, 2, 3, 4, 5]), torch.tensor([6, 7, 8])], [2, 1]
    ids, mask = _batch(seqs, plens, [0, 1], max_len=16, pad=0, windows=torch.tensor([[9, 10, 11, 12, 13, 14]]))
    assert ids.tolist() == [[1, 2, 3, 4, 5, 0], [6, 7, 8, 0, 0, 0], [9, 10, 11, 12, 13, 14]]
    assert mask.tolist() == [[0, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0]]


def test_train_head_corpus_windows_beside_the_answers_and_resumed_alike(model_dir, tmp_path, monkeypatch):
    """--corpus: half of every batch's rows are fresh corpus windows (other windows each step); training.json records
    it; a run stopped and resumed draws the same windows at each step as one that was not."""
    from safetensors.torch import load_file

    from fastspec.training import trainer

    drawn = []

    def recording_windows(stream, count, length, seed):
        drawn.append(data_module.corpus_windows(stream, count, length, seed))
        return drawn[-1]

    monkeypatch.setattr(trainer, "corpus_windows", recording_windows)
    corpus = tmp_path / "corpus.txt"
    words = "def class return import for while if else print self value None True".split()
    gen = torch.Generator().manual_seed(1)
    corpus.write_text(" ".join(words[int(j)] for j in torch.randint(0, len(words), (400,), generator=gen)))
    extra = ("--corpus", str(corpus), "--corpus-fraction", "0.5", "--corpus-tokens", "24")
    whole = train_head_main(cli_args(model_dir, tmp_path / "whole", "--max-steps", "3", *extra))
    corpus_record = whole["data"]["corpus"]
    assert corpus_record["sources"] == [str(corpus)] and corpus_record["tokens"] > 24
    assert corpus_record["windows_per_batch"] == 2 and corpus_record["answer_rows_per_batch"] == 2
    assert corpus_record["window_tokens"] == 24 and "--corpus-fraction 0.5" in whole["command"]
    assert len(drawn) == 3 and all(w.shape == (2, 24) for w in drawn) and not torch.equal(drawn[0], drawn[1])
    whole_windows, drawn[:] = list(drawn), []
    train_head_main(cli_args(model_dir, tmp_path / "split", "--max-steps", "2", *extra))
    train_head_main(cli_args(model_dir, tmp_path / "split", "--max-steps", "3", "--resume", *extra))
    assert len(drawn) == 3 and all(torch.equal(a, b) for a, b in zip(whole_windows, drawn, strict=True))
    drawn[:] = []
    plain = train_head_main(cli_args(model_dir, tmp_path / "plain", "--max-steps", "3"))
    assert plain["data"]["corpus"] is None and drawn == []
    a, c = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "plain" / "model.safetensors")
    assert not torch.equal(a["fc.weight"], c["fc.weight"])
    with pytest.raises(ValueError, match="corpus_fraction: 1.0 of batch_size 4 rows leaves 0 answer rows"):
        train_head_main(cli_args(model_dir, tmp_path / "all", "--max-steps", "1", "--corpus", str(corpus),
                                 "--corpus-fraction", "1.0"))  # fmt: skip
    with pytest.raises(ValueError, match=r"corpus_tokens: must be in \[2, max_len=16\], got 24"):
        train_head_main(cli_args(model_dir, tmp_path / "long", "--max-steps", "1", *extra, "--max-len", "16"))


def test_head_from_checkpoint_is_the_runs_head(model_dir, tmp_path):
    """head_from_checkpoint: the checkpoint's head (its kind, draft vocabulary and feature layers) with the weights
    the run then writes; a file that is not a checkpoint is refused naming it."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from fastspec.training import head_from_checkpoint

    out = tmp_path / "head"
    train_head_main(cli_args(model_dir, out, "--max-steps", "2"))
    target = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    head, step = head_from_checkpoint(Path(str(out) + ".work") / "checkpoint.pt", target)
    assert step == 2 and isinstance(head, Eagle3Head) and head.feature_layers == AUX and not head.training
    saved = load_file(out / "model.safetensors")
    state = head.state_dict()
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in saved)
    other = tmp_path / "other.pt"
    torch.save({"step": 1}, other)
    with pytest.raises(ValueError, match="other.pt: not a train-head checkpoint"):
        head_from_checkpoint(other, target)


class _RunsCodeWhenUnpickled:
    """An object whose unpickling calls a function (here a harmless one): what a checkpoint from elsewhere could do."""

    def __reduce__(self):
        return (os.getpid, ())


def test_checkpoints_are_read_without_unpickling_arbitrary_objects(model_dir, tmp_path):
    """--resume and `head_from_checkpoint` read checkpoints with torch.load(weights_only=True): a file holding any
    other object is refused, naming the option and the file, before anything in it runs."""
    from fastspec.training import head_from_checkpoint

    out = tmp_path / "head"
    train_head_main(cli_args(model_dir, out, "--max-steps", "1"))
    checkpoint = Path(str(out) + ".work") / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)  # what train-head writes reads back safely
    torch.save(dict(state, extra=_RunsCodeWhenUnpickled()), checkpoint)
    with pytest.raises(ValueError, match=r"resume: .*checkpoint.pt holds objects other than tensors"):
        train_head_main(cli_args(model_dir, out, "--max-steps", "2", "--resume"))
    with pytest.raises(ValueError, match=r"checkpoint: .*checkpoint.pt holds objects other than tensors"):
        head_from_checkpoint(checkpoint, None)
