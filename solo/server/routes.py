"""The HTTP routes: OpenAI's chat, completions and models; vLLM's tokenize and detokenize; health; metrics.

A generation route validates the body (pydantic, via FastAPI), then on a worker thread rejects a prompt too
long to possibly fit (from its size in bytes, without tokenizing it), tokenizes and prepares one `Request`
per choice; it submits them to the scheduler, then either streams server-sent events
(`data: {...}` ... `data: [DONE]`) or waits for every choice. A client that disconnects cancels its
generation: streaming responses are cancelled by Starlette when the client goes away, and non-streamed
ones watch for the disconnect themselves.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from solo.chat_template import allows_parallel_calls, check_continued, check_template_kwargs
from solo.engine.output_reader import OutputReader, splits_reasoning
from solo.engine.reasoning import (
    continues_reasoning,
    prompt_closes_reasoning,
    prompt_opens_reasoning,
)
from solo.engine.request import GenerationEvent
from solo.engine.request import Request as EngineRequest
from solo.engine.tool_calls import (
    ToolCall,
    arguments_as_objects,
    check_prefill_opens_no_call,
    check_tools,
    output_constraint,
    tool_parameters,
)
from solo.errors import InvalidRequestError
from solo.server.chat_adapter import thinking_switch
from solo.server.errors import APIError, StrictJSONRoute, api_error_from, shutting_down
from solo.server.logprobs import CompletionLogprobsBuilder, chat_logprobs, completion_logprobs
from solo.server.metrics import CONTENT_TYPE
from solo.server.protocol import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionTokensDetails,
    Delta,
    DetokenizeRequest,
    DetokenizeResponse,
    FunctionCall,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    TokenizeRequest,
    TokenizeResponse,
    ToolCallOut,
    Usage,
)
from solo.server.scheduler import Generation
from solo.server.state import ServerState

logger = logging.getLogger("solo.server")

router = APIRouter(route_class=StrictJSONRoute)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _state(request: Request) -> ServerState:
    return request.app.state.solo


def _sse(payload: BaseModel | dict) -> str:
    body = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload, ensure_ascii=False)
    return f"data: {body}\n\n"


_DONE = "data: [DONE]\n\n"


def _json(payload: BaseModel) -> Response:
    return Response(payload.model_dump_json(), media_type="application/json")


STREAM_STALL_S = 60.0
"""Seconds a stream may wait on a client that reads none of it (one send that does not complete) before its
generation is abandoned (`Generation.abandon`): the output it would have kept for that client is dropped, so
a client that never reads holds one chunk, not its whole reply (nginx's send_timeout is 60 s too)."""


def send_or_abandon(send: Send, generation: Generation) -> Send:
    """`send` for a streamed response that abandons `generation` when one body chunk waits `STREAM_STALL_S`.

    The chunk is still sent (the client may read again): the stream then ends with each choice's abort.
    """
    async def guarded(message: Any) -> None:  # noqa: ANN401
        if message["type"] != "http.response.body":
            await send(message)
            return
        try:
            # (no task per chunk: a timer; the server's send waits only before it writes, for the client to
            # drain the socket, so a send cut short there wrote nothing and is sent again below)
            async with asyncio.timeout(STREAM_STALL_S):
                await send(message)
                return
        except TimeoutError:
            logger.info("a client read nothing of its stream for %.0f s: its generation is abandoned",
                        STREAM_STALL_S)
            generation.abandon()
        await send(message)

    return guarded


class GenerationStream(StreamingResponse):
    """Server-sent events of one generation, cancelled however the response ends.

    Finished, client gone before or during streaming, server shutdown: the generation's slots are freed. A
    client that reads nothing for `STREAM_STALL_S` gets no more of it (`send_or_abandon`).
    """

    def __init__(self, events: AsyncIterator[str], generation: Generation, prompt_tokens: int = 0) -> None:
        super().__init__(events, media_type="text/event-stream", headers=_SSE_HEADERS)
        self.generation = generation
        self.prompt_tokens = prompt_tokens  # (for streams that announce it first: Anthropic's message_start)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the events; the generation is cancelled when the response ends, however it ends."""
        try:
            await super().__call__(scope, receive, send_or_abandon(send, self.generation))
        finally:
            # Also covers a client that left before the first event: the body iterator never started, so
            # its own cleanup would never run.
            self.generation.cancel()


@dataclass
class _Job:
    # One API request in flight: its generation, response id, and token counts for `usage`.
    generation: Generation
    response_id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))
    prompt_tokens: int = 0
    completion_tokens: int = 0
    choices_per_prompt: int = 1  # (n: choice i answers prompt i // n, as OpenAI numbers a batch's choices)
    cached_per_prompt: dict[int, int] = field(default_factory=dict)

    @property
    def cached_tokens(self) -> int:
        return sum(self.cached_per_prompt.values())

    def usage(self) -> Usage:
        return Usage(prompt_tokens=self.prompt_tokens, completion_tokens=self.completion_tokens,
                     total_tokens=self.prompt_tokens + self.completion_tokens,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens))

    def count(self, index: int, event: GenerationEvent) -> None:
        if event.stats is not None:
            self.completion_tokens += event.stats.completion_tokens
            # Each prompt is counted once however many choices (its best reuse is what was cached), and the
            # prompts of a batch add up, as prompt_tokens do.
            prompt = index // self.choices_per_prompt
            self.cached_per_prompt[prompt] = max(self.cached_per_prompt.get(prompt, 0), event.stats.cached_tokens)


