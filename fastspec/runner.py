"""Model runners: the only code that runs a model forward during decoding.

A runner is one model (the target, a draft model, or a draft head) plus its KV cache, fed incrementally from the
shared right-aligned token buffer (`fastspec.batch.RowBatch`; which columns each cache holds is
`fastspec.layout`). It owns three things every model needs alike:
- the cache: a growing `DynamicKVCache`, or a preallocated `StaticKVCache` of a given capacity (`new_kv_cache`);
- the forward over the static cache: after the first forward (the prefill, one shape per prompt, eager) the n new
  positions are padded to a compiled width (`fastspec.compiled.CompiledForward.width`: copies of the last one,
  written past the live entries, masked, and overwritten by the next forward), the attention covers the whole
  capacity, and the step runs compiled (`StepRunner._run_static`);
- for a target that a draft head reads, the hidden states it needs, kept per column beside the cache
  (`CachedModel.keep_features`, `target_logits_and_features`);
- on CPU, eager forwards of a model whose weights stream from memory under `fastspec.cpu_linear.linear_mode`
  (small-row linear layers as W @ x^T, where MKL's x @ W^T is slow).

Position ids are derived from the attention mask (cumsum - 1), which is what HF generate does for left-padded
batches; absolute-position models (GPT-2) and rotary ones (Llama, Qwen2, Mistral) are both correct because the
cached keys already carry their positions.
"""

from __future__ import annotations

import functools
import inspect
import weakref

import torch

from fastspec.cache import DynamicKVCache, FeatureStore, right_align_index
from fastspec.cache_kinds import takes_fed_mask
from fastspec.compiled import CompiledForward
from fastspec.cpu_linear import linear_mode
from fastspec.layout import KeptPositions
from fastspec.masks import AttentionKinds, additive_mask
from fastspec.static_cache import StaticKVCache

__all__ = [
    "BufferCache",
    "CachedModel",
    "HeadRunner",
    "StepRunner",
    "additive_mask",
    "causal_visibility",
    "decoder_layers",
    "execution_device",
    "new_kv_cache",
    "position_ids",
    "target_logits_and_features",
]


def position_ids(mask: torch.Tensor) -> torch.Tensor:
    """Position of every column of left-padded rows, mask [R, L] -> [R, L] (real tokens before it; padding 0)."""
    return (mask.long().cumsum(-1) - 1).clamp_min(0)


def causal_visibility(mask: torch.Tensor, start: int) -> torch.Tensor:
    """[R, L - start, L] bool: new token i (column start + i) sees the real columns (mask [R, L]) up to itself."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    return mask.bool()[:, None, :] & (cols[None, :] <= cols[start:, None])[None]


def repeat_last(x: torch.Tensor, count: int, dim: int = 1) -> torch.Tensor:
    """`x` with its last entry along `dim` repeated `count` more times: how a step of n new positions is padded to
    a compiled width."""
    last = x.narrow(dim, x.shape[dim] - 1, 1)
    return torch.cat([x, last.expand(*(count if d == dim else -1 for d in range(x.dim())))], dim=dim)


def execution_device(model: torch.nn.Module) -> torch.device:
    """The device `model` computes on, where its inputs go: for a model dispatched with a device map (accelerate,
    `device_map=...`), the execution device of its input embedding's hook (its weights may sit on the meta device,
    offloaded to CPU or disk and loaded by the hook); else the device of that module's first parameter. A module
    without an input embedding (an lm_head, a draft head) answers for itself."""
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    module = model if embed is None else embed
    device = getattr(getattr(module, "_hf_hook", None), "execution_device", None)
    if device is not None:
        return torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return next(module.parameters()).device


def new_kv_cache(num_layers: int, capacity: int | None, device: torch.device,
                 config=None) -> DynamicKVCache | StaticKVCache:  # fmt: skip
    """The KV cache of a runner: a growing `DynamicKVCache` for `capacity` None, with one layer of the kind each
    decoder layer of the model `config` needs (`fastspec.cache_kinds`: every attention layer keeps all its positions,
    even a window's, since windows could not be cropped; recurrent / conv state with per-position history; indexer
    keys), or plain attention layers for `config` None; else a `StaticKVCache` of `capacity` positions per row whose
    buffers come from the shared pool (`StaticKVCache.pooled`: a later call of the same shapes reuses them, and on
    CUDA its recorded graphs). ValueError naming the model type for a layer kind fastspec cannot roll back."""
    return DynamicKVCache(config) if capacity is None else StaticKVCache.pooled(num_layers, capacity, device)


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of an HF causal LM, in order: the ModuleList of its base model with one entry per hidden
    layer (`model.layers` for Llama, Qwen2, Mistral, Phi-3, Gemma; `transformer.h` for GPT-2). ValueError naming
    `target` when there is none."""
    count = model.config.get_text_config().num_hidden_layers
    base = model.base_model
    for name in ("layers", "h", "blocks", "decoder_layers"):
        layers = getattr(base, name, None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers) == count:
            return layers
    for module in base.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return module
    raise ValueError(f"target: found no list of {count} decoder layers in {type(model).__name__} to read features from")


