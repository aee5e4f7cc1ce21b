"""llama-server's own API: `POST /completion`, `POST /infill`, `GET /props`, `POST /apply-template`.

Tools written for llama.cpp's server reach `solo serve` at its address: llama.vim and llama.vscode complete
code at the cursor through `/infill` (with code from other open files in `input_extra`), Continue's llama.cpp
provider and scripts call `/completion`. A request becomes the `/v1/completions` request it means (`n_predict`
-> `max_tokens`, `repeat_penalty` -> `repetition_penalty`, `grammar` -> a GBNF grammar, `json_schema` -> a JSON
schema, `logit_bias` pairs -> OpenAI's map), runs through that route, and comes back in llama-server's shape:
`content`, `stop`, `stop_type` ("eos", "word" with `stopping_word`, "limit"), `tokens_predicted`,
`tokens_evaluated`, `tokens_cached`, `truncated`, `timings` (`prompt_n`, `prompt_ms`, `predicted_per_second`,
...), `generation_settings`; streamed (`stream: true`) as server-sent events `data: {"content": ..., "stop":
false}`, the last one `stop: true` with the statistics. `response_fields` keeps only the fields named (a name
with a slash, `timings/prompt_n`, lifts a nested one, as llama-server does).

`/infill` lays out `input_extra` (other files, oldest first), `input_prefix`, `input_suffix` and `prompt` (the
middle's start) with the model's FIM tokens in llama-server's order (`solo.engine.fim.infill_layout`); what does
not fit the context (after room for `n_predict`) is left out as llama-server leaves it out, the oldest files
first, then the prefix's start and the suffix's end, and the reply says so (`truncated: true`). `n_indent` ends
the middle at a line indented less than asked, and `t_max_predict_ms` after that time once a line is complete,
as llama-server does for editors. `n_predict: 0` evaluates the prompt (filling the prefix cache) and writes
nothing; -1 (the default) writes until the context ends. Without `samplers`, sampling values left out are the
model's (generation_config.json), as on Solo's other routes, not llama-server's defaults; with `samplers`, the
samplers it leaves out are off (temperature: 1, plain sampling), as in llama-server.

Differences, each said where it applies: Solo applies its samplers in one order (penalties, temperature,
top-k, top-p, min-p), so `samplers` chooses which apply, not their order; llama-server's `infill` sampler (which
merges candidates sharing a prefix) has no counterpart and listing it changes nothing; repetition penalties
cover the whole sequence (`repeat_last_n` -1 or 0 beside one); `tokens` is always empty (`return_tokens` and
`n_probs` are refused: `/v1/completions` has `logprobs`); one prompt per request; fields that place work in
llama-server's slots or shift its context (`id_slot`, `n_keep`, `n_discard`, `n_cache_reuse`,
`t_max_prompt_ms`, which llama-server does not enforce either) change nothing; sampling Solo does not have
(`mirostat`, `typical_p`, DRY, XTC, `top_n_sigma`, dynamic temperature) is taken only at its off value.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from solo import __version__
from solo.errors import ContextLengthError, InvalidRequestError
from solo.server.chat_adapter import chat_chunks, chat_request_from
from solo.server.errors import APIError, shutting_down, unreadable_body_message
from solo.server.protocol import CompletionRequest

router = APIRouter()

# llama-server's field -> the completions route's.
_RENAMED = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty", "grammar": "guided_grammar",
            "json_schema": "guided_json"}
_FIELD_NAMES = {route: ours for ours, route in _RENAMED.items()}
_PASSED = ("model", "temperature", "top_k", "top_p", "min_p", "seed", "stop", "ignore_eos", "presence_penalty",
           "frequency_penalty", "repeat_penalty", "grammar", "json_schema", "cache_prompt")
# Sampling Solo does not have, taken at the value that turns it off.
_OFF_VALUES = {"mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0,
               "dynatemp_range": 0.0, "min_keep": 0, "n_probs": 0, "return_tokens": False, "timings_per_token": False,
               "return_progress": False, "post_sampling_probs": False, "n_cmpl": 1, "lora": []}
# Fields that tune a sampler only while it is on (all of the above are off), or place work in llama-server's
# slots, or shift its context: nothing Solo generates depends on them.
_NO_EFFECT = frozenset({"mirostat_tau", "mirostat_eta", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                        "dry_sequence_breakers", "xtc_threshold", "dynatemp_exponent", "id_slot", "n_keep",
                        "n_discard", "n_cache_reuse", "t_max_prompt_ms"})
_OWN = frozenset({"prompt", "n_predict", "stream", "samplers", "t_max_predict_ms", "n_indent", "response_fields",
                  "repeat_last_n", "logit_bias"})
_INFILL_OWN = frozenset({"input_prefix", "input_suffix", "input_extra"})
# Sampler names (llama.cpp's and their aliases) -> Solo's sampling field each turns on.
_SAMPLERS = {"top_k": "top_k", "top_p": "top_p", "nucleus": "top_p", "min_p": "min_p", "temperature": "temperature",
             "temp": "temperature", "penalties": "penalties", "infill": None, "dry": None, "typ_p": None,
             "typical_p": None, "typical": None, "xtc": None, "top_n_sigma": None}
_OFF_SAMPLING = {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
_PENALTIES = ("repetition_penalty", "presence_penalty", "frequency_penalty")


def _typed(data: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:  # noqa: ANN401
    # data[name] if it is of `kind` (null or absent: None).
    value = data.get(name)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple)
                                                                                 else (kind,))):
        raise InvalidRequestError(f"{name} must be {what}, got {value!r:.40}", param=name)
    return value


class _Ask:
    """One llama-server request, checked: the completions route's fields and what this module does itself."""

    def __init__(self, data: Mapping[str, Any], infill: bool) -> None:
        known = _OWN | _NO_EFFECT | set(_PASSED) | set(_OFF_VALUES) | (_INFILL_OWN if infill else set())
        route = "/infill" if infill else "/completion"
        for name in data:
            if name not in known:
                raise InvalidRequestError(f"{name} is not a field of llama-server's {route} that Solo knows; leave it "
                                          "out", param=name)
        for name, off in _OFF_VALUES.items():
            value = data.get(name)
            if value is not None and value != off and not (name == "top_n_sigma" and _number(value) and value <= 0):
                why = {"n_probs": "send logprobs to /v1/completions for token probabilities",
                       "return_tokens": "POST /tokenize gives the ids of a text",
                       "n_cmpl": "send one request per completion", "lora": "Solo serves no LoRA adapters"
                       }.get(name, f"Solo has no {name} sampling")
                raise InvalidRequestError(f"{name} is not supported by Solo ({why}); leave it out or set it to "
                                          f"{json.dumps(off)}", param=name)
        self.stream = bool(_typed(data, "stream", bool, "true or false"))
        predict = _typed(data, "n_predict", int, "an integer")
        if predict is not None and predict < -1:
            raise InvalidRequestError(f"n_predict must be -1 (until the context ends), 0 (evaluate the prompt only) or "
                                      f"a positive number of tokens, got {predict}", param="n_predict")
        self.n_predict = -1 if predict is None else predict
        self.n_indent = _typed(data, "n_indent", int, "an integer") or 0
        if self.n_indent < 0:
            raise InvalidRequestError(f"n_indent must be 0 (no limit) or a number of blanks, got {self.n_indent}",
                                      param="n_indent")
        limit_ms = _typed(data, "t_max_predict_ms", (int, float), "a number of milliseconds")
        self.t_max_predict_s = limit_ms / 1e3 if limit_ms and limit_ms > 0 else None
        fields = _typed(data, "response_fields", list, "a list of field names")
        if fields is not None and not all(isinstance(f, str) for f in fields):
            raise InvalidRequestError("response_fields must be a list of field names (strings)",
                                      param="response_fields")
        self.response_fields: list[str] | None = fields
        self.fields: dict[str, Any] = {_RENAMED.get(k, k): data[k] for k in _PASSED if data.get(k) is not None}
        seed = self.fields.get("seed")
        if seed == -1 or (isinstance(seed, int) and not isinstance(seed, bool) and seed == 0xFFFFFFFF):
            del self.fields["seed"]  # (llama-server's random seed)
        temperature = self.fields.get("temperature")
        if _number(temperature) and temperature < 0:
            self.fields["temperature"] = 0.0  # llama-server: below 0, greedy
        self._penalty_window(data)
        self._samplers(data.get("samplers"))
        bias = _logit_bias(data.get("logit_bias"))
        if bias is not None:
            self.fields["logit_bias"] = bias
        self.samplers = data.get("samplers")

    def _penalty_window(self, data: Mapping[str, Any]) -> None:
        window = data.get("repeat_last_n")
        if window is not None and (not isinstance(window, int) or isinstance(window, bool)):
            raise InvalidRequestError(f"repeat_last_n must be an integer, got {window!r:.40}", param="repeat_last_n")
        penalized = any(self.fields.get(name) not in (None, 0, 0.0) for name in _PENALTIES[1:]) or \
            self.fields.get("repetition_penalty") not in (None, 1, 1.0)
        if window not in (None, -1, 0) and penalized:
            raise InvalidRequestError("repeat_last_n: Solo's penalties cover the whole sequence (as vLLM's); beside "
                                      "repeat_penalty, presence_penalty or frequency_penalty set repeat_last_n to -1 "
                                      "(the whole sequence) or 0 (no penalty), or leave it out", param="repeat_last_n")
        if window == 0:
            for name in _PENALTIES:  # (a window of no tokens penalizes nothing)
                self.fields.pop(name, None)

    def _samplers(self, samplers: Any) -> None:  # noqa: ANN401
        if samplers is None:
            return
        if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
            raise InvalidRequestError('samplers must be a list of sampler names, such as ["top_k", "top_p", '
                                      '"temperature"]', param="samplers")
        on = set()
        for name in samplers:
            key = name.strip().lower().replace("-", "_")
            if key not in _SAMPLERS:
                raise InvalidRequestError(f"samplers: {name!r} is not a sampler Solo knows; use top_k, top_p, min_p, "
                                          "temperature, penalties (and llama.cpp's others at their off values)",
                                          param="samplers")
            on.add(_SAMPLERS[key])
        for name, off in _OFF_SAMPLING.items():
            if name not in on:
                self.fields[name] = off
        if "penalties" not in on:
            for name in _PENALTIES:
                self.fields.pop(name, None)

    def settings(self, n_ctx: int, model: str) -> dict[str, Any]:
        """llama-server's `generation_settings`: what this request asked for (null: the model's default)."""
        out = {"n_ctx": n_ctx, "n_predict": self.n_predict, "model": model, "stream": self.stream,
               "n_indent": self.n_indent, "t_max_predict_ms": (self.t_max_predict_s or 0) * 1e3,
               "samplers": self.samplers}
        for ours, route in (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                            ("min_p", "min_p"), ("seed", "seed"), ("repeat_penalty", "repetition_penalty"),
                            ("presence_penalty", "presence_penalty"), ("frequency_penalty", "frequency_penalty"),
                            ("ignore_eos", "ignore_eos"), ("stop", "stop")):
            out[ours] = self.fields.get(route)
        return out


