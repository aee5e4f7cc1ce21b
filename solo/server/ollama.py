"""Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`, `/api/version`).

Tools written for Ollama (its Python and JavaScript clients, Open WebUI, Continue, LangChain's ChatOllama)
reach `solo serve` by pointing them at it (`OLLAMA_HOST=http://127.0.0.1:8000`). A chat or generate request
becomes the chat request it means (`options` -> sampling fields, `format` -> `response_format`, `think` ->
the template's `enable_thinking`, Ollama's tool calls and `tool_name` results -> OpenAI's ids), runs through
the chat route (so templates, tool-call parsing, the reasoning split and grammars behave exactly as there),
and comes back in Ollama's shape: streamed by default as newline-delimited JSON objects
(`application/x-ndjson`), the last one `done: true` with token counts and durations in nanoseconds. A raw
generate request (`raw: true`) runs through the completions route, the prompt as it is. Errors are Ollama's
`{"error": "..."}`, with the status the OpenAI routes give.

`num_predict` is a cap, as Ollama's: past the context the reply runs to the context's end (`done_reason`
"length"), and `num_ctx` below the server's context is the window for prompt and output (above it, the
server's context is the window: `/api/show` gives it). Models are listed with Ollama's `:latest` tag and
answer to their name with or without it. An assistant message last is continued (a prefill), as Ollama
continues it.

Differences from Ollama, each said where it applies: sampling defaults are the model's
(generation_config.json), as on Solo's other routes, not Ollama's (temperature 0.8, top_k 40, ...);
without `repeat_last_n` the penalties cover the whole sequence, as vLLM's (Ollama's default window is the
last 64 tokens), and with one presence and frequency penalties count the output's tokens in it; a prompt longer
than the window is refused instead of truncated, and the window is not shifted to continue past it;
options that place the model (`num_gpu`, `num_thread`, ...) or that only steer Ollama's context shifting (`num_keep`,
`shift`, `truncate`) have no effect here, and `keep_alive` none (the model stays loaded while the server
runs; a load request with `keep_alive` 0, which asks to unload it, is refused); they are still type-checked.
Generate's `suffix` fills in the middle with the model's FIM tokens (capability "insert"). Refused by name:
images, `template`, `context`, `suffix` on a model without FIM tokens, `/api/show`'s `verbose` (Solo's
`model_info` has no tokenizer lists), `think` levels (and `think: false` on a template that cannot turn thinking
off), and sampling Solo does not have (`mirostat`, `typical_p`, `tfs_z` other than their off
values). Every field is checked, a load request's (no messages or prompt) too; `null` means a field's
default. Model management (`/api/pull`, `/api/create`, ...) and embeddings answer 501 with the `solo`
command to use, except a pull of the served model, which answers `{"status": "success"}` as Ollama's does for a
model it has; the final generate object carries no `context` (Solo takes none back); `temperature` above 2 is
refused, as on the OpenAI routes; `HEAD /` and `/api/version` answer without the API key (Ollama's CLI probes them).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.responses import StreamingResponse

from solo import __version__
from solo.engine.tool_calls import arguments_as_objects, supports_tools
from solo.errors import ContextLengthError, InvalidRequestError
from solo.server.chat_adapter import (
    chat_chunks,
    chat_request_from,
    continue_prefill,
    field_terms,
    in_api_terms,
    stream_error,
    thinking_switch,
    typed_field,
)
from solo.server.errors import APIError, StrictJSONRoute, api_error_from, json_body, logger, shutting_down
from solo.server.protocol import CompletionRequest
from solo.server.state import listed_name

router = APIRouter(route_class=StrictJSONRoute)

NDJSON = "application/x-ndjson"
"""Media type of Ollama's streams: one JSON object per line."""

# options -> the chat / completions request field that means the same.
_SAMPLING_OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                     "seed": "seed", "presence_penalty": "presence_penalty",
                     "frequency_penalty": "frequency_penalty", "repeat_penalty": "repetition_penalty",
                     "repeat_last_n": "repeat_last_n",
                     "stop": "stop", "num_predict": "max_tokens"}
# Options that decide where and how the model runs (or how Ollama shifts a full context), not what it
# generates; Solo's are set by `solo serve`. Each still has Ollama's type (it refuses a string num_thread).
_NO_EFFECT_OPTIONS: dict[str, tuple[type, str]] = {
    **dict.fromkeys(("numa", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mmap", "use_mlock",
                     "embedding_only", "penalize_newline"), (bool, "true or false")),
    **dict.fromkeys(("num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep"), (int, "an integer"))}
# Sampling Solo does not have, taken at the value that turns it off.
_OFF_VALUES = {"mirostat": 0, "typical_p": 1.0, "tfs_z": 1.0}
# Request fields (besides the ones each route reads) that change nothing Solo generates.
_NO_EFFECT_FIELDS = frozenset({"keep_alive", "truncate", "shift"})
_CHAT_FIELDS = frozenset({"model", "messages", "tools", "format", "options", "stream", "think", "logprobs",
                          "top_logprobs", *_NO_EFFECT_FIELDS})
