"""Anthropic's Messages API (`POST /v1/messages`) on top of the chat route.

Agents and tools written for Anthropic's API (the `anthropic` SDK, Claude Code pointed at a local server with
ANTHROPIC_BASE_URL) send `system`, `messages` of content blocks and `tools` with `input_schema`; the route
turns a request into the chat request it means (text blocks -> message text, `tool_use` blocks -> the
assistant's `tool_calls`, `tool_result` blocks -> `tool` messages, `thinking` blocks -> `reasoning_content`,
`tool_choice` auto / any / tool / none -> auto / required / a named function / none, `stop_sequences` ->
`stop`), runs it through the chat route, and turns the reply back into content blocks (`thinking`, `text`,
`tool_use` with its parsed `input`) with Anthropic's `stop_reason`, or, streamed, into its events
(`message_start`, `content_block_start` / `_delta` / `_stop`, `message_delta`, `message_stop`). Errors come in
Anthropic's shape ({"type": "error", "error": {"type", "message"}}), and the API key may come as `x-api-key`.

A `tool_result` with `is_error` reaches the model as "Error: " and its text (chat templates have no such flag);
an assistant message last (a prefill) is continued, the reply holding what follows it (vLLM's
`continue_final_message`); `thinking: {"type": "disabled"}` turns a Qwen3-style model's thinking off (its
template's enable_thinking; refused for a thinking model whose template has no such switch); `thinking`
requests with a token budget are refused. Structured outputs (`output_config.format`, or the beta's
`output_format`: {"type": "json_schema", "schema"}, as the SDK's `messages.parse` sends it) become the chat
route's `response_format`: the reply's text is JSON the schema admits. A context overflow is worded first as
Anthropic's ("prompt is too long: N tokens > M maximum"), which agent tools match on. Keys inside blocks, tools
and messages that Solo does not read (`cache_control`, `citations`, a thinking block's `signature`, which Claude
Code and the SDK send back) are taken without effect; the fields they carry that Solo does read are type-checked.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, StrictBool, ValidationError

from solo.errors import ContextLengthError, InvalidRequestError, SoloError
from solo.server.chat_adapter import (
    CHAT_TOOL_TERMS,
    CUT_SHORT,
    chat_chunks,
    chat_request_from,
    content_after_calls,
    continue_prefill,
    field_terms,
    in_api_terms,
    stream_error,
    string_field,
    text_around_calls,
    thinking_switch,
)
from solo.server.errors import RETRY_AFTER_S, APIError, StrictJSONRoute, api_error_from, json_body, validation_error
from solo.server.protocol import ChatCompletionRequest, JsonFloat, JsonInt, JsonStr, one_of

router = APIRouter(route_class=StrictJSONRoute)

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error",
                503: "overloaded_error"}
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
# Chat fields the Messages API names otherwise (for errors the chat request's validation finds).
_FIELD_NAMES = {"max_tokens": "max_tokens", "stop": "stop_sequences", "tools": "tools", "messages": "messages",
                "response_format": "output_config.format"}
# Fields of Anthropic's structured outputs (`_output_format`).
_OUTPUT_FIELDS = frozenset({"output_config", "output_format"})
# The chat route's terms in errors -> the Messages API's (`in_api_terms`).
_TERMS = ((r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"), *CHAT_TOOL_TERMS,
          (r'tool_choice "required"', 'tool_choice {"type": "any"}'),
          (r"tool_choice names the function", "tool_choice names the tool"),
          (r"^stop must be", "stop_sequences must be"), (r"^stop holds", "stop_sequences holds"),
          (r"stop strings\b", "stop sequences"), *field_terms({"response_format": "output_config.format"}))
# Fields of Anthropic's API that change nothing Solo generates. context_management (clearing old tool uses or
# thinking from the context) is not applied either, but Claude Code sends it on every request.
_NO_EFFECT = frozenset({"metadata", "service_tier", "cache_control", "context_management"})
# Fields of Anthropic's API for what Solo does not do, each with what to do instead.
_NOT_DONE = {
    "mcp_servers": "Solo connects to no MCP servers; list their tools in tools and run the calls yourself",
    "container": "Solo runs no containers (code execution, skills); leave container out",
    "thread": "Solo keeps no threads; send the whole conversation in messages (the SDK's tool_runner: thread=False)",
}


class MessagesRequest(BaseModel):
    """POST /v1/messages (Anthropic's fields Solo honours; others are refused by name or have no effect)."""

    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: JsonInt
    messages: list[dict[str, Any]]
    system: Annotated[str | list[dict[str, Any]], one_of("a string or a list of text blocks")] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[JsonStr] | None = None
    temperature: JsonFloat | None = None
    top_p: JsonFloat | None = None
    top_k: JsonInt | None = None
    stream: StrictBool = False
    thinking: dict[str, Any] | None = None


def anthropic_error(error: APIError) -> JSONResponse:
    """An error in Anthropic's shape: {"type": "error", "error": {"type", "message"}}, with its status.

    The chat route's field names and shapes in its message are put in the Messages API's terms.
    """
    kind = _ERROR_TYPES.get(error.status, "api_error")
    message = in_api_terms(error.message, _TERMS)
    return JSONResponse({"type": "error", "error": {"type": kind, "message": message}},
                        status_code=error.status, headers=error.headers)


def _error_from(exc: SoloError | APIError) -> JSONResponse:
    # As api_error_from, with a context overflow worded as Anthropic's API words it first: agent tools (Claude
    # Code's compaction, LiteLLM's ContextWindowExceededError) recognise the overflow by that text.
    error = api_error_from(exc)
    if isinstance(exc, ContextLengthError) and exc.prompt_tokens is not None and exc.limit is not None:
        if exc.prompt_tokens >= exc.limit:  # (a prompt that fills the context leaves no room for a token)
            words = f"prompt is too long: {exc.prompt_tokens} tokens > {exc.limit - 1} maximum"
        else:
            words = (f"input length and `max_tokens` exceed context limit: {exc.prompt_tokens} + "
                     f"{exc.max_tokens or 1} > {exc.limit}, decrease input length or `max_tokens` and try again")
        error = APIError(error.status, f"{words} ({exc})", param=error.param, code=error.code)
    return anthropic_error(error)


def chat_request(body: MessagesRequest, thinking_switch: bool = True, counting: bool = False) -> ChatCompletionRequest:
    """The chat request a Messages request means (see the module docstring).

    Args:
        body: the request.
        thinking_switch: the template can turn thinking off (`thinking: {"type": "disabled"}`).
        counting: for count_tokens: settings that change what is generated but not the prompt (a thinking
            budget, output settings, any field Solo does not know) are taken, as they would be counted.

    Raises:
        InvalidRequestError: a `thinking` budget, a block Solo does not take (images, documents, server tool
            results), a server tool, a malformed block, or any field the chat route refuses.
    """
    if body.thinking is not None and body.thinking.get("type") != "disabled" and not counting:
        raise InvalidRequestError(f"thinking {body.thinking.get('type')!r} is not supported by Solo (it has no "
                                  "reasoning-budget control; a thinking model's reasoning comes back as thinking "
                                  'blocks anyway); leave thinking out, or send {"type": "disabled"}',
                                  param="thinking")
    extra = body.model_extra or {}
    output_format = None if counting else _output_format(extra)
    for name in () if counting else extra:
        if name in _OUTPUT_FIELDS:
            continue
        if name in _NOT_DONE:
            raise InvalidRequestError(f"{name}: {_NOT_DONE[name]}", param=name)
        if name not in _NO_EFFECT:
            raise InvalidRequestError(f"{name} is not a field Solo's Messages API takes", param=name)
    if not counting:
        _check_no_effect_fields(extra)
    if body.temperature is not None and not 0 <= body.temperature <= 1:
        raise InvalidRequestError(f"temperature must be in [0, 1] on the Messages API (Anthropic's range), got "
                                  f"{body.temperature!r}; for more, use /v1/chat/completions", param="temperature")
    messages: list[dict[str, Any]] = []
    if body.system is not None:
        messages.append({"role": "system", "content": _text(body.system, "system")})
    # Tool results answer the calls of the assistant turn before them; Anthropic's API merges consecutive
    # messages of one role into one turn, so calls and results gather over them.
    asked: list[str] = []  # the last assistant turn's tool_use ids
    answered: list[str] = []  # the tool_use ids the user turn after it answered
    turn_start = 0  # index of the message that began the last assistant turn
    spoke = False  # the user turn being read has text (its tool_result blocks must all come before)

    def check_answered(before: int | None) -> None:
        unanswered = [call_id for call_id in asked if call_id not in answered]
        if unanswered:
            raise InvalidRequestError(
                f"messages[{turn_start}] has tool_use ids with no tool_result in the user message after it"
                f"{'' if before is None else f' (before messages[{before}])'}: {', '.join(map(repr, unanswered))}; "
                "answer each call with a tool_result block in the next user message", param="messages")
    for i, message in enumerate(body.messages):
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise InvalidRequestError(f"messages[{i}].role must be user or assistant, got {role!r}", param="messages")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or (not blocks and (role == "user" or i + 1 < len(body.messages))):
            raise InvalidRequestError(f"messages[{i}].content must be a string or a non-empty list of blocks (only a "
                                      "last assistant message may be empty)", param="messages")
        previous = body.messages[i - 1].get("role") if i else None
        if role == "assistant" and previous == "user":  # a new assistant turn: the last one's calls are answered
            check_answered(i)
            asked, answered, turn_start = [], [], i
        elif role == "assistant" and previous is None:
            turn_start = i
        if role == "user" and previous != "user":
            spoke = False
        texts, calls, results, thinking = [], [], [], None
        for j, block in enumerate(blocks):
            kind = block.get("type") if isinstance(block, dict) else None
            where = f"messages[{i}].content[{j}]"
            if kind == "text":
                text = string_field(block, "text", where, "messages")
                if not text.strip() and role == "user":  # as Anthropic's API
                    raise InvalidRequestError(f"{where}: text must not be empty or only whitespace; leave the block "
                                              "out", param="messages")
                if text.strip() or i + 1 == len(body.messages):  # (an earlier reply's blank block says nothing)
                    texts.append(text)
                spoke = spoke or role == "user"
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("input"), dict):
                    raise InvalidRequestError(f"{where}.input must be an object (the call's arguments), got "
                                              f"{block.get('input')!r:.40}", param="messages")
                call_id, name = string_field(block, "id", where, "messages"), string_field(block, "name", where,
                                                                                            "messages")
                if not call_id or not name or call_id in asked or any(c["id"] == call_id for c in calls):
                    raise InvalidRequestError(f"{where}: a tool_use block needs a non-empty name and an id no other "
                                              f"tool_use of the turn has; got id {call_id!r}, name {name!r}",
                                              param="messages")
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": name, "arguments": json.dumps(block["input"])}})
            elif kind == "tool_result" and role == "user":
                output = _text(block.get("content", ""), where)
                if not isinstance(block.get("is_error", False), bool):
                    raise InvalidRequestError(f"{where}.is_error must be true or false, got "
                                              f"{block.get('is_error')!r:.40}", param="messages")
                if block.get("is_error"):  # chat templates have no such flag: said in the text the model reads
                    output = f"Error: {output}"
                call_id = string_field(block, "tool_use_id", where, "messages")
                if spoke:  # as Anthropic's API: the template would show the results first anyway
                    raise InvalidRequestError(f"{where} is a tool_result after text of the same user turn; put the "
                                              "tool_result blocks first, then any text", param="messages")
                if call_id not in asked or call_id in answered:
                    # As Anthropic's API: a result answers one call of the assistant turn right before.
                    raise InvalidRequestError(
                        f"{where}.tool_use_id {call_id!r} answers no tool_use block of the assistant turn before it "
                        f"(its ids: {', '.join(map(repr, asked)) or 'none'}), or answers one twice; each tool_result "
                        "answers one tool_use of the previous assistant message", param="messages")
                answered.append(call_id)
                results.append({"role": "tool", "tool_call_id": call_id, "content": output})
            elif kind == "thinking" and role == "assistant":
                # (interleaved thinking sends several blocks a turn: the template takes one reasoning text)
                part = string_field(block, "thinking", where, "messages")
                thinking = part if thinking is None else f"{thinking}\n{part}"
            else:
                media = "; Solo's models take text only" if kind in ("image", "document") else ""
                raise InvalidRequestError(f"{where} is a {kind!r} block, which Solo does not take here (text, "
                                          "tool_use from the assistant, tool_result from the user, thinking)"
                                          f"{media}", param="messages")
        asked += [call["id"] for call in calls]
        last_block = blocks[-1] if blocks else None
        if (role == "assistant" and i + 1 == len(body.messages) and isinstance(last_block, dict)
                and last_block.get("type") == "text" and last_block["text"] != last_block["text"].rstrip()):
            # A reply's start ending in a space leaves the model at a token boundary text rarely has.
            raise InvalidRequestError(f"messages[{i}]: the final assistant message (the reply's start) must not end "
                                      "with whitespace, as on Anthropic's API; strip it", param="messages")
        if role == "user":
            messages += results  # a user turn answers the calls first, then speaks
            if texts or not results:
                messages.append({"role": "user", "content": "\n".join(texts)})
        else:
            reply: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
            if calls:
                reply["tool_calls"] = calls
            if thinking:
                reply["reasoning_content"] = thinking
            messages.append(reply)
    if body.messages and body.messages[-1].get("role") == "user":
        check_answered(None)
    messages = _one_turn_per_role(messages)
    fields: dict[str, Any] = {"model": body.model, "messages": messages, "max_tokens": body.max_tokens,
                              "stream": body.stream, "temperature": body.temperature, "top_p": body.top_p,
                              "top_k": body.top_k, "stop": body.stop_sequences}
    continue_prefill(messages, fields)
    if body.stream:
        fields["stream_options"] = {"include_usage": True}
    if body.tools:
        fields["tools"] = [_chat_tool(t, i) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        fields.update(_chat_tool_choice(body.tool_choice))
    if output_format is not None:
        fields["response_format"] = output_format
    if body.thinking is not None and body.thinking.get("type") == "disabled" and thinking_switch:  # (without a
        # switch: as asked already)
        fields["chat_template_kwargs"] = {"enable_thinking": False}
    return chat_request_from(fields, _FIELD_NAMES)


def _output_format(extra: dict[str, Any]) -> dict[str, Any] | None:
    # Anthropic's structured outputs, output_config.format (or the beta's output_format): {"type": "json_schema",
    # "schema": {...}} -> the chat route's response_format, whose grammar keeps the reply's text to the schema.
    config, beta = extra.get("output_config"), extra.get("output_format")
    if config is not None:
        if not isinstance(config, dict) or set(config) - {"format", "effort"}:
            raise InvalidRequestError(f"output_config takes format (and effort), got {config!r:.60}",
                                      param="output_config")
        if config.get("effort") not in (None, "high"):  # "high" is Anthropic's default: what Solo does anyway
            raise InvalidRequestError(f"output_config.effort {config['effort']!r:.40} is not supported by Solo (it "
                                      "has no effort control); leave effort out", param="output_config.effort")
        if config.get("format") is not None and beta is not None:
            raise InvalidRequestError("output_format and output_config.format both give the output's format; send "
                                      "only output_config.format", param="output_format")
        beta = config.get("format") if config.get("format") is not None else beta
    if beta is None:
        return None
    where = "output_config.format" if config is not None and config.get("format") is not None else "output_format"
    if not isinstance(beta, dict) or beta.get("type") != "json_schema" or not isinstance(beta.get("schema"), dict) \
            or set(beta) - {"type", "schema"}:
        raise InvalidRequestError(f'{where} must be {{"type": "json_schema", "schema": {{...}}}}, got {beta!r:.60}',
                                  param=where)
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": beta["schema"]}}


def _text(content: Any, where: str) -> str:  # noqa: ANN401
    # A string, or text blocks (joined one per line, as chat text parts are).
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(b, dict) and b.get("type") == "text"
                                         and isinstance(b.get("text"), str) for b in content):
        return "\n".join(b["text"] for b in content)
    raise InvalidRequestError(f"{where} must be a string or a list of text blocks (Solo's models take text only)",
                              param="system" if where == "system" else "messages")


