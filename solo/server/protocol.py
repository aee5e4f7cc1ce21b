"""Request and response bodies of the OpenAI-compatible API, as pydantic models.

Requests: `model` is optional, as in vLLM (left out, the served model answers); when given it must be the
served name (another name is a 404). An unknown field in a chat or completions request is refused by name,
as OpenAI's API refuses an unrecognized argument, except those that cannot change the output
(`NO_EFFECT_FIELDS`: `store`, `metadata`, `service_tier`, ...) and vLLM's fields at the value that changes
nothing (`use_beam_search` false, `length_penalty` 1, ...:
`SamplingFields.DEFAULT_ONLY`); `null` for any optional field means its default, as in OpenAI's API.
Known fields are strictly typed (no "0.5" strings for numbers, no 1 for true, no NaN) and range-checked,
so FastAPI rejects bad input before any engine work.
What Solo cannot honour is rejected rather than silently ignored: `echo`, `suffix` on a model without
fill-in-the-middle tokens, `best_of` != n, the deprecated `functions` unless `function_call` is "none" and a
`function_call` naming a function (use `tools` and `tool_choice`), `stream_options` without `stream`, a
non-assistant message without content, `max_tokens` and `max_completion_tokens` that disagree, `modalities`
other than ["text"], `reasoning_effort` but "none" (thinking off), `verbosity` but "medium", and llama-server's
fields it has no counterpart for (`FOREIGN_FIELDS`: the error names the field to send instead). llama-server's
own fields that its clients send to these routes (llama.vim's instructions) are taken as llama-server takes
them (`llama_server_fields`): `n_predict` (max_tokens), `repeat_penalty` (repetition_penalty), `repeat_last_n`
(the penalties' window), `samplers` (which samplers apply; those left out are off), `id_slot` (no effect).
Extensions that vLLM also accepts: `top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`,
`include_stop_str_in_output`, `ignore_eos`, `min_tokens`, `allowed_token_ids`, `bad_words`, `skip_special_tokens`,
`add_generation_prompt`, `chat_template_kwargs`, and structured output beside `response_format` (both
routes): `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, and `structured_outputs` {"json",
"regex", "choice", "grammar", "json_object"}; `response_format` also takes Solo's types {"type": "regex" |
"choice" | "grammar", ...}.

Responses mirror OpenAI's shapes field for field (chat.completion, chat.completion.chunk, text_completion,
usage, both logprobs shapes).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from solo.engine.constraints import StructuredOutput
from solo.engine.sampling import SamplingParams
from solo.errors import InvalidRequestError
from solo.tokenizer import is_valid_unicode

# Strict scalar types: JSON numbers only (an int is accepted where a float is expected), finite.
JsonInt = Annotated[int, Strict()]
JsonFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
JsonBool = Annotated[bool, Strict()]

SURROGATE_MESSAGE = "Input should be valid Unicode text; it holds an unpaired surrogate (such as \\ud800)"


def _valid_unicode(value: Any) -> Any:
    # JSON can carry a lone surrogate ("\ud800"), which no tokenizer takes (it was a 500).
    if isinstance(value, str) and not is_valid_unicode(value):
        raise PydanticCustomError("unicode_surrogate", SURROGATE_MESSAGE)
    return value


JsonStr = Annotated[str, Strict(), BeforeValidator(_valid_unicode)]


def one_of(description: str) -> WrapValidator:
    """A union field's validator that reports a failure once, in words ("Input should be {description}").

    Pydantic reports it once per alternative, with its internal tags in the location ("stop.str",
    "stop.list[str]").
    """

    def validate(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            if any(e["type"] == "unicode_surrogate" for e in exc.errors()):  # the type was right; say what was not
                raise PydanticCustomError("unicode_surrogate", SURROGATE_MESSAGE) from None
            raise PydanticCustomError("union_type", f"Input should be {description}") from None

    return WrapValidator(validate)


SEED_MIN, SEED_MAX = -(2**63) + 128, 2**63 - 1 - 128
"""Accepted range of `seed` (what a torch.Generator takes, with room for the choice index: n <= 128)."""
MAX_TOP_LOGPROBS = 20
"""Most alternatives per token in logprobs (OpenAI's limit for chat)."""
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default `max_tokens` for the (legacy) completions API; chat fills the context instead."""


class _Lenient(BaseModel):
    # Unknown fields are ignored, as OpenAI's API does.
    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        # OpenAI's API takes null for any optional field as "use the default" (clients send it); a
        # required field keeps its null, so the error says what is wrong with it.
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or (k in fields and fields[k].is_required())}


# ------------------------------------------------------------------------------------------- requests

def _refuse_unknown(model: BaseModel, no_effect: frozenset[str], default_only: dict[str, Any]) -> None:
    """Refuse every undeclared field of `model` (extra="allow") that could change the output.

    All but `no_effect` ones and `default_only` ones at their default value.

    Raises:
        ValidationError: one error per such field, located at it.
    """
    errors = []
    for name, value in (model.model_extra or {}).items():
        if name in no_effect:
            continue
        if name in default_only:
            default = default_only[name]
            same_type = type(value) is type(default) or (type(default) is float and type(value) is int)
            if same_type and value == default:
                continue
            message = (f"{json.dumps(value)} is not supported by Solo (only {json.dumps(default)}, which changes "
                       "nothing); leave it out")
        elif name in FOREIGN_FIELDS:
            message = f"unrecognized request argument: {FOREIGN_FIELDS[name]}"
        else:
            message = ("unrecognized request argument: Solo's API does not know it, so it cannot honour it; "
                       "leave it out (the fields it takes: the README's \"Serve (OpenAI-compatible)\" section)")
        # Located at the field, so the error names it (param) as for a declared field's bad value.
        errors.append({"type": PydanticCustomError("unsupported_field", message), "loc": (name,), "input": value})
    if errors:
        raise ValidationError.from_exception_data(type(model).__name__, errors)


class StreamOptions(_Lenient):
    """`stream_options`: include_usage adds a last chunk with the token counts (and empty choices).

    OpenAI's `include_obfuscation` changes no token and is ignored; vLLM's `continuous_usage_stats` is refused
    unless false, as is any other key.
    """

    model_config = ConfigDict(extra="allow")

    include_usage: JsonBool = False

    @model_validator(mode="after")
    def _nothing_dropped(self) -> StreamOptions:
        _refuse_unknown(self, frozenset({"include_obfuscation"}), {"continuous_usage_stats": False})
        return self


NO_EFFECT_FIELDS = frozenset({"store", "metadata", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                              "safety_identifier", "prediction", "guided_decoding_backend", "request_id",
                              "cache_salt"})
"""Request fields of OpenAI's or vLLM's API that cannot change what Solo generates: accepted and ignored."""

_DROP = "a llama.cpp sampler Solo does not run; leave it out (top_p, min_p and top_k are Solo's)"
FOREIGN_FIELDS = {
    "grammar": 'llama.cpp\'s; send response_format {"type": "grammar", "grammar": "..."} (or vLLM\'s guided_grammar)',
    "json_schema": 'llama.cpp\'s; send response_format {"type": "json_schema", "json_schema": {"name": "...", '
                   '"schema": {...}}}',
    "n_probs": "llama.cpp's; send logprobs (with top_logprobs on the chat route)",
    **dict.fromkeys(("typical_p", "mirostat", "mirostat_tau", "mirostat_eta", "tfs_z", "dry_multiplier",
                     "xtc_probability"), _DROP),
}
"""Other servers' request fields Solo refuses: the error names what to send instead."""

# llama.cpp's sampler names (and aliases) -> the sampling field each turns on (None: one Solo does not run, taken
# at its off value; "infill": llama-server's FIM sampler, without a counterpart).
LLAMA_SAMPLERS = {"top_k": "top_k", "top_p": "top_p", "nucleus": "top_p", "min_p": "min_p",
                  "temperature": "temperature", "temp": "temperature", "penalties": "penalties", "infill": None,
                  "dry": None, "typ_p": None, "typical_p": None, "typical": None, "xtc": None, "top_n_sigma": None}
_LLAMA_OFF_SAMPLING = {"top_k": -1, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
_PENALTIES_OFF = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def llama_server_fields(data: dict[str, Any], max_tokens: str | None = "max_tokens") -> list[tuple[str, str]]:
    """Turn llama-server's sampling fields in a request body into Solo's, in place, as llama-server means them.

    `n_predict` -> `max_tokens` (-1 or null: unset; with `max_tokens` None, the caller reads it itself),
    `repeat_penalty` -> `repetition_penalty`, `repeat_last_n` (kept: the penalties' window, `SamplingParams`),
    `samplers` (a list of names, or llama.cpp's letters such as "kpt"; the samplers it leaves out are off: top-k,
    top-p, min-p, the penalties (at their neutral values, so a model's default penalty is off too), and temperature
    1, plain sampling; their order is Solo's), `id_slot` (llama-server's slots: no effect). A value of the wrong
    type is left for the request's own validation to refuse.

    Args:
        data: the request body (a dict), changed in place.
        max_tokens: the field `n_predict` becomes; None leaves `n_predict` in place.

    Returns:
        (field, problem) for each field that cannot be taken (empty when all were).
    """
    problems: list[tuple[str, str]] = []
    data.pop("id_slot", None)
    if max_tokens is not None and "n_predict" in data:
        predict = data.pop("n_predict")
        if predict in (None, -1) and not isinstance(predict, bool):
            pass  # (null or -1: until the context ends, the default)
        elif data.get(max_tokens) is not None or data.get("max_completion_tokens") is not None:
            problems.append(("n_predict", "n_predict is llama-server's max_tokens; send one of them"))
        elif isinstance(predict, int) and not isinstance(predict, bool) and predict >= 1:
            data[max_tokens] = predict
        else:
            problems.append(("n_predict", f"n_predict must be -1 (until the context ends) or a positive number of "
                                          f"tokens here, got {predict!r:.40} (0, the prompt evaluated alone, is "
                                          "/completion's)"))
    if "repeat_penalty" in data:
        penalty = data.pop("repeat_penalty")
        if penalty is not None and data.get("repetition_penalty") is not None:
            problems.append(("repeat_penalty", "repeat_penalty is llama-server's repetition_penalty; send one"))
        elif penalty is not None:
            data["repetition_penalty"] = penalty
    samplers = data.pop("samplers", None)
    if samplers is None:
        return problems
    if isinstance(samplers, str):  # llama.cpp's letters ("edskypmxt", its --sampler-seq)
        unknown = [c for c in samplers if c not in _LLAMA_SAMPLER_LETTERS]
        if unknown:
            problems.append(("samplers", f"samplers: {unknown[0]!r} is not one of llama.cpp's sampler letters "
                                         f"({''.join(_LLAMA_SAMPLER_LETTERS)})"))
            return problems
        samplers = [_LLAMA_SAMPLER_LETTERS[c] for c in samplers]
    if not isinstance(samplers, list) or not all(isinstance(x, str) for x in samplers):
        problems.append(("samplers", 'samplers must be a list of sampler names, such as ["top_k", "top_p", '
                                     '"temperature"], or llama.cpp\'s letters, such as "kpt"'))
        return problems
    on = set()
    for name in samplers:
        key = name.strip().lower().replace("-", "_")
        if key not in LLAMA_SAMPLERS:
            problems.append(("samplers", f"{name!r} is not a sampler Solo knows; use top_k, top_p, min_p, "
                                         "temperature, penalties (and llama.cpp's others at their off values)"))
            return problems
        on.add(LLAMA_SAMPLERS[key])
    for name, off in _LLAMA_OFF_SAMPLING.items():
        if name not in on and _number_or_none(data.get(name)):
            data[name] = off
    if "penalties" not in on:
        for name, off in _PENALTIES_OFF.items():  # (explicit: a model's default penalty would apply otherwise)
            if _number_or_none(data.get(name)):
                data[name] = off
    return problems


def _number_or_none(value: Any) -> bool:  # noqa: ANN401
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


_LLAMA_SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                          "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill"}
"""llama.cpp's sampler letters (common/sampling.cpp; its default sequence is "edskypmxt")."""
_LLAMA_FIELDS = frozenset({"n_predict", "repeat_penalty", "repeat_last_n", "samplers", "id_slot"})


class SamplingFields(_Lenient):
    """Fields shared by chat and completions requests.

    Sampling values left out (None) come from the model's generation_config.json, then OpenAI's defaults.
    A field this API does not know is refused by name (as OpenAI's API refuses an unrecognized argument),
    except `NO_EFFECT_FIELDS`, and vLLM's fields in `DEFAULT_ONLY` at the value that changes nothing:
    whatever else a client sends would change its output, and Solo would not honour it.
    """

    model_config = ConfigDict(extra="allow")
    DEFAULT_ONLY: ClassVar[dict[str, Any]] = {
        "use_beam_search": False, "length_penalty": 1.0, "spaces_between_special_tokens": True,
        "return_tokens_as_token_ids": False,
        "cache_prompt": True,  # llama-server's (its web UI sends it): Solo's prefix cache reuses what it can anyway
    }

    model: JsonStr | None = None
    max_tokens: Annotated[JsonInt, Field(ge=1)] | None = None
    temperature: Annotated[JsonFloat, Field(ge=0, le=2)] | None = None
    top_p: Annotated[JsonFloat, Field(gt=0, le=1)] | None = None
    top_k: Annotated[JsonInt, Field(ge=-1)] | None = None
    min_p: Annotated[JsonFloat, Field(ge=0, le=1)] | None = None
    presence_penalty: Annotated[JsonFloat, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[JsonFloat, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[JsonFloat, Field(gt=0)] | None = None
    # llama.cpp's and Ollama's: the penalties' window in tokens (-1 the whole sequence, 0 no penalties).
    repeat_last_n: Annotated[JsonInt, Field(ge=-1)] | None = None
    seed: Annotated[JsonInt, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stop: Annotated[JsonStr | list[JsonStr], one_of("a string or a list of strings")] | None = None
    # vLLM's extension: token ids that end the generation (left out of the text), besides the model's EOS ids.
    stop_token_ids: list[Annotated[JsonInt, Field(ge=0)]] | None = None
    # vLLM's extension: keep a matched stop string at the end of the text.
    include_stop_str_in_output: JsonBool = False
    n: Annotated[JsonInt, Field(ge=1, le=128)] = 1
    stream: JsonBool = False
    stream_options: StreamOptions | None = None
    user: JsonStr | None = None
    ignore_eos: JsonBool = False
    # vLLM's extension: lower values leave the server's waiting queue first (interactive before batch).
    priority: Annotated[JsonInt, Field(ge=-(2**31), le=2**31 - 1)] = 0
    # OpenAI's: {"token id": bias in [-100, 100]}, added to the logits before sampling.
    logit_bias: dict[str, Annotated[JsonFloat, Field(ge=-100, le=100)]] | None = None
    # vLLM's extensions: see solo.engine.sampling.SamplingParams.
    min_tokens: Annotated[JsonInt, Field(ge=0)] = 0
    allowed_token_ids: Annotated[list[Annotated[JsonInt, Field(ge=0)]], Field(min_length=1)] | None = None
    bad_words: list[Annotated[JsonStr, Field(min_length=1)]] | None = None
    skip_special_tokens: JsonBool = True
    response_format: dict[str, Any] | None = None
    guided_json: dict[str, Any] | JsonStr | None = None
    guided_regex: JsonStr | None = None
    guided_choice: list[JsonStr] | None = None
    guided_grammar: JsonStr | None = None
    structured_outputs: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _llama_servers_fields(cls, data: Any) -> Any:  # noqa: ANN401
        # llama-server's own fields, as its clients send them to these routes (see the module docstring).
        if not isinstance(data, dict) or not data.keys() & _LLAMA_FIELDS:
            return data
        data = dict(data)
        problems = llama_server_fields(data)
        if problems:
            raise ValidationError.from_exception_data(cls.__name__, [
                {"type": PydanticCustomError("value_error", message), "loc": (name,), "input": None}
                for name, message in problems])
        return data

    @field_validator("model")
    @classmethod
    def _model_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("model is an empty string; send the served model's id (GET /v1/models lists it) or "
                             "leave model out")
        return value

    @field_validator("response_format")
    @classmethod
    def _known_response_format(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        try:
            StructuredOutput.parse(value)
        except InvalidRequestError as exc:
            raise ValueError(str(exc)) from None
        return value

    def structured_output(self) -> StructuredOutput | None:
        """The output constraint asked for, from response_format or one of vLLM's fields.

        Raises:
            InvalidRequestError: more than one is given, or one is malformed (e.g. guided_json not JSON).
        """
        given: list[tuple[str, StructuredOutput | None]] = []
        if self.response_format is not None:
            given.append(("response_format", StructuredOutput.parse(self.response_format)))
        legacy = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                  "guided_grammar": "grammar"}
        for name, key in legacy.items():
            if getattr(self, name) is not None:
                given.append((name, _vllm_structured(key, getattr(self, name), name)))
        for key, value in (self.structured_outputs or {}).items():
            if value is None or value is False:
                continue
            if key not in ("json", "regex", "choice", "grammar", "json_object"):
                raise InvalidRequestError(f"structured_outputs.{key} is not supported; use json, regex, choice, "
                                          "grammar or json_object", param="structured_outputs")
            given.append((f"structured_outputs.{key}", _vllm_structured(key, value, f"structured_outputs.{key}")))
        given = [(n, g) for n, g in given if g is not None]
        if len(given) > 1:
            raise InvalidRequestError(f"give one output constraint, got {', '.join(n for n, _ in given)}",
                                      param=given[1][0])
        return given[0][1] if given else None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true; set stream to true or leave "
                             "stream_options out")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        ids: dict[int, str] = {}
        for key in value or {}:
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"logit_bias keys must be token ids (strings of digits, as \"50256\"), got {key!r}")
            if len(key.lstrip("0")) > 18:  # beyond any vocabulary (and Python's int() refuses 4301+ digits)
                raise ValueError(f"logit_bias holds token id {key[:24]}{'...' if len(key) > 24 else ''}, outside "
                                 "this model's vocabulary")
            if int(key) in ids:  # ("020" and "20": one token, two biases; one would be dropped)
                raise ValueError(f"logit_bias names token {int(key)} twice ({ids[int(key)]!r} and {key!r}); give "
                                 "each token one bias")
            ids[int(key)] = key
        return value

    @model_validator(mode="after")
    def _nothing_dropped(self) -> SamplingFields:
        # A field this model does not declare would otherwise be dropped without a word.
        _refuse_unknown(self, NO_EFFECT_FIELDS, self.DEFAULT_ONLY)
        return self

    @property
    def include_usage(self) -> bool:
        """True when a streamed response ends with a usage chunk."""
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    def sampling_params(self, max_tokens: int | None, logprobs: int | None, choice: int,
                        response_format: StructuredOutput | None = None) -> SamplingParams:
        """The engine's `SamplingParams` for choice `choice` (its seed is seed + choice; seed - choice below 0).

        Raises:
            InvalidRequestError: a value the engine rejects (e.g. an empty stop string).
        """
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        sent = self.max_tokens is not None or getattr(self, "max_completion_tokens", None) is not None
        if max_tokens is not None and self.min_tokens > max_tokens and not sent:
            raise InvalidRequestError(
                f"min_tokens ({self.min_tokens}) exceeds the {max_tokens} tokens this request may generate without "
                "max_tokens (the default, or what fits the context); send max_tokens >= min_tokens",
                param="min_tokens")
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
            min_p=self.min_p, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            repeat_last_n=self.repeat_last_n,
            # -1 is vLLM's "random"; other negative seeds step away from it, so no choice lands on it.
            seed=None if self.seed in (None, -1) else self.seed + choice if self.seed >= 0 else self.seed - choice,
            stop=stop,
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output, ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logit_bias={int(k): float(v) for k, v in self.logit_bias.items()} if self.logit_bias else None,
            allowed_token_ids=self.allowed_token_ids, bad_words=list(self.bad_words or []),
            skip_special_tokens=self.skip_special_tokens, logprobs=logprobs, response_format=response_format,
        )


def _vllm_structured(key: str, value: Any, name: str) -> StructuredOutput | None:  # noqa: ANN401
    # vLLM's guided_* / structured_outputs values, as a StructuredOutput.
    if key == "json_object":
        return StructuredOutput("json_object", source=name) if value is True else None
    if key == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"{name} must be a JSON Schema (an object, or a string of one): {exc}",
                                          param=name) from None
        return StructuredOutput("json_schema", value, source=name)
    return StructuredOutput(key, value, source=name)  # type: ignore[arg-type]