def _number(value: Any) -> bool:  # noqa: ANN401
    return isinstance(value, int | float) and not isinstance(value, bool)


def _logit_bias(value: Any) -> dict[str, float] | None:  # noqa: ANN401
    """llama-server's logit_bias ([[id, bias], ...], a bias of false bans; or OpenAI's {"id": bias}) as OpenAI's map.

    Raises:
        InvalidRequestError: not one of those shapes, or a token given as text (send its ids: POST /tokenize).
    """
    if value is None:
        return None
    pairs = list(value.items()) if isinstance(value, Mapping) else value
    if not isinstance(pairs, list):
        raise InvalidRequestError('logit_bias must be a list of [token id, bias] pairs or an object {"id": bias}',
                                  param="logit_bias")
    out: dict[str, float] = {}
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2:
            raise InvalidRequestError(f"logit_bias entries are [token id, bias] pairs, got {pair!r:.40}",
                                      param="logit_bias")
        token, bias = pair
        if isinstance(token, str) and token.strip().isdigit():
            token = int(token)
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidRequestError(f"logit_bias: Solo takes token ids, not text ({token!r:.40}); POST /tokenize "
                                      "gives a text's ids", param="logit_bias")
        if bias is False:
            bias = -100.0  # (a ban: OpenAI's lowest bias)
        if not _number(bias):
            raise InvalidRequestError(f"logit_bias: the bias of token {token} must be a number or false, got "
                                      f"{bias!r:.40}", param="logit_bias")
        out[str(token)] = float(bias)
    return out