def _check_no_effect_fields(extra: dict[str, Any]) -> None:
    # Fields that change nothing still take only Anthropic's values (a wrong one is the client's mistake).
    metadata = extra.get("metadata")
    if metadata is not None and (not isinstance(metadata, dict) or set(metadata) - {"user_id"}
                                 or not isinstance(metadata.get("user_id", ""), str | None)):
        raise InvalidRequestError(f"metadata takes only user_id (a string), as Anthropic's; got {metadata!r:.60}",
                                  param="metadata")
    tier = extra.get("service_tier")
    if tier is not None and tier not in ("auto", "standard_only"):
        raise InvalidRequestError(f'service_tier must be "auto" or "standard_only", got {tier!r:.40}',
                                  param="service_tier")
    for name in ("cache_control", "context_management"):
        if extra.get(name) is not None and not isinstance(extra[name], dict):
            raise InvalidRequestError(f"{name} must be an object, got {extra[name]!r:.40}", param=name)


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    if tool.get("type", "custom") != "custom":
        raise InvalidRequestError(f"tools[{index}] is a {tool.get('type')!r} tool; Solo runs client tools only "
                                  '({"name", "description", "input_schema"}; server tools run on Anthropic\'s side)',
                                  param="tools")
    if not isinstance(tool.get("input_schema"), dict):
        raise InvalidRequestError(f"tools[{index}] needs an input_schema (a JSON Schema object of its input)",
                                  param="tools")
    # (keys in the order the OpenAI routes pass them: the template renders the tools as given)
    function: dict[str, Any] = {"name": tool.get("name")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    function["parameters"] = tool["input_schema"]
    if tool.get("strict") is not None:
        function["strict"] = tool["strict"]
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: dict[str, Any]) -> dict[str, Any]:
    kind = choice.get("type")
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise InvalidRequestError('tool_choice {"type": "tool"} needs the "name" of one of the tools',
                                      param="tool_choice")
        mapped = {"type": "function", "function": {"name": choice["name"]}}
    if mapped is None:
        raise InvalidRequestError(f"tool_choice type must be auto, any, tool or none, got {kind!r}",
                                  param="tool_choice")
    fields: dict[str, Any] = {"tool_choice": mapped}
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise InvalidRequestError(f"tool_choice.disable_parallel_tool_use must be true or false, got {disable!r:.40}",
                                  param="tool_choice")
    if disable:
        fields["parallel_tool_calls"] = False
    return fields