_GENERATE_FIELDS = frozenset({"model", "prompt", "suffix", "system", "template", "context", "raw", "images",
                              "format", "options", "stream", "think", "logprobs", "top_logprobs",
                              *_NO_EFFECT_FIELDS})
_SHOW_FIELDS = frozenset({"model", "name", "verbose", "system", "template", "options"})
# Chat request fields as an Ollama request names them (for errors the chat route's validation finds).
_FIELD_NAMES = {**{chat: f"options.{option}" for option, chat in _SAMPLING_OPTIONS.items()},
                "response_format": "format", "logprobs": "top_logprobs", "prompt": "prompt"}


def ollama_error(error: APIError) -> JSONResponse:
    """An error in Ollama's shape, {"error": "message"}, with its status and headers (Retry-After)."""
    return JSONResponse({"error": error.message}, status_code=error.status, headers=error.headers)


def _now() -> str:
    # Ollama's created_at: RFC 3339 in UTC.
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def _check_model(request: Request, data: Mapping[str, Any]) -> str:
    """The model name to echo, as the request gave it, after checking it names the served model.

    The served name may come with or without Ollama's `:latest` tag.

    Raises:
        APIError: 400 without a model, 404 for another model, 503 while loading or draining.
    """
    state = request.app.state.solo
    state.require_ready()
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(400, f"model must be a string, the served model's name (GET /api/tags lists it), got "
                            f"{json.dumps(model)[:40]}", param="model")
    if not model:
        raise APIError(400, "model is required: name the served model (GET /api/tags lists it)", param="model")
    if not state.serves(model):
        raise APIError(404, f"model {model!r} not found: this server serves {listed_name(state.served_name)!r} "
                       "(GET /api/tags lists it)", code="model_not_found")
    return model


def _check_fields(data: Mapping[str, Any], known: frozenset[str], route: str) -> None:
    for name in data:
        if name not in known:
            raise InvalidRequestError(f"{name} is not a field of Ollama's {route} that Solo takes; leave it out "
                                      f"(it takes {', '.join(sorted(known))})", param=name)


