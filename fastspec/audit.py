"""`fastspec check`: audit a user's own target (with their draft model, head or prompt lookup) for losslessness.

Before trusting a speedup on a model nobody here tried, each decoding path is checked on the user's prompts:
- greedy: the output equals `target.generate(do_sample=False)` for every prompt alone and for all of them as one
  left-padded batch. At the first differing token the target's logit gap is measured (its top logit minus the
  logit of the token fastspec emitted, from one target forward over the reference prefix): a gap within rounding
  (`tie_tolerance`) is a near-tie that another summation order may flip; a larger one is a logic error;
- sampled: after the prompt whose next token is most uncertain, the first two new tokens drawn `samples` times at
  temperature 1 (drafted and verified: a draft model drafts from the first step, a head from the second) against the
  target's own joint distribution p(t1) p(t2 | t1), by chi-square tests of the pair and of the first token alone
  (bins expected below 5 merged; the smaller p-value, doubled, below `ALPHA` fails);
- acceptance per draft position, from the greedy calls' `SpecStats`.
Each method gets a verdict: "lossless", "near-tie" (outputs differ only where the target's top two logits tie
within rounding), "wrong", "refused: <why>" (fastspec refused the path before decoding) or "error: <what>".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

import fastspec

__all__ = ["ALPHA", "METHODS", "MethodReport", "as_json", "audit", "chi_square", "format_report", "tie_tolerance"]

ALPHA = 1e-3  # a sampled method fails when the chi-square p-value is below this
METHODS = ("chain", "tree", "lookup", "static", "compile")


@dataclass
class MethodReport:
    """One method's audit: its verdict and the evidence."""

    method: str
    verdict: str = "lossless"
    greedy_equal: int = 0  # greedy comparisons (prompts alone, then the batch) equal to HF generate
    greedy_total: int = 0
    mismatches: list[dict] = field(default_factory=list)  # {case, position, gap, tolerance}
    chi_square: float | None = None
    p_value: float | None = None
    samples: int = 0
    acceptance_per_position: list[float] = field(default_factory=list)


def audit(target, prompts: list[torch.Tensor], draft=None, methods=METHODS[:4], max_new_tokens: int = 32,
          samples: int = 1000, pad_token_id: int = 0) -> list[MethodReport]:  # fmt: skip
    """Audit each of `methods` (subset of `METHODS`) on `prompts` (1D LongTensors of token ids).

    `draft`: a draft model or head (chain, tree, static and compile use it; without one they use prompt lookup and
    tree is skipped). Returns one `MethodReport` per method asked.
    """
    reports = []
    for method in methods:
        if method not in METHODS:
            raise ValueError(f"methods: unknown method {method!r} (choose from {', '.join(METHODS)})")
        kwargs = _method_kwargs(method, draft)
        report = MethodReport(method)
        if kwargs is None:
            report.verdict = "skipped: needs a draft model or head (--draft / --head)"
        else:
            try:
                _greedy(report, target, prompts, kwargs, max_new_tokens, pad_token_id)
                _sampled(report, target, _most_uncertain(target, prompts), kwargs, samples)
            except ValueError as exc:
                report.verdict = f"refused: {exc}"
            except Exception as exc:  # noqa: BLE001 - the audit reports any failure as the method's verdict
                report.verdict = f"error: {type(exc).__name__}: {exc}"
        reports.append(report)
    return reports


def _method_kwargs(method: str, draft) -> dict | None:
    source = {"draft": draft} if draft is not None else {"prompt_lookup": 3}
    if method == "chain":
        return None if draft is None else {"draft": draft}
    if method == "tree":
        return None if draft is None else {"draft": draft, "tree": "dynamic"}
    if method == "lookup":
        return {"prompt_lookup": 3}
    return dict(source, static_cache=True) if method == "static" else dict(source, compile=True)


