"""OpenAI's Responses API (`POST /v1/responses`) on top of the chat route, stateless.

Agents built on the Responses API (OpenAI's Agents SDK, Codex) send `input` items and get `output` items; the
route turns a request into the chat request it means (instructions -> a system message, messages, function
calls and their outputs -> the chat history with `tool_calls` and `tool` messages, flat function tools ->
chat tools, `text.format` -> `response_format`, `max_output_tokens` -> `max_tokens`), runs it through the chat
route (so templates, tool-call parsing, reasoning and output grammars behave exactly as there), and turns the
result back: a `reasoning` item for a thinking model's block, a `message` item with `output_text`, one
`function_call` item per call. Streamed, the chat deltas become the Responses events (`response.created`,
`response.output_item.added`, `response.output_text.delta`, `response.function_call_arguments.delta`, ...,
`response.completed` or `response.incomplete`), each with its `sequence_number`.

`POST /v1/responses/input_tokens` counts the prompt a request would run, as OpenAI's. `top_logprobs` and `include`
["message.output_text.logprobs"] give each output_text part (and text delta) its tokens' logprobs.

`truncation: "auto"` leaves the oldest turns out of a conversation longer than the context (`_fit_context`).

Solo stores no responses, as vLLM without a store: `previous_response_id` (and GET /v1/responses/{id}) is
refused, and a client sends the whole conversation each turn (the Agents SDK does with `store=False`). A reasoning
item's `encrypted_content` (OpenAI's, which only OpenAI reads) is not read: an item with no text adds no turn.
`include: ["reasoning.encrypted_content"]` (a stateless client's ask for the reasoning to send back) is taken:
Solo's reasoning items carry that reasoning in the clear, in `content`, and read it back.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, model_validator

from solo.engine.tool_calls import check_arguments
from solo.errors import InvalidRequestError
from solo.server.chat_adapter import (
    CHAT_TOOL_TERMS,
    CUT_SHORT,
    chat_chunks,
    chat_request_from,
    content_after_calls,
    field_terms,
    in_api_terms,
    string_field,
    text_around_calls,
    thinking_switch,
)
from solo.server.errors import StrictJSONRoute
from solo.server.protocol import ChatCompletionRequest, JsonBool, JsonFloat, JsonInt, one_of

router = APIRouter(route_class=StrictJSONRoute)

# Chat fields a Responses request names otherwise (for errors that the chat request's validation finds).
_FIELD_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input"}


class ResponsesRequest(BaseModel):
    """POST /v1/responses (OpenAI's fields Solo honours; the rest are refused by name or have no effect).

    `input` is a string (one user message) or a list of items: messages ({"role", "content": a string or
    input_text / output_text parts}), {"type": "function_call", "call_id", "name", "arguments"},
    {"type": "function_call_output", "call_id", "output"}, and the `reasoning` items a reply carried
    (passed back to the template as the next assistant message's reasoning_content).
    """

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:  # noqa: ANN401
        # As on the other routes: null for an optional field is its default (clients send it).
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or k == "input"}

    model: str | None = None
    input: Annotated[str | list[dict[str, Any]], one_of("a string or a list of input items")]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Annotated[str | dict[str, Any],
                           one_of('"none", "auto", "required" or an object naming a tool')] | None = None
    parallel_tool_calls: JsonBool | None = None
    max_output_tokens: JsonInt | None = None
    temperature: JsonFloat | None = None
    top_p: JsonFloat | None = None
    stream: JsonBool = False
    text: dict[str, Any] | None = None
    store: JsonBool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    previous_response_id: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: JsonInt | None = None


# Fields of OpenAI's API a Responses request may carry that change nothing Solo generates.
# (max_tool_calls bounds OpenAI's built-in tools' calls; Solo runs none, and function calls are the client's.)
_NO_EFFECT = frozenset({"service_tier", "prompt_cache_key", "safety_identifier", "stream_options", "max_tool_calls"})
# Sampling fields the chat route takes as they are (vLLM accepts them on /v1/responses too).
_PASSED = ("temperature", "top_p", "user", "seed", "top_k", "min_p", "frequency_penalty", "presence_penalty",
           "repetition_penalty", "stop", "logit_bias", "priority")


def chat_request(body: ResponsesRequest, thinking_switch: bool = True) -> ChatCompletionRequest:
    """The chat request a Responses request means (see the module docstring).

    `reasoning: {"effort": "none"}` turns a Qwen3-style template's thinking off (`enable_thinking`, where
    `thinking_switch` says the template has it; without one a model that does not think is as asked).

    Raises:
        InvalidRequestError: `previous_response_id` (nothing is stored), a `reasoning` setting other than
            {"effort": "none"}, `include` entries, an input item or content part Solo does not take (images,
            files), a malformed item, or any field the chat route refuses (named by its Responses name:
            max_output_tokens, text, input).
    """
    if body.previous_response_id is not None:
        raise InvalidRequestError("previous_response_id needs stored responses, which Solo does not keep; send the "
                                  "whole conversation in input (store: false)", param="previous_response_id")
    reasoning = {k: v for k, v in (body.reasoning or {}).items() if v is not None}  # (null: the default)
    thinking_off = reasoning.get("effort") == "none" \
        and set(reasoning) <= {"effort", "summary"}  # (a summary of no reasoning changes nothing)
    if reasoning and not thinking_off:
        raise InvalidRequestError("reasoning settings are not supported by Solo (it has no reasoning-budget control) "
                                  'but {"effort": "none"}, thinking off; leave reasoning out', param="reasoning")
    for entry in body.include or []:
        if entry not in (_LOGPROBS, _REASONING):
            raise InvalidRequestError(f"include {entry!r} is not supported (Solo includes {_LOGPROBS!r} and "
                                      f"{_REASONING!r}); leave it out", param="include")
    if (body.model_extra or {}).get("background"):
        raise InvalidRequestError("background responses need stored responses, which Solo does not keep; leave "
                                  "background out (or stream the response)", param="background")
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    reasoning: str | None = None

    def flush_reasoning() -> None:
        # A reasoning item that no reply of its own follows (a reply cut short inside the block): a thinking-only
        # assistant message, as the other APIs send it.
        nonlocal reasoning
        if reasoning is not None:
            messages.append({"role": "assistant", "content": "", "reasoning_content": reasoning})
            reasoning = None

    pending: dict[str, int] = {}  # function_call items' call_ids without an output yet -> their index
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind != "reasoning" and not (kind == "function_call" or (kind == "message"
                                                                    and item.get("role") == "assistant")):
            flush_reasoning()
        if kind == "message":
            if item.get("role") == "tool":
                raise InvalidRequestError(f'input[{i}] is a message of role "tool"; a function\'s result is a '
                                          '{"type": "function_call_output", "call_id", "output"} item after its '
                                          "function_call item", param="input")
            if pending and item.get("role") != "assistant":  # (an assistant's note between outputs is the reply's)
                call_id, index = next(iter(pending.items()))
                raise InvalidRequestError(f"input[{i}] is a {item.get('role')} message after the function_call "
                                          f"{call_id!r} (input[{index}]) and before its function_call_output; send "
                                          "each call's output right after the calls", param="input")
            message = {"role": item.get("role"), "content": _text(item.get("content"), i)}
            if message["role"] == "assistant" and reasoning is not None:
                message["reasoning_content"] = reasoning
            reasoning = None  # a reasoning item belongs to the reply right after it
            messages.append(message)
        elif kind == "function_call":
            where = f"input[{i}]"
            arguments = string_field(item, "arguments", where, "input")
            check_arguments(arguments, f"{where}.arguments", "input")  # (named as the client sent it)
            call = {"id": string_field(item, "call_id", where, "input"), "type": "function",
                    "function": {"name": string_field(item, "name", where, "input"), "arguments": arguments}}
            if not call["id"] or not call["function"]["name"] or call["id"] in pending:
                raise InvalidRequestError(f"{where}: a function_call needs a non-empty name and a call_id no other "
                                          f"unanswered call has; got call_id {call['id']!r}, name "
                                          f"{call['function']['name']!r}", param="input")
            pending[call["id"]] = i
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and (reasoning is None
                                                                     or "reasoning_content" not in last):
                last.setdefault("tool_calls", []).append(call)  # the same reply: its text, then its calls
                if reasoning is not None:
                    last["reasoning_content"], reasoning = reasoning, None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
                if reasoning is not None:
                    messages[-1]["reasoning_content"], reasoning = reasoning, None
        elif kind == "function_call_output":
            output = item.get("output")
            call_id = string_field(item, "call_id", f"input[{i}]", "input")
            if pending.pop(call_id, None) is None:  # as OpenAI's API: an output answers a call sent before it
                raise InvalidRequestError(f"input[{i}].call_id {call_id!r} answers no function_call item before it "
                                          f"(unanswered call_ids: {', '.join(map(repr, pending)) or 'none'}); send "
                                          "the function_call item, then its output", param="input")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": output if isinstance(output, str) else _text(output, i, "output")})
        elif kind == "reasoning":  # its text, else its summary's
            parts = item.get("content") or item.get("summary") or []
            texts = [part.get("text") if isinstance(part, dict) else None for part in parts] \
                if isinstance(parts, list) else None
            if texts is None or not all(isinstance(t, str) for t in texts):
                raise InvalidRequestError(f"input[{i}] is a reasoning item whose content is not a list of text parts",
                                          param="input")
            flush_reasoning()  # (two in a row: each its own reply)
            reasoning = "".join(texts) or None  # (no text, as an item of only encrypted_content: no turn)
        else:
            raise InvalidRequestError(f"input[{i}] is a {kind!r} item, which Solo does not take (it takes messages, "
                                      "function_call, function_call_output and reasoning items)", param="input")
    flush_reasoning()
    if pending:
        call_id, index = next(iter(pending.items()))
        raise InvalidRequestError(f"input[{index}] is a function_call ({call_id!r}) with no function_call_output "
                                  "item after it; send each call's output", param="input")
    fields: dict[str, Any] = {"model": body.model, "messages": messages, "stream": body.stream,
                              "max_tokens": body.max_output_tokens}
    if body.stream:
        fields["stream_options"] = {"include_usage": True}
    for name in _PASSED:
        value = getattr(body, name, None) if name in ResponsesRequest.model_fields else (body.model_extra or {}).get(
            name)
        if value is not None:
            fields[name] = value
    if body.tools:
        fields["tools"] = [_chat_tool(t, i) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        fields["tool_choice"] = _chat_tool_choice(body.tool_choice)
    if body.parallel_tool_calls is not None:
        fields["parallel_tool_calls"] = body.parallel_tool_calls
    if body.text is not None:
        fields["response_format"] = _response_format(body.text)
    if wants_logprobs(body):  # (the chat route's logprobs: each output_text part carries its tokens')
        fields["logprobs"], fields["top_logprobs"] = True, body.top_logprobs or 0
    if thinking_off and thinking_switch:
        fields["chat_template_kwargs"] = {"enable_thinking": False}
    for name in body.model_extra or {}:
        if name not in _PASSED and name not in _NO_EFFECT and name != "background":
            raise InvalidRequestError(f"{name} is not a field Solo's Responses API takes", param=name)
    _check_no_effect_fields(body.model_extra or {}, body.stream)
    return chat_request_from(fields, _FIELD_NAMES)


def _check_no_effect_fields(extra: dict[str, Any], stream: bool) -> None:
    # Fields that change nothing still take only OpenAI's values (a wrong one is the client's mistake).
    calls = extra.get("max_tool_calls")
    if calls is not None and (not isinstance(calls, int) or isinstance(calls, bool) or calls < 0):
        raise InvalidRequestError(f"max_tool_calls must be an integer >= 0, got {json.dumps(calls)[:40]}",
                                  param="max_tool_calls")
    options = extra.get("stream_options")
    if options is None:
        return
    if not isinstance(options, dict):
        raise InvalidRequestError("stream_options must be an object, as {\"include_obfuscation\": false}",
                                  param="stream_options")
    for name, value in options.items():
        if name != "include_obfuscation":
            raise InvalidRequestError(f"stream_options.{name} is not an option of the Responses API (it takes "
                                      "include_obfuscation; usage comes in response.completed)", param="stream_options")
        if not isinstance(value, bool):
            raise InvalidRequestError("stream_options.include_obfuscation must be true or false",
                                      param="stream_options")
    if not stream:
        raise InvalidRequestError("stream_options is only allowed when stream is true; set stream to true or leave "
                                  "stream_options out", param="stream_options")


_LOGPROBS = "message.output_text.logprobs"
"""The `include` entry Solo takes: the output text's token logprobs, as `top_logprobs` asks for them too."""
_REASONING = "reasoning.encrypted_content"
"""Taken as asked: a stateless client (`store: false`: Codex, the Agents SDK) asks for the reasoning it must send
back next turn; Solo's reasoning items carry it in the clear, in `content`, which it reads back."""


def wants_logprobs(body: ResponsesRequest) -> bool:
    """The request asks for the output text's logprobs (`include` or `top_logprobs`, as the Agents SDK sends)."""
    return body.top_logprobs is not None or _LOGPROBS in (body.include or [])


def _text(content: Any, index: int, key: str = "content") -> str:  # noqa: ANN401
    # A message's content: a string, or input_text / output_text parts (joined one per line, as chat parts are).
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text")
                    and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise InvalidRequestError(f"input[{index}] holds a {kind!r} part; Solo's models take text only "
                                          "(input_text / output_text)", param="input")
            texts.append(part["text"])
        return "\n".join(texts)
    raise InvalidRequestError(f"input[{index}].{key} must be a string or a list of text parts", param="input")


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    # Responses' flat {"type": "function", "name", "description", "parameters", "strict"} -> chat's nesting.
    if tool.get("type") != "function":
        raise InvalidRequestError(f"tools[{index}] is a {tool.get('type')!r} tool; Solo runs function tools only "
                                  "(built-in tools such as web_search run on OpenAI's servers)", param="tools")
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")
                                             if tool.get(k) is not None}}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    # Responses' {"type": "function", "name"} -> chat's nesting; other shapes are refused in Responses' terms.
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise InvalidRequestError('tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}',
                              param="tool_choice")


