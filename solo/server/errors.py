"""Every error the server returns, in OpenAI's shape, with its HTTP status decided in one place.

OpenAI's API answers errors as `{"error": {"message", "type", "param", "code"}}`. Solo's engine raises
`SoloError` subclasses for problems the user can fix; `api_error_from` maps each one to a status here, so
a user's mistake is a 4xx and never a 500. FastAPI's own 422 validation errors and Starlette's 404/405
are rewritten into the same shape (422 becomes 400, as OpenAI and vLLM answer).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from solo.errors import (
    CheckpointError,
    ContextLengthError,
    EngineFailedError,
    InvalidRequestError,
    KVCacheMemoryError,
    ModelNotFoundError,
    SoloError,
    UnsupportedArchitectureError,
)
from solo.server.scheduler import QueueFullError, SchedulerStoppedError

logger = logging.getLogger("solo.server")

RETRY_AFTER_S = 1
"""Seconds a client is asked to wait (the Retry-After header) when the server is busy or loading."""

MAX_MESSAGE_CHARS = 4000
"""An error message or param longer than this is cut (it may quote the request: a break test's 5 MB model name
came back in a 5 MB 404)."""


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}... ({len(text) - MAX_MESSAGE_CHARS} more characters)"


class APIError(Exception):
    """An error response: HTTP status plus OpenAI's error object.

    Args:
        status: HTTP status code.
        message: one line for the user, naming the problem and the fix.
        type: OpenAI's error type ("invalid_request_error", "authentication_error", ...).
        param: the offending request field, or None.
        code: a machine-readable code ("model_not_found", "context_length_exceeded", ...), or None.
        headers: extra response headers (Retry-After, WWW-Authenticate).
    """

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        message = _cut(message) or ""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = _cut(param)
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON body: {"error": {"message", "type", "param", "code"}}."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        """The error as a JSON response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def api_error_from(exc: BaseException) -> APIError:
    """Map an exception to the error response it deserves; the one table of SoloError -> status.

    ContextLengthError and InvalidRequestError -> 400; a model folder or checkpoint problem -> 400 with
    its own code; EngineFailedError (a tensor-parallel rank died) -> 500 "engine_failed"; KVCacheMemoryError
    (memory a step needed was gone) -> 503 "out_of_memory" with Retry-After; QueueFullError
    (Retry-After: its estimate) and SchedulerStoppedError -> 503 with Retry-After; anything else is a bug in
    Solo -> 500 (logged with its traceback by the caller). A client that left before sending its whole body
    (ClientDisconnect) -> 499, nginx's "client closed request": no bug, and no one reads the answer.
    """
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ClientDisconnect):
        return APIError(499, "the client closed the connection before sending the whole request body",
                        code="client_closed_request")
    if isinstance(exc, ContextLengthError):
        message = str(exc)
        if exc.prompt_tokens is not None and exc.limit is not None:  # and OpenAI's and vLLM's words: clients
            # (litellm's ContextWindowExceededError, context-window fallbacks) recognise an overflow by them
            completion = exc.max_tokens or 1
            message += (f". This model's maximum context length is {exc.limit} tokens. However, you requested "
                        f"{exc.prompt_tokens + completion} tokens ({exc.prompt_tokens} in the messages, {completion} "
                        "in the completion).")
        return APIError(400, message, param=exc.param, code="context_length_exceeded")
    if isinstance(exc, InvalidRequestError):
        return APIError(400, str(exc), param=exc.param)
    if isinstance(exc, ModelNotFoundError):
        return APIError(404, str(exc), code="model_not_found")
    if isinstance(exc, CheckpointError | UnsupportedArchitectureError):
        return APIError(400, str(exc), code="unsupported_model")
    if isinstance(exc, EngineFailedError):  # not the request's fault: clients and balancers retry a 5xx elsewhere
        return APIError(500, str(exc), type="server_error", code="engine_failed")
    if isinstance(exc, KVCacheMemoryError):  # this machine's memory, not the request's fault: retry later
        return APIError(503, str(exc), type="server_overloaded", code="out_of_memory",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, SoloError):
        return APIError(400, str(exc))
    if isinstance(exc, QueueFullError):
        return APIError(503, str(exc), type="server_overloaded", code="queue_full",
                        headers={"Retry-After": str(exc.retry_after_s)})
    if isinstance(exc, SchedulerStoppedError):
        return APIError(503, str(exc), type="server_overloaded", code="shutting_down",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    return APIError(500, "internal server error; see the server log", type="server_error", code="internal_error")


def model_not_found(name: str, served: str) -> APIError:
    """404 for a request naming a model this server does not serve."""
    return APIError(404, f"the model {name!r} does not exist on this server; it serves {served!r} "
                         "(see GET /v1/models)", param="model", code="model_not_found")


def model_loading() -> APIError:
    """503 while the model is still loading (or the server is shutting down)."""
    return APIError(503, "the model is still loading; retry shortly (GET /health turns 200 when ready)",
                    type="server_overloaded", code="model_loading", headers={"Retry-After": str(RETRY_AFTER_S)})


def shutting_down() -> APIError:
    """503 for new work once graceful shutdown has begun."""
    return APIError(503, "the server is shutting down; retry on another instance", type="server_overloaded",
                    code="shutting_down", headers={"Retry-After": str(RETRY_AFTER_S)})


def _location(loc: Sequence[str | int]) -> str:
    # ("body", "messages", 0, "content") -> "messages[0].content"
    text = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """400 for FastAPI's request validation errors (malformed JSON, wrong types, out-of-range values).

    The message names the first problem (and how many more there are); `param` is the top-level field.
    The offending input is never echoed back (it may be huge, or NaN, which JSON cannot carry).
    """
    if not errors:
        return APIError(400, "the request body is invalid")
    first = errors[0]
    loc = list(first.get("loc", ()))
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON ({detail})".replace(" ()", ""))
    if first.get("type") == "missing" and loc == ["body"]:
        return APIError(400, "the request has no body; send a JSON object")
    if first.get("type") == "model_attributes_type" and loc == ["body"]:
        return APIError(400, "the request body must be a JSON object, sent with Content-Type: application/json")
    where = _location(loc)
    param = next((p for p in loc[1:] if isinstance(p, str)), None) if loc[:1] == ["body"] else None
    text = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    named = where and text.startswith(where) and text[len(where):len(where) + 1] in (" ", ".", ":", "[")
    message = text if named or not where else f"{where}: {text}"  # (a validator's message may name it)
    more = len({_location(e.get("loc", ())) for e in errors} - {where})
    if more:
        message += f" (and {more} more invalid field{'s' if more > 1 else ''})"
    return APIError(400, message, param=param)


async def json_body(request: Request, object_only: bool = True) -> Any:  # noqa: ANN401
    """The request's body decoded as JSON, for routes that read it themselves (Ollama's, Anthropic's, llama-server's).

    Args:
        request: the request.
        object_only: refuse a body that is not a JSON object.

    Raises:
        InvalidRequestError: the body is no JSON (`unreadable_body_message` says why), or no object.
    """
    import json

    try:
        data = await request.json()
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(unreadable_body_message(exc) if not isinstance(exc, json.JSONDecodeError)
                                  else "the request body is not valid JSON", param=unreadable_body_param(exc)) from None
    if object_only and not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return data


class NonFiniteJSONError(ValueError):
    """A request body holds NaN, Infinity or a number too large for a float.

    None is JSON (RFC 8259), though Python's decoder takes them; values Solo echoes back (metadata, schemas)
    could not be encoded again.

    Attributes:
        location: where the first one is ("temperature", "metadata.a", "messages[0].content"); None if unknown.
    """

    def __init__(self, problem: str, location: str | None = None) -> None:
        super().__init__(problem)
        self.location = location


def _non_finite_location(value: Any, path: tuple[str | int, ...] = ()) -> str | None:  # noqa: ANN401
    # The first NaN / ±Infinity in a decoded body, as a location (only walked for a body already refused).
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        return _location(list(path)) or "the body"
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        if isinstance(child, float | dict | list) and (where := _non_finite_location(child, (*path, key))):
            return where
    return None


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise NonFiniteJSONError(f"the number {text[:40]} is too large for a float")
    return value


def _no_constant(name: str) -> float:
    raise NonFiniteJSONError(f"{name} is not a JSON value")


class StrictJSONRequest(Request):
    """A request whose body decodes as RFC 8259 JSON only.

    NaN, Infinity, -Infinity and numbers that overflow a float (1e400) are refused, as llama-server's and
    OpenAI's parsers refuse them (Python's `json`, which FastAPI uses, takes them).
    """

    async def json(self) -> Any:  # noqa: ANN401
        """The body decoded as JSON.

        Raises:
            json.JSONDecodeError: the body is not JSON.
            NonFiniteJSONError: it holds NaN, Infinity or a number beyond a float's range.
            UnicodeDecodeError: it is not UTF-8.
        """
        if not hasattr(self, "_json"):
            import json

            body = await self.body()
            try:
                self._json = json.loads(body, parse_constant=_no_constant, parse_float=_finite_float)
            except NonFiniteJSONError as exc:
                raise NonFiniteJSONError(str(exc), _non_finite_location(json.loads(body))) from None
        return self._json


class StrictJSONRoute(APIRoute):
    """The route class of every router: its handler reads the body through `StrictJSONRequest`.

    That covers FastAPI's own body parsing and `json_body` (FastAPI's documented custom-request pattern).
    """

    def get_route_handler(self) -> Callable[[Request], Any]:
        """FastAPI's handler, given a `StrictJSONRequest` over the same ASGI scope and receive channel."""
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))
        return strict


