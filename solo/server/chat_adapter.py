"""Running another API's request through the chat route (`responses.py`, `anthropic_messages.py`, `ollama.py`).

The chat request it means, validated with errors named by the calling API's own field names, and the chat
stream's server-sent events read back as chunks; what those APIs share in between: a last assistant message
(a prefill) and their ways of turning thinking off.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from solo.engine.reasoning import has_thinking_switch
from solo.errors import InvalidRequestError
from solo.server.errors import APIError, validation_error
from solo.server.protocol import SURROGATE_MESSAGE, ChatCompletionRequest
from solo.tokenizer import is_valid_unicode

CUT_SHORT = "the server stopped before the reply finished (it is shutting down); send the request again"
"""What a reply the chat route ended with finish_reason "abort" says on APIs that have no such reason."""


def chat_request_from(fields: Mapping[str, Any], field_names: Mapping[str, str],
                      kind: type[BaseModel] = ChatCompletionRequest) -> Any:  # noqa: ANN401
    """A validated chat request (or another route's, `kind`) from `fields` (None values: the route's defaults).

    Args:
        fields: the request's fields.
        field_names: route field -> the calling API's name for it, for error messages and `param`.
        kind: the route's request model (ChatCompletionRequest, or CompletionRequest for a raw prompt).

    Raises:
        InvalidRequestError: a field the route refuses, named as the calling API names it.
    """
    try:
        return kind(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *(field_names.get(str(p), p) for p in e["loc"]))} for e in exc.errors()]
        error = validation_error(errors)
        raise InvalidRequestError(error.message, param=error.param) from None


CHAT_TOOL_TERMS = ((r"tools\[(\d+)\]\.function\.", r"tools[\1]."),)
"""The chat route's nested tool fields in a flat tool's terms (Anthropic's and Responses' tools are flat)."""


def stream_error(error: Mapping[str, Any]) -> APIError:
    """A chat stream's error event (`{"error": {...}}`: a grammar that ran dead mid-output, a bug) as an APIError.

    Its status is 500 for a "server_error" (a bug), else 400 (the request's own fault).
    """
    status = 500 if error.get("type") == "server_error" else 400
    return APIError(status, error.get("message", ""), type=error.get("type", "invalid_request_error"),
                    param=error.get("param"))


def in_api_terms(message: str, terms: Sequence[tuple[str, str]]) -> str:
    """An error message of the chat route with its field names and shapes in the calling API's terms.

    Args:
        message: the chat route's message.
        terms: (regular expression, replacement) pairs, applied in order (`re.sub`).
    """
    for pattern, replacement in terms:
        message = re.sub(pattern, replacement, message)
    return message


def field_terms(names: Mapping[str, str]) -> list[tuple[str, str]]:
    """`in_api_terms` pairs that rename each field (route's name -> the calling API's) where it stands as a word."""
    return [(rf"(?<![\w.]){re.escape(route)}(?!\w)", ours) for route, ours in names.items()]


def typed_field(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str,
                default: Any = None) -> Any:  # noqa: ANN401
    """`data[name]` checked to be of `kind`, for routes that read their body themselves (Ollama's, llama-server's).

    Args:
        data: the request body.
        name: the field.
        kind: its type(s); a boolean is refused unless `bool` is one of them (JSON's true is no number).
        what: the type in words, for the error ("an integer").
        default: the value of a field left out or null (as those APIs take null).

    Raises:
        InvalidRequestError: the value is of another type, or text that is not valid Unicode (param: the field).
    """
    value = data.get(name)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise InvalidRequestError(f"{name} must be {what}, got {value!r:.40}", param=name)
    if isinstance(value, str) and not is_valid_unicode(value):  # (else named later as the route's field it became)
        raise InvalidRequestError(f"{name}: {SURROGATE_MESSAGE}", param=name)
    return value


def content_after_calls(reply: object) -> str:
    """The end of the first choice's content that came after its tool calls ("" where there is none).

    The chat route records it on its unstreamed reply (`content_after_calls`, one per choice).
    """
    return (getattr(reply, "content_after_calls", None) or [""])[0]


def text_around_calls(message: Mapping[str, Any], after_calls: str) -> tuple[str, str]:
    """A chat reply's content split into the text before its tool calls and the text after them.

    Args:
        message: the chat reply's message (content, tool_calls).
        after_calls: the end of the content that followed the calls (`content_after_calls`).

    Returns:
        (before, after); after is "" without calls or when the content does not end with `after_calls`.
    """
    text = message.get("content") or ""
    after = after_calls if message.get("tool_calls") and after_calls and text.endswith(after_calls) else ""
    return text[:len(text) - len(after)], after


def continue_prefill(messages: list[dict[str, Any]], fields: dict[str, Any]) -> None:
    """Continue an assistant message last (a prefill) when it holds anything: its text, calls or thinking.

    An empty one is left out of `messages` (the reply starts as without it); else `fields`, the chat request's,
    ask to continue it.
    """
    if messages and messages[-1].get("role") == "assistant":
        last = messages[-1]
        if str(last.get("content") or "").strip() or last.get("tool_calls") or last.get("reasoning_content"):
            fields.update(continue_final_message=True, add_generation_prompt=False)
        else:
            messages.pop()


def thinking_switch(state: Any, off_asked: bool, param: str) -> bool:  # noqa: ANN401
    """Whether the served model's chat template has an `enable_thinking` switch.

    Args:
        state: the server's state (its engine's template, whether replies are split into reasoning).
        off_asked: the request asks for thinking off (its API's way).
        param: the request field that asks, for the error.

    Raises:
        InvalidRequestError: thinking off asked of a model that thinks and has no such switch (it would be
            ignored); a model that does not think is as asked already.
    """
    template = state.engine.tokenizer.chat_template if state.engine is not None else None
    switch = has_thinking_switch(template.source if template is not None else None)
    if off_asked and state.reasoning and not switch:
        raise InvalidRequestError(f"{state.served_name!r} thinks whatever the request says (its chat template has no "
                                  f"enable_thinking switch); leave {param} out", param=param)
    return switch


def string_field(obj: Mapping[str, Any], key: str, where: str, param: str) -> str:
    """`obj[key]`, which must be a string.

    Raises:
        InvalidRequestError: it is missing or not a string; the message names `where`.key, `param` the field.
    """
    value = obj.get(key)
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where}.{key} must be a string, got {value!r:.40}", param=param)
    return value


async def chat_chunks(events: AsyncIterator[Any]) -> AsyncIterator[dict[str, Any]]:  # noqa: ANN401
    """The chat stream's chunks (its `data:` events as objects; an error event is {"error": {...}}), in order."""
    async for raw in events:
        for line in str(raw).splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[len("data: "):])
