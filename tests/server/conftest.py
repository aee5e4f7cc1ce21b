"""Fixtures of the server tests: tiny checkpoints and a running server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from checkpoints import make_checkpoint, write_tokenizer
from server_harness import RunningServer, serving


@pytest.fixture(scope="session")
def tiny_model(tiny_llama) -> Path:
    """The shared tiny Llama (context 256, with a chat template)."""
    return tiny_llama


@pytest.fixture(scope="session")
def no_template_model(tmp_path_factory) -> Path:
    """A tiny model whose tokenizer has no chat template (completions only)."""
    folder = make_checkpoint(tmp_path_factory.mktemp("plain") / "model")
    write_tokenizer(folder, chat_template=False)
    return folder


@pytest.fixture(scope="session")
def long_model(tmp_path_factory) -> Path:
    """A tiny model with a 4096-token context: long generations to interrupt."""
    return make_checkpoint(tmp_path_factory.mktemp("long") / "model", max_position_embeddings=4096)


@pytest.fixture(scope="module")
def server(tiny_model) -> Iterator[RunningServer]:
    """A server on the tiny model: 4 slots, 16 queued."""
    with serving(tiny_model, max_batch=4, max_queue=16) as running:
        yield running