async def _body(request: Request) -> dict[str, Any]:
    try:
        data = await request.json()
    except (ValueError, RecursionError) as exc:
        raise InvalidRequestError(unreadable_body_message(exc) if not isinstance(exc, json.JSONDecodeError)
                                  else "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the request body must be a JSON object")
    return data


def _prompt_ids(engine: Any, prompt: Any) -> list[int]:  # noqa: ANN401
    """A /completion prompt's ids: a text, token ids, or a mix (texts encoded, BOS only before a leading text).

    Raises:
        InvalidRequestError: several prompts, an empty one, or something else.
    """
    if isinstance(prompt, str):
        parts: list[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str | int) and not isinstance(p, bool)
                                                     for p in prompt):
        if len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
            raise InvalidRequestError("prompt is a list of prompts; Solo's /completion takes one prompt per request "
                                      "(send several requests, or use /v1/completions)", param="prompt")
        parts = prompt
    else:
        raise InvalidRequestError("prompt must be a string, a list of token ids, or a list mixing strings and token "
                                  f"ids, got {prompt!r:.40}", param="prompt")
    ids: list[int] = []
    for index, part in enumerate(parts):
        if isinstance(part, str):
            ids += engine.tokenizer.encode(part, add_special_tokens=index == 0)
        else:
            ids.append(part)
    if not ids:
        raise InvalidRequestError("prompt is empty; give text or token ids", param="prompt")
    return engine.encode_prompt(ids)  # (checks the ids against the vocabulary)