def _one_turn_per_role(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # As Anthropic's API: "consecutive user or assistant turns in your request will be combined into a single
    # turn" (chat templates that enforce alternation, Llama 2's and Mistral's, refused two user messages in a row).
    # Texts join as a message's text blocks do; an assistant turn's calls gather in order.
    merged: list[dict[str, Any]] = []
    for message in messages:
        last = merged[-1] if merged else None
        if last is None or message["role"] != last["role"] or message["role"] not in ("user", "assistant"):
            merged.append(dict(message))
            continue
        texts = [t for t in (last.get("content"), message.get("content")) if t]
        last["content"] = "\n".join(texts) if texts or message["role"] == "user" else None
        if message.get("tool_calls"):
            last["tool_calls"] = [*(last.get("tool_calls") or []), *message["tool_calls"]]
        thinking = [t for t in (last.get("reasoning_content"), message.get("reasoning_content")) if t]
        if thinking:
            last["reasoning_content"] = "\n".join(thinking)
    return merged


def _stop(finish_reason: str | None, stop_reason: Any, body: MessagesRequest,  # noqa: ANN401
          called: bool = False) -> dict[str, Any]:
    # Anthropic's stop_reason and stop_sequence from the chat route's finish_reason and vLLM's stop_reason. A
    # reply with calls is a tool_use however the chat route ended it (it says "stop" for a named function, as
    # OpenAI's API; Anthropic's says tool_use for {"type": "tool"} too).
    if called and finish_reason == "stop":
        finish_reason = "tool_calls"
    matched = stop_reason if isinstance(stop_reason, str) and stop_reason in (body.stop_sequences or ()) else None
    if finish_reason == "stop" and matched is not None:
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    # (a reply with tool calls that a stop sequence ended stays a tool_use, which agent loops act on, and names it)
    return {"stop_reason": _STOP_REASONS.get(finish_reason or "stop", "end_turn"),
            "stop_sequence": matched if finish_reason == "tool_calls" else None}


def _usage(usage: dict[str, Any]) -> dict[str, int]:
    # Anthropic counts the prompt tokens read from the cache apart: input_tokens is the rest.
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"input_tokens": usage.get("prompt_tokens", 0) - cached, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0, "output_tokens": usage.get("completion_tokens", 0)}


