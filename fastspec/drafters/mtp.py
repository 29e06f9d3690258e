"""`MtpDrafter`: draft with the target's own multi-token-prediction (MTP) layers (`generate(use_mtp=True)`).

DeepSeek-V3, GLM-4.5 MoE (glm4_moe), Ernie 4.5 MoE and other models ship MTP layers beside their decoder (DeepSeek-AI
2024, DeepSeek-V3 technical report, arXiv 2412.19437, section 2.2). transformers (5.2x) builds them as
`transformers.modeling_layers.MtpModel`, sharing the target's embedding, lm_head and rotary embedding, its weights
read from the target's checkpoint (`MtpModel.from_pretrained(target)`, as `generate(use_mtp=True)` does). MTP layer 0
at position p reads the target's last hidden state h_p (after the final norm, transformers' `hidden_states[-1]`) and
the embedding of token p + 1:

    x = eh_proj(concat(enorm(embed(token[p + 1])), hnorm(h_p)))      [R, n, 2H] -> [R, n, H]
    h'_p = post_norm(mtp_block(x))                                    one decoder layer of the target's kind
    logits of token p + 2 = lm_head(h'_p)

which is exactly the contract of a draft head (`fastspec.heads.DraftHeadBase`): a feature of column p and the token
of column p + 1 in, a feature and the logits of column p + 2 out. `MtpHead` adapts an `MtpModel` to it, and
`MtpDrafter` is `fastspec.drafters.HeadDrafter` over that head: the target's runner keeps its last hidden state per
column (`CachedModel.keep_features([-1])`), the MTP layer keeps its own one-layer KV cache over the feature columns,
chains feed the layer's own output h'_p back in (K drafts per step, as vLLM and SGLang speculate with one MTP layer),
and trees score each level under the tree-attention mask. A model with several MTP layers drafts with its first,
chained: its later layers are not used (HF's `MTPCandidateGenerator` drafts exactly one token per layer instead).
The drafts only decide speed: verification by the target keeps every path lossless.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from fastspec.drafters.base import DraftSetup
from fastspec.drafters.head import HeadDrafter
from fastspec.heads.base import DraftHeadBase

__all__ = ["MtpDrafter", "MtpHead", "load_mtp_model", "mtp_draft"]

# MTP layer kinds `MtpHead` runs: attention under the additive mask fastspec hands it (no recurrent state)
_ATTENTION_KINDS = ("full_attention",)


def _model_type(target: nn.Module) -> str:
    return getattr(target.config.get_text_config(), "model_type", type(target).__name__)


def _mtp_layer_count(target: nn.Module) -> int:
    """The target's number of MTP layers; ValueError naming `use_mtp` and the model type when it has none."""
    count = getattr(target.config.get_text_config(), "num_mtp_layers", None)
    if not count:
        raise ValueError(
            f"use_mtp: the target ({_model_type(target)}) has no multi-token-prediction layers: its config sets no "
            "num_mtp_layers (num_nextn_predict_layers); pass a draft model or head instead"
        )
    return int(count)


def _check_mtp_layer_kinds(target: nn.Module) -> None:
    """ValueError naming `use_mtp` when the target's MTP layers are of a kind `MtpHead` cannot run (linear attention
    keeps a recurrent state, and windows or chunks need their own masks)."""
    config = target.config.get_mtp_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if not kinds <= set(_ATTENTION_KINDS):
        raise ValueError(
            f"use_mtp: the target's ({_model_type(target)}) MTP layers are {sorted(kinds)}; fastspec drafts with MTP "
            f"layers of the kinds {list(_ATTENTION_KINDS)} only"
        )


def _mtp_model_class():
    try:
        from transformers.modeling_layers import MtpModel
    except ImportError as error:  # transformers before MTP support (the GPU image's 5.17)
        import transformers

        raise ValueError(
            f"use_mtp: this transformers ({transformers.__version__}) has no MtpModel; drafting with a model's MTP "
            "layers needs a transformers that builds them (5.2x)"
        ) from error
    return MtpModel


def load_mtp_model(target: nn.Module) -> nn.Module:
    """The target's MTP layers as transformers builds them for `generate(use_mtp=True)`: an `MtpModel` whose layer
    weights come from the target's checkpoint (`target.config.name_or_path`) and whose embedding, lm_head and rotary
    embedding are the target's. ValueError naming `use_mtp` and the model type when the target has no MTP layers,
    layers of a kind fastspec cannot run, or no checkpoint holding their weights."""
    _mtp_layer_count(target)
    _check_mtp_layer_kinds(target)
    mtp_class = _mtp_model_class()
    if not target.config.name_or_path:
        raise ValueError(
            f"use_mtp: the target ({_model_type(target)}) was not loaded from a checkpoint, which is where its MTP "
            "layers' weights are; pass draft=MtpHead(mtp_model) for MTP layers built another way"
        )
    device = next(p.device for p in target.get_decoder().layers[-1].parameters())
    if not isinstance(target.config.dtype, torch.dtype):  # a model built from a config holds None or a name here;
        target.config.dtype = target.dtype  # `MtpModel.from_pretrained` builds its layers in this dtype
    try:
        mtp = mtp_class.from_pretrained(target, device_map={"": device})
    except (OSError, RuntimeError, ValueError, KeyError) as error:
        raise ValueError(
            f"use_mtp: could not load the MTP layers of the target ({_model_type(target)}) from its checkpoint "
            f"{target.config.name_or_path}: {error}"
        ) from error
    return mtp.eval()