class TextContentPart(_Lenient):
    """One part of a message's content; Solo's models take text only."""

    type: Literal["text"]
    text: JsonStr


class ChatMessage(BaseModel):
    """One chat message. Fields beyond role and content (name, tool_calls, ...) reach the chat template."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[JsonStr | list[TextContentPart], one_of(
        'a string or a list of text parts ({"type": "text", "text": ...}); Solo\'s models take text only'
    )] | None = None

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> ChatMessage:
        # OpenAI allows a null content only on assistant messages (those that made tool calls).
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs a content (a string or a list of text parts); "
                             "only assistant messages may leave it out or null")
        for key in ("reasoning_content", "reasoning"):  # (the template writes it as text: 5 was taken)
            value = (self.model_extra or {}).get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{key} must be a string (the message's reasoning text), got {value!r:.40}")
        return self

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template expects it: text parts joined one per line (as vLLM joins them)."""
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            message["content"] = "\n".join(part.text for part in self.content)
        return message


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    DEFAULT_ONLY: ClassVar[dict[str, Any]] = {**SamplingFields.DEFAULT_ONLY, "echo": False,
                                               "add_special_tokens": False, "verbosity": "medium"}

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[JsonInt, Field(ge=1)] | None = None
    logprobs: JsonBool | None = None
    top_logprobs: Annotated[JsonInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | dict[str, Any],
        one_of('"none", "auto", "required" or an object naming a function'),
    ] | None = None
    tools: list[dict[str, Any]] | None = None
    parallel_tool_calls: JsonBool = True
    # OpenAI's deprecated predecessors of tool_choice / tools, refused the same way.
    function_call: Annotated[
        Literal["none", "auto"] | dict[str, Any], one_of('"none", "auto" or an object naming a function'),
    ] | None = None
    functions: list[dict[str, Any]] | None = None
    modalities: list[JsonStr] | None = None
    reasoning_effort: JsonStr | None = None
    add_generation_prompt: JsonBool = True
    continue_final_message: JsonBool = False  # vLLM's: the model continues the last (assistant) message
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _needs_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs set to true")
        return value

    @field_validator("max_completion_tokens")
    @classmethod
    def _one_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        other = info.data.get("max_tokens")
        if value is not None and other is not None and other != value:
            raise ValueError(f"max_tokens ({other}) and max_completion_tokens ({value}) disagree; send one of them")
        return value

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and value != ["text"]:
            raise ValueError('Solo generates text only; send modalities ["text"] or leave it out')
        return value

    @field_validator("reasoning_effort")
    @classmethod
    def _no_reasoning_effort(cls, value: str | None) -> str | None:
        if value is not None and value != "none":
            raise ValueError("reasoning_effort is not supported by Solo (it has no reasoning-budget control) but "
                             '"none", thinking off; leave it out')
        return value

    @field_validator("function_call")
    @classmethod
    def _no_forcing_function_call(cls, value: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        # "none" / "auto" change nothing without functions (those are refused below); a named one would force a
        # call Solo never makes from this field.
        if isinstance(value, dict):
            raise ValueError('the deprecated function_call is not supported by Solo; send tool_choice {"type": '
                             '"function", "function": {"name": ...}} with the function in tools')
        return value

    @field_validator("functions")
    @classmethod
    def _no_function_calls(cls, value: list[dict[str, Any]] | None, info: ValidationInfo
                           ) -> list[dict[str, Any]] | None:
        if value and info.data.get("function_call", "auto") != "none":
            raise ValueError('the deprecated functions / function_call are not supported by Solo; send the same '
                             'functions as tools (tools=[{"type": "function", "function": ...}], tool_choice)')
        return value

    def check_tool_results(self) -> None:
        """OpenAI's rules for `tool` messages: each answers a call of the assistant message right before them.

        A tool message follows an assistant message with `tool_calls` (or other tool messages after it), and
        its `tool_call_id` names one of those calls not answered yet (where the calls have ids).

        Raises:
            InvalidRequestError: a tool message with no such assistant message before it, without a
                `tool_call_id`, or with one that answers none of its calls (param "messages").
        """
        calls: list[Any] | None = None  # the ids of the calls the next tool messages answer
        answered: set[str] = set()
        for i, message in enumerate(self.messages):
            extra = message.model_extra or {}
            if message.role == "tool":
                call_id = extra.get("tool_call_id")
                if calls is None:
                    raise InvalidRequestError(
                        f"messages[{i}] is a tool result with no assistant message with tool_calls right before "
                        "it; a tool message answers one of the calls of the assistant message it follows",
                        param="messages")
                if not isinstance(call_id, str):
                    raise InvalidRequestError(
                        f"messages[{i}].tool_call_id is {'missing' if call_id is None else 'not a string'}; give "
                        f"the id of the call it answers ({', '.join(map(repr, calls))})", param="messages")
                if all(isinstance(c, str) for c in calls) and (call_id not in calls or call_id in answered):
                    left = [c for c in calls if c not in answered]
                    raise InvalidRequestError(
                        f"messages[{i}].tool_call_id {call_id!r} answers no "
                        f"{'unanswered ' if call_id in calls else ''}call of the assistant message before it "
                        f"(unanswered: {', '.join(map(repr, left)) or 'none'})", param="messages")
                answered.add(call_id)
            elif message.role == "assistant" and isinstance(extra.get("tool_calls"), list) and extra["tool_calls"]:
                calls = [c.get("id") if isinstance(c, Mapping) else None for c in extra["tool_calls"]]
                answered = set()
            else:
                calls = None

    @property
    def completion_budget(self) -> int | None:
        """max_completion_tokens (OpenAI's newer name) or else max_tokens."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def top_logprobs_count(self) -> int | None:
        """None without logprobs, else the number of alternatives per token."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt` is text, token ids, or a list of either (one choice set each)."""

    DEFAULT_ONLY: ClassVar[dict[str, Any]] = {**SamplingFields.DEFAULT_ONLY, "add_special_tokens": True}

    prompt: Annotated[
        JsonStr | list[JsonInt] | list[JsonStr] | list[list[JsonInt]],
        one_of("a string, a list of token ids, a list of strings or a list of token-id lists"),
    ]
    logprobs: Annotated[JsonInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    echo: JsonBool = False
    suffix: JsonStr | None = None  # fill-in-the-middle: the text after the gap ("" or null: none)
    best_of: Annotated[JsonInt, Field(ge=1)] | None = None

    @field_validator("prompt")
    @classmethod
    def _not_empty(cls, value: str | list) -> str | list:
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p for p in value)):
            raise ValueError("prompt is empty; give text or token ids")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool) -> bool:
        if value:
            raise ValueError("echo is not supported by Solo; leave it out or set it to false")
        return value

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None, info: ValidationInfo) -> int | None:
        n = info.data.get("n", 1)
        if value is not None and value < n:  # (OpenAI's and vLLM's rule: best_of candidates, the best n returned)
            raise ValueError(f"best_of ({value}) must be >= n ({n}); leave it out or set it to n")
        if value is not None and value != n:
            raise ValueError("best_of other than n is not supported by Solo; leave it out")
        return value

    def prompts(self) -> list[str | list[int]]:
        """The prompts of this request (a batch of one unless `prompt` is a list of texts or id lists)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class TokenizeRequest(_Lenient):
    """POST /tokenize (vLLM's shape): either `prompt` or `messages`; or llama-server's, `content`.

    With messages, `tools` and `chat_template_kwargs` reach the chat template as on the chat route, so the
    count is the chat request's prompt. `return_token_strs` adds each token's string. llama-server's form:
    `content` (its text), `add_special` (BOS; default false, as llama-server's), `parse_special` (false: special
    tokens' texts stay text), `with_pieces` (each token as {"id", "piece"}, the piece its text, or its bytes where
    they are no whole UTF-8). Other fields are refused by name, not ignored.
    """

    model_config = ConfigDict(extra="forbid")

    model: JsonStr | None = None
    prompt: JsonStr | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: JsonBool = True
    add_generation_prompt: JsonBool = True
    continue_final_message: JsonBool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: JsonBool = False
    content: JsonStr | None = None  # llama-server's
    add_special: JsonBool = False
    parse_special: JsonBool = True
    with_pieces: JsonBool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if sum(x is not None for x in (self.prompt, self.messages, self.content)) != 1:
            raise ValueError("give exactly one of prompt or messages (vLLM's), or content (llama-server's)")
        llama = [name for name in ("add_special", "parse_special", "with_pieces") if name in self.model_fields_set]
        if llama and self.content is None:
            raise ValueError(f"{llama[0]} goes with content (llama-server's form); with prompt, send "
                             "add_special_tokens / return_token_strs")
        chat_only = ("tools", "chat_template_kwargs", "continue_final_message", "add_generation_prompt")
        given = [name for name in chat_only if name in self.model_fields_set and getattr(self, name) is not None]
        if self.prompt is not None and given:
            raise ValueError(f"{given[0]} goes with messages (it is passed to the chat template), not a prompt")
        return self


class DetokenizeRequest(_Lenient):
    """POST /detokenize (vLLM's shape; special tokens are kept, as vLLM's). Other fields are refused by name."""

    model_config = ConfigDict(extra="forbid")

    model: JsonStr | None = None
    tokens: list[Annotated[JsonInt, Field(ge=0)]]


# ------------------------------------------------------------------------------------------ responses

class PromptTokensDetails(BaseModel):
    """Breakdown of the prompt tokens: `cached_tokens` came from the prefix cache (not prefilled), as OpenAI."""

    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    """Breakdown of the completion tokens: `reasoning_tokens` were a thinking model's `<think>` block, as OpenAI."""

    reasoning_tokens: int = 0


class Usage(BaseModel):
    """Token counts of a response (the prompt counted once, however many choices)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


class TopLogprob(BaseModel):
    """One alternative token in chat logprobs."""

    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(BaseModel):
    """One generated token in chat logprobs."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """Chat logprobs: one entry per generated token."""

    content: list[ChatTokenLogprob] | None


class CompletionLogprobs(BaseModel):
    """Completions logprobs (parallel lists, one entry per generated token)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class FunctionCall(BaseModel):
    """The function of a tool call: its name and its arguments as a JSON string."""

    name: str
    arguments: str


class ToolCallOut(BaseModel):
    """One tool call of an assistant reply."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    """The reply of a non-streamed chat choice; content is null when the reply is only tool calls.

    `reasoning_content` (vLLM's and DeepSeek's field) holds a thinking model's `<think>` block, when the
    server splits it out (`solo.engine.reasoning`); it is left out of replies that have none.
    """

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _calls_when_present(self, handler: Any) -> dict[str, Any]:  # noqa: ANN401
        data = handler(self)
        for key in ("tool_calls", "reasoning_content"):
            if getattr(self, key) is None:
                data.pop(key, None)
        return data


class ChatChoice(BaseModel):
    """A non-streamed chat choice."""

    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended the choice


class ChatCompletion(BaseModel):
    """A non-streamed chat response."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(BaseModel):
    """What a streamed chunk adds to a chat choice; absent keys are left out, as OpenAI sends them.

    `tool_calls` entries are OpenAI's incremental shape: {"index", "id", "type", "function": {"name",
    "arguments"}} in a call's first delta, then {"index", "function": {"arguments": ...}} pieces.
    """

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    @model_serializer(mode="plain")
    def _present_only(self) -> dict[str, Any]:
        return {k: v for k, v in (("role", self.role), ("content", self.content),
                                  ("reasoning_content", self.reasoning_content), ("tool_calls", self.tool_calls))
                if v is not None}


class ChatChunkChoice(BaseModel):
    """A streamed chat choice; finish_reason is null until the choice's last chunk."""

    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat response."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChoice(BaseModel):
    """A completions choice (streamed or not)."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None  # vLLM's: the stop string or stop token id that ended the choice


class Completion(BaseModel):
    """A completions response, or one streamed chunk of it (then usage is null until the last)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """One entry of GET /v1/models, in OpenAI's shape and Anthropic's at once.

    OpenAI's fields (object, created, owned_by; vLLM's max_model_len) and Anthropic's (type, display_name,
    created_at: RFC 3339) share the id, so both SDKs' `models.list()` / `retrieve()` read theirs.
    """

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "solo"
    max_model_len: int
    type: Literal["model"] = "model"
    display_name: str = ""
    created_at: str = ""

    def model_post_init(self, __context: Any) -> None:  # noqa: ANN401
        """Anthropic's display name and time from the id and `created` where not given."""
        self.display_name = self.display_name or self.id
        self.created_at = self.created_at or datetime.datetime.fromtimestamp(
            self.created, datetime.UTC).isoformat().replace("+00:00", "Z")


class ModelList(BaseModel):
    """GET /v1/models: OpenAI's list, with Anthropic's paging fields (one page)."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
    has_more: bool = False
    first_id: str | None = None
    last_id: str | None = None

    def model_post_init(self, __context: Any) -> None:  # noqa: ANN401
        """Anthropic's first and last ids from the data."""
        if self.data:
            self.first_id, self.last_id = self.first_id or self.data[0].id, self.last_id or self.data[-1].id


class TokenizeResponse(BaseModel):
    """POST /tokenize."""

    count: int
    max_model_len: int
    tokens: list[int] | list[dict[str, Any]]  # (llama-server's with_pieces: {"id", "piece"})
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    """POST /detokenize: the text as vLLM names it (`prompt`) and as llama-server does (`content`)."""

    prompt: str
    content: str
