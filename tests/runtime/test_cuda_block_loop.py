"""The engine-side block loop gives what the per-token loop gives: tokens, text, stops, finish reasons."""

from __future__ import annotations

# isort: off
from _triton_env import DEVICE, requires_triton  # first: sets TRITON_INTERPRET before Triton loads
# isort: on
import re

import pytest
import torch
from _cuda_helpers import TinyCheckpoints

from solo import Engine, SamplingParams
from solo.engine.block_decoding import can_run_in_blocks, run_in_blocks
from solo.runtime.cuda.runtime import CudaGraphRuntime

pytestmark = requires_triton

PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = TinyCheckpoints(tmp_path_factory.mktemp("block-loop")).folder("llama")
    return Engine.load(folder, device=DEVICE, backend="eager")


@pytest.fixture(scope="module")
def runtime(engine):
    return CudaGraphRuntime(engine.model, step="torch", use_graphs=False, block_size=4)


def _blocks(engine, runtime, params):
    request = engine.make_request(PROMPT, params)
    assert can_run_in_blocks(runtime, request)
    runtime.reserve(1, len(request.prompt_ids) + request.max_new_tokens)
    logits = runtime.prefill(0, torch.tensor(request.prompt_ids))
    events = list(run_in_blocks(runtime, request, logits))
    assert all(len(e.token_ids) == 1 for e in events) and events[-1].finish_reason is not None
    assert all(e.finish_reason is None for e in events[:-1])
    return ("".join(e.text for e in events), [t for e in events for t in e.token_ids], events[-1].finish_reason,
            events[-1].stats.completion_tokens)


def _per_token(engine, params):
    r = engine.complete(PROMPT, params)
    return r.text, r.token_ids, r.finish_reason, r.stats.completion_tokens


def test_length_finish(engine, runtime):
    params = SamplingParams(max_tokens=11, ignore_eos=True)
    assert _blocks(engine, runtime, params) == _per_token(engine, params)


def test_stop_token_inside_a_block(engine, runtime):
    base = engine.complete(PROMPT, SamplingParams(max_tokens=12, ignore_eos=True))
    params = SamplingParams(max_tokens=12, stop_token_ids=[base.token_ids[6]])
    got = _blocks(engine, runtime, params)
    assert got == _per_token(engine, params) and got[2] == "stop" and got[1][-1] == base.token_ids[6]


def test_stop_string_inside_a_block_drops_the_rest(engine, runtime):
    base = engine.complete(PROMPT, SamplingParams(max_tokens=16, ignore_eos=True))
    words = re.findall(r"[A-Za-z]{2,}", base.text)
    if len(words) < 2:
        pytest.skip("the tiny model's text has no usable stop string here")
    stop = words[-1][:2]  # a later word, so the stop lands after the first block
    params = SamplingParams(max_tokens=16, ignore_eos=True, stop=[stop])
    got = _blocks(engine, runtime, params)
    assert got == _per_token(engine, params) and got[2] == "stop" and stop not in got[0]


def test_requests_that_need_the_host_stay_per_token(engine, runtime):
    assert not can_run_in_blocks(runtime, engine.make_request(PROMPT, SamplingParams(repetition_penalty=1.2)))
    assert not can_run_in_blocks(runtime, engine.make_request(PROMPT, SamplingParams(logprobs=2)))
    assert not can_run_in_blocks(runtime, engine.make_request(PROMPT, SamplingParams(logit_bias={3: 1.0})))
    assert not can_run_in_blocks(runtime, engine.make_request(PROMPT, SamplingParams(min_tokens=2)))
    assert not can_run_in_blocks(engine.runtime, engine.make_request(PROMPT, SamplingParams()))  # eager runtime
