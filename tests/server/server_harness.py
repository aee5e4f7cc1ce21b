"""A real server for tests: uvicorn in a thread on a free loopback port, plus clients for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from solo.server.runner import SoloServer, build_server
from solo.server.state import ServerSettings

MODEL_NAME = "tiny"
BACKEND = "eager"
# A JSON schema whose required property only leads to itself: it compiles, and a reply runs dead after '{"a":',
# mid-output (for the routes' errors of a grammar that runs dead).
DEAD_SCHEMA = {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "required": ["a"],
               "$defs": {"x": {"$ref": "#/$defs/x"}}}


@dataclass
class RunningServer:
    server: SoloServer
    thread: threading.Thread
    base_url: str

    @property
    def state(self):
        return self.server.state

    def client(self, api_key: str = "unused", **kwargs) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, **kwargs)

    def http(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=60, **kwargs)

    def stop(self, timeout: float = 30) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "server did not shut down"


def start_server(model_dir: Path | None, timeout: float = 120, wait: bool = True, load_engine=None,
                 **settings) -> RunningServer:
    """Start a server on port 0 and (with `wait`) wait until the model is loaded (or failed to load)."""
    settings.setdefault("served_model_name", MODEL_NAME)
    settings.setdefault("dtype", "float32")
    # The server's behaviour does not depend on the runtime; the eager oracle keeps these tests independent
    # of the fast runtimes' own test suites.
    settings.setdefault("backend", BACKEND)
    server = build_server(ServerSettings(model=None if model_dir is None else str(model_dir), **settings),
                          "127.0.0.1", 0, load_engine=load_engine, log_level="warning")
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.started and (not wait or server.state.status in ("ok", "failed")):
            break
        if not thread.is_alive():
            break
        time.sleep(0.02)
    else:
        raise TimeoutError("server did not become ready")
    port = server.port
    return RunningServer(server, thread, f"http://127.0.0.1:{port}")


@contextmanager
def serving(model_dir: Path | None, **settings) -> Iterator[RunningServer]:
    """A started server (`start_server`) whose model loaded, stopped when the block ends (a module fixture's body)."""
    running = start_server(model_dir, **settings)
    try:
        assert running.state.status == "ok", running.state.error
        yield running
    finally:
        running.stop()