def content_blocks(message: dict[str, Any], after_calls: str = "") -> list[dict[str, Any]]:
    """A chat reply's `message` as Anthropic content blocks: thinking, text, tool_use (with `input` parsed), text.

    Args:
        message: the chat reply's message.
        after_calls: the end of its content that came after the tool calls (a block after them, as streamed).
    """
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    before, after = text_around_calls(message, after_calls)
    if message.get("tool_calls"):  # a blank between the thinking and the calls is no text block (Anthropic's API
        before, after = before.strip() and before, after.strip() and after  # refuses blank ones sent back)
    if before:
        blocks.append({"type": "text", "text": before})
    for call in message.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": json.loads(call["function"]["arguments"])})
    if after:
        blocks.append({"type": "text", "text": after})
    return blocks


class CountTokensRequest(MessagesRequest):
    """POST /v1/messages/count_tokens: a Messages request's fields, without max_tokens."""

    max_tokens: int | None = None  # type: ignore[assignment]


async def _read(request: Request, kind: type[MessagesRequest]) -> tuple[MessagesRequest, ChatCompletionRequest]:
    # The body, validated, and the chat request it means.
    data = await json_body(request, object_only=False)  # (the model says what a non-object is)
    try:
        body = kind.model_validate(data)
    except ValidationError as exc:
        error = validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
        raise InvalidRequestError(error.message, param=error.param) from None
    disabled = body.thinking is not None and body.thinking.get("type") == "disabled"
    switch = thinking_switch(request.app.state.solo, disabled, "thinking")
    return body, chat_request(body, thinking_switch=switch, counting=kind is CountTokensRequest)


