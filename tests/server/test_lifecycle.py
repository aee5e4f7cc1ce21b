"""Loading, disconnects, a full queue and failures (graceful shutdown under load: test_misbehaving_clients.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_harness import BACKEND, MODEL_NAME, start_server

from solo.engine.engine import Engine
from solo.errors import ModelNotFoundError

LONG = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "count"}], "max_tokens": 4000,
        "temperature": 0, "ignore_eos": True}


def metric(http: httpx.Client, name: str, labels: dict | None = None) -> float:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        for sample in family.samples:
            if sample.name == name and (labels is None or all(sample.labels.get(k) == v for k, v in labels.items())):
                return sample.value
    return 0.0


def wait_for(predicate, timeout: float) -> float:
    """Seconds until predicate() holds; fails after `timeout`."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def long_server(long_model):
    running = start_server(long_model, max_batch=1, max_queue=1)
    yield running
    running.stop()


def test_disconnect_mid_stream_frees_the_slot(long_server):
    with long_server.http() as http:
        aborted = metric(http, "solo_generations_finished_total", {"finish_reason": "abort"})
        with httpx.Client(base_url=long_server.base_url, timeout=30) as client, \
                client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as response:
            lines = response.iter_lines()
            for _ in range(5):
                next(lines)
            assert metric(http, "solo_active_slots") == 1
        # The client is gone: its generation stops and the slot is free again within a second.
        wait_for(lambda: metric(http, "solo_active_slots") == 0, timeout=1.0)
        wait_for(lambda: metric(http, "solo_generations_finished_total", {"finish_reason": "abort"}) == aborted + 1,
                 timeout=1.0)
        reply = http.post("/v1/chat/completions", json={**LONG, "max_tokens": 3})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 3


def test_disconnect_while_waiting_for_a_non_streamed_reply(long_server):
    with long_server.http() as http:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{long_server.base_url}/v1/chat/completions", json=LONG, timeout=0.5)
        wait_for(lambda: metric(http, "solo_active_slots") == 0, timeout=1.0)
        assert http.post("/v1/chat/completions", json={**LONG, "max_tokens": 2}).status_code == 200


def test_full_queue_answers_503_with_retry_after(long_server):
    with long_server.http() as http, httpx.Client(base_url=long_server.base_url, timeout=30) as a, \
            httpx.Client(base_url=long_server.base_url, timeout=30) as b:
        # Keep the line iterators referenced: dropping one closes its response (a disconnect).
        with a.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as running:
            running_lines = running.iter_lines()
            next(running_lines)
            # (its role chunk comes before it holds the slot: on a busy machine the second could queue beside it)
            wait_for(lambda: metric(http, "solo_active_slots") == 1, 10.0)
            with b.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as queued:
                queued_lines = queued.iter_lines()
                next(queued_lines)  # the role chunk comes at once, even while waiting for a slot
                assert metric(http, "solo_queue_depth") == 1
                response = http.post("/v1/chat/completions", json=LONG)
                assert response.status_code == 503
                assert int(response.headers["Retry-After"]) >= 1  # an estimate: see test_overload.py
                error = response.json()["error"]
                assert error["code"] == "queue_full" and error["type"] and error["message"]
        wait_for(lambda: metric(http, "solo_active_slots") == 0 and metric(http, "solo_queue_depth") == 0, 2.0)
        assert http.get("/health").status_code == 200


def test_health_is_503_while_loading(tiny_model):
    release = threading.Event()

    def slow_load() -> Engine:
        release.wait(30)
        return Engine.load(tiny_model, dtype="float32", backend=BACKEND)

    running = start_server(None, wait=False, load_engine=slow_load)
    try:
        with running.http() as http:
            health = http.get("/health")
            assert (health.status_code, health.json()) == (503, {"status": "loading"})
            for response in (http.post("/v1/chat/completions", json={**LONG, "max_tokens": 1}), http.get("/v1/models")):
                assert response.status_code == 503 and response.headers["Retry-After"]
                assert response.json()["error"]["code"] == "model_loading"
            release.set()
            wait_for(lambda: http.get("/health").status_code == 200, timeout=30)
            assert http.post("/v1/chat/completions", json={**LONG, "max_tokens": 1}).status_code == 200
    finally:
        release.set()
        running.stop()


def test_stopping_while_the_model_loads_does_not_wait_for_the_load():
    # The load ran on the event loop's executor, whose threads asyncio.run waits for: a Ctrl-C during a
    # multi-GB load waited for the whole load (a trial measured 9.8 s after the signal).
    release = threading.Event()

    def slow_load() -> Engine:
        release.wait(60)
        raise RuntimeError("(never loaded)")

    running = start_server(None, wait=False, load_engine=slow_load)
    try:
        assert running.state.loading
        start = time.monotonic()
        running.stop(timeout=10)
        assert time.monotonic() - start < 5 and running.state.loading  # (the load thread, a daemon, goes on)
    finally:
        release.set()