def mtp_draft(target: nn.Module) -> MtpHead:
    """The draft of `generate(use_mtp=True)`, passed on as `draft=`: the target's first MTP layer as a head
    (`load_mtp_model`), which `fastspec.drafters.build_drafter` drafts with as an `MtpDrafter`."""
    return MtpHead(load_mtp_model(target))


class MtpHead(DraftHeadBase):
    """The first MTP layer of an `MtpModel` as a draft head (module docstring).

    Args:
        mtp: a `transformers.modeling_layers.MtpModel` of the target (`load_mtp_model`, or built with
            `MtpModel(target, num_mtp_layers)` and given weights); it must share the target's embedding and lm_head.

    Only the MTP layer (and a shared post-norm, where the model has one) are the head's parameters; the `MtpModel`
    itself is kept outside the module tree, so the target's embedding and lm_head are not counted twice.
    """

    kind = "MTP layer"

    def __init__(self, mtp: nn.Module):
        super().__init__()
        text = mtp.config
        self.layer = mtp.layers[0]
        self.shared_post_norm = getattr(mtp, "shared_post_norm", None) if mtp.use_shared_post_norm else None
        object.__setattr__(self, "mtp", mtp)
        self.config = SimpleNamespace(vocab_size=text.vocab_size, target_model_type=text.model_type)
        self._llama_config = text  # the config `DraftHeadBase.new_cache` builds a cache for
        self.hidden_size = text.hidden_size

    @property
    def feature_layers(self) -> list[int]:
        """The target's last hidden state (after its final norm): transformers' `hidden_states[-1]`, what HF's
        `MTPCandidateGenerator` feeds the MTP layers."""
        return [-1]

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size

    def bind(self, target) -> MtpHead:
        """`DraftHeadBase.bind`, and a ValueError naming `draft` when the MTP layers are not this target's (another
        embedding or lm_head)."""
        super().bind(target)
        if self.mtp.embed_tokens.weight is not target.get_input_embeddings().weight:
            raise ValueError("draft: these MTP layers do not share the target's input embedding; build them from it")
        if self.mtp.shared_head is not target.get_output_embeddings():
            raise ValueError("draft: these MTP layers do not share the target's lm_head; build them from it")
        return self

    def target_features(self, features: torch.Tensor) -> torch.Tensor:
        """The target's last hidden state [R, n, H] is the MTP layer's input as is."""
        return features

    def step(self, features, input_ids, position_ids, attention_mask, cache) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP layer over n positions (the step `fastspec.compiled` compiles).

        Args:
            features: [R, n, H] the hidden state of position p (the target's, or the layer's own previous output).
            input_ids: [R, n] the token at p + 1; position_ids: [R, n] the rotary position of p.
            attention_mask: additive [R, 1, n, L] over the cache's keys then the new ones (None only for n = 1 with
                a dynamic cache); cache: the layer's one-layer KV cache.
        Returns:
            (hidden [R, n, H]: the layer's output, the next chain step's feature; logits [R, n, V] of token p + 2).
        """
        mtp = self.mtp
        embeds = mtp.embed_tokens(input_ids).to(features.dtype)
        if attention_mask is not None:
            attention_mask = attention_mask.to(embeds.dtype)
        position_embeddings = None if mtp.rotary_emb is None else mtp.rotary_emb(embeds, position_ids=position_ids)
        hidden = self.layer(
            embeds, features, position_embeddings=position_embeddings, attention_mask=attention_mask,
            position_ids=position_ids, cache=cache, use_cache=cache is not None,
        )  # fmt: skip
        if self.shared_post_norm is not None:
            hidden = self.shared_post_norm(hidden)
        return hidden, mtp._project_to_logits(hidden)


class MtpDrafter(HeadDrafter):
    """Drafts chains and trees with the target's first MTP layer over its features (`HeadDrafter` over `MtpHead`).

    Args:
        mtp: an `MtpHead`, or an `MtpModel` of the target.
        setup: the call's `DraftSetup`; the target's runner is made to keep its last hidden state.
    """

    def __init__(self, mtp: nn.Module, setup: DraftSetup):
        super().__init__(mtp if isinstance(mtp, MtpHead) else MtpHead(mtp), setup)

    @classmethod
    def for_target(cls, target: nn.Module, setup: DraftSetup) -> MtpDrafter:
        """The drafter of `generate(use_mtp=True)`: the target's MTP layers loaded from its checkpoint
        (`load_mtp_model`)."""
        return cls(load_mtp_model(target), setup)