def _infill_ids(engine: Any, data: Mapping[str, Any], budget: int) -> tuple[list[int], bool]:  # noqa: ANN401
    """An /infill request's layout, fitted in `budget` tokens; whether anything was left out."""
    prefix = _typed(data, "input_prefix", str, "a string") or ""
    suffix = _typed(data, "input_suffix", str, "a string") or ""
    middle = _typed(data, "prompt", str, "a string (the middle's start, after the FIM middle token)") or ""
    extra = _typed(data, "input_extra", list, 'a list of {"filename": ..., "text": ...} objects') or []
    files = []
    for index, chunk in enumerate(extra):
        if not isinstance(chunk, Mapping) or not isinstance(chunk.get("text", ""), str) \
                or not isinstance(chunk.get("filename", ""), str) or set(chunk) - {"filename", "text"}:
            raise InvalidRequestError(f'input_extra[{index}] must be {{"filename": string, "text": string}}, got '
                                      f"{chunk!r:.60}", param="input_extra")
        files.append((chunk.get("filename") or "tmp", chunk.get("text") or ""))
    try:
        layout = engine.infill_layout(prefix, suffix, files, middle, budget)
    except InvalidRequestError as exc:
        exc.param = {"suffix": "input_suffix", "middle": "prompt", "files": "input_extra"}.get(exc.param or "",
                                                                                               exc.param)
        raise
    return layout.ids, layout.truncated


