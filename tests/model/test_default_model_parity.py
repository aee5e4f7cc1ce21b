"""The bundled trained model: Solo's greedy tokens equal transformers' on real code prompts."""

from __future__ import annotations

import pytest
import torch
from checkpoints import hf_greedy_ids
from transformers import AutoModelForCausalLM

from solo import Engine, SamplingParams
from solo.errors import ModelNotFoundError
from solo.model.default_model import default_model_path

PROMPTS = ["def fibonacci(n):", "import os\nimport sys\n\n\ndef main(", "class Stack:\n    def __init__(self):"]


@pytest.fixture(scope="module")
def bundled():
    try:
        return default_model_path()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def hf_model(bundled):
    return AutoModelForCausalLM.from_pretrained(bundled, dtype=torch.float32)


@pytest.mark.parametrize("backend", ["eager", "auto"])
def test_bundled_model_greedy_parity(bundled, hf_model, backend):
    engine = Engine.load(None, dtype="float32", backend=backend)
    assert engine.model_dir == bundled
    for prompt in PROMPTS:
        ids = engine.encode_prompt(prompt)
        expected = hf_greedy_ids(hf_model, ids, 32)
        result = engine.complete(prompt, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
        assert result.token_ids == expected, prompt