def unreadable_body_param(cause: BaseException) -> str | None:
    """The top-level field an unreadable body's problem lies in, where known (a NaN in `temperature`)."""
    location = getattr(cause, "location", None) if isinstance(cause, NonFiniteJSONError) else None
    if not location or location == "the body":
        return None
    return location.split(".", 1)[0].split("[", 1)[0]


def unreadable_body_message(cause: BaseException) -> str:
    """What was wrong with a body FastAPI could not parse, from the decoder's exception.

    FastAPI answers a bare "There was an error parsing the body" for bytes that are not UTF-8, an integer
    beyond Python's 4300-digit conversion limit, or nesting too deep to decode.
    """
    if isinstance(cause, NonFiniteJSONError):
        where = f" (at {cause.location})" if cause.location else ""
        return (f"the request body is not valid JSON: {cause}{where}; send a finite number (JSON has no NaN or "
                "Infinity), or null where the field takes it")
    if isinstance(cause, UnicodeDecodeError):
        return (f"the request body is not UTF-8 (byte 0x{cause.object[cause.start]:02x} at offset {cause.start}); "
                "send JSON encoded as UTF-8, with non-ASCII text as such or as \\u escapes")
    if isinstance(cause, RecursionError):
        return "the request body's JSON is nested too deeply to decode; send a flatter document"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return ("the request body holds an integer with more digits than JSON decoding allows (4300); send it "
                "as a string or a float")
    return f"the request body cannot be read as JSON ({type(cause).__name__}); send a UTF-8 JSON object"