class _Reply:
    """One reply assembled from the completions stream, with llama-server's early stops and statistics."""

    def __init__(self, ask: _Ask, start: float) -> None:
        self.ask, self.start = ask, start
        self.text = ""
        self.first: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.usage: dict[str, Any] = {}
        self.cut = False  # ended here (n_indent, t_max_predict_ms), not by the engine

    def feed(self, chunk: Mapping[str, Any]) -> str:
        """Take one chunk of the completions stream; returns the text it adds (after any early stop)."""
        self.usage = chunk.get("usage") or self.usage
        added = ""
        for choice in chunk.get("choices", []):
            text = choice.get("text") or ""
            if self.first is None and (text or choice.get("finish_reason")):
                self.first = time.perf_counter()
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            self.stop_reason = choice.get("stop_reason", self.stop_reason)
            if self.ask.n_predict == 0 or self.cut:
                continue
            before = len(self.text)
            self.text += text
            at = indent_cut(self.text, self.ask.n_indent)
            if at is not None:
                self.text, self.cut = self.text[:at], True
            elif (self.ask.t_max_predict_s is not None and "\n" in self.text
                  and time.perf_counter() - (self.first or self.start) > self.ask.t_max_predict_s):
                self.cut = True
            added += self.text[before:]
        return added

    @property
    def done(self) -> bool:
        return self.cut or self.finish_reason is not None

    def final(self, ask: _Ask, state: Any, prompt_ids: list[int], truncated: bool) -> dict[str, Any]:  # noqa: ANN401
        """llama-server's final object (content included; the stream's last event empties it)."""
        end = time.perf_counter()
        first = self.first or end
        prompt_n = self.usage.get("prompt_tokens", len(prompt_ids))
        cached = (self.usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
        predicted = 0 if ask.n_predict == 0 else self.usage.get("completion_tokens", 0)
        if self.cut or ask.n_predict == 0 or self.finish_reason == "length":
            stop_type, word = "limit", ""
        elif isinstance(self.stop_reason, str):
            stop_type, word = "word", self.stop_reason
        else:
            stop_type, word = "eos", ""
        prompt_ms, predicted_ms = (first - self.start) * 1e3, (end - first) * 1e3
        evaluated = prompt_n - cached
        timings = {"cache_n": cached, "prompt_n": evaluated, "prompt_ms": prompt_ms,
                   "prompt_per_token_ms": prompt_ms / evaluated if evaluated else 0.0,
                   "prompt_per_second": evaluated / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
                   "predicted_n": predicted, "predicted_ms": predicted_ms,
                   "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
                   "predicted_per_second": predicted / predicted_ms * 1e3 if predicted and predicted_ms > 0 else 0.0}
        return {"index": 0, "content": self.text, "tokens": [], "id_slot": 0, "stop": True, "model": state.served_name,
                "tokens_predicted": predicted, "tokens_evaluated": prompt_n,
                "generation_settings": ask.settings(state.max_model_len, state.served_name),
                "prompt": state.engine.tokenizer.decode(prompt_ids, skip_special_tokens=False),
                "has_new_line": "\n" in self.text, "truncated": truncated, "stop_type": stop_type,
                "stopping_word": word, "tokens_cached": cached, "timings": timings}


def indent_cut(text: str, n_indent: int) -> int | None:
    """Where llama-server's `n_indent` ends a middle: the first line after the first whose indentation is short.

    Every line after the first newline must start with at least `n_indent` spaces or tabs; the first that has
    something else (a character, or its own newline) sooner ends the text there, its indentation kept.

    Args:
        text: the text generated so far.
        n_indent: the least indentation, in whitespace characters (0: no limit).

    Returns:
        The length to cut the text to, or None while every line is indented enough.
    """
    if n_indent <= 0:
        return None
    start = text.find("\n") + 1
    while start > 0:
        end = start
        while end < len(text) and text[end] in " \t":
            end += 1
        if end == len(text):
            return None  # (the line has only its indentation so far)
        if end - start < n_indent:
            return end
        start = text.find("\n", end) + 1
    return None


def _projected(obj: Mapping[str, Any], fields: list[str] | None) -> dict[str, Any]:
    # llama-server's response_fields: only the fields named, a nested one lifted under its full path.
    if fields is None:
        return dict(obj)
    out: dict[str, Any] = {}
    for name in fields:
        value: Any = obj
        for part in name.split("/"):
            if not isinstance(value, Mapping) or part not in value:
                break
            value = value[part]
        else:
            out[name] = value
    return out


def _sse(obj: Mapping[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _EventStream(StreamingResponse):
    # llama-server's stream; the generation is cancelled however the response ends.

    def __init__(self, events: AsyncIterator[str], generation: Any) -> None:  # noqa: ANN401
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.generation = generation

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:  # noqa: ANN401
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.cancel()


async def _serve(request: Request, infill: bool) -> Response:
    from solo.server.routes import GenerationStream, completions, while_connected

    start = time.perf_counter()
    data = await _body(request)
    state = request.app.state.solo
    engine, _ = state.require_ready(data.get("model"))
    ask = _Ask(data, infill)
    context = state.max_model_len
    if infill:
        reserve = ask.n_predict if ask.n_predict > 0 else max(1, context // 4) if ask.n_predict < 0 else 1
        ids, truncated = await run_in_threadpool(_infill_ids, engine, data, max(1, context - min(reserve, context - 1)))
    else:
        if data.get("prompt") is None:
            raise InvalidRequestError("prompt is missing; give the text (or token ids) to continue", param="prompt")
        ids, truncated = await run_in_threadpool(_prompt_ids, engine, data["prompt"]), False
    room = context - len(ids)
    if room < 1:
        raise ContextLengthError(f"the prompt is {len(ids)} tokens, which leaves no room to write in this server's "
                                 f"context of {context} tokens; shorten the prompt (Solo does not truncate "
                                 "/completion prompts)", param="prompt", prompt_tokens=len(ids), max_tokens=0,
                                 limit=context)
    max_tokens = room if ask.n_predict < 0 else 1 if ask.n_predict == 0 else min(ask.n_predict, room)
    if ask.n_predict > room > 0:
        truncated = True  # (the context ends first, as llama-server says)
    fields = {**ask.fields, "prompt": ids, "max_tokens": max(1, max_tokens), "stream": True,
              "stream_options": {"include_usage": True}}
    reply_stream = await completions(chat_request_from(fields, _FIELD_NAMES, CompletionRequest), request)
    assert isinstance(reply_stream, GenerationStream)
    generation = reply_stream.generation
    reply = _Reply(ask, start)
    chunks = chat_chunks(reply_stream.body_iterator)

    async def events() -> AsyncIterator[str]:
        async for chunk in chunks:
            if "error" in chunk:
                yield _sse({"error": chunk["error"]})
                return
            text = reply.feed(chunk)
            if text:
                yield _sse({"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": 0})
            if reply.cut:
                generation.cancel()
                break
        yield _sse(_projected({**reply.final(ask, state, ids, truncated), "content": ""}, ask.response_fields))

    if ask.stream:
        return _EventStream(events(), generation)

    async def gather() -> None:
        async for chunk in chunks:
            if "error" in chunk:
                error = chunk["error"]
                status = 500 if error.get("type") == "server_error" else 400
                raise APIError(status, error.get("message", ""), type=error.get("type", "invalid_request_error"))
            reply.feed(chunk)
            if reply.cut:
                break

    try:
        await while_connected(gather(), request)
    finally:
        generation.cancel()
    if reply.finish_reason == "abort" and not reply.usage.get("completion_tokens"):
        raise shutting_down()
    return JSONResponse(_projected(reply.final(ask, state, ids, truncated), ask.response_fields))


@router.post("/completion", response_model=None)
async def completion(request: Request) -> Response:
    """llama-server's completion: `prompt` continued as it is (see the module docstring)."""
    return await _serve(request, infill=False)


@router.post("/infill", response_model=None)
async def infill(request: Request) -> Response:
    """llama-server's code infill: `input_prefix`, `input_suffix`, `input_extra` and `prompt` (see the module)."""
    return await _serve(request, infill=True)


@router.get("/props")
async def props(request: Request) -> JSONResponse:
    """llama-server's properties: the context, the default settings, the chat template, one slot."""
    state = request.app.state.solo
    engine, _ = state.require_ready(None)
    template = engine.tokenizer.chat_template
    settings = {"n_ctx": state.max_model_len, "params": {"n_predict": -1}, "model": state.served_name}
    return JSONResponse({"default_generation_settings": settings, "total_slots": 1,
                         "model_alias": state.served_name, "model_path": state.settings.model or state.served_name,
                         "chat_template": template.source if template is not None else "",
                         "modalities": {"vision": False, "audio": False}, "build_info": f"solo {__version__}",
                         "is_sleeping": False})


@router.post("/apply-template")
async def apply_template(request: Request) -> JSONResponse:
    """llama-server's chat-template rendering: `messages` (as on the chat route) -> `prompt`, the text to continue."""
    from solo.server.routes import chat_prompt_text

    data = await _body(request)
    state = request.app.state.solo
    engine, _ = state.require_ready(data.get("model"))
    if not isinstance(data.get("messages"), list) or not data["messages"]:
        raise InvalidRequestError("messages must be a non-empty list of chat messages", param="messages")
    fields = {k: v for k, v in data.items() if k in ("messages", "tools", "chat_template_kwargs", "model",
                                                     "add_generation_prompt", "continue_final_message")}
    for name in set(data) - set(fields):
        raise InvalidRequestError(f"{name} is not a field of /apply-template; leave it out", param=name)
    body = chat_request_from(fields, {})
    return JSONResponse({"prompt": await run_in_threadpool(chat_prompt_text, state, engine, body)})

