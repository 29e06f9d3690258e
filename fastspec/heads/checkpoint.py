"""Head checkpoint files: read a directory's ``config.json`` and weights (``.safetensors``, ``.bin``/``.pt`` read
with ``torch.load(weights_only=True)``, or shards named by a ``*.index.json``), remembering which file holds each
key so that errors name it; write ``config.json`` + ``model.safetensors``.

Nothing here knows a head format: `fastspec.heads.formats` detects and translates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

__all__ = ["Checkpoint", "read_checkpoint", "read_config", "write_checkpoint"]

CONFIG_NAME = "config.json"
# single-file names tried in this order when a directory has no index (Medusa's own names last)
WEIGHT_NAMES = (
    "model.safetensors",
    "pytorch_model.bin",
    "medusa_lm_head.safetensors",
    "medusa_lm_head.pt",
)
INDEX_NAMES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass
class Checkpoint:
    """A head directory's weights: ``tensors`` by key and, for error messages, the file of each key."""

    path: Path
    tensors: dict[str, torch.Tensor]
    files: dict[str, str] = field(default_factory=dict)

    def where(self, key: str) -> str:
        """``file 'key'`` (the file that holds it, or the directory for a missing key) for error messages."""
        return f"{self.path / self.files[key] if key in self.files else self.path} key {key!r}"

    def weight_files(self) -> str:
        return ", ".join(sorted(set(self.files.values()))) or "(no weights)"


def read_config(path: Path) -> dict:
    """``path/config.json`` as a dict; ValueError naming the file when it is missing or not a JSON object."""
    cfg_path = Path(path) / CONFIG_NAME
    if not cfg_path.is_file():
        raise ValueError(f"draft: no head config at {cfg_path}")
    try:
        data = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"draft: {cfg_path} is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"draft: {cfg_path} must hold a JSON object")
    return data


def _load_file(file: Path) -> dict[str, torch.Tensor]:
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(file))
    try:
        state = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (any unpickling failure: name the file)
        raise ValueError(f"draft: cannot read {file} as a weights-only torch checkpoint ({err})") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"draft: {file} does not hold a state dict of tensors")
    return dict(state)


def read_checkpoint(path, names: tuple[str, ...] | None = None) -> Checkpoint:
    """The weights of head directory ``path``: an index (``model.safetensors.index.json`` or
    ``pytorch_model.bin.index.json``, its ``weight_map`` naming the shards), else the first of ``names`` (default
    `WEIGHT_NAMES`) that exists, else the only ``*.safetensors`` / ``*.bin`` / ``*.pt`` file. ValueError naming the
    directory when there is none or several candidates."""
    path = Path(path)
    for index_name in INDEX_NAMES:
        index = path / index_name
        if index.is_file():
            weight_map = json.loads(index.read_text()).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"draft: {index} has no 'weight_map'")
            tensors, files = {}, {}
            for shard in sorted(set(weight_map.values())):
                if not (path / shard).is_file():
                    raise ValueError(f"draft: {index} names shard {shard!r}, which {path} does not have")
                for key, value in _load_file(path / shard).items():
                    tensors[key], files[key] = value, shard
            missing = sorted(set(weight_map) - set(tensors))
            if missing:
                raise ValueError(f"draft: {index} maps key {missing[0]!r} to a shard that does not hold it")
            return Checkpoint(path, tensors, files)
    for name in names or WEIGHT_NAMES:
        if (path / name).is_file():
            state = _load_file(path / name)
            return Checkpoint(path, state, dict.fromkeys(state, name))
    candidates = sorted(p.name for ext in ("*.safetensors", "*.bin", "*.pt") for p in path.glob(ext))
    if len(candidates) != 1:
        found = f"several ({', '.join(candidates)}) and no index" if candidates else "none"
        raise ValueError(
            f"draft: {path}: expected one weights file (.safetensors, .bin, .pt) or an index, found {found}"
        )
    state = _load_file(path / candidates[0])
    return Checkpoint(path, state, dict.fromkeys(state, candidates[0]))


def write_checkpoint(path, config: dict, tensors: dict[str, torch.Tensor], name: str = "model.safetensors") -> None:
    """Write ``config.json`` and one safetensors file of ``tensors`` (contiguous CPU copies) into directory ``path``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path / name),
              metadata={"format": "pt"})  # fmt: skip
    (path / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")
