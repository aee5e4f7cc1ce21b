"""The GPU benchmark's bookkeeping, run on a tiny model (on the CPU without a GPU)."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import argparse
import json

import pytest
from _cuda_helpers import PROMPT, TinyCheckpoints

from solo.runtime.cuda import bench

pytestmark = requires_triton


def test_parse_engine():
    assert bench.parse_engine("triton", 16) == ("triton", "block", 16)
    assert bench.parse_engine("torch:token", 16) == ("torch", "token", 16)
    assert bench.parse_engine("triton-pdl:block:8", 16) == ("triton-pdl", "block", 8)
    with pytest.raises(SystemExit):
        bench.parse_engine("triton:batch", 16)


def test_bench_solo_reports_speed_syncs_and_agreement(tmp_path):
    model = TinyCheckpoints(tmp_path).model("llama", DEVICE)
    out = tmp_path / "solo.json"
    args = argparse.Namespace(engines="torch:block:4,torch:token", block_size=4, gen_len=9, repeats=2, json=str(out))
    report = {"shape": "tiny", "engines": {}, "roofline": {"tokens_per_s": 1000.0}}
    bench.bench_solo(args, report, model, PROMPT, roofline_tps=1000.0)
    block, token = report["engines"]["solo-torch-block-k4"], report["engines"]["solo-torch-token"]
    assert "error" not in block and "error" not in token
    assert block["decode_tok_s"]["median"] > 0 and len(block["runs"]) == 2
    # Prefill + 2 blocks for 9 tokens, against prefill + one per token.
    assert block["host_syncs_per_token"] == pytest.approx(3 / 9)
    assert token["host_syncs_per_token"] == pytest.approx(9 / 9)
    assert report["greedy_agreement"] == {"solo-torch-block-k4": 9, "solo-torch-token": 9}
    peer = tmp_path / "peer.json"
    peer.write_text(json.dumps({"shape": "tiny", "engines": {"hf-compile": {
        "decode_tok_s": {"median": block["decode_tok_s"]["median"] / 2}}}}))
    summary = bench.summarize_files([str(out), str(peer)])["tiny"]
    assert summary["best_solo"] in ("solo-torch-block-k4", "solo-torch-token")
    assert summary["speedup_vs_peers"]["hf-compile"] >= 2.0 - 1e-9
