"""`solo run|serve|bench --tp N` as a user runs them: separate processes, real ports, a rank killed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from checkpoints import make_lane_checkpoint

from solo import Engine, SamplingParams
from solo.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lane_model(tmp_path_factory):
    return make_lane_checkpoint(tmp_path_factory.mktemp("laneformer"), delay=1)


def _expected(folder, prompt, n):
    return Engine.load(folder).complete(prompt, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)).text


def test_run_tp2_prints_one_process_output(lane_model):
    proc = subprocess.run([sys.executable, "-m", "solo.cli", "run", str(lane_model), "--tp", "2", "--prompt",
                           "def f(x):", "--max-tokens", "8", "--ignore-eos", "--temperature", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _expected(lane_model, "def f(x):", 8) + "\n"
    assert "backend: eager-tp2" in proc.stderr


def _torchrun_run(folder, max_tokens: int) -> subprocess.CompletedProcess:
    # `solo run --tp 2` under torchrun: every process runs the same command (the env:// variables torchrun sets).
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(port), "-m", "solo.cli", "run", str(folder), "--tp", "2", "--prompt", "def f(x):",
                           "--max-tokens", str(max_tokens), "--ignore-eos", "--temperature", "0"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_run_under_torchrun_env_rendezvous(lane_model):
    # Rank 1 follows rank 0.
    proc = _torchrun_run(lane_model, 8)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == _expected(lane_model, "def f(x):", 8) + "\n"


def test_torchrun_followers_load_the_dtype_rank_0_loads(tmp_path):
    # From a break-test: with no dtype in config.json rank 0 (Engine.load) took the weights' bfloat16 and the
    # torchrun followers float32; their first collective then failed on the mismatched sizes.
    import torch
    from checkpoints import make_checkpoint

    folder = make_checkpoint(tmp_path / "llama", "llama", dtype=torch.bfloat16)
    config = {k: v for k, v in json.loads((folder / "config.json").read_text()).items()
              if k not in ("dtype", "torch_dtype")}
    (folder / "config.json").write_text(json.dumps(config))
    proc = _torchrun_run(folder, 4)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() and "4 generated tokens" in proc.stderr


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_serve_tp2_answers_then_dies_cleanly_with_a_rank(lane_model):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "solo.cli", "serve", str(lane_model), "--tp", "2", "--port",
                             str(port), "--served-model-name", "tiny"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(base + "/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        body = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 6, "temperature": 0}
        reply = httpx.post(base + "/v1/completions", json=body, timeout=60).json()
        assert reply["choices"][0]["text"] == _expected(lane_model, "def f(x):", 6)
        # Kill the follower (a grandchild: forked by the helper process); the server must notice while idle,
        # report unhealthy and exit on its own, non-zero.
        helper_children = [p for p in _descendants(proc.pid) if p not in _children_of(proc.pid)]
        assert helper_children
        for pid in helper_children:
            os.kill(pid, signal.SIGKILL)
        assert proc.wait(timeout=90) == 1
        assert "tensor parallelism failed" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def _children_of(pid: int) -> list[int]:
    return [p for p in _descendants(pid) if int((Path("/proc") / str(p) / "stat").read_text()
                                                  .rsplit(")", 1)[1].split()[1]) == pid]


def test_bench_tp2_reports_blocked_time(tmp_path, capsys, lane_model):
    out = tmp_path / "tp.json"
    code = main(["bench", str(lane_model), "--tp", "2", "--prompt-len", "8", "--gen-len", "4", "--repeats", "1",
                 "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    variant = report["variants"]["model as trained"]
    assert variant["ms_per_token"] > 0 and variant["blocked_ms_per_token_max_rank"] >= 0
    assert variant["collectives_per_token"] > 0
    assert "blocked ms/token" in capsys.readouterr().out


def test_a_stopped_rank_fails_the_engine_before_the_gloo_timeout(lane_model, monkeypatch):
    # From a break test: a follower stopped with SIGSTOP (alive, answering nothing) left a request blocked and
    # /health "ok" for gloo's 300 s timeout. Its heartbeat stands still: rank 0 marks the runtime failed.
    import threading

    from solo.distributed import runtime as tp_runtime

    monkeypatch.setattr(tp_runtime, "STALL_S", 3.0)  # (conftest keeps a failure from ending the test process)
    engine = Engine.load(lane_model, tp=2)
    followers = [p for p in _descendants(os.getpid()) if p not in _children_of(os.getpid())]  # (forked by the
    # helper process)
    assert followers
    errors: list[BaseException] = []

    def generate() -> None:
        try:
            engine.complete("def f(x):", SamplingParams(max_tokens=4, temperature=0))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    try:
        # A few heartbeats: a follower beats once it runs its command loop, which on a loaded machine can come
        # seconds after Engine.load returns; one never seen beating is not watched (another launcher's rank).
        store, deadline = tp_runtime._default_store(), time.monotonic() + 60
        while store.add(tp_runtime._beat_key(1), 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in followers:
            os.kill(pid, signal.SIGSTOP)
        worker = threading.Thread(target=generate, daemon=True)
        worker.start()
        deadline = time.monotonic() + 90  # (3 s of stillness; more under a loaded machine)
        while not engine.errored and time.monotonic() < deadline:
            time.sleep(0.2)
        assert engine.errored and "heartbeat stood still" in engine.runtime.failed
    finally:
        for pid in followers:
            os.kill(pid, signal.SIGKILL)
            os.kill(pid, signal.SIGCONT)
    worker.join(60)
    assert not worker.is_alive() and errors
    engine.close()  # leaves the process group (later tests start their own)


def test_tp_refusals_under_a_launcher_and_beside_other_benchmarks(lane_model, monkeypatch, capsys, tmp_path):
    # From a break test: under torchrun a command without --tp ran once per process (a completion printed twice,
    # a second server failing on its port), and bench --tp with --structured or --agent dropped one of the two.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert main(["run", str(lane_model), "--prompt", "x", "--max-tokens", "1"]) == 2
    assert "the launcher started 2 processes (WORLD_SIZE) but --tp is 1; pass --tp 2" in capsys.readouterr().err
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    for flag in (["--structured"], ["--agent", str(trace)]):
        assert main(["bench", str(lane_model), "--tp", "2", *flag]) == 2
        assert f"{flag[0]} runs on one process" in capsys.readouterr().err


def test_ctrl_c_leaves_the_fork_helper_quiet():
    # Ctrl-C reaches the terminal's whole process group: the tensor-parallel fork helper printed a KeyboardInterrupt
    # traceback; rank 0 stops it (its stdin closes).
    helper = subprocess.Popen([sys.executable, "-m", "solo.distributed.zygote"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert helper.stdout.readline().strip() == "ready"
    helper.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert helper.poll() is None
    _, err = helper.communicate(input="", timeout=60)
    assert helper.returncode == 0 and "Traceback" not in err, err


def test_the_fork_helper_ends_with_the_process_that_started_it():
    # The helper was left running at exit, its two pipes unclosed (ResourceWarnings at the end of every process
    # that used tensor parallelism in-process, the test suite's included).
    child = ("import sys; from solo.distributed import zygote; follower = zygote.fork('builtins:int', []); "
             "follower.wait(); print(zygote._HELPER.pid, flush=True)")
    result = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", child], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and "ResourceWarning" not in result.stderr, result.stderr
    helper_pid = int(result.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(helper_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the fork helper {helper_pid} outlived its process")
