"""`generate`, `speculative_generate`, `autoregressive_generate`: the decoding loop.

One loop serves normal and speculative decoding. Each step:
1. the proposer drafts K tokens per active row (K = 0 for normal decoding);
2. the target scores the last buffer token and the K drafts in one forward (the first step is the prefill);
3. the verifier (fused Triton kernel on CUDA, eager reference otherwise) accepts a prefix of the drafts and
   emits one recovered or bonus token: every row gains between 1 and K+1 tokens;
4. tokens are appended to each row's output, cut at EOS and at max_new_tokens (even inside a draft);
5. rows that accepted fewer tokens than the best row are shifted right (more left padding), so all rows
   end at the same column: token buffer, attention mask and both KV caches stay rectangular;
6. finished rows leave the batch (their cache rows are dropped), and leading columns that are padding in every
   remaining row are dropped from the buffer and the caches.
With `tree`, steps 1-3 draft a token tree instead, score all its nodes in one target forward under a
tree-attention mask and verify it (`fastspec.tree_step`); step 5 then compacts the caches to the accepted path.

Batch cost of step 5: when rows disagree, one gather over each KV cache per step, and the padding of a row
grows by the tokens it fell behind (attention over those columns is masked, but computed) until every row has
it (step 6). With batch 1, or when all rows accept the same count, it is a plain crop.
"""

from __future__ import annotations

import time

import torch

from fastspec.adaptive import DraftLengthController
from fastspec.cache import right_align_index
from fastspec.checks import check_finite_logits, check_generate_args, vocab_size
from fastspec.proposers import DraftModelProposer, LookupThenDraftProposer, PromptLookupProposer
from fastspec.rng import RowRandom
from fastspec.runner import CachedModel
from fastspec.sampling import Sampler
from fastspec.stats import SpecStats
from fastspec.tree import resolve_tree
from fastspec.tree_step import TreeSpeculator
from fastspec.verify import resolve_backend, verify_chain

__all__ = ["autoregressive_generate", "generate", "speculative_generate"]


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    draft: torch.nn.Module | None = None,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 128,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_draft_tokens: int | str = 4,
    tree=None,
    prompt_lookup: int | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    seed: int | list[int] | torch.Tensor | None = None,
    return_stats: bool = False,
    streamer=None,
    verify_backend: str = "auto",
    check_logits: bool = True,
):
    """Decode from `target`, speculatively when a `draft` model is given; a drop-in for `target.generate`.

    Args:
        target: any HF causal LM.
        input_ids: [B, T] prompt ids (left-padded when B > 1, with `attention_mask`).
        draft: HF causal LM with the target's vocabulary, or None (normal decoding).
        attention_mask: [B, T], 1 for real tokens, 0 for left padding.
        max_new_tokens: tokens to generate per row (>= 1); generation stops exactly there.
        do_sample, temperature, top_k, top_p: as in HF generate; greedy when do_sample is False.
        num_draft_tokens: chain length K, or "auto" to choose K (<= 8) each step from each row's measured
            per-position acceptance and the measured step time per K (`fastspec.adaptive`).
        tree: tree speculation with `draft` (`fastspec.tree`): a list of paths of child ranks (e.g. [[0], [1],
            [0, 0]]), a named static tree ("small", "medium", "large": 16/32/64 nodes of depth num_draft_tokens),
            "dynamic" or a `DynamicTree` (EAGLE-2, depth num_draft_tokens); None drafts a chain.
        prompt_lookup: n-gram size for drafting from the prompt (and the text generated so far) instead of a draft
            model; with a `draft` too, rows whose last n-gram occurs earlier draft by lookup, the others with the
            draft model (`fastspec.proposers.LookupThenDraftProposer`).
        eos_token_id, pad_token_id: default to the target's generation config.
        seed: fixes every random draw. An int seeds row b with seed + b; a list / tensor [B] gives each row its
            own seed, and a row's output then depends only on its prompt and seed, not on the rest of the batch.
        return_stats: also return a `SpecStats`.
        streamer: object with `put(tensor)` / `end()` (transformers' TextStreamer), batch 1 only.
        verify_backend: "auto" (Triton on CUDA), "triton" or "reference".
        check_logits: raise `NonFiniteLogitsError` when the target or draft emits NaN/inf logits or a row with
            no finite logit (one reduction over V per forward); False skips the check.

    Returns:
        sequences [B, T + new] (new = longest row's output; shorter rows padded with pad_token_id), and
        `SpecStats` when `return_stats`.
    """
    check_generate_args(
        target, input_ids, draft, attention_mask, max_new_tokens, do_sample, temperature, top_k, top_p,
        num_draft_tokens, prompt_lookup, eos_token_id, pad_token_id,
    )  # fmt: skip
    resolve_backend(verify_backend, input_ids.device)
    if tree is not None and draft is None:
        raise ValueError("tree speculation drafts with a draft model: pass draft=... (or tree=None)")
    if tree is not None and num_draft_tokens == "auto":
        raise ValueError("num_draft_tokens='auto' adapts a chain's length; with a tree pass the depth as an int")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ValueError(f"streamer supports batch size 1 only, got a batch of {input_ids.shape[0]}")
    config = target.generation_config
    eos = eos_token_id if eos_token_id is not None else config.eos_token_id
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = pad_token_id if pad_token_id is not None else config.pad_token_id
    pad = pad if pad is not None else (eos_ids[0] if eos_ids else 0)
    sampler = Sampler(do_sample, float(temperature), top_k, top_p, RowRandom(_row_seeds(seed, input_ids)))
    proposer = None
    if prompt_lookup is not None and tree is not None:
        raise ValueError("prompt_lookup combines with a chain draft, not a tree: pass tree=None")
    if prompt_lookup is not None and draft is not None:
        proposer = LookupThenDraftProposer(prompt_lookup, DraftModelProposer(draft, vocab_size(target), check_logits))
    elif prompt_lookup is not None:
        proposer = PromptLookupProposer(prompt_lookup)
    elif tree is not None:
        spec = resolve_tree(tree, num_draft_tokens)
        proposer = TreeSpeculator(draft, spec, vocab_size(target), check_logits, verify_backend)
        num_draft_tokens = proposer.depth
    elif draft is not None:
        proposer = DraftModelProposer(draft, vocab_size(target), check_logits)
    sequences, stats = _decode(
        target, input_ids, attention_mask, max_new_tokens, sampler, eos_ids, pad, proposer, num_draft_tokens,
        streamer, verify_backend, check_logits,
    )  # fmt: skip
    return (sequences, stats) if return_stats else sequences