# Other servers' routes clients call (llama.vim's /infill, LangChain's embeddings): what Solo serves instead.
_OTHER_SERVERS_ROUTES = {
    "/slots": "llama-server's; GET /metrics shows the running and waiting requests",
    **dict.fromkeys(("/embedding", "/embeddings", "/v1/embeddings"),
                    "an embeddings route; Solo serves no embeddings (it generates text): use an embedding server"),
    **dict.fromkeys(("/v1/score", "/score", "/v1/rerank", "/rerank", "/pooling"),
                    "vLLM's scoring / pooling; Solo serves none (it generates text)"),
}


def install_error_handlers(app: FastAPI, reply: Callable[[str, APIError], Response] | None = None) -> None:
    """Answer every error: APIError, SoloError, validation errors, 404/405, and bugs.

    Args:
        app: the application.
        reply: the response for an error on a path (the shape of the API the path belongs to); default
            OpenAI's shape.
    """
    shape = reply or (lambda _path, error: error.response())

    async def on_api_error(request: Request, exc: Exception) -> Response:
        return shape(request.url.path, api_error_from(exc))

    async def on_validation_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return shape(request.url.path, validation_error(exc.errors()))

    async def on_http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        message = {404: "no such route; see /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, "
                          "/v1/models, Ollama's /api/chat, /api/generate, /api/tags, /api/show, /api/ps, "
                          "/api/version, llama-server's /completion, /infill, /props, /apply-template, and /tokenize, "
                          "/detokenize, /health, /metrics, /version",
                   405: "this route does not accept that HTTP method"}.get(exc.status_code, str(exc.detail))
        path = request.url.path.rstrip("/")
        if exc.status_code == 404 and path in _OTHER_SERVERS_ROUTES:
            message = f"{request.url.path} is {_OTHER_SERVERS_ROUTES[path]}"
        elif exc.status_code == 404 and path.startswith("/v1/responses/"):
            message = ("Solo stores no responses, so none can be retrieved, cancelled or deleted; keep the reply you "
                       "got, and send the whole conversation in input")
        elif exc.status_code == 404 and path.startswith("/v1/messages/batches"):
            message = ("Solo runs no message batches (its requests answer at once); send each request to POST "
                       "/v1/messages")
        if exc.status_code == 400 and isinstance(exc.__cause__, APIError):  # (a body past --max-body-mb)
            return shape(request.url.path, exc.__cause__)
        if exc.status_code == 400 and isinstance(exc.__cause__, ClientDisconnect):  # (FastAPI's own body read)
            return await on_client_gone(request, exc.__cause__)
        param = None
        if exc.status_code == 400 and exc.__cause__ is not None:
            message, param = unreadable_body_message(exc.__cause__), unreadable_body_param(exc.__cause__)
        return shape(request.url.path, APIError(exc.status_code, message, type=kind, param=param,
                                                headers=exc.headers))

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        # (a dropped upload is the client's doing, as a dropped stream is: no traceback in the log)
        logger.debug("client left before its request body was read: %s %s", request.method, request.url.path)
        return shape(request.url.path, api_error_from(exc))

    async def on_bug(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error", exc_info=exc)
        return shape(request.url.path, api_error_from(exc))

    app.add_exception_handler(APIError, on_api_error)
    app.add_exception_handler(SoloError, on_api_error)
    app.add_exception_handler(QueueFullError, on_api_error)
    app.add_exception_handler(SchedulerStoppedError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(ClientDisconnect, on_client_gone)
    app.add_exception_handler(Exception, on_bug)