def _response_format(text: dict[str, Any]) -> dict[str, Any]:
    # Responses' text.format {"type": "json_schema", "name", "schema", "strict"} -> chat's nesting.
    if not isinstance(text, dict):
        raise InvalidRequestError("text must be an object ({\"format\": {...}})", param="text")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise InvalidRequestError(f"text.{unknown[0]} is not a setting Solo knows; leave it out", param="text")
    if text.get("verbosity") not in (None, "medium"):  # (GPT-5's; a model here has no such control)
        raise InvalidRequestError(f"text.verbosity {text['verbosity']!r} is not supported by Solo (only \"medium\", "
                                  "the default, which changes nothing); leave it out", param="text")
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise InvalidRequestError("text.format must be an object", param="text")
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("name"), str) or "schema" not in fmt:
            raise InvalidRequestError('text.format json_schema needs "name" and "schema" beside its type: {"type": '
                                      '"json_schema", "name": ..., "schema": {...}}', param="text")
        return {"type": "json_schema", "json_schema": {k: v for k, v in fmt.items() if k != "type"}}
    return fmt


# ------------------------------------------------------------------------------------------- output

def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_object(body: ResponsesRequest, response_id: str, created: int, model: str, output: list[dict[str, Any]],
                    finish_reason: str | None, usage: dict[str, Any] | None, status: str | None = None
                    ) -> dict[str, Any]:
    """The Responses API's `response` object for a finished (or, with `status`, running) chat choice.

    A reply the server cut short (finish_reason "abort": it is shutting down) has failed, with its error.
    """
    incomplete = finish_reason == "length"
    cut = finish_reason == "abort" and status is None
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "id": response_id, "object": "response", "created_at": created, "model": model,
        "status": status or ("incomplete" if incomplete else "failed" if cut else "completed"),
        "error": {"code": "server_error", "message": CUT_SHORT} if cut else None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete and status is None else None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "metadata": body.metadata or {}, "output": output,
        "parallel_tool_calls": body.parallel_tool_calls is not False, "previous_response_id": None,
        "temperature": body.temperature, "top_p": body.top_p, "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [], "text": body.text or {"format": {"type": "text"}},
        "truncation": body.truncation or "disabled",
        "store": False, "user": body.user,
        "usage": None if not usage else {
            "input_tokens": usage.get("prompt_tokens", 0), "output_tokens": usage.get("completion_tokens", 0),
            "total_tokens": usage.get("total_tokens", 0),
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
            "output_tokens_details": {
                "reasoning_tokens": (usage.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)}},
    }


