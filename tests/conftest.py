"""Shared fixtures: tiny checkpoints written by transformers, and the read-only HF metadata fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from checkpoints import make_checkpoint  # noqa: E402

# Read-only metadata of real models (configs, tokenizers, chat templates) beside the repository; absent in
# a user's fresh clone, where the tests that need it skip.
SHARED_HF = Path(os.environ.get("SOLO_SHARED_FIXTURES", Path(__file__).resolve().parents[2] / "shared")) / \
    "fixtures" / "hf"


@pytest.fixture(scope="session")
def shared_hf() -> Path:
    if not SHARED_HF.is_dir():
        pytest.skip("the shared HF metadata fixtures (../shared/fixtures/hf) are not present in this checkout")
    return SHARED_HF


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny float32 Llama checkpoint with a chat template."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama")