@router.post("/v1/messages/count_tokens", response_model=None)
async def count_tokens(request: Request) -> Response:
    """Anthropic's token counting: {"input_tokens": N} of the prompt a Messages request would run.

    Claude Code asks before it sends one. Nothing is generated, so no slot is taken.
    """
    from starlette.concurrency import run_in_threadpool

    from solo.server.routes import counted_chat_prompt_ids

    try:
        body, chat = await _read(request, CountTokensRequest)
        state = request.app.state.solo
        engine, _ = state.require_ready(body.model)
        ids = await run_in_threadpool(counted_chat_prompt_ids, state, engine, chat)
    except (SoloError, APIError) as exc:
        return _error_from(exc)
    return JSONResponse({"input_tokens": len(ids)})


@router.post("/v1/messages", response_model=None)
async def messages(request: Request) -> Response:
    """Anthropic's Messages API (see the module docstring); streamed as its events when `stream` is true."""
    from solo.server.routes import GenerationStream, chat_completions

    try:
        body, chat = await _read(request, MessagesRequest)
        reply = await chat_completions(chat, request)
    except (SoloError, APIError) as exc:
        return _error_from(exc)
    message_id = f"msg_{uuid.uuid4().hex}"
    if isinstance(reply, GenerationStream):
        model = request.app.state.solo.served_name
        return GenerationStream(_events(body, reply.body_iterator, message_id, model, reply.prompt_tokens),
                                reply.generation)
    completion = json.loads(reply.body)
    choice, usage = completion["choices"][0], completion.get("usage") or {}
    if choice["finish_reason"] == "abort":  # (Anthropic has no stop_reason for a reply the server cut)
        return anthropic_error(APIError(503, CUT_SHORT, type="server_overloaded", code="shutting_down",
                                        headers={"Retry-After": str(RETRY_AFTER_S)}))
    result = {"id": message_id, "type": "message", "role": "assistant", "model": completion["model"],
              "content": content_blocks(choice["message"], content_after_calls(reply)),
              **_stop(choice["finish_reason"], choice.get("stop_reason"), body,
                      bool(choice["message"].get("tool_calls"))),
              "usage": _usage(usage)}
    return Response(json.dumps(result, ensure_ascii=False), media_type="application/json")