def output_items(message: dict[str, Any], finish_reason: str | None = "stop",
                 after_calls: str = "") -> list[dict[str, Any]]:
    """A chat reply's `message` as Responses output items: reasoning, a message, the function calls, a message.

    The last message holds `after_calls`, the end of the content that followed the calls (as streamed). A message
    item is left out when its text is blank beside other items (Qwen3 writes two newlines between its thinking
    and a call); a reply cut by max_output_tokens marks its last item "incomplete", as OpenAI does, where that is
    a message (a function call item is whole: a call that was cut is left out, or is text).
    """
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(_reasoning_item(_new_id("rs"), message["reasoning_content"]))
    calls = message.get("tool_calls") or []
    text, after = text_around_calls(message, after_calls)
    if text.strip() or not (items or calls):
        items.append(_message_item(_new_id("msg"), text, "completed"))
    for call in calls:
        items.append(_call_item(_new_id("fc"), call["id"], call["function"]["name"], call["function"]["arguments"],
                                "completed"))
    if after.strip():
        items.append(_message_item(_new_id("msg"), after, "completed"))
    if finish_reason in ("length", "abort") and items[-1]["type"] == "message":  # (a call item is whole: a cut
        items[-1]["status"] = "incomplete"  # call is left out or is text, so a client runs the calls it gets)
    return items