def _greedy(report: MethodReport, target, prompts, kwargs: dict, max_new_tokens: int, pad: int) -> None:
    cases = [(f"prompt {i}", p[None], None) for i, p in enumerate(prompts)]
    if len(prompts) > 1:
        cases.append(("batch", *_left_padded(prompts, pad)))
    accepted = drafted = None
    for name, ids, mask in cases:
        common = dict(attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad)
        out, stats = fastspec.generate(target, ids, return_stats=True, **common, **kwargs)  # a refusal comes first
        try:
            expected = target.generate(ids, do_sample=False, **common)
        except Exception as exc:
            raise RuntimeError(f"HF generate, the reference, failed: {type(exc).__name__}: {exc}") from exc
        report.greedy_total += 1
        if out.shape == expected.shape and torch.equal(out, expected):
            report.greedy_equal += 1
        else:
            report.mismatches.append(dict(case=name, **_first_mismatch(target, expected, out, mask, ids.shape[1])))
        accepted = _add(accepted, stats.accepted_per_position)
        drafted = _add(drafted, stats.drafted_per_position)
    report.acceptance_per_position = [a / d for a, d in zip(accepted or [], drafted or [], strict=True) if d > 0]
    if report.mismatches:
        tie = all(m["gap"] <= m["tolerance"] for m in report.mismatches)
        report.verdict = "near-tie" if tie else "wrong"


def _add(total: list[int] | None, counts: list[int]) -> list[int]:
    if total is None:
        return list(counts)
    width = max(len(total), len(counts))
    return [(total[i] if i < len(total) else 0) + (counts[i] if i < len(counts) else 0) for i in range(width)]


@torch.no_grad()
def _first_mismatch(target, expected: torch.Tensor, out: torch.Tensor, mask, prompt_len: int) -> dict:
    """Where `out` [B, T'] first leaves `expected` [B, T] and the target's logit gap there."""
    width = min(expected.shape[1], out.shape[1])
    differs = (expected[:, :width] != out[:, :width]).nonzero()
    if len(differs) == 0:  # one is longer: an early or missed stop
        return dict(position=width - prompt_len, gap=float("inf"), tolerance=0.0)
    row, col = (int(v) for v in differs[0])
    ids = expected[row : row + 1, :col]
    row_mask = None if mask is None else torch.cat([mask[row : row + 1], ids.new_ones(1, col - prompt_len)], 1)
    logits = target(ids, attention_mask=row_mask).logits[0, -1].float()
    gap = float(logits.max() - logits[out[row, col]])
    return dict(position=col - prompt_len, gap=gap, tolerance=tie_tolerance(logits, target.dtype))


def tie_tolerance(logits: torch.Tensor, dtype: torch.dtype) -> float:
    """The logit gap rounding can explain: 8 units in the last place of the model's dtype at the largest logit."""
    return 8 * torch.finfo(dtype).eps * max(1.0, float(logits.abs().max()))


@torch.no_grad()
def _most_uncertain(target, prompts: list[torch.Tensor]) -> torch.Tensor:
    """The prompt whose next-token distribution has the highest entropy: where sampling draws most varied tokens,
    the chi-square can see a wrong distribution (after a near-certain token every method draws the same)."""
    entropies = []
    for prompt in prompts:
        logp = torch.log_softmax(target(prompt[None]).logits[0, -1].double(), dim=-1)
        entropies.append(float(-(logp.exp() * logp).sum()))
    return prompts[entropies.index(max(entropies))]


