"""Batch invariance of the native CPU runtime at a real head size (the grouped GQA attention kernel).

A soak of `solo serve` on the earlier kernels found greedy outputs that changed under load: with head_dim 64
a batched decode step differed from batch 1 for some mixes of row lengths. The kernels now use one reduction
order for every batch size; the server still probes several mixes at start-up and decodes one row at a time
if any differs. This test is the regression check, on the ISA level the machine picks.
"""

from __future__ import annotations

import pytest
from checkpoints import make_checkpoint

from solo import Engine
from solo.runtime.cpu import cpu_unsupported_reason
from solo.server.scheduler import runtime_is_batch_invariant


@pytest.mark.slow
def test_grouped_attention_batched_decode_equals_batch_1(tmp_path):
    folder = make_checkpoint(tmp_path / "m", "llama", hidden_size=384, num_attention_heads=6, num_key_value_heads=2,
                             head_dim=64, intermediate_size=256, num_hidden_layers=2)
    engine = Engine.load(folder, dtype="bfloat16", backend="auto")
    if engine.runtime.name != "cpu":
        pytest.skip(f"the native CPU runtime is not available here ({cpu_unsupported_reason(engine.model)})")
    engine.runtime.reserve(4, 128)
    assert runtime_is_batch_invariant(engine.runtime, rows=4, trials=32)
