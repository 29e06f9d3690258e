"""`fastspec check` (`fastspec.audit`): verdicts per method, and that a broken path is caught, not waved through."""

import json

import pytest
import torch

from fastspec import audit as audit_module
from fastspec.audit import ALPHA, audit, chi_square, format_report
from fastspec.cli import main
from fastspec.masks import AttentionKinds, additive_mask
from tests.conftest import perturbed_copy, tiny_model
from tests.test_attention_kinds import windowed_model


def prompts(*lengths: int, vocab: int = 128) -> list[torch.Tensor]:
    return [torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]


def test_a_lossless_target_gets_lossless_verdicts_with_evidence():
    target = tiny_model("llama")
    draft = perturbed_copy(target, 0.02)
    reports = audit(target, prompts(9, 14, vocab=256), draft=draft, methods=["chain", "lookup"], max_new_tokens=16,
                    samples=300)  # fmt: skip
    for report in reports:
        assert report.verdict == "lossless", format_report(reports)
        assert report.greedy_equal == report.greedy_total == 3  # two prompts alone, then both as one batch
        assert report.samples == 300 and report.p_value > ALPHA
    assert reports[0].acceptance_per_position[0] > 0  # the partly shared draft is partly accepted


def test_a_path_that_ignores_the_window_is_found_wrong_with_a_logit_gap_beyond_rounding(monkeypatch):
    """The bug of issue 44 put back: every layer kind gets the full-attention mask."""

    def full_only(self, visible, q_pos, k_pos, dtype, length=None):
        return additive_mask(visible, dtype, length)

    monkeypatch.setattr(AttentionKinds, "masks", full_only)
    target = windowed_model("mistral")
    reports = audit(target, prompts(12), draft=perturbed_copy(target, 0.05), methods=["chain", "tree"],
                    max_new_tokens=16, samples=0)  # fmt: skip
    chain, tree = reports
    assert chain.verdict == "lossless"  # the chain hands the model a 2D mask: its own masks are right
    assert tree.verdict == "wrong", format_report(reports)
    mismatch = tree.mismatches[0]
    assert mismatch["gap"] > 100 * mismatch["tolerance"]


def test_a_verifier_that_accepts_every_draft_is_found_wrong_by_the_chi_square(monkeypatch):
    """Sampled drafts all accepted (uniforms 0: u < p/q always) follow the draft's distribution, not the target's:
    greedy output stays equal, so only the chi-square can tell."""
    from fastspec import speculators

    original = speculators.verify_chain

    def accept_all(logits, tokens, probs, num_draft, temperature, top_k, top_p, uniforms, noise, **kwargs):
        return original(logits, tokens, probs, num_draft, temperature, top_k, top_p, torch.zeros_like(uniforms),
                        noise, **kwargs)  # fmt: skip

    monkeypatch.setattr(speculators, "verify_chain", accept_all)
    target = tiny_model("llama", vocab=64, init=0.1)  # flat distributions: a noisy draft's q differs from p
    (report,) = audit(target, prompts(6, vocab=64), draft=perturbed_copy(target, 1.0), methods=["chain"],
                      max_new_tokens=8, samples=1000)  # fmt: skip
    assert report.greedy_equal == report.greedy_total  # greedy rows compare argmaxes, never the uniforms
    assert report.verdict == "wrong" and report.p_value < ALPHA, format_report([report])


def test_refusals_and_missing_drafts_are_verdicts_not_crashes():
    target = windowed_model("mistral")
    target.config.layer_types = ["sliding_attention", "full_attention"]  # kinds its forward cannot take apart
    reports = audit(target, prompts(6), draft=None, methods=["chain", "static"], max_new_tokens=4, samples=0)
    assert reports[0].verdict.startswith("skipped: needs a draft")
    assert reports[1].verdict.startswith("refused: static_cache: the target (mistral)")
    with pytest.raises(ValueError, match="methods: unknown method 'beam'"):
        audit(target, prompts(6), methods=["beam"])


def test_chi_square_accepts_the_distribution_and_rejects_another():
    probs = torch.softmax(torch.randn(50, generator=torch.Generator().manual_seed(0), dtype=torch.float64), 0)
    draws = torch.multinomial(probs, 20000, replacement=True, generator=torch.Generator().manual_seed(1))
    counts = torch.bincount(draws, minlength=50).double()
    assert chi_square(counts, probs)[1] > ALPHA
    shifted = torch.softmax(probs.log() + 0.3 * torch.linspace(-1, 1, 50, dtype=torch.float64), 0)
    assert chi_square(counts, shifted)[1] < ALPHA


def test_cli_check_on_the_shipped_pair_writes_json(tmp_path, capsys):
    out = tmp_path / "check.json"
    main(["check", "def add(a, b):\n", "--methods", "chain", "lookup", "--samples", "0", "--max-new-tokens", "8",
          "--json", str(out)])  # fmt: skip
    table = capsys.readouterr().out
    assert "| chain | lossless | 1/1 |" in table and "| lookup | lossless | 1/1 |" in table
    assert [r["method"] for r in json.loads(out.read_text())] == ["chain", "lookup"]
    assert audit_module.METHODS[-1] == "compile"  # asked on CUDA by default, on CPU by name


def test_cli_check_head_is_a_flag_for_the_shipped_head_and_head_dir_names_another(capsys):
    from fastspec.models import shipped_head_dir

    main(["check", "--head", "def add(a, b):\n", "--methods", "chain", "--samples", "0", "--max-new-tokens", "6"])
    assert "| chain | lossless | 1/1 |" in capsys.readouterr().out  # the prompt stayed the prompt
    main(["check", "--head-dir", str(shipped_head_dir(None)), "--methods", "tree", "--samples", "0",
          "--max-new-tokens", "6"])  # fmt: skip
    assert "| tree | lossless | 4/4 |" in capsys.readouterr().out  # three built-in prompts, then the batch