@torch.no_grad()
def _sampled(report: MethodReport, target, prompt: torch.Tensor, kwargs: dict, samples: int, rows: int = 100):
    """Chi-square tests of the first two sampled tokens against the target's p(t1) p(t2 | t1) after `prompt`, jointly
    and of the first alone (the smaller p-value, doubled: Bonferroni, is the report's).

    Three new tokens per call, so a drafter that needs the target's features first (a head drafts from the second
    step on) still verifies a draft for the second token; a draft model verifies from the first."""
    if samples <= 0:
        return
    end = prompt.shape[0]
    counts: dict[tuple[int, int], int] = {}
    drawn = 0
    while drawn < samples:
        batch = min(rows, samples - drawn)
        out = fastspec.generate(target, prompt.expand(batch, -1), do_sample=True, temperature=1.0, max_new_tokens=3,
                                seed=drawn, **kwargs)  # fmt: skip
        for pair in out[:, end : end + 2].tolist():
            counts[tuple(pair)] = counts.get(tuple(pair), 0) + 1
        drawn += batch
    first = torch.softmax(target(prompt[None]).logits[0, -1].double(), dim=-1)
    # p(t2 | t1) for every t1 expected at least once (at most 256 of them); the rest of the mass is one bin
    likely = first.argsort(descending=True)[: min(256, int((first * drawn >= 1).sum()) or 1)]
    second = torch.softmax(target(torch.cat([prompt.expand(len(likely), -1), likely[:, None]], 1)).logits[:, -1]
                           .double(), dim=-1)  # fmt: skip
    joint = first[likely, None] * second  # [C, V]
    observed = torch.zeros_like(joint)
    for (t1, t2), n in counts.items():
        hit = (likely == t1).nonzero()
        if len(hit):
            observed[int(hit[0]), t2] += n
    rest = drawn - observed.sum()
    joint_test = chi_square(
        torch.cat([observed.flatten(), rest[None]]), torch.cat([joint.flatten(), (1 - joint.sum()).clamp_min(0)[None]])
    )
    # the first token alone too: where p(t1, t2) spreads thinly over many bins, most of them merge into one
    first_counts = torch.zeros_like(first)
    for (t1, _), n in counts.items():
        first_counts[t1] += n
    first_test = chi_square(first_counts, first)
    report.samples = drawn
    report.chi_square, p_value = min(joint_test, first_test, key=lambda test: test[1])
    report.p_value = min(1.0, 2 * p_value)  # Bonferroni over the two tests
    if report.p_value < ALPHA and report.verdict == "lossless":
        report.verdict = "wrong"


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, float]:
    """Pearson's chi-square of `counts` [V] against `probs` [V]: bins expected below 5 merged into one (dropped if
    that one is still below 5). Returns (statistic, p-value)."""
    expected = probs * counts.sum()
    big = expected >= 5
    observed, expect = counts[big], expected[big]
    rest_expected = expected[~big].sum()
    if rest_expected >= 5:
        observed = torch.cat([observed, counts[~big].sum()[None]])
        expect = torch.cat([expect, rest_expected[None]])
    stat = float(((observed - expect) ** 2 / expect).sum())
    dof = max(observed.numel() - 1, 1)
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))
    return stat, p_value


def _left_padded(prompts: list[torch.Tensor], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(p.shape[0] for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - p.shape[0] :] = p
        mask[row, width - p.shape[0] :] = 1
    return ids, mask


def format_report(reports: list[MethodReport]) -> str:
    """A markdown table of the reports, one row per method."""
    lines = ["| method | verdict | greedy equal | first mismatch (gap / tolerance) | chi-square p (samples) | "
             "acceptance per position |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in reports:
        first = r.mismatches[0] if r.mismatches else None
        where = "" if first is None else f"{first['case']}, token {first['position']} ({first['gap']:.3g} / " \
                                         f"{first['tolerance']:.2g})"  # fmt: skip
        chi = "" if r.p_value is None else f"{r.p_value:.3g} ({r.samples})"
        accept = " ".join(f"{a:.2f}" for a in r.acceptance_per_position)
        equal = f"{r.greedy_equal}/{r.greedy_total}" if r.greedy_total else ""
        lines.append(f"| {r.method} | {r.verdict} | {equal} | {where} | {chi} | {accept} |")
    return "\n".join(lines)


def as_json(reports: list[MethodReport]) -> list[dict]:
    """The reports as plain dicts (`fastspec check --json`)."""
    return [asdict(r) for r in reports]