def test_serve_exits_at_once_on_a_signal_during_the_load(tmp_path):
    # `solo serve` exits without waiting for the load (os._exit: no thread can interrupt it).
    script = tmp_path / "slow_serve.py"
    script.write_text(
        "import time, solo.engine.engine as e, solo.cli\n"
        "e.Engine.load = classmethod(lambda cls, *a, **k: time.sleep(60))\n"
        "raise SystemExit(solo.cli.main(['serve', '--port', '0']))\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if "Application startup complete" in line:
                break
        proc.send_signal(signal.SIGINT)
        start = time.monotonic()
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and time.monotonic() - start < 10
    assert "solo: stopped while the model was loading" in out and "Traceback" not in out


def test_a_model_that_cannot_load_stops_the_server(tmp_path):
    running = start_server(tmp_path / "missing")
    running.thread.join(30)
    assert not running.thread.is_alive()
    assert running.state.status == "failed"
    assert isinstance(running.state.error, ModelNotFoundError)


def test_cli_exits_2_when_the_model_cannot_load(tmp_path, tiny_model, capsys, monkeypatch, caplog):
    from solo.cli import main
    from solo.server import runner

    monkeypatch.setattr(runner, "_log_to_console", lambda level: None)  # keep the test session's logging as it is
    # A missing folder is refused before the server starts listening.
    assert main(["serve", str(tmp_path / "missing"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "cannot load the model" not in err
    # A folder that passes that check but has no weights fails while loading, with the server up.
    folder = tmp_path / "no-weights"
    folder.mkdir()
    shutil.copy(tiny_model / "config.json", folder)
    caplog.clear()
    assert main(["serve", str(folder), "--port", "0"]) == 2
    assert capsys.readouterr().err.count("cannot load the model") == 1
    # Reported once, by the CLI, not also by the server's log.
    assert not [r for r in caplog.records if "cannot load the model" in r.getMessage()]


def test_cli_exits_2_when_the_port_is_taken(tiny_model, capsys):
    from solo.cli import main

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert main(["serve", str(tiny_model), "--port", str(sock.getsockname()[1])]) == 2
    assert "cannot listen" in capsys.readouterr().err


def test_every_address_the_host_resolves_to_is_checked(monkeypatch):
    # Only the first was: a port taken on the second (localhost as ::1 and 127.0.0.1) failed after the model loaded.
    from solo.errors import SoloError
    from solo.server import runner

    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        both = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.2", port))]
        monkeypatch.setattr(runner.socket, "getaddrinfo", lambda *args, **kwargs: both)
        with pytest.raises(SoloError, match=f"cannot listen on multi:{port}"):
            runner.check_address("multi", port)


def test_an_address_family_the_kernel_lacks_is_skipped(monkeypatch):
    # Under ipv6.disable=1 localhost's ::1 cannot even get a socket: a traceback, where the server skips the family.
    from solo.server import runner

    make = socket.socket

    def no_ipv6(family=socket.AF_INET, *args, **kwargs):
        if family == socket.AF_INET6:
            raise OSError(97, "Address family not supported by protocol")
        return make(family, *args, **kwargs)

    both = [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", 0, 0, 0)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
    monkeypatch.setattr(runner.socket, "getaddrinfo", lambda *args, **kwargs: both)
    monkeypatch.setattr(runner.socket, "socket", no_ipv6)
    runner.check_address("localhost", 0)


def test_a_taken_port_is_refused_before_the_model_is_checked(tiny_model, capsys, monkeypatch):
    # A GGUF file was converted (minutes for a large one) before the port was found taken.
    from solo.cli import main

    checked = []
    monkeypatch.setattr("solo.model.hub.check_local_model", lambda *args: checked.append(args))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert main(["serve", str(tiny_model), "--port", str(sock.getsockname()[1])]) == 2
    assert "cannot listen" in capsys.readouterr().err and not checked


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_second_signal_ends_the_requests_at_once_in_one_line_and_a_nonzero_status(sig):
    # A trial saw two CancelledError tracebacks and status 0 while a stream was cut off; a later one, the stream
    # cut off mid-chunk (no abort, no [DONE]) and a queued request answered with uvicorn's bare 500. Now the
    # second signal ends them as the grace period's end does, then the process exits 1.
    proc, port = _serve_bundled_model("--max-batch", "1")
    try:
        base = f"http://127.0.0.1:{port}"
        streamed, lines, queued = threading.Event(), [], []

        def stream() -> None:
            with httpx.stream("POST", f"{base}/v1/completions", json={  # (seconds long: still running at the 2nd)
                    "prompt": "hi", "max_tokens": 2000, "ignore_eos": True, "stream": True}, timeout=60) as response:
                for line in response.iter_lines():
                    lines.append(line)
                    streamed.set()

        def wait_in_the_queue() -> None:  # (the only slot is taken)
            queued.append(httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 4}, timeout=60))

        clients = [threading.Thread(target=stream, daemon=True), threading.Thread(target=wait_in_the_queue,
                                                                                   daemon=True)]
        clients[0].start()
        assert streamed.wait(30)
        clients[1].start()
        time.sleep(0.5)
        proc.send_signal(sig)
        time.sleep(0.3)
        proc.send_signal(sig)
        out = _output(proc)
        for client in clients:
            client.join(10)
    finally:
        proc.kill()
    assert proc.returncode == 1 and "solo: forced shutdown (a second signal)" in out
    assert "Traceback" not in out and "CancelledError" not in out, out
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]" and '"finish_reason":"abort"' in "".join(events).replace(" ", "")
    assert queued[0].status_code == 503 and "retry-after" in queued[0].headers


def _serve_bundled_model(*flags: str) -> tuple[subprocess.Popen, int]:
    # `solo serve` of the bundled model in a process of its own (signals go to it), once it answers /health.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # Its output goes to a file, not a pipe: a pipe nobody reads until the end fills (64 KiB: uvicorn's trace log
    # of the health checks while the model loads, on a busy machine) and blocks the server.
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([sys.executable, "-m", "solo.cli", "serve", "--port", str(port), "--threads", "1",
                             *flags], stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    try:
        wait_for(lambda: _healthy(f"http://127.0.0.1:{port}"), timeout=60)
    except BaseException:
        proc.kill()
        raise
    return proc, port


def _output(proc: subprocess.Popen) -> str:
    # A `_serve_bundled_model` process's output once it exits (within 30 s).
    proc.wait(timeout=30)
    with proc.log:
        proc.log.seek(0)
        return proc.log.read()


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
def test_a_request_still_sending_its_body_at_the_grace_periods_end_gets_the_503():
    # It waited for uvicorn's own deadline (--shutdown-grace + 5 s), then got a bare 500 and one traceback each.
    proc, port = _serve_bundled_model("--shutdown-grace", "1")
    try:
        body = json.dumps({"prompt": "x", "max_tokens": 4}).encode()
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (len(body) + 10) + body)
        time.sleep(0.3)
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        half.settimeout(20)
        reply = half.recv(4096)
        answered_s = time.monotonic() - start  # (the grace period, 1 s; uvicorn's own deadline was 6 s)
        while chunk := half.recv(4096):  # (until the server closes the connection)
            reply += chunk
        reply = reply.decode()
        out = _output(proc)
    finally:
        proc.kill()
    assert reply.startswith("HTTP/1.1 503") and "retry-after" in reply.lower() and "shutting_down" in reply, reply
    assert answered_s < 5, answered_s
    assert proc.returncode == 0 and "Traceback" not in out, out


@pytest.mark.slow
def test_serve_on_ipv6_any_takes_ipv4_clients_and_exits_0_with_closed_standard_streams():
    # `--host ::` listened on IPv6 alone (uvicorn's loop sets IPV6_V6ONLY), so IPv4 clients were refused; with
    # stdout closed `solo serve` died at start-up (uvicorn's formatter asked None.isatty()), and with stdin closed
    # its event loop took fd 0 and libuv aborted the graceful exit (status 134).
    if not socket.has_dualstack_ipv6():
        pytest.skip("this machine has no dual-stack IPv6")
    with socket.socket(socket.AF_INET6) as sock:
        sock.bind(("::", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "solo.cli", "serve", "--host", "[::]", "--port", str(port),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: (os.close(0), os.close(1)))
    try:
        wait_for(lambda: _healthy(f"http://127.0.0.1:{port}") or proc.poll() is not None, timeout=60)
        assert proc.poll() is None
        assert httpx.get(f"http://[::1]:{port}/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert f"Uvicorn running on http://[::]:{port}" in err and "Traceback" not in err and "Assertion" not in err


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "shown", "hidden"), [
    (("--disable-access-log",), ["Application startup complete"], ["GET /health"]),
    (("--log-level", "WARNING"), [], ["Application startup complete", "GET /health", "INFO:"]),
    (("--uvicorn-log-level", "trace"), ["Application startup complete", "GET /health", "TRACE:"], []),
    ((), ["Application startup complete", "GET /health"], []),
])
def test_log_level_and_access_log_flags(flags, shown, hidden):
    proc, port = _serve_bundled_model(*flags)
    try:
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        proc.send_signal(signal.SIGTERM)
        out = _output(proc)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in out
    assert all(line in out for line in shown) and not any(line in out for line in hidden), out
