"""Every layer kind transformers has, decoded by fastspec: greedy output equal to `target.generate(do_sample=False)`
for chain, prompt lookup, tree, ragged batch and static cache, or a refusal naming the model type.

By default one tiny model type per layer kind (`tests.tiny_configs.REPRESENTATIVES`); with
`FASTSPEC_ALL_ARCHITECTURES=1` every decoder-only model type of transformers' causal-LM mapping, so a new transformers
release with a new architecture shows up here as a failure or a stated refusal. The whole mapping as a table:
`python bench/architectures.py` (bench/results/architectures.md).
"""

import functools
import os

import pytest

from tests.architecture_cases import GREEDY_FASTSPEC_CASES, Architecture
from tests.tiny_configs import REPRESENTATIVES, decoder_types

MODEL_TYPES = decoder_types() if os.environ.get("FASTSPEC_ALL_ARCHITECTURES") == "1" else REPRESENTATIVES


@functools.cache
def architecture(model_type: str) -> Architecture:
    """The tiny target, draft and inputs of one model type, built once per session."""
    return Architecture(model_type)


@pytest.mark.parametrize("case", GREEDY_FASTSPEC_CASES)
@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_greedy_equals_hf_or_refused(model_type, case):
    status = architecture(model_type).run(case)
    if status.startswith("skip: "):  # HF itself cannot decode this input: there is no reference
        pytest.skip(f"{model_type} {case}: {status}")
    assert status == "pass" or status.startswith("refused: "), f"{model_type} {case}: {status}"
