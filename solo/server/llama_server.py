"""llama-server's own API: `POST /completion`, `POST /infill`, `GET /props`, `POST /apply-template`.

Tools written for llama.cpp's server reach `solo serve` at its address: llama.vim and llama.vscode complete code at
the cursor through `/infill` (with code from other open files in `input_extra`), Continue's llama.cpp provider and
scripts call `/completion`. A request becomes the `/v1/completions` request it means (`n_predict` -> `max_tokens`,
`repeat_penalty` -> `repetition_penalty`, `grammar` -> a GBNF grammar, `json_schema` -> a JSON schema, `logit_bias`
pairs -> OpenAI's map, `n_cmpl` -> `n`), is run by that route (its generation's events read here), and comes back in
llama-server's shape: `content`, `stop`, `stop_type` ("eos", "word" with `stopping_word`, "limit"),
`tokens_predicted`, `tokens_evaluated`, `tokens_cached` (prompt tokens from the prefix cache), `truncated`,
`timings` (`prompt_n`, `prompt_ms`, `predicted_per_second`, ...), `generation_settings` (the values the completion
ran with), `tokens` with `return_tokens`; several completions (`n_cmpl`) as a list of such objects, each with its
`index`. Streamed (`stream: true`): server-sent events `data: {"index", "content", "tokens", "stop": false,
"tokens_predicted", ...}`, then per completion one `stop: true` with the statistics. `response_fields` keeps only
the fields named (a name with a slash, `timings/prompt_n`, lifts a nested one, as llama-server does).

`/infill` lays out `input_extra` (other files, oldest first: `{"filename", "text"}`; other keys, such as llama.vim's
`time`, are the editor's bookkeeping, as llama-server takes them), `input_prefix` and `prompt` (the cursor's line so
far, which llama-server appends to the prefix), and `input_suffix` with the model's FIM tokens in llama-server's
order (`solo.engine.fim.infill_layout`); what does not fit the context (after room for `n_predict`, at most a
quarter of it) is left out, whole files from the oldest, then the prefix's start and the suffix's end, and the reply
says so (`truncated: true`). `n_indent` ends the middle at a line indented less than asked, and `t_max_predict_ms`
after that time once a line is complete, as llama-server does for editors. `n_predict: 0` evaluates the prompt
(filling the prefix cache) and writes nothing; -1 (the default) writes until the context ends. Without `samplers`,
sampling values left out are the model's (generation_config.json), as on Solo's other routes, not llama-server's
defaults; with `samplers`, the samplers it leaves out are off (temperature: 1, plain sampling), as in llama-server.

Differences, each said where it applies: the prompt is fitted to the context, not to llama-server's batch, and other
files go out whole (llama-server cuts their tokens from the front); Solo applies its samplers in one order
(penalties, temperature, top-k, top-p, min-p), so `samplers` chooses which apply, not their order; llama-server's
`infill` sampler (which merges candidates sharing a prefix) has no counterpart and listing it changes nothing;
without `repeat_last_n` the penalties cover the whole sequence (llama-server: the last 64 tokens), and with one
presence and frequency penalties count the output's tokens in the window, not the prompt's; `n_probs` is refused
(`/v1/completions` has `logprobs`); one prompt per request; a completion that `n_indent` or `t_max_predict_ms` ended
beside others (`n_cmpl`) runs on to its own end, unseen; errors come in OpenAI's shape, as on Solo's other routes;
`model` names nothing here: any name (editors send their configured one, or an empty one) is the served model, as a
llama-server with one model takes it; fields that place work in llama-server's slots or shift its context
(`id_slot`, `n_keep`, `n_discard`, `n_cache_reuse`, `t_max_prompt_ms`, which llama-server does not enforce either)
change nothing; sampling Solo does not have (`mirostat`, `typical_p`, DRY, XTC, `top_n_sigma`, dynamic temperature)
is taken only at its off value.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from solo import __version__
from solo.errors import ContextLengthError, InvalidRequestError
from solo.server.chat_adapter import chat_request_from, field_terms, in_api_terms, typed_field
from solo.server.errors import StrictJSONRoute, api_error_from, json_body, shutting_down
from solo.server.protocol import CompletionRequest, llama_server_fields

router = APIRouter(route_class=StrictJSONRoute)

# llama-server's field -> the completions route's.
_RENAMED = {"n_predict": "max_tokens", "repeat_penalty": "repetition_penalty", "grammar": "guided_grammar",
            "json_schema": "guided_json"}
_FIELD_NAMES = {**{route: ours for ours, route in _RENAMED.items()}, "n": "n_cmpl"}
_PASSED = ("temperature", "top_k", "top_p", "min_p", "seed", "stop", "ignore_eos", "presence_penalty",
           "frequency_penalty", "repeat_penalty", "grammar", "json_schema", "cache_prompt")
# Sampling Solo does not have, taken at the value that turns it off.
_OFF_VALUES = {"mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0,
               "dynatemp_range": 0.0, "min_keep": 0, "n_probs": 0, "timings_per_token": False,
               "return_progress": False, "post_sampling_probs": False, "lora": []}
# Fields that tune a sampler only while it is on (all of the above are off), or place work in llama-server's
# slots, or shift its context: nothing Solo generates depends on them.
_NO_EFFECT = frozenset({"mirostat_tau", "mirostat_eta", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                        "dry_sequence_breakers", "xtc_threshold", "dynatemp_exponent", "id_slot", "n_keep",
                        "n_discard", "n_cache_reuse", "t_max_prompt_ms",
                        "model"})  # (a one-model llama-server serves it whatever the name: editors send theirs, or "")
_OWN = frozenset({"prompt", "n_predict", "stream", "samplers", "t_max_predict_ms", "n_indent", "response_fields",
                  "repeat_last_n", "logit_bias", "n_cmpl", "return_tokens"})
_DEFAULT_SAMPLERS = ["penalties", "top_k", "top_p", "min_p", "temperature"]
"""Solo's samplers, in the order it applies them (`solo.engine.sampling`)."""
_INFILL_OWN = frozenset({"input_prefix", "input_suffix", "input_extra"})
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
                       "timings_per_token": "the last object's timings cover the whole reply",
                       "return_progress": "it reports no prompt-processing progress",
                       "post_sampling_probs": "send logprobs to /v1/completions for token probabilities",
                       "lora": "Solo serves no LoRA adapters"}.get(name, f"Solo has no {name} sampling")
                raise InvalidRequestError(f"{name} is not supported by Solo ({why}); leave it out or set it to "
                                          f"{json.dumps(off)}", param=name)
        self.stream = bool(typed_field(data, "stream", bool, "true or false"))
        self.return_tokens = bool(typed_field(data, "return_tokens", bool, "true or false"))
        n_cmpl = typed_field(data, "n_cmpl", int, "an integer")
        self.n_cmpl = 1 if n_cmpl is None else n_cmpl
        if self.n_cmpl < 1:
            raise InvalidRequestError(f"n_cmpl must be at least 1, got {self.n_cmpl}", param="n_cmpl")
        predict = typed_field(data, "n_predict", int, "an integer")
        if predict is not None and predict < -1:
            raise InvalidRequestError(f"n_predict must be -1 (until the context ends), 0 (evaluate the prompt only) or "
                                      f"a positive number of tokens, got {predict}", param="n_predict")
        self.n_predict = -1 if predict is None else predict
        self.n_indent = typed_field(data, "n_indent", int, "an integer") or 0
        if self.n_indent < 0:
            raise InvalidRequestError(f"n_indent must be 0 (no limit) or a number of blanks, got {self.n_indent}",
                                      param="n_indent")
        limit_ms = typed_field(data, "t_max_predict_ms", (int, float), "a number of milliseconds")
        self.t_max_predict_s = limit_ms / 1e3 if limit_ms and limit_ms > 0 else None
        fields = typed_field(data, "response_fields", list, "a list of field names")
        if fields is not None and not all(isinstance(f, str) for f in fields):
            raise InvalidRequestError("response_fields must be a list of field names (strings)",
                                      param="response_fields")
        self.response_fields: list[str] | None = fields or None  # (an empty list: every field, as llama-server)
        self.fields: dict[str, Any] = {k: data[k] for k in (*_PASSED, "samplers", "repeat_last_n")
                                       if data.get(k) is not None}
        problems = llama_server_fields(self.fields, max_tokens=None)  # (penalties and samplers, as on the chat route)
        if problems:
            raise InvalidRequestError(problems[0][1], param=problems[0][0])
        for ours in ("grammar", "json_schema"):
            if ours in self.fields:
                self.fields[_RENAMED[ours]] = self.fields.pop(ours)
        seed = self.fields.get("seed")
        if seed == -1 or (isinstance(seed, int) and not isinstance(seed, bool) and seed == 0xFFFFFFFF):
            del self.fields["seed"]  # (llama-server's random seed)
        temperature = self.fields.get("temperature")
        if _number(temperature) and temperature < 0:
            self.fields["temperature"] = 0.0  # llama-server: below 0, greedy
        bias = _logit_bias(data.get("logit_bias"))
        if bias is not None:
            self.fields["logit_bias"] = bias
        self.samplers = data.get("samplers")

    def settings(self, state: Any, sampling: Any) -> dict[str, Any]:  # noqa: ANN401
        """llama-server's `generation_settings`: the values this completion ran with (`ResolvedSampling`)."""
        return {"n_ctx": state.max_model_len, "n_predict": self.n_predict, "model": state.served_name,
                "stream": self.stream, "n_indent": self.n_indent,
                "t_max_predict_ms": (self.t_max_predict_s or 0) * 1e3,
                "samplers": self.samplers if self.samplers is not None else _DEFAULT_SAMPLERS,
                **_sampling_settings(sampling), "seed": sampling.seed,
                "ignore_eos": bool(self.fields.get("ignore_eos")), "stop": self.fields.get("stop") or [],
                "n_cmpl": self.n_cmpl}