def speculative_generate(target: torch.nn.Module, input_ids: torch.Tensor, draft: torch.nn.Module, **kwargs):
    """Speculative decoding with a draft model; same arguments and results as `generate`."""
    if draft is None:
        raise ValueError("draft must be a model for speculative_generate (use autoregressive_generate without one)")
    return generate(target, input_ids, draft=draft, **kwargs)


def autoregressive_generate(target: torch.nn.Module, input_ids: torch.Tensor, **kwargs):
    """Normal decoding (one target forward per token) through the same loop, sampling and stopping rules."""
    if kwargs.get("draft") is not None:
        raise ValueError("draft must be None for autoregressive_generate")
    return generate(target, input_ids, **kwargs)


def _row_seeds(seed, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-row seeds [B] int64: seed + row for an int, the given values for a list/tensor, random for None."""
    batch = input_ids.shape[0]
    if seed is None:  # drawn from torch's global generator, so torch.manual_seed still fixes the output
        seed = int(torch.randint(0, 2**62, (1,)))
    if isinstance(seed, int):
        return seed + torch.arange(batch, device=input_ids.device)
    seeds = torch.as_tensor(seed, dtype=torch.long, device=input_ids.device).reshape(-1)
    if seeds.numel() != batch:
        raise ValueError(f"seed has {seeds.numel()} per-row values for a batch of {batch}")
    return seeds


@torch.no_grad()
def _decode(target, input_ids, attention_mask, max_new_tokens, sampler, eos_ids, pad, proposer, k_max, streamer,
            verify_backend, check_logits):  # fmt: skip
    """The loop of the module docstring. Returns (sequences [B, T + new], SpecStats)."""
    start = time.perf_counter()
    batch, _ = input_ids.shape
    device = input_ids.device
    tokens = input_ids
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.dtype)
    outputs = torch.full((batch, max_new_tokens), pad, dtype=torch.long)  # host-side, written per step
    counts = [0] * batch
    active = list(range(batch))  # original row of each buffer row
    padding = (mask.cumsum(dim=1) == 0).sum(dim=1).tolist()  # leading padding columns of each buffer row
    eos_set = set(eos_ids)
    stats = SpecStats()
    target_runner = CachedModel(target)
    controller = DraftLengthController() if k_max == "auto" and proposer is not None else None
    k_max = controller.max_k if controller is not None else k_max
    if streamer is not None:
        streamer.put(input_ids.cpu())

    while active:
        step_rows = active  # `active` is rebound below when rows finish
        rows, width = tokens.shape
        remaining = [max_new_tokens - counts[r] for r in active]
        sampler.begin_step(
            torch.tensor(active, device=device), torch.tensor([counts[r] for r in active], device=device)
        )
        k = 0 if proposer is None else min(k_max, max(remaining) - 1)
        step_start = time.perf_counter()
        sources = None
        if controller is not None:
            sources = proposer.sources(tokens, mask, k)
            k = controller.choose(k, active, remaining, sources)
        num_draft, num_nodes = None, None
        if isinstance(proposer, TreeSpeculator):  # draft, score and verify a token tree of depth <= k
            out, num_accepted, num_draft, nodes = proposer.step(target_runner, tokens, mask, k, sampler)
            num_nodes = torch.full((rows,), nodes)  # num_draft: each row's tree depth
        else:
            drafts, draft_probs = tokens.new_empty(rows, 0), None
            if k > 0:
                drafts, draft_probs, num_draft = proposer.propose(tokens, mask, k, sampler)
            if num_draft is not None:  # ragged proposal: drop columns no row uses (all of them if nothing matched)
                k = int(num_draft.max())
                drafts, num_draft = drafts[:, :k], num_draft.clamp(max=k)
            logits = target_runner.forward(tokens, mask, extra=drafts, num_logits=k + 1)
            if check_logits:
                check_finite_logits(logits, "target", stats.steps)
            if sampler.do_sample:
                uniforms, noise = sampler.verify_randomness(k, logits.shape[-1])
            else:  # greedy rows ignore randomness: skip drawing [R, V] noise
                uniforms, noise = logits.new_ones(rows, k), logits.new_ones(rows, logits.shape[-1])
            out, num_accepted = verify_chain(
                logits, drafts, draft_probs, num_draft, sampler.verify_temperature, sampler.top_k, sampler.top_p,
                uniforms, noise, backend=verify_backend,
            )  # fmt: skip

        # emit: host bookkeeping of at most K+1 tokens per row, cut at EOS and max_new_tokens
        out_host, accepted_host = out.cpu(), num_accepted.cpu()
        draft_host = torch.full((rows,), k) if num_draft is None else num_draft.cpu()
        finished, emitted = [], 0
        for i, row in enumerate(active):
            new = out_host[i, : int(accepted_host[i]) + 1].tolist()[: remaining[i]]
            hit_eos = next((j for j, t in enumerate(new) if t in eos_set), None)
            if hit_eos is not None:
                new = new[: hit_eos + 1]
            outputs[row, counts[row] : counts[row] + len(new)] = torch.tensor(new)
            counts[row] += len(new)
            emitted += len(new)
            finished.append(hit_eos is not None or counts[row] == max_new_tokens)
            if streamer is not None:
                streamer.put(torch.tensor(new))
        stats.record(draft_host, accepted_host, emitted, num_nodes)
        if all(finished):
            break

        # append the emitted tokens and right-align rows that accepted fewer than the best row
        num_new = num_accepted + 1
        most = int(accepted_host.max()) + 1
        tokens = torch.cat([tokens, out[:, :most].clamp_min(0)], dim=1)
        mask = torch.cat([mask, (out[:, :most] >= 0).to(mask.dtype)], dim=1)
        shift = most - num_new
        padding = [p + most - 1 - int(a) for p, a in zip(padding, accepted_host, strict=True)]
        shifted = bool((accepted_host != accepted_host.max()).any())
        if shifted:
            index = right_align_index(width + most, shift)
            tokens = tokens.gather(1, index)
            shifted_in = torch.arange(width + most, device=device)[None, :] < shift[:, None]
            mask = mask.gather(1, index).masked_fill(shifted_in, 0)
        if isinstance(proposer, TreeSpeculator):  # keep the accepted path's cache entries, right-aligned
            proposer.realign(target_runner, num_accepted, shift)
        else:
            accepted_len = width + num_accepted  # old columns + accepted drafts, per row
            target_runner.realign(accepted_len, shift, shifted)
            if proposer is not None:
                proposer.realign(accepted_len, shift, shifted)

        # finished rows leave the batch
        if any(finished):
            keep = torch.tensor([i for i, f in enumerate(finished) if not f], device=device)
            tokens, mask = tokens[keep], mask[keep]
            target_runner.select_rows(keep)
            if proposer is not None:
                proposer.select_rows(keep)
            active = [row for row, f in zip(active, finished, strict=True) if not f]
            padding = [p for p, f in zip(padding, finished, strict=True) if not f]
        common = min(padding)  # columns that are padding in every row: no row attends to them
        if common > 0:
            tokens, mask = tokens[:, common:], mask[:, common:]
            target_runner.drop_leading(common)
            if proposer is not None:
                proposer.drop_leading(common)
            padding = [p - common for p in padding]
        if controller is not None:
            controller.update(step_rows, draft_host, accepted_host, time.perf_counter() - step_start, sources)

    if streamer is not None:
        streamer.end()
    stats.wall_time = time.perf_counter() - start
    new_len = max(counts)
    return torch.cat([input_ids, outputs[:, :new_len].to(device)], dim=1), stats