def _reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


@router.post("/v1/responses", response_model=None)
async def responses(body: ResponsesRequest, request: Request) -> Response:
    """OpenAI's Responses API, stateless (see the module docstring); streamed as its events when `stream` is true."""
    from solo.server.routes import GenerationStream, chat_completions

    off = (body.reasoning or {}).get("effort") == "none"  # (other settings are refused by chat_request)
    switch = thinking_switch(request.app.state.solo, off, "reasoning")
    chat = chat_request(body, thinking_switch=switch)
    try:
        if body.truncation == "auto":
            chat = await _fit_context(body, chat, switch, request)
        reply = await chat_completions(chat, request)
    except InvalidRequestError as exc:
        raise _in_responses_terms(exc) from None
    response_id, created = _new_id("resp"), int(time.time())
    if isinstance(reply, GenerationStream):
        model = request.app.state.solo.served_name
        return GenerationStream(_events(body, reply.body_iterator, response_id, created, model), reply.generation)
    completion = json.loads(reply.body)
    choice = completion["choices"][0]
    output = output_items(choice["message"], choice["finish_reason"], content_after_calls(reply))
    if wants_logprobs(body):  # the reply's tokens on its first text part, [] on any other
        tokens = (choice.get("logprobs") or {}).get("content") or []
        for part in (p for item in output if item["type"] == "message" for p in item["content"]):
            part["logprobs"], tokens = tokens, []
    result = response_object(body, response_id, created, completion["model"], output, choice["finish_reason"],
                             completion.get("usage"))
    return Response(json.dumps(result, ensure_ascii=False), media_type="application/json")


