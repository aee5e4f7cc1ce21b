"""The server's start-up probe of batch invariance on the native CPU runtime's grouped attention kernel.

A soak of `solo serve` found greedy outputs that changed under load: with head_dim 64 (the grouped GQA
attention kernel) a batched decode step differs from batch 1 for some mixes of row lengths. The server
probes several mixes at start-up and decodes one row at a time when any differs, so outputs stay right;
this test records the kernel's state (xfail until the kernel is batch-invariant again).
"""

from __future__ import annotations

import pytest
from checkpoints import make_checkpoint

from solo import Engine
from solo.runtime.cpu import cpu_unsupported_reason
from solo.server.scheduler import runtime_is_batch_invariant


@pytest.mark.slow
@pytest.mark.xfail(reason="CPU grouped attention: batched decode differs from batch 1 for some row-length mixes",
                   strict=False)
def test_grouped_attention_batched_decode_equals_batch_1(tmp_path):
    folder = make_checkpoint(tmp_path / "m", "llama", hidden_size=384, num_attention_heads=6, num_key_value_heads=2,
                             head_dim=64, intermediate_size=256, num_hidden_layers=2)
    engine = Engine.load(folder, dtype="bfloat16", backend="auto")
    if engine.runtime.name != "cpu":
        pytest.skip(f"the native CPU runtime is not available here ({cpu_unsupported_reason()})")
    engine.runtime.reserve(4, 128)
    assert runtime_is_batch_invariant(engine.runtime, rows=4, trials=16)