def sampling_fields(options: Any) -> dict[str, Any]:  # noqa: ANN401
    """The chat / completions request fields an Ollama `options` object means (see the module docstring).

    Args:
        options: the request's `options` (an object, or None).

    Raises:
        InvalidRequestError: not an object, an unknown option, sampling Solo does not have, a
            `num_predict` of 0 or below -2.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidRequestError(f"options must be an object, got {options!r:.40}", param="options")
    fields: dict[str, Any] = {}
    for name, value in options.items():
        if name in _NO_EFFECT_OPTIONS:
            kind, what = _NO_EFFECT_OPTIONS[name]
            if isinstance(value, float) and kind is int and value.is_integer():
                continue  # (4.0: Ollama takes a JSON number for an integer option)
            if value is not None and (not isinstance(value, kind) or isinstance(value, bool) != (kind is bool)):
                raise InvalidRequestError(f"options.{name} must be {what}, got {value!r:.40}", param=f"options.{name}")
            continue
        if name == "num_ctx":
            continue
        if name in _SAMPLING_OPTIONS:
            if value is None:
                continue  # (null: the default)
            fields[_SAMPLING_OPTIONS[name]] = value
        elif name in _OFF_VALUES:
            if value is not None and value != _OFF_VALUES[name]:
                raise InvalidRequestError(f"options.{name} is not supported by Solo (it has no {name} sampling); "
                                          f"leave it out or set it to {_OFF_VALUES[name]}", param=f"options.{name}")
        else:
            raise InvalidRequestError(f"options.{name} is not an option Solo knows; leave it out",
                                      param=f"options.{name}")
    predict = fields.get("max_tokens")
    if isinstance(predict, int) and not isinstance(predict, bool) and predict <= 0:
        if predict not in (-1, -2):
            raise InvalidRequestError(f"options.num_predict must be positive, or -1 / -2 (until the context ends), "
                                      f"got {predict}", param="options.num_predict")
        del fields["max_tokens"]
    return fields


def _response_format(fmt: Any) -> dict[str, Any] | None:  # noqa: ANN401
    # Ollama's `format`: "json", a JSON schema, or "" / null for free text.
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, Mapping):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": dict(fmt), "strict": True}}
    raise InvalidRequestError(f'format must be "json" or a JSON schema object, got {fmt!r:.40}', param="format")


def _thinking(think: Any, state: Any) -> dict[str, Any] | None:  # noqa: ANN401
    # Ollama's `think` as chat_template_kwargs; None leaves the template's default.
    if think is None:
        return None
    if isinstance(think, str):
        raise InvalidRequestError(f"think {think!r}: Solo has no reasoning-effort levels; send true or false",
                                  param="think")
    if not isinstance(think, bool):
        raise InvalidRequestError(f"think must be true or false, got {think!r:.40}", param="think")
    if think and not state.reasoning:
        raise InvalidRequestError(
            f"{state.served_name!r} does not support thinking here (its chat template writes no reasoning block, "
            "or the server runs with --reasoning-parser none); leave think out", param="think")
    switch = thinking_switch(state, not think, "think")
    return {"enable_thinking": think} if switch else None  # (without a switch it is as asked already)


def chat_messages(messages: Any) -> list[dict[str, Any]]:  # noqa: ANN401
    """OpenAI chat messages from Ollama's.

    Assistant `tool_calls` ({"function": {"name", "arguments": {...}}}) get ids and JSON-string arguments;
    a `tool` message's `tool_name` is matched to the earliest unanswered call of that name (or, without a
    name, the earliest unanswered call) for its `tool_call_id`; `thinking` becomes `reasoning_content`.

    Raises:
        InvalidRequestError: not a list of objects, images, a malformed tool call (arguments not an object),
            tool fields on messages of other roles.
    """
    if not isinstance(messages, list):
        raise InvalidRequestError(f"messages must be a list of messages, got {messages!r:.40}", param="messages")
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of calls without a tool message yet
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"messages[{i}] must be an object with role and content", param="messages")
        if message.get("images"):
            raise InvalidRequestError(f"messages[{i}].images: Solo's models take text only; leave images out",
                                      param="messages")
        role = message.get("role")
        for key, roles in (("tool_calls", ("assistant",)), ("thinking", ("assistant",)), ("tool_name", ("tool",))):
            if message.get(key) is not None and role not in roles:
                raise InvalidRequestError(f"messages[{i}].{key} belongs on {roles[0]} messages, not {role!r} ones",
                                          param="messages")
        converted = {k: v for k, v in message.items()
                     if k not in ("images", "thinking", "tool_calls", "tool_name") and v is not None}
        converted.setdefault("content", "")
        if role == "assistant":
            if message.get("thinking"):
                converted["reasoning_content"] = message["thinking"]
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise InvalidRequestError(f"messages[{i}].tool_calls must be a list", param="messages")
            converted_calls = []
            for j, call in enumerate(calls):
                function = call.get("function") if isinstance(call, Mapping) else None
                name = function.get("name") if isinstance(function, Mapping) else None
                if not isinstance(name, str):
                    raise InvalidRequestError(f'messages[{i}].tool_calls[{j}] must be {{"function": {{"name": ..., '
                                              '"arguments": {...}}}}', param="messages")
                arguments = function.get("arguments", {})
                if isinstance(arguments, str):  # (OpenAI's way; Ollama's is an object)
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError:
                        arguments = None
                if not isinstance(arguments, dict):
                    raise InvalidRequestError(f"messages[{i}].tool_calls[{j}].function.arguments must be an object, "
                                              f"got {function.get('arguments')!r:.40}", param="messages")
                # (9 letters and digits, the form Mistral's template requires; the same each turn, so the
                # prefix cache keeps the history)
                call_id = call.get("id") if call.get("id") is not None else f"call{i:03d}{j:02d}"[-9:]
                if not isinstance(call_id, str):
                    raise InvalidRequestError(f"messages[{i}].tool_calls[{j}].id must be a string", param="messages")
                converted_calls.append({"id": call_id, "type": "function", "function": {
                    "name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
                unanswered.append((call_id, name))
            if converted_calls:
                converted["tool_calls"] = converted_calls
        elif role == "tool":
            name = message.get("tool_name") or message.get("name")
            match = next((k for k, (_, n) in enumerate(unanswered) if name is None or n == name), None)
            if match is not None:
                call_id, call_name = unanswered.pop(match)
                converted.setdefault("tool_call_id", call_id)
                name = name or call_name
            if isinstance(name, str):
                converted["name"] = name
        out.append(converted)
    return out


def _logprobs(content: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    # The chat route's logprobs.content entries are already Ollama's {token, logprob, bytes, top_logprobs}.
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e.get("bytes"),
             "top_logprobs": e.get("top_logprobs") or []} for e in content or []]


class _Reply:
    """One Ollama reply being assembled from the chat or completions stream's chunks, with its timings."""

    def __init__(self, model: str, start_ns: int, requests: Sequence[Any] = ()) -> None:
        # requests: the engine's requests of the reply, whose stats time its first token where it was generated
        self.model, self.start_ns, self.requests = model, start_ns, requests
        self.content: list[str] = []
        self.thinking: list[str] = []
        self.logprobs: list[dict[str, Any]] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}

    def feed(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """Take one chunk; returns the piece it adds ({"content", "thinking", "logprobs"}) or None."""
        self.usage = chunk.get("usage") or self.usage
        piece: dict[str, Any] = {}
        for choice in chunk.get("choices", []):
            delta = choice.get("delta")
            if delta is None:  # the completions route (raw), with the chat shape's token entries (TOKEN_LOGPROBS)
                text = choice.get("text") or ""
                logprobs = _logprobs(choice.get("token_logprobs"))
                thinking = ""
            else:
                text, thinking = delta.get("content") or "", delta.get("reasoning_content") or ""
                logprobs = _logprobs((choice.get("logprobs") or {}).get("content"))
                for call in delta.get("tool_calls") or []:
                    entry = self.calls.setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
                    function = call.get("function") or {}
                    entry["id"] = call.get("id") or entry["id"]
                    entry["name"] += function.get("name") or ""
                    entry["arguments"] += function.get("arguments") or ""
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            self.content.append(text)
            self.thinking.append(thinking)
            self.logprobs += logprobs
            if text or thinking or logprobs:
                piece = {"content": text, "thinking": thinking, "logprobs": logprobs}
        return piece or None

    def tool_calls(self) -> list[dict[str, Any]]:
        """Ollama's tool_calls: arguments as objects."""
        return [{"id": c["id"], "function": {"index": i, "name": c["name"], "arguments": json.loads(c["arguments"])}}
                for i, c in sorted(self.calls.items())]

    def final(self) -> dict[str, Any]:
        """The last object's statistics: done_reason, token counts, durations in nanoseconds."""
        end = time.perf_counter_ns()
        # The first token as the engine timed it (none generated: no eval time): text held back (a stop string that
        # might still match, a tool call until it closes) reached this stream later, and the time of its first chunk
        # here read its generation time as prompt evaluation.
        generated = [r.start_time + r.stats.ttft_s for r in self.requests if r.stats.ttft_s is not None]
        first = min(max(int(min(generated) * 1e9), self.start_ns), end) if generated else end
        reason = {"tool_calls": "stop", None: "stop"}.get(self.finish_reason, self.finish_reason)
        return {"done": True, "done_reason": reason, "total_duration": end - self.start_ns, "load_duration": 0,
                "prompt_eval_count": self.usage.get("prompt_tokens", 0), "prompt_eval_duration": first - self.start_ns,
                "eval_count": self.usage.get("completion_tokens", 0), "eval_duration": end - first}


def _chat_object(model: str, piece: Mapping[str, Any], calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": piece.get("content", "")}
    if piece.get("thinking"):
        message["thinking"] = piece["thinking"]
    if calls:
        message["tool_calls"] = calls
    out = {"model": model, "created_at": _now(), "message": message}
    if piece.get("logprobs"):
        out["logprobs"] = piece["logprobs"]
    return out


def _generate_object(model: str, piece: Mapping[str, Any]) -> dict[str, Any]:
    out = {"model": model, "created_at": _now(), "response": piece.get("content", "")}
    if piece.get("thinking"):
        out["thinking"] = piece["thinking"]
    if piece.get("logprobs"):
        out["logprobs"] = piece["logprobs"]
    return out


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


async def _lines(chunks: AsyncIterator[dict[str, Any]], reply: _Reply, shape: Callable[..., dict[str, Any]]
                 ) -> AsyncIterator[str]:
    # The stream's chunks as Ollama's objects, one per line; the last one done with the statistics.
    async for chunk in chunks:
        if "error" in chunk:
            yield _line({"error": _renamed(stream_error(chunk["error"])).message})
            return
        piece = reply.feed(chunk)
        if piece is not None:
            yield _line({**shape(reply.model, piece), "done": False})
    calls = reply.tool_calls()
    last = _chat_object(reply.model, {}, calls) if shape is _chat_object else shape(reply.model, {})
    yield _line({**last, **reply.final()})


async def _whole(chunks: AsyncIterator[dict[str, Any]], reply: _Reply, request: Request) -> None:
    # Every chunk into `reply` (a reply that is not streamed); stops if the client leaves.
    from solo.server.routes import while_connected

    async def gather() -> None:
        async for chunk in chunks:
            if "error" in chunk:
                raise _renamed(stream_error(chunk["error"]))
            reply.feed(chunk)

    await while_connected(gather(), request)


class _NDJSONStream(StreamingResponse):
    # Ollama's stream; the generation is cancelled however the response ends (as GenerationStream's).

    def __init__(self, lines: AsyncIterator[str], generation: Any) -> None:  # noqa: ANN401
        super().__init__(lines, media_type=NDJSON, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # noqa: ANN401
        from solo.server.routes import send_or_abandon

        try:
            await super().__call__(scope, receive, send_or_abandon(send, self.generation))
        finally:
            self.generation.cancel()


async def _run(request: Request, data: Mapping[str, Any], model: str, start_ns: int, fields: dict[str, Any],
               raw: bool, shape: Callable[..., dict[str, Any]], num_ctx: int | None) -> Response:
    # The chat (or, raw, completions) route on `fields`, its output bounded by the window (`_fit_window`:
    # num_ctx, a raw prompt's context), streamed internally, answered in Ollama's shape.
    from solo.server.routes import TOKEN_LOGPROBS, GenerationStream, chat_completions, completions

    await _fit_window(request, fields, num_ctx, raw)
    stream = typed_field(data, "stream", bool, "true or false", default=True)
    fields = {**fields, "stream": True, "stream_options": {"include_usage": True}}

    async def call(fields: dict[str, Any]) -> Any:  # noqa: ANN401
        if not raw:
            return await chat_completions(chat_request_from(fields, _FIELD_NAMES), request)
        setattr(request.state, TOKEN_LOGPROBS, True)
        return await completions(chat_request_from(fields, _FIELD_NAMES, CompletionRequest), request)

    with _in_ollama_terms():
        try:
            reply_stream = await call(fields)
        except ContextLengthError as exc:
            if exc.param != "max_tokens" or raw or num_ctx is not None:  # (a budget fitted to the window stands)
                raise
            # num_predict is a cap (Ollama generates until the context ends): the prompt fits, so fill the rest.
            reply_stream = await call({**fields, "max_tokens": None})
    assert isinstance(reply_stream, GenerationStream)
    reply = _Reply(model, start_ns, reply_stream.generation.requests)
    chunks = chat_chunks(reply_stream.body_iterator)
    if stream:
        return _NDJSONStream(_lines(chunks, reply, shape), reply_stream.generation)
    try:
        await _whole(chunks, reply, request)
    finally:
        reply_stream.generation.cancel()
    if reply.finish_reason == "abort" and not reply.usage.get("completion_tokens"):
        raise shutting_down()  # ended by shutdown before any token: retry elsewhere, as the chat route says
    text = {"content": "".join(reply.content), "thinking": "".join(reply.thinking), "logprobs": reply.logprobs}
    obj = _chat_object(model, text, reply.tool_calls()) if shape is _chat_object else shape(model, text)
    return JSONResponse({**obj, **reply.final()})


def _num_ctx(options: Any, state: Any) -> int | None:  # noqa: ANN401
    # options.num_ctx, when it asks for a smaller window than the server's context.
    num_ctx = options.get("num_ctx") if isinstance(options, Mapping) else None
    if num_ctx is None:
        return None
    if not isinstance(num_ctx, int) or isinstance(num_ctx, bool) or num_ctx < 1:
        raise InvalidRequestError(f"options.num_ctx must be a positive integer, got {num_ctx!r:.40}",
                                  param="options.num_ctx")
    return num_ctx if num_ctx < state.max_model_len else None


async def _fit_window(request: Request, fields: dict[str, Any], num_ctx: int | None, raw: bool) -> None:
    """Bound the output by the window (num_ctx, or raw, the rest of the context; the completions route's is 16).

    num_ctx (Ollama's context size) counts when smaller than the server's context.

    A raw prompt is tokenized here (off the event loop) and handed on as token ids.

    Raises:
        InvalidRequestError: the prompt leaves no room in num_ctx (Solo does not truncate prompts).
    """
    from starlette.concurrency import run_in_threadpool

    if num_ctx is None and not raw:
        return
    state = request.app.state.solo
    tokenizer = state.engine.tokenizer

    def count() -> int:
        if raw and fields.get("suffix"):  # (fill-in-the-middle: its layout's ids, which end at the FIM end tokens)
            fields["prompt"] = state.engine.infill_ids(fields["prompt"], fields.pop("suffix"))
            return len(fields["prompt"])
        if raw:
            fields["prompt"] = tokenizer.encode(fields["prompt"], add_special_tokens=True)  # as the route would
            return len(fields["prompt"])
        messages = arguments_as_objects([m.for_template() for m in chat_request_from(fields, _FIELD_NAMES).messages])
        text = tokenizer.render_chat(messages, fields.get("add_generation_prompt", True),
                                     tools=fields.get("tools") or None,
                                     continue_final_message=fields.get("continue_final_message", False),
                                     **(fields.get("chat_template_kwargs") or {}))
        return len(tokenizer.encode(text, add_special_tokens=False))

    with _in_ollama_terms():
        prompt_tokens = await run_in_threadpool(count)
    if num_ctx is not None and prompt_tokens >= num_ctx:
        raise InvalidRequestError(f"the prompt is {prompt_tokens} tokens, which leaves no room in options.num_ctx "
                                  f"{num_ctx}; Solo does not truncate prompts: raise num_ctx (this server's context "
                                  f"is {state.max_model_len}) or shorten the prompt", param="options.num_ctx")
    window = state.max_model_len if num_ctx is None else min(num_ctx, state.max_model_len)
    if prompt_tokens >= window:  # (the num_predict fitted below would be named in the route's error)
        raise ContextLengthError(f"the prompt is {prompt_tokens} tokens, which leaves no room to write in this "
                                 f"server's context of {window} tokens; Solo does not truncate prompts: shorten the "
                                 "prompt", param="prompt")  # (no counts: OpenAI's wording of them names messages)
    room = window - prompt_tokens
    asked = fields.get("max_tokens")
    # num_predict is a cap: at most the rest of the window (raw, the completions route's default is 16)
    fields["max_tokens"] = room if asked is None else min(asked, room)


def _common_fields(data: Mapping[str, Any], raw: bool) -> dict[str, Any]:
    # The fields chat and generate share, checked: options, format, logprobs, stream, keep_alive.
    fields = sampling_fields(data.get("options"))
    fields["response_format"] = _response_format(data.get("format"))
    typed_field(data, "stream", bool, "true or false")
    _keep_alive_s(data.get("keep_alive"))
    logprobs = typed_field(data, "logprobs", bool, "true or false")
    top = typed_field(data, "top_logprobs", int, "an integer")
    if top and logprobs is False:
        raise InvalidRequestError("top_logprobs needs logprobs; send logprobs: true or leave top_logprobs out",
                                  param="top_logprobs")
    if logprobs or top:
        fields["logprobs"] = (top or 0) if raw else True  # (raw: the completions route's top count)
        if not raw:
            fields["top_logprobs"] = top or 0
    return fields


_DURATION = re.compile(r"(-?)((?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _keep_alive_s(value: Any) -> float | None:  # noqa: ANN401
    # Ollama's keep_alive in seconds: a number of seconds, or a duration ("5m", "1h30m", "-1"); None if absent.
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
        if _DURATION.fullmatch(value):
            seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION_PART.findall(value))
            return -seconds if value.startswith("-") else seconds
    raise InvalidRequestError(f'keep_alive must be seconds or a duration such as "5m", got {value!r:.40}',
                              param="keep_alive")


def _load_reply(data: Mapping[str, Any], model: str, chat: bool) -> JSONResponse:
    # Ollama loads a model when asked with no messages / prompt; Solo's is loaded already. keep_alive 0 asks
    # to unload it, which Solo does not do while the server runs.
    if _keep_alive_s(data.get("keep_alive")) == 0:
        raise InvalidRequestError("Solo keeps its model loaded while `solo serve` runs; stop the server to free it",
                                  param="keep_alive")
    obj = {"model": model, "created_at": _now(), "done": True, "done_reason": "load"}
    obj.update({"message": {"role": "assistant", "content": ""}} if chat else {"response": ""})
    return JSONResponse(obj)


@contextlib.contextmanager
def _in_ollama_terms() -> Iterator[None]:
    # Errors of the chat / completions route (and of its request model) with the fields Ollama names otherwise
    # renamed: the error's field, and fields no message uses as plain words. Ollama's own checks name
    # Ollama's fields already (its boolean logprobs is the completions route's top count's name).
    try:
        yield
    except Exception as exc:
        error = api_error_from(exc)
        if error.code == "internal_error":
            raise  # (a bug: logged with its traceback by `_answer`)
        raise _renamed(error) from exc


def _renamed(error: APIError) -> APIError:
    # `error` (the chat route's, before or during the output) with its fields as Ollama names them.
    named = {f: _FIELD_NAMES[f] for f in (error.param, "max_tokens", "repetition_penalty", "response_format")
             if f in _FIELD_NAMES}
    error.message = in_api_terms(error.message, field_terms(named))
    error.param = named.get(error.param or "", error.param)
    return error


async def _answer(request: Request, handle: Callable[[dict[str, Any]], Any]) -> Response:
    # Parse the body, run the route's handler, and answer any error in Ollama's shape.
    try:
        return await handle(await json_body(request))
    except Exception as exc:  # noqa: BLE001 (every error, a bug included, answered in Ollama's shape)
        error = api_error_from(exc)
        if error.code == "internal_error":  # a bug (a full queue or a shutdown is no error of Solo's)
            logger.error("request failed", exc_info=exc)
        return ollama_error(error)


@router.post("/api/chat", response_model=None)
async def chat(request: Request) -> Response:
    """Ollama's chat (see the module docstring); streamed as JSON lines unless `stream` is false."""
    start_ns = time.perf_counter_ns()

    async def handle(data: dict[str, Any]) -> Response:
        model = _check_model(request, data)
        _check_fields(data, _CHAT_FIELDS, "/api/chat")
        state = request.app.state.solo
        messages = chat_messages(typed_field(data, "messages", list, "a list of messages", default=[]))
        fields = {**_common_fields(data, raw=False), "messages": messages,
                  "tools": typed_field(data, "tools", list, "a list of tools") or None,
                  "chat_template_kwargs": _thinking(data.get("think"), state)}
        continue_prefill(messages, fields)  # (Ollama continues it)
        num_ctx = _num_ctx(data.get("options"), state)
        if not messages:
            return _load_reply(data, model, chat=True)
        return await _run(request, data, model, start_ns, fields, raw=False, shape=_chat_object, num_ctx=num_ctx)

    return await _answer(request, handle)


@router.post("/api/generate", response_model=None)
async def generate(request: Request) -> Response:
    """Ollama's generate: `prompt` (and `system`) through the chat template, or as it is with `raw`.

    On a model without a chat template the prompt goes as it is (raw), as Ollama's default template does.
    """
    start_ns = time.perf_counter_ns()

    async def handle(data: dict[str, Any]) -> Response:
        model = _check_model(request, data)
        _check_fields(data, _GENERATE_FIELDS, "/api/generate")
        state = request.app.state.solo
        for name, why in (("images", "Solo's models take text only"),
                          ("template", "Solo renders the model's own (Jinja) chat template; send raw: true with "
                                       "a prompt you formatted yourself"),
                          ("context", "Solo keeps no generate context; send the conversation to /api/chat as "
                                      "messages")):
            if data.get(name):
                raise InvalidRequestError(f"{name}: {why}; leave {name} out", param=name)
        prompt = typed_field(data, "prompt", str, "a string", default="")
        system = typed_field(data, "system", str, "a string")
        raw = typed_field(data, "raw", bool, "true or false", default=False)
        suffix = typed_field(data, "suffix", str, "a string", default="")

        def without_template(why: str) -> None:
            # The prompt goes as it is: system and think are refused, an empty system and think false (which
            # editors and front ends send on every request) are none.
            for name in ("system", "think"):
                if data.get(name) not in (None, False, ""):
                    raise InvalidRequestError(f"{name} {why}; leave {name} out", param=name)
            data.pop("think", None)
            data.pop("system", None)

        tokenizer = state.engine.tokenizer
        if suffix:  # fill-in-the-middle: the model's FIM tokens, not its chat template (empty prompt: a file's start)
            state.engine.infill_prompt(prompt, suffix)  # (refused here, named as Ollama's field, on a model without)
            without_template("has no place in a fill-in-the-middle prompt (suffix)")
            raw = True
        elif not raw and tokenizer.chat_template is None and tokenizer.chat_template_error is None:
            # A base model without a chat template: Ollama's template for one is the prompt itself ({{ .Prompt }}).
            # (A template that does not compile is no absent one: the chat route refuses it with its error.)
            without_template("needs a chat template and this model has none (its prompt is sent as it is, as "
                             "Ollama does for such a model)")
            raw = True
        fields = _common_fields(data, raw)
        thinking = None if raw else _thinking(data.get("think"), state)
        num_ctx = _num_ctx(data.get("options"), state)
        if not prompt and not suffix:
            if system:
                raise InvalidRequestError("system without a prompt: give the prompt the system message goes with",
                                          param="prompt")
            return _load_reply(data, model, chat=False)
        if raw:
            for name in ("system", "think"):  # (think false, which front ends send on every request: as asked)
                if data.get(name) not in (None, "") and not (name == "think" and data[name] is False):
                    raise InvalidRequestError(f"{name} needs the chat template, which raw: true skips; leave {name} "
                                              "out or send raw: false", param=name)
            fields["prompt"] = prompt
            if suffix:
                fields["suffix"] = suffix
        else:
            messages = [{"role": "system", "content": system}] if system else []
            fields.update(messages=[*messages, {"role": "user", "content": prompt}], chat_template_kwargs=thinking)
        return await _run(request, data, model, start_ns, fields, raw=raw, shape=_generate_object, num_ctx=num_ctx)

    return await _answer(request, handle)


def _details(state: Any) -> dict[str, Any]:  # noqa: ANN401
    # Ollama's model details: format, family, parameter size, quantization level.
    engine = state.engine
    config = engine.config
    params = config.num_parameters()
    size = f"{params / 1e9:.1f}B" if params >= 1e9 else f"{params / 1e6:.2f}M" if params >= 1e6 else f"{params}"
    level = (state.settings.quantize or str(engine.model.dtype).removeprefix("torch.")).upper()
    level = {"BFLOAT16": "BF16", "FLOAT16": "F16", "FLOAT32": "F32"}.get(level, level)
    fmt = "gguf" if (state.settings.model or "").lower().endswith(".gguf") else "safetensors"
    # Ollama's family names: LlamaForCausalLM -> llama, Qwen3MoeForCausalLM -> qwen3moe.
    family = re.sub(r"For(CausalLM|ConditionalGeneration)$", "", config.architecture).lower()
    return {"parent_model": "", "format": fmt, "family": family, "families": [family], "parameter_size": size,
            "quantization_level": level}


def _model_entry(state: Any) -> dict[str, Any]:  # noqa: ANN401
    engine = state.engine
    bits = {"int8": 8, "int4": 4}.get(state.settings.quantize or "", 8 * engine.kv_cache_element_bytes)
    size = engine.config.num_parameters() * bits // 8  # (the weights' bytes as served)
    created = datetime.datetime.fromtimestamp(state.created, datetime.UTC).isoformat().replace("+00:00", "Z")
    name = listed_name(state.served_name)
    return {"name": name, "model": name, "modified_at": created, "size": size,
            "digest": "", "details": _details(state)}


@router.api_route("/api/tags", methods=["GET", "HEAD"])  # (HEAD: as Ollama answers it)
async def tags(request: Request) -> Response:
    """Ollama's list of local models: the served one."""
    try:
        state = request.app.state.solo
        state.require_ready()
        return JSONResponse({"models": [_model_entry(state)]})
    except APIError as exc:
        return ollama_error(exc)


@router.get("/api/ps")
async def running(request: Request) -> Response:
    """Ollama's list of loaded models: the served one, loaded until the server stops."""
    try:
        state = request.app.state.solo
        state.require_ready()
        entry = _model_entry(state)
        on_gpu = state.engine.device.type != "cpu"
        return JSONResponse({"models": [{**entry, "expires_at": "9999-12-31T23:59:59Z",
                                         "size_vram": entry["size"] if on_gpu else 0,
                                         "context_length": state.max_model_len}]})
    except APIError as exc:
        return ollama_error(exc)


@router.post("/api/show", response_model=None)
async def show(request: Request) -> Response:
    """Ollama's model information: details, the chat template, the shape in `model_info`, capabilities."""

    async def handle(data: dict[str, Any]) -> Response:
        if "name" in data and "model" not in data:  # older clients send `name`
            data = {**data, "model": data["name"]}
        _check_model(request, data)
        _check_fields(data, _SHOW_FIELDS, "/api/show")
        for name in ("system", "template", "options"):  # (Ollama shows a modelfile changed by them)
            if data.get(name):
                raise InvalidRequestError(f"{name}: Solo shows the served model as it is (it has no modelfile to "
                                          f"change); leave {name} out", param=name)
        if typed_field(data, "verbose", bool, "true or false"):
            raise InvalidRequestError("verbose: Solo's model_info has no tokenizer lists (tokens, merges); leave "
                                      "verbose out, or read them from the model folder's tokenizer.json",
                                      param="verbose")
        state = request.app.state.solo
        engine = state.engine
        config = engine.config
        template = engine.tokenizer.chat_template
        source = template.source if template is not None else None
        family = _details(state)["family"]
        info = {"general.architecture": family, "general.parameter_count": config.num_parameters(),
                f"{family}.context_length": state.max_model_len, f"{family}.embedding_length": config.hidden_size,
                f"{family}.block_count": config.num_layers, f"{family}.feed_forward_length": config.intermediate_size,
                f"{family}.attention.head_count": config.num_heads,
                f"{family}.attention.head_count_kv": config.num_kv_heads, f"{family}.vocab_size": config.vocab_size}
        capabilities = ["completion"]
        if template is not None and template.tool_format is not None and supports_tools(source):
            capabilities.append("tools")
        if state.reasoning:
            capabilities.append("thinking")
        if engine.fim is not None:
            capabilities.append("insert")  # (Ollama's name for fill-in-the-middle: generate's suffix)
        return JSONResponse({"modelfile": "", "parameters": "", "template": source or "", "license": "",
                             "details": _details(state), "model_info": info, "capabilities": capabilities,
                             "modified_at": _model_entry(state)["modified_at"]})

    return await _answer(request, handle)


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> dict[str, str]:
    """Solo's version, where Ollama gives its own."""
    return {"version": __version__}


_NOT_SERVED = {
    "/api/pull": "download models with `solo pull MODEL`, then serve one with `solo serve MODEL`",
    "/api/push": "Solo does not publish models; push them with huggingface_hub",
    "/api/create": "Solo serves Hugging Face checkpoints and GGUF files as they are; there are no Modelfiles",
    "/api/copy": "Solo serves one model; start the server with --served-model-name to give it another name",
    "/api/delete": "delete downloaded models with `solo rm MODEL`",
    "/api/embed": "Solo serves no embeddings",
    "/api/embeddings": "Solo serves no embeddings",
}


def _not_served(path: str) -> Callable[[Request], Any]:
    async def handler(request: Request) -> Response:
        if path == "/api/pull":  # scripts pull a model before using it: the served one is there already
            try:
                data = await request.json()
            except ValueError:
                data = None
            state = request.app.state.solo
            name = data.get("model") or data.get("name") if isinstance(data, dict) else None
            if isinstance(name, str) and state.engine is not None and state.serves(name):
                done = {"status": "success"}
                if not isinstance(data.get("stream", True), bool):
                    return ollama_error(APIError(400, f"stream must be true or false, got {data['stream']!r:.40}",
                                                 param="stream"))
                if data.get("stream", True) is False:
                    return JSONResponse(done)
                return Response(json.dumps(done) + "\n", media_type=NDJSON)
        return JSONResponse({"error": f"{path} is not served by Solo: {_NOT_SERVED[path]}"}, status_code=501)
    return handler


for _path in _NOT_SERVED:
    router.add_api_route(_path, _not_served(_path), methods=["POST", "DELETE"], include_in_schema=False)