class _LayerInputs:
    """Forward pre-hooks on a model's decoder layers that keep each hooked layer's input hidden states (a reference,
    no copy) in `inputs[i]`: what transformers returns as `hidden_states[i]`, without storing every layer. Installed
    once per model and kept (`of`), like transformers' own hidden-state hooks; a hook costs one dict store."""

    _installed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self):
        self.inputs: dict[int, torch.Tensor] = {}
        self.hooked: set[int] = set()

    @classmethod
    def of(cls, model: torch.nn.Module, indices) -> _LayerInputs:
        """The capture of `model`, with hooks on the layers `indices` (installed where missing)."""
        capture = cls._installed.setdefault(model, cls())
        missing = sorted(set(indices) - capture.hooked)
        if missing:  # every forward asks; only the first finds the layers
            layers = decoder_layers(model)
            for index in missing:
                layers[index].register_forward_pre_hook(functools.partial(capture._keep, index), with_kwargs=True)
                capture.hooked.add(index)
        return capture

    def _keep(self, index: int, module, args, kwargs) -> None:
        self.inputs[index] = args[0] if args else kwargs["hidden_states"]


def target_logits_and_features(
    target, num_logits: int = 0, feature_layers: tuple[int, ...] | list[int] = (-1,), **inputs
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of ``target`` as its base model then its ``lm_head``: ``(logits [R, num_logits, V] of the last
    positions (all of them for 0, as ``logits_to_keep``), features [R, n, F] of every fed position)``.

    ``feature_layers`` names the hidden states a head reads, in transformers' ``hidden_states`` numbering: i in
    [0, L) is the input of decoder layer i (0: the embeddings; the residual stream, before any norm), read by a
    forward pre-hook on that layer (`_LayerInputs`); -1 (or L) is the last hidden state, after the final norm: the
    input of the ``lm_head``. The features are those states concatenated in order, ``F = len(feature_layers) * H``.
    ``inputs`` are the base model's keyword arguments (``input_ids``, ``attention_mask``, ``position_ids``, the
    cache, ...); the logits are ``target(**inputs, logits_to_keep=num_logits)`` for targets whose logits are
    ``lm_head(last hidden state)``, which a head's ``bind`` checks.
    """
    count = target.config.get_text_config().num_hidden_layers
    layers = [-1 if i in (-1, count) else i for i in feature_layers]
    capture = _LayerInputs.of(target, [i for i in layers if i != -1])
    hidden = target.base_model(**inputs).last_hidden_state
    states = [hidden if i == -1 else capture.inputs.pop(i) for i in layers]
    features = states[0] if len(states) == 1 else torch.cat(states, dim=-1)
    return target.get_output_embeddings()(hidden[:, -num_logits:]), features


class BufferCache:
    """Stores that cover buffer columns [0, cached) of every row (a KV cache, the target's features), and the
    surgery `RowBatch` applies to all of them after a step: compaction, row selection, dropped leading columns.

    Every store has `set_length`, `gather_positions`, `select_rows` and `drop_leading` (`DynamicKVCache`,
    `StaticKVCache`, `FeatureStore`).
    """

    def __init__(self, stores: list):
        self.stores = stores
        self.cached = 0  # buffer columns [0, cached) are in every store, for every row

    def keep(self, kept: KeptPositions, shift: torch.Tensor, shifted: bool) -> None:
        """Compact after verification: each row keeps positions [0, prefix_len) and its accepted entries, moved right
        by `shift` [R] (the buffer's right-alignment). The new coverage is the smallest row's kept length plus shift.

        Contiguous entries (a chain's accepted drafts) beyond what is cached are not there yet and are fed at the
        next forward; when every shift is 0 (`shifted` False) that is a crop, else one gather per layer.
        """
        if kept.positions is None:
            valid = (kept.prefix_len + kept.num_kept).clamp(max=self.cached)
            self.cached = int((valid + shift).min())
            for store in self.stores:
                if shifted:
                    store.gather_positions(right_align_index(self.cached, shift))
                else:
                    store.set_length(self.cached)
            return
        prefix_len, positions = kept.prefix_len, kept.positions
        self.cached = int((prefix_len + kept.num_kept + shift).min())
        col = torch.arange(self.cached, device=shift.device)[None, :] - shift[:, None]  # unshifted column
        if positions.shape[1] == 0:
            positions = col.new_zeros(col.shape[0], 1)
        tail = positions.clamp_min(0).gather(1, (col - prefix_len).clamp(0, positions.shape[1] - 1))
        index = torch.where(col < prefix_len, col.clamp_min(0), tail)
        for store in self.stores:
            store.gather_positions(index)

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only batch rows `rows` [R'] of every store."""
        for store in self.stores:
            store.select_rows(rows)

    def drop_leading(self, columns: int) -> None:
        """The buffer lost its first `columns` columns (padding in every row): drop their entries."""
        dropped = min(columns, self.cached)
        for store in self.stores:
            store.drop_leading(dropped)
        self.cached -= dropped


class StepRunner(BufferCache):
    """A step function over its own KV cache: the cache choice and the fixed-width forward every runner shares.

    Args:
        module: the model or head whose parameters give the device and dtype.
        step: `step(**inputs) -> tuple of outputs [R, n, ...]` (a model's logits, a head's hidden and logits).
        num_layers: decoder layers the cache holds.
        capacity: None for a `DynamicKVCache`; else positions per row of a `StaticKVCache`, which every forward
            attends over in full.
        compiled: a `CompiledForward` of `step` over the static cache (every forward after the first padded to its
            width), or None (eager).
        config: the model's config, whose layer kinds the dynamic cache's layers follow (`new_kv_cache`); None for
            plain attention layers (a draft head's).
    """

    def __init__(self, module: torch.nn.Module, step, num_layers: int, capacity: int | None,
                 compiled: CompiledForward | None = None, config=None):  # fmt: skip
        parameter = next(module.parameters())
        self.cache = new_kv_cache(num_layers, capacity, execution_device(module), config)
        super().__init__([self.cache])
        self.capacity = capacity
        self.step = step
        self.compiled = compiled
        self.dtype = parameter.dtype
        self.linear_mode = linear_mode(module)

    def _eager(self, inputs: dict) -> tuple:
        """`step(**inputs)` eagerly, under the module's `fastspec.cpu_linear.linear_mode` where it has one."""
        if self.linear_mode is None:
            return self.step(**inputs)
        with self.linear_mode:
            return self.step(**inputs)

    def _run_dynamic(self, per_position: dict, mask: torch.Tensor, fixed: dict) -> tuple:
        """One forward over the dynamic cache: `per_position` inputs [R, n, ...], `mask` as the step takes it (a 2D
        padding mask over cache + new columns, or an additive 4D one), `fixed` the other keyword arguments."""
        outputs = self._eager(dict(per_position, **fixed, attention_mask=mask))
        self.cached = self.cache.get_seq_length()  # tree entries count until `keep` compacts them
        return outputs

    def _attention_mask(self, visible: torch.Tensor, q_pos: torch.Tensor, length: int | None = None):
        """The attention mask a forward hands its step for `visible` [R, n, cached + m] (m <= n fed columns) and
        the positions `q_pos` [R, n] of the n new positions: additive [R, 1, n, length] (`additive_mask`)."""
        return additive_mask(visible, self.dtype, length)

    def _run_static(self, per_position: dict, visible: torch.Tensor, fixed: dict) -> tuple:
        """One forward over the static cache: `visible` [R, n, cached + n] says which positions each new position
        attends to. A compiled forward (any but the prefill) pads n to its width (module docstring). Returns the
        step's outputs for the n real positions."""
        num = visible.shape[1]
        compiled = self.compiled if self.cached > 0 else None  # the prefill (one shape per prompt) runs eagerly
        width = num if compiled is None else compiled.width(num)
        self.cache.check_room(width)
        if width > num:
            per_position = {name: repeat_last(value, width - num) for name, value in per_position.items()}
            visible = repeat_last(visible, width - num)
        # fresh contiguous inputs: a compiled graph guards on strides, and a slice of the buffer has the buffer's
        inputs = {name: value.clone(memory_format=torch.contiguous_format) for name, value in per_position.items()}
        inputs.update(fixed, attention_mask=self._attention_mask(visible, inputs["position_ids"], self.capacity))
        outputs = self._eager(inputs) if compiled is None else compiled(inputs)
        self.cache.advance(num)
        self.cached = self.cache.get_seq_length()
        return tuple(None if out is None else out[:, :num] for out in outputs)


class CachedModel(StepRunner):
    """An HF causal LM (target or draft model) and its KV cache, fed from the shared token buffer.

    Args:
        model: HF causal LM.
        capacity: None for a growing cache, else positions per row of a static one (`StepRunner`).
        compile: name the model in log lines and compile its fixed-width steps over the static cache
            (`fastspec.compiled.CompiledForward`); None runs eagerly.
    """

    def __init__(self, model: torch.nn.Module, capacity: int | None = None, compile: str | None = None):  # noqa: A002
        self.model = model
        self.name = compile
        self.features = None
        self.kinds = AttentionKinds(model)
        # positions of the cached columns, where a layer kind's mask depends on them (windows, chunks)
        self.key_positions = None if self.kinds.plain else FeatureStore()
        num_layers = model.config.get_text_config().num_hidden_layers
        super().__init__(model, None, num_layers, capacity, config=model.config)
        # transformers renamed `past_key_values` to `cache` (5.2x); the GPU image's 5.17 knows only the old name
        self._set_step(None)
        if self.key_positions is not None:
            self.stores.append(self.key_positions)

    def _set_step(self, feature_layers: list[int] | None) -> None:
        model = self.model
        if feature_layers is None:
            self.step, key, called = _logits_step(model), "logits", model
        else:
            self.step, called = _logits_and_features_step(model, feature_layers), model.base_model
            key = f"logits_and_features{tuple(feature_layers)}"
        if takes_fed_mask(model):
            self.step = _fed_positions_mask(self.step)
        if getattr(self.cache, "has_state", False):
            self.step = _recording_states(self.step, self.cache)
        self.cache_arg = "cache" if "cache" in inspect.signature(called.forward).parameters else "past_key_values"
        self.compiled = None if self.name is None else CompiledForward(model, self.name, self.step, key)

    def keep_features(self, feature_layers: list[int]) -> None:
        """Also keep the hidden states `feature_layers` (a draft head's; [-1] = the last hidden state, the input of
        the lm_head) of every fed column in `self.features` (a `FeatureStore` covering the cache's columns).
        Called by a head's drafter before the first forward."""
        if self.cached:
            raise RuntimeError("keep_features must be called before the model's first forward")
        self.features = FeatureStore()
        self.stores.append(self.features)
        self._set_step(list(feature_layers))

    @torch.no_grad()
    def forward(
        self, tokens: torch.Tensor, mask: torch.Tensor, extra: torch.Tensor | None = None, num_logits: int = 1
    ) -> torch.Tensor:
        """Feed the not-yet-cached part of buffer + `extra`; return logits [R, num_logits, V] of the last positions.

        Args:
            tokens: [R, S] right-aligned token buffer (pad columns hold any valid id).
            mask: [R, S] 1 for real tokens, 0 for left padding.
            extra: [R, E] tokens that follow the buffer (drafts), all real; those already cached are skipped.
            num_logits: how many trailing positions' logits to return.
        """
        full_mask = mask
        if extra is not None and extra.shape[1] > 0:
            tokens = torch.cat([tokens, extra], dim=1)
            full_mask = torch.cat([mask, torch.ones_like(extra, dtype=mask.dtype)], dim=1)
        new = tokens[:, self.cached :]
        positions = position_ids(full_mask)[:, self.cached :]
        if self.capacity is None:
            return self._run(new, full_mask, positions, num_logits)
        return self._run(new, causal_visibility(full_mask, self.cached), positions, num_logits)

    @torch.no_grad()
    def forward_tree(self, tokens: torch.Tensor, mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Feed token-tree nodes after the cache; return logits [R, N, V] at every node.

        Args:
            tokens: [R, N] node tokens, fed after the `cached` columns.
            mask: [R, 1, N, cached + N] additive float mask in the model's dtype (`fastspec.kernels.tree_mask`);
                transformers hands a 4D mask to eager and SDPA attention as-is.
            position_ids: [R, N] real prefix length + depth (GPT-2's absolute positions and rotary ones alike).
        """
        num = tokens.shape[1]
        return self._run(tokens, mask if self.capacity is None else mask[:, 0] == 0, position_ids, num)

    def _run(self, new: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, num_logits: int) -> torch.Tensor:
        """One forward of `new` [R, n]: `mask` is a dynamic cache's attention mask, or a static cache's visibility
        [R, n, cached + n]. Returns the logits of the last `num_logits` positions."""
        per_position = {"input_ids": new, "position_ids": positions}
        if self.capacity is None:
            if mask.dim() == 4 and self.key_positions is not None:  # a tree's mask: add each layer kind's rule
                mask = self._attention_mask(mask[:, 0] == 0, positions)
            fixed = {"use_cache": True, "num_logits": num_logits, self.cache_arg: self.cache}
            logits, features = self._run_dynamic(per_position, mask, fixed)
        else:
            fixed = {"use_cache": True, "num_logits": 0, self.cache_arg: self.cache}  # 0: every position's logits
            logits, features = self._run_static(per_position, mask, fixed)
        if self.features is not None:
            self.features.append(features)
        if self.key_positions is not None:
            self.key_positions.append(positions[:, :, None])
        return logits[:, logits.shape[1] - num_logits :]

    def _attention_mask(self, visible: torch.Tensor, q_pos: torch.Tensor, length: int | None = None):
        """`StepRunner._attention_mask` with each layer kind's rule (`fastspec.masks.AttentionKinds.masks`): a dict
        of masks for a model with several kinds. Key positions: the cached columns', then the fed ones'."""
        if self.key_positions is None:
            return additive_mask(visible, self.dtype, length)
        fed = visible.shape[2] - self.cached
        cached = q_pos.new_zeros(q_pos.shape[0], 0) if self.cached == 0 else self.key_positions.values[:, :, 0]
        k_pos = torch.cat([cached.to(q_pos.device), q_pos[:, :fed]], dim=1)
        return self.kinds.masks(visible, q_pos, k_pos, self.dtype, length)


class HeadRunner(StepRunner):
    """A draft head (`fastspec.heads.DraftHeadBase`, one decoder layer) and its KV cache.

    Args:
        head: the head, bound to its target.
        capacity: None for a growing cache, else positions per row of a static one (`StepRunner`).
        compile: compile the head's fixed-width steps over the static cache.
    """

    def __init__(self, head: torch.nn.Module, capacity: int | None = None, compile: bool = False):  # noqa: A002
        self.head = head
        super().__init__(head, head.step, 1, capacity)
        self.compiled = CompiledForward(head, "draft head", head.step, "step") if compile else None

    def forward(self, features, ids, positions, visible) -> tuple[torch.Tensor, torch.Tensor]:
        """The head over n new positions after its cache: features [R, n, H], ids [R, n], positions [R, n] and
        `visible` [R, n, cached + n] bool. Returns (hidden [R, n, H], logits [R, n, V])."""
        if self.capacity is None:
            return self._run(features, ids, positions, additive_mask(visible, self.dtype))
        return self._run(features, ids, positions, visible)

    def forward_tree(self, features, ids, positions, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` under a tree's additive mask [R, 1, n, cached + n] (`fastspec.kernels.tree_mask`)."""
        return self._run(features, ids, positions, mask.to(self.dtype) if self.capacity is None else mask[:, 0] == 0)

    def _run(self, features, ids, positions, mask) -> tuple[torch.Tensor, torch.Tensor]:
        per_position = {"features": features, "input_ids": ids, "position_ids": positions}
        if self.capacity is None:
            return self._run_dynamic(per_position, mask, {"cache": self.cache})
        return self._run_static(per_position, mask, {"cache": self.cache})


def _logits_step(model: torch.nn.Module):
    """`step(num_logits, **inputs) -> (logits [R, num_logits, V], None)`: the model's forward."""

    def step(num_logits: int, **inputs):
        return model(**inputs, logits_to_keep=num_logits).logits, None

    return step


def _fed_positions_mask(step):
    """`step` for a model whose forward multiplies its fed positions by the 2D padding mask as given (Mamba,
    FalconMamba: `fastspec.cache_kinds.takes_fed_mask`): the mask over cache + fed columns cut to the fed ones."""

    def trimmed(num_logits: int, **inputs):
        mask = inputs.get("attention_mask")
        if mask is not None and mask.dim() == 2:
            inputs["attention_mask"] = mask[:, mask.shape[1] - inputs["input_ids"].shape[1] :]
        return step(num_logits, **inputs)

    return trimmed


def _recording_states(step, cache: DynamicKVCache):
    """`step` for a model with recurrent state: each forward keeps the states after the positions whose logits it
    returns (a chain's root and drafts, a draft model's newest position) and the one before them (the column a draft
    model's cache may fall back to), not after every fed position (`DynamicKVCache.record_states`; each costs a
    sequential scan step)."""

    def recording(num_logits: int, **inputs):
        cache.record_states(num_logits + 1 if num_logits > 0 else None)
        return step(num_logits, **inputs)

    return recording


def _logits_and_features_step(model: torch.nn.Module, feature_layers: list[int]):
    """`step(num_logits, **inputs) -> (logits [R, num_logits, V], features [R, n, len(feature_layers) * H])` in one
    pass."""
    layers = tuple(feature_layers)

    def step(num_logits: int, **inputs):
        return target_logits_and_features(model, num_logits, layers, **inputs)

    return step
