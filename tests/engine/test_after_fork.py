"""A child process forked from one holding a loaded engine generates (on one thread) instead of hanging."""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings

import pytest
import torch

from solo import Engine, SamplingParams

pytestmark = pytest.mark.skipif(not hasattr(os, "fork") or sys.platform != "linux", reason="needs os.fork (Linux)")

PROMPTS = ["def fibonacci(n):", "import os\n" + "x = 1\n" * 200]  # the second's prefill is 1000+ positions


def _in_child(engine: Engine) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts = [engine.complete(p, SamplingParams(max_tokens=12)).text for p in PROMPTS]
        again = engine.complete(PROMPTS[0], SamplingParams(max_tokens=12)).text
    return {"texts": texts, "again": again, "warnings": [str(w.message) for w in caught],
            "torch_threads": torch.get_num_threads(), "runtime_threads": getattr(engine.runtime, "num_threads", None)}


def test_a_forked_child_generates_on_one_thread_and_says_so():
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # the parent's kernels start their thread pools: what a child inherits broken
    try:
        engine = Engine.load()
        threads = engine.runtime.num_threads
        expected = [engine.complete(p, SamplingParams(max_tokens=12)).text for p in PROMPTS]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, never return into pytest
            code = 1
            try:
                signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a hang ends the child, not the test run
                signal.alarm(60)
                os.close(read)
                os.write(write, json.dumps(_in_child(engine)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            out = pipe.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"the forked child failed or hung (status {status})"
        child = json.loads(out)
        assert child["texts"] == expected  # greedy: the same tokens on one thread as on two
        assert child["again"] == expected[0]
        assert child["torch_threads"] == 1 and child["runtime_threads"] == 1
        if threads > 1:  # said once, naming the fix
            assert len(child["warnings"]) == 1 and "spawn" in child["warnings"][0], child["warnings"]
        # The parent keeps its threads and still generates.
        assert engine.runtime.num_threads == threads and torch.get_num_threads() == 2
        assert engine.complete(PROMPTS[0], SamplingParams(max_tokens=12)).text == expected[0]
    finally:
        torch.set_num_threads(before)
