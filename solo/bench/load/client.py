"""One request of a load run, sent with httpx and timed by the client.

Latencies count from the request's scheduled arrival, not from when it was sent, so a client that falls
behind its schedule cannot hide queueing (the "coordinated omission" of closed-loop load tests):
TTFT to the first chunk with text (streamed requests only), TPOT as (e2e - TTFT) / (tokens - 1), e2e to
the last byte. Every failure is classified into one `error` kind for the report.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass
class Outcome:
    """What happened to one request.

    Attributes:
        cls: its class name.
        offered_at: scheduled arrival, `time.perf_counter()` seconds.
        status: HTTP status, or None when no response came.
        error: None on success, else a kind: "503 queue_full", "timeout", "connect", "reset",
            "incomplete stream", "wrong output", ...
        error_message: the server's message for that error (its first 300 characters), where it sent one.
        cancelled: the client went away mid-stream on purpose (not an error).
        ttft_s, tpot_s, e2e_s: latencies (None where not measured).
        completion_tokens: from `usage` (or chunks counted when cancelled).
        text: the generated text (checked against a lone run for greedy requests).
        finish_reason: of the (first) choice.
        retry_after_s: Retry-After of a 503.
        key: the reference key of a greedy request, else None.
        refusals: 503s this request got and retried after their Retry-After.
        send_lag_s: how late the (last) attempt was handed to the HTTP client after its scheduled time
            (the load generator's own delay: on a small machine it shares the CPUs with the server).
        prompt: index of its prompt in the class's pool (None for requests outside a phase's plan).
        cached_tokens: prompt tokens the server reused from its prefix cache (`usage.prompt_tokens_details`;
            None where no usage came, e.g. a cancelled stream).
        prompt_tokens: the prompt's length in tokens (`usage`; None where no usage came).
    """

    cls: str
    offered_at: float
    status: int | None = None
    error: str | None = None
    error_message: str | None = None
    cancelled: bool = False
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    completion_tokens: int = 0
    text: str = ""
    finish_reason: str | None = None
    retry_after_s: float | None = None
    key: tuple | None = None
    refusals: int = 0
    send_lag_s: float | None = None
    prompt: int | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None

    @property
    def prefix_hit(self) -> bool | None:
        """The server reused the whole prompt but its last token (the prefix cache's full hit; None: unknown)."""
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens >= self.prompt_tokens - 1

    @property
    def completed(self) -> bool:
        """Answered in full (not cancelled, no error)."""
        return self.error is None and not self.cancelled and self.status == 200


def request_body(endpoint: str, model: str, prompt: str, max_tokens: int, stream: bool, greedy: bool,
                 seed: int) -> dict[str, Any]:
    """The JSON body of a chat or completions request."""
    sampling = {"temperature": 0.0} if greedy else {"temperature": 0.8, "seed": seed}
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream, **sampling}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


ERROR_MESSAGE_CHARS = 300
"""The most of a server's error message an outcome keeps."""


def _note_error(response: httpx.Response, outcome: Outcome) -> None:
    # The error's kind ("400", "503 queue_full") and the server's message for it.
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        error = None
    code = error.get("code") if isinstance(error, dict) else None
    outcome.error = f"{response.status_code} {code}" if code else str(response.status_code)
    message = error.get("message") if isinstance(error, dict) else (error if isinstance(error, str) else None)
    if message is None and not isinstance(error, dict):
        message = response.text.strip() or None
    outcome.error_message = str(message)[:ERROR_MESSAGE_CHARS] if message else None


async def send(client: httpx.AsyncClient, endpoint: str, body: dict[str, Any], outcome: Outcome,
               cancel_after: int | None, timeout_s: float) -> Outcome:
    """Send one request and fill `outcome` (never raises for a network or HTTP failure).

    Args:
        client: a client whose base_url is the server.
        endpoint: "chat" or "completions".
        body: see `request_body`.
        outcome: filled in place (and returned).
        cancel_after: close the stream after this many text chunks (a client going away), or None.
        timeout_s: the whole request's deadline.
    """
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    if not outcome.refusals:
        outcome.send_lag_s = time.perf_counter() - outcome.offered_at
    try:
        async with asyncio.timeout(timeout_s):
            if body.get("stream"):
                await _stream(client, path, endpoint, body, outcome, cancel_after)
            else:
                response = await client.post(path, json=body)
                outcome.status = response.status_code
                now = time.perf_counter()
                if response.status_code != 200:
                    _note_error(response, outcome)
                    outcome.retry_after_s = _retry_after(response)
                else:
                    data = response.json()
                    choice = data["choices"][0]
                    outcome.text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
                    outcome.finish_reason = choice["finish_reason"]
                    outcome.completion_tokens = data["usage"]["completion_tokens"]
                    outcome.cached_tokens = _cached_tokens(data["usage"])
                    outcome.prompt_tokens = data["usage"].get("prompt_tokens")
                    outcome.e2e_s = now - outcome.offered_at
    except TimeoutError:
        outcome.error = "timeout"
    except httpx.ConnectError:
        outcome.error = "connect"
    except (httpx.RemoteProtocolError, httpx.ReadError):
        outcome.error = "reset"
    except httpx.HTTPError as exc:
        outcome.error = type(exc).__name__
    except (ValueError, KeyError, IndexError, TypeError):
        outcome.error = "malformed response"
    return outcome


def _cached_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    return int(cached) if isinstance(cached, int) else None


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return float(response.headers["Retry-After"])
    except (KeyError, ValueError):
        return None


async def _stream(client: httpx.AsyncClient, path: str, endpoint: str, body: dict[str, Any], outcome: Outcome,
                  cancel_after: int | None) -> None:
    async with client.stream("POST", path, json=body) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            _note_error(response, outcome)
            outcome.retry_after_s = _retry_after(response)
            return
        chunks, parts, done, first, last = 0, [], False, None, None
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[6:])
            if "error" in event:
                outcome.error = f"stream error {event['error'].get('code')}"
                outcome.error_message = str(event["error"].get("message") or "")[:ERROR_MESSAGE_CHARS] or None
                return
            if event.get("usage"):
                outcome.completion_tokens = event["usage"]["completion_tokens"]
                outcome.cached_tokens = _cached_tokens(event["usage"])
                outcome.prompt_tokens = event["usage"].get("prompt_tokens")
            for choice in event.get("choices", []):
                text = (choice.get("delta") or {}).get("content") if endpoint == "chat" else choice.get("text")
                if text:
                    last = time.perf_counter()
                    first = first or last
                    parts.append(text)
                    chunks += 1
                outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
            if cancel_after is not None and chunks >= cancel_after:
                outcome.cancelled = True  # leaving the block closes the connection: the server sees a disconnect
                outcome.completion_tokens = chunks
                break
        outcome.text = "".join(parts)
        now = time.perf_counter()
        if first is not None:
            outcome.ttft_s = first - outcome.offered_at
        if outcome.cancelled:
            return
        if not done:
            outcome.error = "incomplete stream"
            return
        outcome.e2e_s = now - outcome.offered_at
        if first is not None and last is not None and outcome.completion_tokens > 1:
            outcome.tpot_s = (last - first) / (outcome.completion_tokens - 1)