async def _until_disconnected(request: Request) -> None:
    # After the body is read, the next ASGI message is http.disconnect (sent when the client goes away).
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def while_connected(work: Awaitable[None], request: Request) -> None:
    """Run `work` to its end (re-raising its failure), or stop it when the client closes the connection.

    Raises:
        APIError: 499 when the client left first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise APIError(499, "the client closed the connection", code="client_closed_request")
        task.result()  # re-raises a failure inside the scheduler
    finally:
        for running in (task, watcher):
            running.cancel()


async def _collect(job: _Job, request: Request, n: int) -> list[list[GenerationEvent]]:
    """Every choice's events (non-streamed responses); cancels the generation if the client leaves."""
    per_choice: list[list[GenerationEvent]] = [[] for _ in range(n)]

    async def gather() -> None:
        async for index, event in job.generation.events():
            per_choice[index].append(event)
            job.count(index, event)

    try:
        await while_connected(gather(), request)
        if job.completion_tokens == 0 and all(events and events[-1].finish_reason == "abort" for events in per_choice):
            # Ended by shutdown before any token: nothing was done, so say so (503, retry elsewhere) instead of
            # a 200 with empty text that only finish_reason tells apart from a real answer.
            raise shutting_down()
        return per_choice
    finally:
        job.generation.cancel()


def _utf8_len(text: str) -> int:
    # isascii() is O(1) in CPython, so ASCII text is measured without a copy. A lone surrogate (JSON can
    # carry one) counts as its 3 bytes.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


async def _submit(state: ServerState, prepare: Callable[[], list[EngineRequest]], priority: int = 0) -> Generation:
    # Tokenizing and rendering the chat template run on a worker thread, off the event loop.
    requests = await run_in_threadpool(prepare)
    return state.submit(requests, priority)


def _check_n(state: ServerState, n: int) -> None:
    capacity = state.settings.max_batch + state.settings.max_queue
    if n > capacity:
        raise InvalidRequestError(
            f"{n} choices can never fit this server (--max-batch {state.settings.max_batch} slots plus "
            f"--max-queue {state.settings.max_queue}); ask for at most {capacity}", param="n")


# ---------------------------------------------------------------------------------------------- chat

@router.post("/v1/chat/completions", response_model=None)
async def openai_chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """OpenAI's chat completions (streamed as server-sent events when `stream` is true).

    The tool results are checked against the calls they answer, as OpenAI's API does (`check_tool_results`);
    the other APIs run `chat_completions` after their own checks (Ollama's results name no call).
    """
    body.check_tool_results()
    return await chat_completions(body, request)