async def _fit_context(body: ResponsesRequest, chat: ChatCompletionRequest, switch: bool, request: Request
                       ) -> ChatCompletionRequest:
    """`truncation: "auto"`: the chat request with the oldest input items left out until it fits the context.

    As OpenAI's API drops items from the beginning of the conversation, turn by turn: the leading system and
    developer messages (and `instructions`) stay; what is kept starts at a later user message, or, in an agent's
    loop of calls on one task, at a later assistant turn (a reply, or the calls after a function's output) with
    the user message before it, the task, kept ahead of it. So no call is kept without its output nor an output
    without its call. The prompt, with room for `max_output_tokens` (without it, a quarter of the context), must
    fit the server's context; the fewest items are dropped (a binary search over the turns, each candidate
    rendered by the chat template). A request that fits is unchanged; one that cannot fit from its last turn is
    left whole for the chat route to refuse.
    """
    from starlette.concurrency import run_in_threadpool

    from solo.server.routes import chat_prompt_ids

    if isinstance(body.input, str):
        return chat
    state = request.app.state.solo
    engine, _ = state.require_ready(body.model)
    items = body.input
    room = state.max_model_len - (body.max_output_tokens or state.max_model_len // 4)

    def role(item: Any) -> str:  # noqa: ANN401
        if not isinstance(item, dict):
            return ""
        kind = item.get("type", "message")
        return item.get("role", "") if kind == "message" else kind

    lead = 0
    while lead < len(items) and role(items[lead]) in ("system", "developer"):
        lead += 1
    # Cut points (where the kept items start, and the task kept ahead of them), fewest dropped first; only where
    # every call before has had its output (a kept output needs its call).
    cuts: list[tuple[int, int | None]] = []
    task, waiting = None, set()  # the last user message so far; calls not yet answered
    for i in range(lead, len(items)):
        kind, before = role(items[i]), role(items[i - 1]) if i else ""
        if not waiting and i > lead:
            if kind == "user":
                cuts.append((i, None))
            elif task is not None and i > task + 1 and kind in ("assistant", "function_call", "reasoning") \
                    and before in ("user", "function_call_output"):
                cuts.append((i, task))
        if kind == "user":
            task = i
        elif kind == "function_call":
            waiting.add(str(items[i].get("call_id")))
        elif kind == "function_call_output":
            waiting.discard(str(items[i].get("call_id")))

    def fitted(cut: tuple[int, int | None]) -> ChatCompletionRequest | None:
        start, kept_task = cut
        kept = [*items[:lead], *([] if kept_task is None else [items[kept_task]]), *items[start:]]
        candidate = chat_request(body.model_copy(update={"input": kept}), thinking_switch=switch)
        return candidate if len(chat_prompt_ids(state, engine, candidate)) <= room else None

    def search() -> ChatCompletionRequest:
        if not cuts or len(chat_prompt_ids(state, engine, chat)) <= room:
            return chat
        best, low, high = None, 0, len(cuts) - 1
        while low <= high:  # (the prompt shrinks as the cut moves later)
            middle = (low + high) // 2
            candidate = fitted(cuts[middle])
            if candidate is not None:
                best, high = candidate, middle - 1
            else:
                low = middle + 1
        return best or chat

    return await run_in_threadpool(search)


def _in_responses_terms(exc: InvalidRequestError) -> InvalidRequestError:
    # The chat route's error with its field named as this API names it.
    param = _FIELD_NAMES.get(exc.param or "", exc.param)
    message = str(exc).replace(exc.param, param) if exc.param and param and exc.param != "messages" else str(exc)
    return exc.renamed(in_api_terms(message, [*field_terms({"max_tokens": "max_output_tokens"}), *CHAT_TOOL_TERMS]),
                       param)


@router.post("/v1/responses/input_tokens", response_model=None)
async def input_tokens(body: ResponsesRequest, request: Request) -> Response:
    """OpenAI's token counting for the Responses API: {"object": "response.input_tokens", "input_tokens": N}.

    N is the prompt a `POST /v1/responses` with the same fields would run (instructions, input, tools, as the
    chat template renders them). Nothing is generated, so no slot is taken.
    """
    from starlette.concurrency import run_in_threadpool

    from solo.server.routes import content_bytes, counted_chat_prompt_ids

    state = request.app.state.solo
    engine, _ = state.require_ready(body.model)
    off = (body.reasoning or {}).get("effort") == "none"
    switch = thinking_switch(state, off, "reasoning")
    chat = chat_request(body, thinking_switch=switch)
    try:
        if body.truncation == "auto":  # (the prompt that request would run; fitting it tokenizes the whole first)
            state.check_count_size(content_bytes(chat), "input")
            chat = await _fit_context(body, chat, switch, request)
        ids = await run_in_threadpool(counted_chat_prompt_ids, state, engine, chat)
    except InvalidRequestError as exc:
        raise _in_responses_terms(exc) from None
    return Response(json.dumps({"object": "response.input_tokens", "input_tokens": len(ids)}),
                    media_type="application/json")


async def _events(body: ResponsesRequest, chunks: AsyncIterator[Any], response_id: str, created: int, model: str
                  ) -> AsyncIterator[str]:
    # The chat stream's chunks (server-sent events) as the Responses API's events.
    sequence = 0
    output: list[dict[str, Any]] = []
    open_items: dict[str, dict[str, Any]] = {}  # "reasoning" / "message" -> the item being streamed
    calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> its function_call item
    finish_reason, usage = None, None

    def event(kind: str, **fields: Any) -> str:  # noqa: ANN401
        nonlocal sequence
        sequence += 1
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': sequence - 1, **fields})}\n\n"

    def close(kind: str) -> list[str]:
        item = open_items.pop(kind, None)
        if item is None:
            return []
        index = output.index(item)
        if kind == "reasoning":
            text = item["content"][0]["text"]
            return [event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                          text=text), event("response.output_item.done", output_index=index, item=item)]
        if item["status"] == "in_progress":  # (else "incomplete": cut by max_output_tokens)
            item["status"] = "completed"
        part = item["content"][0]
        return [event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                      text=part["text"], logprobs=part.get("logprobs", [])),
                event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                      part=part),
                event("response.output_item.done", output_index=index, item=item)]

    def running() -> dict[str, Any]:
        return response_object(body, response_id, created, model, [], None, None, status="in_progress")

    def close_call() -> list[str]:
        item = open_items.pop("call", None)
        if item is None:
            return []
        if item["status"] == "in_progress":
            item["status"] = "completed"
        index = output.index(item)
        return [event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                      arguments=item["arguments"]), event("response.output_item.done", output_index=index, item=item)]

    def _open_message(text: str, tokens: list[dict[str, Any]]) -> list[str]:
        item = open_items["message"] = _message_item(_new_id("msg"), None, "in_progress")
        output.append(item)
        index = output.index(item)
        out = [event("response.output_item.added", output_index=index, item=dict(item, content=[]))]
        item["content"].append({"type": "output_text", "text": text, "annotations": []})
        if logprobs:
            item["content"][0]["logprobs"] = list(tokens)
        out.append(event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                         part=dict(item["content"][0], text="", **({"logprobs": []} if logprobs else {}))))
        if text or tokens:  # (tokens with no text, an EOS at once: an empty delta carries their logprobs)
            out.append(event("response.output_text.delta", item_id=item["id"], output_index=index, content_index=0,
                             delta=text, logprobs=tokens))
        return out

    logprobs = wants_logprobs(body)
    # Tokens whose logprobs no text delta has carried yet: those of held-back text (an incomplete UTF-8
    # character), of thinking, of blank text, of the EOS; the next text delta carries them, as the unstreamed
    # reply puts every token on its message's text.
    pending_blank, held = "", []

    yield event("response.created", response=running())
    yield event("response.in_progress", response=running())
    async for chunk in chat_chunks(chunks):
        if "error" in chunk:
            error = chunk["error"]
            if error.get("type") == "invalid_request_error":  # (a request's own fault mid-output: a dead grammar)
                renamed = _in_responses_terms(InvalidRequestError(error.get("message", ""), error.get("param")))
                error = {**error, "message": str(renamed), "param": renamed.param, "code": error.get("code") or
                         "invalid_prompt"}
            yield event("error", code=error.get("code"), message=error.get("message"), param=error.get("param"))
            failed = response_object(body, response_id, created, model, output, None, usage, status="failed")
            yield event("response.failed", response={**failed, "error": {"code": error.get("code") or "server_error",
                                                                         "message": error.get("message", "")}})
            return
        model = chunk.get("model", model)
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                item = open_items.get("reasoning")
                if item is None:
                    item = open_items["reasoning"] = _reasoning_item(_new_id("rs"), "")
                    output.append(item)
                    yield event("response.output_item.added", output_index=output.index(item),
                                item={**item, "content": []})
                item["content"][0]["text"] += delta["reasoning_content"]
                yield event("response.reasoning_text.delta", item_id=item["id"], output_index=output.index(item),
                            content_index=0, delta=delta["reasoning_content"])
            content = delta.get("content") or ""
            if logprobs:
                held += (choice.get("logprobs") or {}).get("content") or []
            if content and "message" not in open_items and not content.strip():
                pending_blank += content  # blank text between thinking and a call: no message item for it
                content = ""
            elif content and "message" not in open_items:
                content, pending_blank = pending_blank + content, ""
            if content:
                tokens, held = held, []
                for text in close("reasoning") + close_call():  # (text after a call: the call's item ends first)
                    yield text
                item = open_items.get("message")
                if item is None:
                    for text in _open_message(content, tokens):
                        yield text
                else:
                    item["content"][0]["text"] += content
                    if logprobs:
                        item["content"][0]["logprobs"] += tokens
                    yield event("response.output_text.delta", item_id=item["id"], output_index=output.index(item),
                                content_index=0, delta=content, logprobs=tokens)
            for call in delta.get("tool_calls") or []:
                pending_blank = ""
                for text in close("reasoning") + close("message"):
                    yield text
                function = call.get("function") or {}
                item = calls.get(call["index"])
                if item is None:
                    for text in close_call():
                        yield text
                    item = calls[call["index"]] = _call_item(_new_id("fc"), call.get("id", ""),
                                                             function.get("name", ""), "", "in_progress")
                    output.append(item)
                    open_items["call"] = item
                    yield event("response.output_item.added", output_index=output.index(item), item=dict(item))
                if function.get("arguments"):
                    item["arguments"] += function["arguments"]
                    yield event("response.function_call_arguments.delta", item_id=item["id"],
                                output_index=output.index(item), delta=function["arguments"])
            finish_reason = choice.get("finish_reason") or finish_reason
    if pending_blank and not output:  # only blank text: it is the reply
        for text in _open_message(pending_blank, held):
            yield text
        held = []
    if not output:  # nothing generated (max_output_tokens reached at once): an empty message, as unstreamed
        for text in _open_message("", held):
            yield text
        held = []
    message = open_items.get("message")
    if held and message is not None:  # (the EOS's, text held back to the end): one last delta carries them
        message["content"][0]["logprobs"] += held
        yield event("response.output_text.delta", item_id=message["id"], output_index=output.index(message),
                    content_index=0, delta="", logprobs=held)
    elif held and (first := next((i for i in output if i["type"] == "message"), None)) is not None:
        first["content"][0]["logprobs"] += held  # (its part is done: the final response carries them)
    if finish_reason in ("length", "abort") and output[-1]["type"] == "message":  # (calls are whole, as above)
        output[-1]["status"] = "incomplete"  # as OpenAI marks the item a max_output_tokens cut ends
    for text in close("reasoning") + close("message") + close_call():
        yield text
    final = response_object(body, response_id, created, model, output, finish_reason, usage)
    yield event({"incomplete": "response.incomplete", "failed": "response.failed"}.get(final["status"],
                                                                                       "response.completed"),
                response=final)