async def _events(body: MessagesRequest, chunks: AsyncIterator[Any], message_id: str, model: str,
                  prompt_tokens: int) -> AsyncIterator[str]:
    # The chat stream's chunks as the Messages API's events. message_start counts the whole prompt as input
    # (how much of it the prefix cache holds is known once it ran: message_delta's usage splits it).
    def event(kind: str, **fields: Any) -> str:  # noqa: ANN401
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    index = -1
    open_kind: str | None = None  # "thinking" / "text" / "tool_use": the block being streamed
    tool_indexes: dict[int, int] = {}
    finish_reason, stop_reason, usage = None, None, None
    yield event("message_start", message={"id": message_id, "type": "message", "role": "assistant",
                                          "model": model, "content": [], "stop_reason": None,
                                          "stop_sequence": None,
                                          "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}})

    def start(kind: str, block: dict[str, Any]) -> list[str]:
        nonlocal index, open_kind
        out = [event("content_block_stop", index=index)] if open_kind is not None else []
        index, open_kind = index + 1, kind
        return [*out, event("content_block_start", index=index, content_block=block)]

    async for chunk in chat_chunks(chunks):
        if "error" in chunk:
            error = stream_error(chunk["error"])
            yield event("error", error={"type": _ERROR_TYPES.get(error.status, "api_error"),
                                        "message": in_api_terms(error.message, _TERMS)})
            return
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                if open_kind != "thinking":
                    for text in start("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                        yield text
                yield event("content_block_delta", index=index,
                            delta={"type": "thinking_delta", "thinking": delta["reasoning_content"]})
            if delta.get("content"):
                if open_kind != "text":
                    for text in start("text", {"type": "text", "text": ""}):
                        yield text
                yield event("content_block_delta", index=index, delta={"type": "text_delta",
                                                                       "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if call["index"] not in tool_indexes:
                    for text in start("tool_use", {"type": "tool_use", "id": call.get("id", ""),
                                                   "name": function.get("name", ""), "input": {}}):
                        yield text
                    tool_indexes[call["index"]] = index
                if function.get("arguments"):
                    yield event("content_block_delta", index=tool_indexes[call["index"]],
                                delta={"type": "input_json_delta", "partial_json": function["arguments"]})
            finish_reason = choice.get("finish_reason") or finish_reason
            stop_reason = choice.get("stop_reason") or stop_reason
    if open_kind is not None:
        yield event("content_block_stop", index=index)
    if finish_reason == "abort":  # an error event ends the stream, as Anthropic's end one it cannot finish
        yield event("error", error={"type": "overloaded_error", "message": CUT_SHORT})
        return
    usage = usage or {}
    yield event("message_delta", delta=_stop(finish_reason or "stop", stop_reason, body, bool(tool_indexes)),
                usage=_usage(usage))
    yield event("message_stop")