def _sampling_settings(sampling: Any) -> dict[str, Any]:  # noqa: ANN401
    # A `ResolvedSampling` under llama-server's names (generation_settings, /props).
    return {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "min_p": sampling.min_p, "repeat_penalty": sampling.repetition_penalty,
            "repeat_last_n": sampling.repeat_last_n, "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty}


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
        if isinstance(token, float) or isinstance(token, bool):
            raise InvalidRequestError(f"logit_bias: a token id is an integer, got {token!r:.40}", param="logit_bias")
        if not isinstance(token, int):
            raise InvalidRequestError(f"logit_bias: Solo takes token ids, not text ({token!r:.40}); POST /tokenize "
                                      "gives a text's ids", param="logit_bias")
        if bias is False:
            bias = -100.0  # (a ban: OpenAI's lowest bias)
        if not _number(bias):
            raise InvalidRequestError(f"logit_bias: the bias of token {token} must be a number or false, got "
                                      f"{bias!r:.40}", param="logit_bias")
        if str(token) in out:
            raise InvalidRequestError(f"logit_bias names token {token} twice; give each token one bias",
                                      param="logit_bias")
        out[str(token)] = float(bias)
    return out


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
    return ids  # (the completions route checks them against the vocabulary)


def _infill_ids(engine: Any, data: Mapping[str, Any], context: int, reserve: int  # noqa: ANN401
                ) -> tuple[list[int], bool]:
    """An /infill request's layout, fitted in the context less `reserve` tokens; whether anything was left out."""
    prefix = typed_field(data, "input_prefix", str, "a string") or ""
    suffix = typed_field(data, "input_suffix", str, "a string") or ""
    # (llama-server appends prompt, the cursor's line up to the cursor in llama.vim's requests, to the prefix)
    prompt = typed_field(data, "prompt", str, "a string (the text right before the cursor, after input_prefix)") or ""
    extra = typed_field(data, "input_extra", list, 'a list of {"filename": ..., "text": ...} objects') or []
    files = []
    for index, chunk in enumerate(extra):
        # (other keys, such as llama.vim's "time", are the editor's own bookkeeping, as llama-server takes them)
        if not isinstance(chunk, Mapping) or not isinstance(chunk.get("text"), str) \
                or not isinstance(chunk.get("filename") or "", str):
            got = f"got {dict(chunk)!r:.60}" if isinstance(chunk, Mapping) else f"got {chunk!r:.40}"
            raise InvalidRequestError(f'input_extra[{index}] must be an object with "text" (a string) and optionally '
                                      f'"filename" (a string); {got}', param="input_extra")
        files.append((chunk.get("filename") or "tmp", chunk.get("text") or ""))
    if engine.fim is None:
        raise InvalidRequestError("/infill needs a model with fill-in-the-middle tokens (such as Qwen2.5-Coder's "
                                  "<|fim_prefix|>, StarCoder's <fim_prefix>, DeepSeek-Coder's <｜fim▁begin｜>); this "
                                  "one has none: serve a code model trained for it, or send /completion",
                                  param="input_suffix")
    try:
        layout = engine.infill_layout(prefix + prompt, suffix, files, context - reserve)
    except InvalidRequestError as exc:
        if exc.param != "budget":
            exc.param = {"suffix": "input_suffix", "files": "input_extra"}.get(exc.param or "", exc.param)
            raise
        raise InvalidRequestError(f"this server's context of {context} tokens, less {reserve} kept for the output "
                                  "(n_predict, at most a quarter of the context), cannot hold the FIM markers; "
                                  "lower n_predict", param="n_predict") from None
    return layout.ids, layout.truncated


class _Reply:
    """One completion (of `n_cmpl`) assembled from the generation's events, with llama-server's early stops."""

    def __init__(self, ask: _Ask, index: int, start: float, request: Any = None) -> None:  # noqa: ANN401
        # request: the engine's Request of this completion (its resolved sampling; its stats, which the scheduler
        # fills as it runs, say the prompt tokens the prefix cache gave even when the reply ends here first)
        self.ask, self.index, self.start, self.request = ask, index, start, request
        self.text = ""
        self.token_ids: list[int] = []
        self.first: float | None = None
        self.end: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: Any = None
        self.cached_tokens = 0
        self.cut = False  # ended here (n_indent, t_max_predict_ms), not by the engine

    def feed(self, event: Any) -> tuple[str, list[int]]:  # noqa: ANN401
        """Take one event (`GenerationEvent`); returns the text and token ids it adds (after any early stop)."""
        if self.first is None and (event.text or event.token_ids or event.finish_reason):
            self.first = time.perf_counter()
        if event.stats is not None:
            self.cached_tokens = event.stats.cached_tokens
        elif self.request is not None:
            self.cached_tokens = self.request.stats.cached_tokens
        if event.finish_reason is not None and not self.cut:
            self.finish_reason, self.stop_reason = event.finish_reason, event.stop_reason
            self.end = time.perf_counter()
        if self.ask.n_predict == 0 or self.cut:
            return "", []
        before = len(self.text)
        self.text += event.text
        self.token_ids += event.token_ids
        at = indent_cut(self.text, self.ask.n_indent)
        if at is not None:
            self.text, self.cut = self.text[:at], True
        elif (self.ask.t_max_predict_s is not None and "\n" in self.text
              and time.perf_counter() - (self.first or self.start) > self.ask.t_max_predict_s):
            self.cut = True
        if self.cut:
            self.end = time.perf_counter()
        return self.text[before:], list(event.token_ids)

    @property
    def done(self) -> bool:
        """Whether this completion has ended (here or in the engine)."""
        return self.cut or self.finish_reason is not None

    @property
    def predicted(self) -> int:
        """Tokens generated so far (none for `n_predict` 0, which only evaluates the prompt)."""
        return 0 if self.ask.n_predict == 0 else len(self.token_ids)

    def final(self, state: Any, prompt_ids: list[int], prompt: str | None, truncated: bool,  # noqa: ANN401
              capped: bool) -> dict[str, Any]:
        """llama-server's final object (content included; the stream's last event empties it).

        `prompt`: the prompt's text (None where `response_fields` leaves it out); `truncated`: the prompt was
        fitted; `capped`: the output may run to the context's end, which the reply reports as truncated when
        it does.
        """
        end = self.end or time.perf_counter()
        first = self.first or end
        ask, cached, predicted = self.ask, self.cached_tokens, self.predicted
        if self.cut or ask.n_predict == 0 or self.finish_reason in ("length", "abort"):  # (abort: shutdown)
            stop_type, word = "limit", ""
        elif isinstance(self.stop_reason, str):
            stop_type, word = "word", self.stop_reason
        else:
            stop_type, word = "eos", ""
        prompt_ms, predicted_ms = (first - self.start) * 1e3, (end - first) * 1e3
        evaluated = len(prompt_ids) - cached
        timings = {"cache_n": cached, "prompt_n": evaluated, "prompt_ms": prompt_ms,
                   "prompt_per_token_ms": prompt_ms / evaluated if evaluated else 0.0,
                   "prompt_per_second": evaluated / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
                   "predicted_n": predicted, "predicted_ms": predicted_ms,
                   "predicted_per_token_ms": predicted_ms / predicted if predicted else 0.0,
                   "predicted_per_second": predicted / predicted_ms * 1e3 if predicted and predicted_ms > 0 else 0.0}
        return {"index": self.index, "content": self.text,
                "tokens": self.token_ids if ask.return_tokens and ask.n_predict else [], "id_slot": 0,
                "stop": True, "model": state.served_name, "tokens_predicted": predicted,
                "tokens_evaluated": len(prompt_ids),
                "generation_settings": ask.settings(state, self.request.sampling),
                **({} if prompt is None else {"prompt": prompt}),
                "has_new_line": "\n" in self.text,
                "truncated": truncated or (capped and self.finish_reason == "length" and not self.cut),
                "stop_type": stop_type, "stopping_word": word, "tokens_cached": cached, "timings": timings}


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


def _renamed(exc: InvalidRequestError) -> InvalidRequestError:
    # The completions route's error with its fields named as llama-server names them ("n" only where the message
    # starts with it: it is a word in prose too).
    terms = [*field_terms({k: v for k, v in _FIELD_NAMES.items() if k != "n"}), (r"^n\b", "n_cmpl")]
    return exc.renamed(in_api_terms(str(exc), terms), _FIELD_NAMES.get(exc.param or "", exc.param))


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


async def _serve(request: Request, infill: bool) -> Response:
    # The completions route on the request's fields; its generation's events read here, so each completion's
    # token ids and counts are exact and n_indent / t_max_predict_ms can end it.
    from solo.server.routes import GenerationStream, completions, while_connected

    start = time.perf_counter()
    data = await json_body(request)
    state = request.app.state.solo
    engine, _ = state.require_ready(None)  # (any model name: see _NO_EFFECT)
    ask = _Ask(data, infill)
    context = state.max_model_len
    if infill:
        # Room for the output, at most a quarter of the context, so the code always has the rest.
        reserve = 1 if ask.n_predict == 0 else min(ask.n_predict if ask.n_predict > 0 else context, context // 4)
        ids, truncated = await run_in_threadpool(_infill_ids, engine, data, context, reserve)
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
    capped = ask.n_predict < 0 or ask.n_predict > room  # (the context ends first: truncated, if reached)
    fields = {**ask.fields, "prompt": ids, "max_tokens": max_tokens, "n": ask.n_cmpl, "stream": True}
    try:
        reply_stream = await completions(chat_request_from(fields, _FIELD_NAMES, CompletionRequest), request)
    except InvalidRequestError as exc:  # (the route's fields named as this API names them)
        raise _renamed(exc) from None
    assert isinstance(reply_stream, GenerationStream)
    generation = reply_stream.generation  # (its events are read here; the route's own stream is not)
    replies = [_Reply(ask, index, start, r) for index, r in enumerate(generation.requests)]
    wanted = ask.response_fields is None or "prompt" in ask.response_fields
    prompt_text = await run_in_threadpool(engine.tokenizer.decode, ids, False) if wanted else None

    async def events() -> AsyncIterator[str]:
        try:
            async for index, event in generation.events():
                reply = replies[index]
                if reply.done:
                    continue
                text, tokens = reply.feed(event)
                if text or tokens:
                    yield _sse({"index": index, "content": text, "tokens": tokens, "stop": False, "id_slot": 0,
                                "tokens_predicted": reply.predicted, "tokens_evaluated": len(ids)})
                if reply.done:
                    final = reply.final(state, ids, prompt_text, truncated, capped)
                    yield _sse(_projected({**final, "content": "", "tokens": []}, ask.response_fields))
                if all(r.done for r in replies):
                    break
        except Exception as exc:  # noqa: BLE001 (a failure mid-stream ends it with llama-server's error event)
            error = api_error_from(_renamed(exc) if isinstance(exc, InvalidRequestError) else exc)
            yield _sse({"error": {"code": error.status, "message": error.message, "type": error.type}})
        finally:
            generation.cancel()

    if ask.stream:
        return GenerationStream(events(), generation)  # (cancels the generation however the stream ends)

    async def gather() -> None:
        async for index, event in generation.events():
            if not replies[index].done:
                replies[index].feed(event)
            if all(r.done for r in replies):
                break

    try:
        await while_connected(gather(), request)
    except InvalidRequestError as exc:  # (a grammar that ran dead mid-output: named as this API names it)
        raise _renamed(exc) from None
    finally:
        generation.cancel()
    if all(r.finish_reason == "abort" and not r.predicted for r in replies):
        raise shutting_down()
    finals = [_projected(r.final(state, ids, prompt_text, truncated, capped), ask.response_fields) for r in replies]
    return JSONResponse(finals[0] if len(finals) == 1 else finals)


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
    """llama-server's properties: the context, the default sampling (the model's), the chat template, the slots."""
    from solo.engine.sampling import SamplingParams

    state = request.app.state.solo
    engine, _ = state.require_ready(None)
    template = engine.tokenizer.chat_template
    defaults = SamplingParams().resolve(engine.defaults, fallback_temperature=1.0)  # (as a request without any)
    params = {"n_predict": -1, **_sampling_settings(defaults), "samplers": _DEFAULT_SAMPLERS, "stop": [],
              "ignore_eos": False}
    settings = {"n_ctx": state.max_model_len, "params": params, "model": state.served_name}
    return JSONResponse({"default_generation_settings": settings, "total_slots": state.settings.max_batch,
                         "model_alias": state.served_name, "model_path": state.settings.model or state.served_name,
                         "chat_template": template.source if template is not None else "",
                         "modalities": {"vision": False, "audio": False}, "build_info": f"solo {__version__}",
                         "is_sleeping": False})


@router.post("/apply-template")
async def apply_template(request: Request) -> JSONResponse:
    """llama-server's chat-template rendering: a chat request's `messages` (and `tools`) -> `prompt`, its text.

    The body is a chat request (its other fields are checked as the chat route checks them, and change no
    prompt).
    """
    from solo.server.routes import chat_prompt_text

    data = await json_body(request)
    state = request.app.state.solo
    engine, _ = state.require_ready(None)  # (any model name: see _NO_EFFECT)
    body = chat_request_from({k: v for k, v in data.items() if k != "model"}, {})
    return JSONResponse({"prompt": await run_in_threadpool(chat_prompt_text, state, engine, body)})