async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """A chat request run and answered in OpenAI's shape (the chat route's work, for every API)."""
    arrival = time.perf_counter()
    state = _state(request)
    engine, _ = state.require_ready(body.model)
    _check_n(state, body.n)
    extra = _template_variables(state, engine, body)
    budget_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    top = body.top_logprobs_count
    prompt_tokens = 0
    tools = _ToolSetup()

    def prepare() -> list[EngineRequest]:
        nonlocal prompt_tokens
        messages = arguments_as_objects([m.for_template() for m in body.messages])
        template = engine.tokenizer.chat_template
        tools.format, tool_list, choice = check_tools(body.tools, body.tool_choice,
                                                      template.source if template is not None else None,
                                                      template.tool_format if template is not None else None)
        tools.parallel = allows_parallel_calls(template, body.parallel_tool_calls)
        response_format, tools.forced = output_constraint(tools.format, tool_list, choice, tools.parallel,
                                                          body.structured_output())
        tools.named = isinstance(choice, Mapping)
        if choice == "none":
            tools.format = None
        tools.parameters = tool_parameters(tool_list)
        if body.continue_final_message:
            check_continued(messages[-1], response_format)
            check_prefill_opens_no_call(tools.format, messages[-1].get("content"))
        # The template adds to the contents (some trim them), so their bytes bound the prompt from below;
        # then the rendered text, which also holds tools and template extras, is bounded the same way.
        content = sum(_utf8_len(m["content"].strip()) for m in messages if isinstance(m.get("content"), str))
        state.check_prompt_size(content, body.completion_budget, budget_param, "messages")
        text = engine.tokenizer.render_chat(messages, body.add_generation_prompt, tools=tool_list or None,
                                            continue_final_message=body.continue_final_message, **extra)
        state.check_prompt_size(_utf8_len(text), body.completion_budget, budget_param, "messages")
        # A thinking model's block is split off unless a grammar holds the output from its first token.
        # (Strict functions under auto leave the text around calls free: the block is split off there too.)
        tools.reasoning = splits_reasoning(state.reasoning, getattr(response_format, "source", None)
                                           if response_format is not None else None, tools.forced)
        tools.in_reasoning = tools.reasoning and (prompt_opens_reasoning(text)
                                                  or (state.settings.reasoning_parser == "deepseek_r1"
                                                      and not prompt_closes_reasoning(text))
                                                  or (body.continue_final_message
                                                      and continues_reasoning(str(messages[-1].get("content")))))
        # Encoded without adding special tokens, as Tokenizer.encode_chat does (templates write BOS).
        ids = engine.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise InvalidRequestError("the messages encode to no tokens; give some text", param="messages")
        prompt_tokens = len(ids)
        max_tokens = state.completion_budget(len(ids), body.completion_budget, None, budget_param, "messages")
        return [engine.make_request(ids, body.sampling_params(max_tokens, top, i, response_format),
                                    fallback_temperature=1.0, start_time=arrival, rendered_chat=True)
                for i in range(body.n)]

    generation = await _submit(state, prepare, body.priority)
    job = _Job(generation, f"chatcmpl-{uuid.uuid4().hex}", state.served_name, prompt_tokens=prompt_tokens,
               choices_per_prompt=body.n)
    if body.stream:
        return GenerationStream(_chat_stream(state, job, body, tools), generation, prompt_tokens)
    per_choice = await _collect(job, request, body.n)
    choices, afters = [], []
    reasoning_tokens = 0
    for index, events in enumerate(per_choice):
        infos = [info for e in events for info in (e.logprobs or [])]
        finish_reason = events[-1].finish_reason if events else None
        reader = tools.reader(engine)
        reasoning_parts, content_parts = [], []
        for e in events:
            reasoning_delta, content_delta = reader.feed(e.text, e.token_ids)
            reasoning_parts.append(reasoning_delta)
            content_parts.append(content_delta)
        reasoning_rest, before, calls, after = reader.finish_in_order()
        content: str | None = "".join(content_parts) + before + after
        afters.append(after)
        calls = calls if tools.parallel else calls[:1]  # OpenAI: at most one call
        if calls or tools.forced:  # (a forced call max_tokens cut, left out: no text either, null as OpenAI's)
            content = content or None
        if calls:
            finish_reason = tools.finish_reason(finish_reason)
        reasoning = ("".join(reasoning_parts) + reasoning_rest) or None  # (an empty block: none, as streamed)
        reasoning_tokens += reader.reasoning_tokens
        choices.append(ChatChoice(
            index=index,
            message=AssistantMessage(content=content, reasoning_content=reasoning, tool_calls=[
                ToolCallOut(id=c.id, function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls
            ] or None),
            logprobs=chat_logprobs(state.pieces, infos) if top is not None else None,  # type: ignore[arg-type]
            finish_reason=finish_reason, stop_reason=events[-1].stop_reason if events else None,
        ))
    reply = _json(ChatCompletion(id=job.response_id, created=job.created, model=job.model, choices=choices,
                                 usage=_with_reasoning(job.usage(), tools, reasoning_tokens)))
    # Per choice, the end of its content that came after its tool calls: routes whose replies are ordered blocks
    # (Anthropic's, Responses') put it after the calls, as their streams do.
    reply.content_after_calls = afters  # type: ignore[attr-defined]
    return reply


def _with_reasoning(usage: Usage, tools: _ToolSetup, reasoning_tokens: int) -> Usage:
    # A chat reply whose reasoning is split off counts its tokens, as OpenAI's completion_tokens_details does.
    if tools.reasoning:
        usage.completion_tokens_details = CompletionTokensDetails(reasoning_tokens=reasoning_tokens)
    return usage


@dataclass
class _ToolSetup:
    # How a chat request's output is read: the tool-call syntax (None: plain content), whether the output was
    # constrained to tool calls, and whether a thinking model's block is split off (opened by the prompt).
    format: str | None = None
    forced: bool = False
    reasoning: bool = False
    in_reasoning: bool = False
    parameters: dict[str, dict[str, Any]] | None = None  # function name -> parameters schema (typed XML values)
    parallel: bool = True  # several calls in a reply (parallel_tool_calls, unless the template takes one only)
    named: bool = False  # tool_choice names a function

    def finish_reason(self, reason: str | None) -> str | None:
        # A reply with calls that ended on its own: "tool_calls", except where tool_choice named the function,
        # which OpenAI's API (and vLLM) answer with "stop".
        return "tool_calls" if reason == "stop" and not self.named else reason

    def reader(self, engine: Any) -> OutputReader:  # noqa: ANN401
        return OutputReader.for_reply(self.format, engine.tokenizer.special_token_ids(), self.forced,
                                      self.parameters, self.reasoning, self.in_reasoning)


def _tool_call_deltas(calls: list[ToolCall]) -> list[Delta]:
    # OpenAI streams a call's id, type and name first, then its arguments.
    deltas = []
    for i, call in enumerate(calls):
        deltas.append(Delta(tool_calls=[{"index": i, "id": call.id, "type": "function",
                                         "function": {"name": call.name, "arguments": ""}}]))
        deltas.append(Delta(tool_calls=[{"index": i, "function": {"arguments": call.arguments}}]))
    return deltas


async def _chat_stream(state: ServerState, job: _Job, body: ChatCompletionRequest, tools: _ToolSetup
                       ) -> AsyncIterator[str]:
    def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> str:
        return _sse(ChatCompletionChunk(id=job.response_id, created=job.created, model=job.model, choices=choices,
                                        usage=usage))

    want_logprobs = body.top_logprobs_count is not None
    engine = state.engine
    readers = [tools.reader(engine) for _ in range(body.n)]
    try:
        # The first chunk of each choice carries the role, as OpenAI's does.
        for index in range(body.n):
            yield chunk([ChatChunkChoice(index=index, delta=Delta(role="assistant", content=""))])
        async for index, event in job.generation.events():
            job.count(index, event)
            logprobs: ChatLogprobs | None = None
            if want_logprobs and event.logprobs:
                logprobs = chat_logprobs(state.pieces, event.logprobs)  # type: ignore[arg-type]
            finish_reason = event.finish_reason
            reader = readers[index]
            reasoning, text = reader.feed(event.text, event.token_ids)
            if finish_reason is not None:
                # In the reply's order: what came before the calls, the calls, then the text after them.
                reasoning_rest, before, calls, after = reader.finish_in_order()
                calls = calls if tools.parallel else calls[:1]  # OpenAI: at most one call
                reasoning, text = reasoning + reasoning_rest, text + before
                if calls:
                    if reasoning or text:
                        yield chunk([ChatChunkChoice(index=index, delta=Delta(reasoning_content=reasoning or None,
                                                                              content=text or None))])
                        reasoning = ""
                    for delta in _tool_call_deltas(calls):
                        yield chunk([ChatChunkChoice(index=index, delta=delta)])
                    finish_reason = tools.finish_reason(finish_reason)
                    text = after
            if not text and not reasoning and logprobs is None and finish_reason is None:
                continue  # text held back (an incomplete character, a possible stop string, marker or tool call)
            delta = Delta(reasoning_content=reasoning or None, content=text or None)
            yield chunk([ChatChunkChoice(index=index, delta=delta, logprobs=logprobs, finish_reason=finish_reason,
                                         stop_reason=event.stop_reason if finish_reason is not None else None)])
        if body.include_usage:
            yield chunk([], _with_reasoning(job.usage(), tools, sum(r.reasoning_tokens for r in readers)))
        yield _DONE
    except Exception as exc:  # a failure inside the scheduler: end the stream with an error event
        yield _error_event(exc)


def _error_event(exc: Exception) -> str:
    error = api_error_from(exc)
    if error.status >= 500 and error.status != 503:  # (a 503 is a state of the server, said where it arose)
        logger.error("stream failed", exc_info=exc)
    return _sse(error.body()) + _DONE


# --------------------------------------------------------------------------------------- completions

@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    """OpenAI's (legacy) text completions; `prompt` may be a batch, giving n choices per prompt."""
    arrival = time.perf_counter()
    state = _state(request)
    engine, _ = state.require_ready(body.model)
    prompts = body.prompts()
    _check_n(state, body.n * len(prompts))
    prompt_tokens = 0

    def prepare() -> list[EngineRequest]:
        nonlocal prompt_tokens
        requests = []
        response_format = body.structured_output()
        suffix = body.suffix or None  # fill-in-the-middle (an empty suffix is none, as OpenAI's)
        # Every prompt is checked for size before any is tokenized.
        for prompt in prompts:
            if suffix is not None and not isinstance(prompt, str):
                raise InvalidRequestError("suffix fills in the gap after a text prompt; send the prompt as text, "
                                          "not token ids", param="suffix")
            if isinstance(prompt, str):
                state.check_prompt_size(_utf8_len(prompt) + _utf8_len(suffix or ""), body.max_tokens)
            else:
                state.completion_budget(len(prompt), body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)
        for prompt in prompts:
            if isinstance(prompt, str):
                ids = engine.encode_prompt(prompt) if suffix is None else engine.infill_ids(prompt, suffix)
                if not ids:
                    raise InvalidRequestError("the prompt encodes to no tokens; give some text", param="prompt")
            else:
                ids = engine.encode_prompt(prompt)  # checks the ids against the vocabulary
            prompt_tokens += len(ids)
            max_tokens = state.completion_budget(len(ids), body.max_tokens, COMPLETIONS_DEFAULT_MAX_TOKENS)
            # (a FIM layout's ids end at the FIM end tokens: make_request finds the middle marker in them)
            requests += [engine.make_request(ids, body.sampling_params(max_tokens, body.logprobs, i, response_format),
                                             fallback_temperature=1.0, start_time=arrival) for i in range(body.n)]
        return requests

    generation = await _submit(state, prepare, body.priority)
    job = _Job(generation, f"cmpl-{uuid.uuid4().hex}", state.served_name, prompt_tokens=prompt_tokens,
               choices_per_prompt=body.n)
    n = body.n * len(prompts)
    if body.stream:
        token_entries = getattr(request.state, TOKEN_LOGPROBS, False)
        return GenerationStream(_completion_stream(state, job, body, n, token_entries), generation)
    per_choice = await _collect(job, request, n)
    choices = []
    for index, events in enumerate(per_choice):
        infos = [info for e in events for info in (e.logprobs or [])]
        logprobs = completion_logprobs(state.pieces, infos, 0, _skipped_ids(engine, body)) \
            if body.logprobs is not None else None  # type: ignore[arg-type]
        choices.append(CompletionChoice(index=index, text="".join(e.text for e in events), logprobs=logprobs,
                                        finish_reason=events[-1].finish_reason if events else None,
                                        stop_reason=events[-1].stop_reason if events else None))
    return _json(Completion(id=job.response_id, created=job.created, model=job.model, choices=choices,
                            usage=job.usage()))


TOKEN_LOGPROBS = "solo_token_logprobs"
"""A `request.state` attribute: set true by a route that streams `/v1/completions` internally (Ollama's raw
generate), each streamed choice with logprobs also carries `token_logprobs`, the chat shape's per-token entries
(exact bytes, exactly the requested alternatives): the completions shape keys alternatives by their text, so two
tokens that both show as U+FFFD (parts of one character) collapse into one."""


async def _completion_stream(state: ServerState, job: _Job, body: CompletionRequest, n: int,
                             token_entries: bool = False) -> AsyncIterator[str]:
    skipped = _skipped_ids(state.engine, body)
    builders = [CompletionLogprobsBuilder(state.pieces, skipped_ids=skipped) for _ in range(n)]
    try:
        async for index, event in job.generation.events():
            job.count(index, event)
            logprobs: CompletionLogprobs | None = None
            if body.logprobs is not None and event.logprobs:
                logprobs = builders[index].add(event.logprobs)  # type: ignore[arg-type]
            if not event.text and logprobs is None and event.finish_reason is None:
                continue
            choice = CompletionChoice(index=index, text=event.text, logprobs=logprobs,
                                      finish_reason=event.finish_reason, stop_reason=event.stop_reason)
            payload: Completion | dict = Completion(id=job.response_id, created=job.created, model=job.model,
                                                    choices=[choice])
            if token_entries and logprobs is not None:
                payload = payload.model_dump()
                payload["choices"][0]["token_logprobs"] = \
                    chat_logprobs(state.pieces, event.logprobs).model_dump()["content"]  # type: ignore[arg-type]
            yield _sse(payload)
        if body.include_usage:
            yield _sse(Completion(id=job.response_id, created=job.created, model=job.model, choices=[],
                                  usage=job.usage()))
        yield _DONE
    except Exception as exc:
        yield _error_event(exc)


def _skipped_ids(engine: Any, body: CompletionRequest) -> frozenset[int]:  # noqa: ANN401
    # Tokens the returned text leaves out (its special tokens, unless skip_special_tokens is false).
    return frozenset(engine.tokenizer.special_token_ids().values()) if body.skip_special_tokens else frozenset()


# ------------------------------------------------------------------------------------ everything else

@router.get("/v1/models")
async def models(request: Request) -> ModelList:
    """The served model (OpenAI's list shape)."""
    state = _state(request)
    state.require_ready()
    return ModelList(data=[_model_card(state)])


@router.get("/v1/models/{model:path}")
async def model(model: str, request: Request) -> ModelCard:
    """One model by id (OpenAI's retrieve); 404 for an id this server does not serve.

    The id may hold slashes ("org/name"); clients send them percent-encoded.
    """
    state = _state(request)
    state.require_ready(model)
    return _model_card(state)


def _model_card(state: ServerState) -> ModelCard:
    return ModelCard(id=state.served_name, created=state.created, max_model_len=state.max_model_len)


def chat_prompt_ids(state: ServerState, engine: Any, body: Any) -> list[int]:  # noqa: ANN401
    """Token ids of a request's chat prompt, rendered as the chat route renders it (no request is run).

    See `chat_prompt_text` for the arguments and errors.
    """
    return engine.tokenizer.encode(chat_prompt_text(state, engine, body), add_special_tokens=False)


def content_bytes(body: Any) -> int:  # noqa: ANN401
    """UTF-8 bytes of a chat request's text contents: a lower bound of its rendered prompt's, read without rendering."""
    messages = (m.for_template() for m in body.messages)
    return sum(_utf8_len(m["content"]) for m in messages if isinstance(m.get("content"), str))


def counted_chat_prompt_ids(state: ServerState, engine: Any, body: Any) -> list[int]:  # noqa: ANN401
    """`chat_prompt_ids` for the routes that only count tokens: the rendered text's size is checked first.

    Raises:
        InvalidRequestError: as `chat_prompt_text`, or the text is too large to count
            (`ServerState.check_count_size`).
    """
    text = chat_prompt_text(state, engine, body)
    state.check_count_size(_utf8_len(text), "messages")
    return engine.tokenizer.encode(text, add_special_tokens=False)


def _template_variables(state: ServerState, engine: Any, body: Any) -> dict[str, Any]:  # noqa: ANN401
    # The chat template's extra variables: chat_template_kwargs checked, and the one reasoning_effort Solo
    # honours, "none" (thinking off, as the other APIs' ways).
    template = engine.tokenizer.chat_template
    extra = check_template_kwargs(body.chat_template_kwargs, template.source if template is not None else None,
                                  thinks=state.reasoning)
    if getattr(body, "reasoning_effort", None) == "none":
        if extra.get("enable_thinking") is True:
            raise InvalidRequestError('reasoning_effort "none" turns thinking off, and chat_template_kwargs '
                                      "enable_thinking: true turns it on; send one of them", param="reasoning_effort")
        if thinking_switch(state, True, "reasoning_effort"):
            extra = {**extra, "enable_thinking": False}
    return extra


def chat_prompt_text(state: ServerState, engine: Any, body: Any) -> str:  # noqa: ANN401
    """A request's chat prompt as text, rendered as the chat route renders it (no request is run).

    Args:
        state: the server's state.
        engine: the served engine.
        body: a request with the chat fields (`ChatCompletionRequest`, `TokenizeRequest`): messages, tools,
            chat_template_kwargs, add_generation_prompt, continue_final_message.

    Raises:
        InvalidRequestError: bad tools or template variables, or messages the template rejects.
    """
    template = engine.tokenizer.chat_template
    extra = _template_variables(state, engine, body)
    _, tools, _ = check_tools(body.tools, "none", template.source if template is not None else None)
    return engine.tokenizer.render_chat(arguments_as_objects([m.for_template() for m in body.messages]),
                                        body.add_generation_prompt, tools=tools or None,
                                        continue_final_message=body.continue_final_message, **extra)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    """Token ids of a prompt or of chat messages (vLLM's /tokenize)."""
    state = _state(request)
    engine, _ = state.require_ready(body.model)

    def encode() -> list[int]:
        if body.messages is not None:
            return counted_chat_prompt_ids(state, engine, body)
        if body.content is not None:  # llama-server's form
            tokenizer = engine.tokenizer
            bos = tokenizer.encode("", add_special_tokens=True) if body.add_special else []
            text = (tokenizer.encode(body.content, add_special_tokens=False) if body.parse_special
                    else tokenizer.encode_plain(body.content))
            return [*bos, *text]
        assert body.prompt is not None
        return engine.tokenizer.encode(body.prompt, body.add_special_tokens)

    def with_pieces(ids: list[int]) -> list[dict[str, Any]]:
        tokens = []
        for token_id in ids:
            _, raw = state.pieces.get(token_id)  # type: ignore[union-attr]
            try:
                piece: str | list[int] = raw.decode("utf-8")
            except UnicodeDecodeError:  # (part of a character: its bytes, as llama-server gives them)
                piece = list(raw)
            tokens.append({"id": token_id, "piece": piece})
        return tokens

    for text, param in ((body.prompt, "prompt"), (body.content, "content")):
        if text is not None:
            state.check_count_size(_utf8_len(text), param)
    ids = await run_in_threadpool(encode)
    strs = [engine.tokenizer.token_string(i) for i in ids] if body.return_token_strs else None
    tokens: list = await run_in_threadpool(with_pieces, ids) if body.with_pieces else ids
    return TokenizeResponse(count=len(ids), max_model_len=state.max_model_len, tokens=tokens, token_strs=strs)


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    """Text of token ids (vLLM's /detokenize); special tokens are kept."""
    state = _state(request)
    engine, _ = state.require_ready(body.model)
    vocab = engine.config.vocab_size
    bad = [t for t in body.tokens if t >= vocab]
    if bad:
        raise InvalidRequestError(f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="tokens")
    text = engine.tokenizer.decode(body.tokens, skip_special_tokens=False)
    return DetokenizeResponse(prompt=text, content=text)


@router.api_route("/health", methods=["GET", "HEAD"])
async def health(request: Request) -> JSONResponse:
    """200 {"status": "ok"} when ready; 503 while loading, after a failed load, or when shutting down."""
    state = _state(request)
    status = state.status
    return JSONResponse({"status": status}, status_code=200 if status == "ok" else 503)


@router.api_route("/version", methods=["GET", "HEAD"])
async def version() -> JSONResponse:
    """{"version": Solo's version} (vLLM's GET /version, which clients probe)."""
    from solo import __version__

    return JSONResponse({"version": __version__})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus metrics in the text exposition format."""
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)
