r"""Tool calling: checking `tools` / `tool_choice`, the grammar of a forced call, and parsing calls out of text.

Solo recognises five model families' tool-call syntax, from their chat templates:

- "hermes" (Hermes 2/3, Qwen2.5, Qwen3, SmolLM3): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`,
  one block per call, after optional text.
- "llama3_json" (Llama 3.1 / 3.2 / 3.3): the whole reply is `{"name": ..., "parameters": {...}}` (optionally
  after `<|python_tag|>`; several calls separated by `;`).
- "mistral" (Mistral 7B Instruct v0.3, Mixtral, Mistral Small / Nemo): `[TOOL_CALLS] [{"name": ..., "arguments":
  {...}}, ...]`.
- "phi4_mini" (Phi-4-mini-instruct): `<|tool_call|>[{"name": ..., "arguments": {...}}, ...]<|/tool_call|>`. Its
  template takes the tools as a JSON string in the system message's `tools` key (Microsoft's model card,
  "Tool-enabled function-calling format") and assistant turns as plain text, so `template_tool_messages`
  puts the request's tools there and writes earlier calls back in that syntax, as llama.cpp does for it.
- "qwen3_coder" (Qwen3-Coder, and newer templates in its syntax): XML parameters, one block per call,
  `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`; a value is text,
  typed by its parameter's schema (local `$ref`s followed; an integer parameter's "3" is 3, Python's True /
  None as the template writes them taken for booleans and nulls; a string's value stays text), as vLLM's
  qwen3_coder parser reads it, which also forgives a missing </parameter> or </function>. A value may hold
  the syntax's own closing tags (a tag ends it only where the next tag follows); a <function=...> element
  written without its <tool_call> wrapper is a call too, as vLLM takes it.

With tool_choice "auto" the model writes freely and its calls are parsed out (as vLLM's hermes, llama3_json
and mistral parsers do). With "required" or a named function the output is grammar-constrained to the
family's syntax (XGrammar structural tags: only calls, no free text, Qwen3-Coder's parameters in XGrammar's
qwen_xml style; a JSON array schema for Mistral and Phi-4-mini, whose call markers are special tokens), so the
name is one of the tools and the arguments validate against its parameters schema.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jinja2

from solo.chat_template import template_variables
from solo.engine.constraints import (
    MAX_WHITESPACE,
    StructuredOutput,
    check_json_schema,
    local_ref_target,
    required_xgrammar_drops,
    xgrammar_mishandles,
)
from solo.errors import InvalidRequestError

TOOL_FORMATS = ("hermes", "llama3_json", "mistral", "phi4_mini", "qwen3_coder")
"""Tool-call syntaxes Solo parses (see the module docstring)."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call, in OpenAI's terms.

    Attributes:
        id: the call's id ("call_..."; 9 alphanumerics for Mistral, whose template requires them).
        name: the function name.
        arguments: the arguments as a JSON object string.
    """

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        """OpenAI's `tool_calls` entry: {"id", "type": "function", "function": {"name", "arguments"}}."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def supports_tools(template_source: str | None) -> bool:
    """Whether a chat template shows tools to its model.

    It does when it reads the `tools` variable, or (Phi-4-mini) a system message's `tools` key. The variable
    is found with Jinja's own parser (`jinja2.meta`): a template that only names "tools" in text, a comment
    or a message key it never renders does not count.
    """
    if template_source is None:
        return False
    if _tools_in_system_message(template_source):
        return True
    try:
        return "tools" in template_variables(template_source)
    except jinja2.TemplateSyntaxError:
        return False  # ChatTemplate refuses it when it compiles it


def _tools_in_system_message(template_source: str) -> bool:
    # Phi-4-mini: `<|system|>{content}<|tool|>{message['tools']}<|/tool|><|end|>`.
    return "<|tool|>" in template_source and re.search(r"""\.tools\b|\[\s*['"]tools['"]\s*\]""",
                                                       template_source) is not None


def detect_tool_format(template_source: str | None) -> str | None:
    """The tool-call syntax a chat template teaches its model (one of `TOOL_FORMATS`), or None."""
    if not supports_tools(template_source):
        return None
    assert template_source is not None
    if _tools_in_system_message(template_source):
        return "phi4_mini"
    if "<tool_call>" in template_source and "<function=" in template_source and "<parameter=" in template_source:
        return "qwen3_coder"
    if "<tool_call>" in template_source:
        return "hermes"
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|python_tag|>" in template_source or ("<|start_header_id|>" in template_source
                                                and "parameters" in template_source):
        return "llama3_json"
    return None


def check_tools(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any,  # noqa: ANN401
                template_source: str | None, tool_format: str | None = None
                ) -> tuple[str | None, list[dict[str, Any]], str | dict | None]:
    """Validate tools and tool_choice against each other and the model's chat template.

    Args:
        tools: OpenAI tools ([{"type": "function", "function": {"name", "description", "parameters"}}]).
        tool_choice: "none", "auto", "required", {"type": "function", "function": {"name": ...}}, or None
            (OpenAI's default: "auto" with tools, "none" without).
        template_source: the model's chat template (None: the model has none).
        tool_format: the tool-call syntax to use (`ChatTemplate.tool_format`: a `--tool-call-parser` or the
            detected one), or None to detect it from the template.

    Returns:
        (tool-call format or None, the tools, the resolved tool_choice).

    Raises:
        InvalidRequestError: a malformed tool, duplicate names, tool_choice naming no tool or "required"
            without tools, tools on a model whose template has no tool support or whose tool-call syntax
            Solo does not recognise; the message names the problem.
    """
    if tools is not None and (isinstance(tools, str | Mapping) or not isinstance(tools, Sequence)
                              or not all(isinstance(t, Mapping) for t in tools)):
        raise InvalidRequestError(f'tools must be a list of tool objects ({{"type": "function", "function": '
                                  f'{{...}}}}), got {tools!r:.80}', param="tools")
    tools = [dict(t) for t in tools or []]
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function")
        if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
            raise InvalidRequestError(f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                                      '"parameters": {...}}}', param="tools")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", name):
            raise InvalidRequestError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -, got "
                                      f"{name!r}", param="tools")
        if name in names:
            raise InvalidRequestError(f"two tools are named {name!r}; tool names must be unique", param="tools")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, Mapping):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON Schema object",
                                      param="tools")
        if parameters is not None and parameters.get("type", "object") != "object":
            # A call's arguments are named values, as OpenAI's and Anthropic's APIs require: the call parsers read
            # an object and would drop a call that forced another type.
            raise InvalidRequestError(f'tools[{i}].function.parameters must be a schema of "type": "object" (the '
                                      f"call's named arguments), got \"type\": {json.dumps(parameters['type'])[:40]}; "
                                      "make the value a property of an object", param="tools")
        if function.get("description") is not None and not isinstance(function["description"], str):
            raise InvalidRequestError(f"tools[{i}].function.description must be a string, got "
                                      f"{function['description']!r:.40}", param="tools")
        if function.get("strict") is not None and not isinstance(function.get("strict"), bool):
            raise InvalidRequestError(f"tools[{i}].function.strict must be true, false or null", param="tools")
        names.append(name)
    if tool_choice is None:
        tool_choice = "auto" if tools else "none"
    shape = 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
    if isinstance(tool_choice, Mapping):
        function = tool_choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise InvalidRequestError(shape, param="tool_choice")
        extra = sorted({*tool_choice} - {"type", "function"}) + sorted({*function} - {"name"})
        if extra:  # (nothing else would be read: refused rather than ignored)
            raise InvalidRequestError(f"tool_choice has {extra[0]!r}, which Solo does not read; {shape}",
                                      param="tool_choice")
        if name not in names:
            raise InvalidRequestError(f"tool_choice names the function {name!r}, which is not among tools "
                                      f"({', '.join(names) or 'none given'})", param="tool_choice")
    elif not isinstance(tool_choice, str) or tool_choice not in ("none", "auto", "required"):
        raise InvalidRequestError(f"{shape}, got {tool_choice!r:.40}", param="tool_choice")
    elif tool_choice == "required" and not tools:
        raise InvalidRequestError('tool_choice "required" needs at least one tool in tools', param="tool_choice")
    if not tools:
        return None, [], tool_choice
    if not supports_tools(template_source):
        raise InvalidRequestError("this model's chat template has no tool support (it never reads `tools`), so "
                                  "the model would not see them; leave tools out, serve a tool-calling model, or "
                                  "give the server a template that shows them (--chat-template)", param="tools")
    fmt = tool_format or detect_tool_format(template_source)
    if fmt is None and tool_choice != "none":
        raise InvalidRequestError("Solo does not recognise this model's tool-call syntax (it parses "
                                  f"{', '.join(TOOL_FORMATS)}); send tool_choice \"none\" to only show the "
                                  "tools to the model", param="tools")
    return fmt, tools, tool_choice


def tool_call_constraint(fmt: str, tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping,
                         parallel_tool_calls: bool = True) -> StructuredOutput | None:
    """The output grammar for tool_choice "required" or a named function (None for "auto" / "none").

    Hermes and Llama use XGrammar's structural tags for their syntax; Mistral's `[TOOL_CALLS]` and
    Phi-4-mini's `<|tool_call|>` are special tokens no grammar can emit as text, so their calls are
    constrained to the JSON array that follows the marker.

    Raises:
        InvalidRequestError: a chosen tool's parameters hold a keyword no grammar engine enforces, or are not
            a valid JSON Schema (param "tools").
    """
    if tool_choice in ("auto", "none"):
        return None
    if isinstance(tool_choice, Mapping):
        name = tool_choice["function"]["name"]
        chosen = [t for t in tools if t["function"]["name"] == name]
        parallel_tool_calls = False
    else:
        chosen = list(tools)
    for tool in chosen:
        _check_enforceable(tool, xgrammar_only=fmt not in ("mistral", "phi4_mini"))  # those: a JSON Schema
    if fmt in ("mistral", "phi4_mini"):
        items = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                                   "arguments": _parameters(t)},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in chosen]
        schema: dict[str, Any] = {"type": "array", "items": items[0] if len(items) == 1 else {"anyOf": items},
                                  "minItems": 1}
        if not parallel_tool_calls:
            schema["maxItems"] = 1
        return StructuredOutput("json_schema", schema, "tool_calls", source="tool_choice")
    from xgrammar.structural_tag import StructuralTag, TagFormat, TagsWithSeparatorFormat

    # Only calls, no free text around them (XGrammar's own "required" tags allow text before a call).
    begin, end = _CALL_SYNTAX[fmt]
    try:
        tags = [TagFormat(begin=begin.format(name=t["function"]["name"]),
                          content=_arguments_format(fmt, _parameters(t)), end=end) for t in chosen]
        if len(tags) == 1 and not parallel_tool_calls:
            tag = StructuralTag(format=tags[0])
        else:
            tag = StructuralTag(format=TagsWithSeparatorFormat(tags=tags, separator=_CALL_SEPARATOR.get(fmt, "\n"),
                                                               at_least_one=True,
                                                               stop_after_first=not parallel_tool_calls))
        return StructuredOutput("structural_tag", tag, "tool_calls", source="tool_choice")
    except Exception as exc:  # pydantic validation of the tags
        raise InvalidRequestError(f"the tools cannot be turned into a tool-call grammar: {exc}",
                                  param="tools") from None


def output_constraint(fmt: str | None, tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping,
                      parallel_tool_calls: bool, response_format: StructuredOutput | None
                      ) -> tuple[StructuredOutput | None, bool]:
    """The request's output constraint once its tools are known: (constraint, whether tool calls are forced).

    Args:
        fmt: the model's tool-call syntax (`check_tools`), or None without tools.
        tools, tool_choice, parallel_tool_calls: as `tool_call_constraint` takes them.
        response_format: the request's own constraint (response_format or vLLM's guided_* fields), or None.

    A JSON response format (a final answer's schema) beside tool_choice "required" or a named function has
    nothing to hold (the output is the call), as on OpenAI's API; beside tools under "auto" the output is either
    calls or the format's JSON (`calls_or_format_constraint`), as agent frameworks ask for a final answer in a
    schema while tools run.

    Raises:
        InvalidRequestError: a regex, grammar or choice beside a forced call, or what `calls_or_format_constraint`
            refuses; the message and `param` name the format's field.
    """
    forced = tool_call_constraint(fmt, tools, tool_choice, parallel_tool_calls) if fmt else None
    if forced is not None and response_format is not None and response_format.kind not in ("json_schema",
                                                                                              "json_object"):
        source = getattr(response_format, "source", "response_format")  # (a regex or grammar is no final answer)
        raise InvalidRequestError(f'{source} cannot be combined with tool_choice "required" or a named function '
                                  "(the output is the tool call)", param=source)
    if forced is not None:
        return forced, True
    if fmt is not None and tool_choice == "auto" and response_format is not None:
        return calls_or_format_constraint(fmt, tools, parallel_tool_calls, response_format), False
    strict = strict_tools_constraint(fmt, tools, tool_choice, parallel_tool_calls) if fmt else None
    return strict or response_format, False


def calls_or_format_constraint(fmt: str, tools: Sequence[Mapping[str, Any]], parallel_tool_calls: bool,
                               response_format: StructuredOutput) -> StructuredOutput:
    """Under tool_choice "auto" with a JSON response format: the output is tool calls or the format's JSON.

    The calls' arguments follow their function's schema where it is `"strict": true` (any JSON object
    otherwise); the answer follows the format. One grammar (XGrammar's structural tags: an OrFormat of the JSON
    and the calls) holds the output from its first token, so a format alone would have ruled the calls out.

    Raises:
        InvalidRequestError: a format other than JSON (regex, grammar, choice), or a model whose calls start
            with a special token no grammar writes (Mistral, Phi-4-mini); param: the format's field.
    """
    from xgrammar.structural_tag import JSONSchemaFormat, OrFormat, StructuralTag, TagsWithSeparatorFormat

    source = getattr(response_format, "source", "response_format")
    if response_format.kind not in ("json_schema", "json_object") or fmt not in _CALL_SYNTAX:
        raise InvalidRequestError(
            f'{source} beside tools under tool_choice "auto" is enforced for a JSON format on models whose calls are '
            f"text (Hermes, Qwen3-Coder, Llama 3); this one is {response_format.kind} on {fmt} calls: send tool_choice "
            '"none" to answer in the format, "required" for a call, or drop the format', param=source)
    tags = _auto_call_tags(fmt, tools)
    answer = response_format.value if response_format.kind == "json_schema" else {"type": "object"}
    mishandled = xgrammar_mishandles(answer)
    if mishandled:
        raise InvalidRequestError(f"the schema in {source} uses {mishandled}, which a grammar of tool calls or that "
                                  f'schema cannot enforce; {_MISHANDLED_FIX}, or send tool_choice "none" to answer in '
                                  "the format", param=source)
    try:
        calls = TagsWithSeparatorFormat(tags=tags, separator=_CALL_SEPARATOR.get(fmt, "\n"), at_least_one=True,
                                        stop_after_first=not parallel_tool_calls)
        tag = StructuralTag(format=OrFormat(elements=[
            JSONSchemaFormat(json_schema=dict(answer), max_whitespace_cnt=MAX_WHITESPACE), calls]))
    except Exception as exc:  # pydantic validation of the formats
        raise InvalidRequestError(f"the tools and {source} cannot be turned into one grammar: {exc}",
                                  param=source) from None
    return StructuredOutput("structural_tag", tag, "tool_calls", source=source)


def strict_tools_constraint(fmt: str, tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping,
                            parallel_tool_calls: bool = True) -> StructuredOutput | None:
    """Under tool_choice "auto", the grammar that holds calls of `"strict": true` functions to their schemas.

    Free text is left free; from the call marker on, a call's arguments follow its function's schema (any
    JSON object for a function without strict), and with parallel_tool_calls false the output ends after
    one call (XGrammar's triggered tags). None when no function is strict: without a grammar a request
    keeps GPU block decoding, min_tokens and token bans, and parallel_tool_calls false keeps the reply's
    first call.

    Raises:
        InvalidRequestError: strict functions on a model whose call syntax is not Hermes' `<tool_call>`
            (its calls are not marked where free text could be left free), or a strict schema with keywords
            no grammar engine enforces (param "tools").
    """
    if tool_choice != "auto" or not any(t["function"].get("strict") is True for t in tools):
        return None
    if fmt not in ("hermes", "qwen3_coder"):
        raise InvalidRequestError(f'"strict": true functions under tool_choice "auto" are enforced for models '
                                  f"whose calls are marked by <tool_call> only (Hermes, Qwen3-Coder); this model's "
                                  f'syntax is {fmt}: drop strict, or send tool_choice "required" or a named function '
                                  "(enforced)", param="tools")
    from xgrammar.structural_tag import StructuralTag, TriggeredTagsFormat

    tags = _auto_call_tags(fmt, tools)
    try:
        tag = StructuralTag(format=TriggeredTagsFormat(triggers=["<tool_call>"], tags=tags,
                                                       stop_after_first=not parallel_tool_calls))
    except Exception as exc:  # pydantic validation of the tags
        raise InvalidRequestError(f"the tools cannot be turned into a tool-call grammar: {exc}",
                                  param="tools") from None
    return StructuredOutput("structural_tag", tag, "tool_calls", source="tools")


def _auto_call_tags(fmt: str, tools: Sequence[Mapping[str, Any]]) -> list[Any]:
    # One tag per function for calls under tool_choice "auto": its arguments held to its schema where it is
    # `"strict": true` (checked enforceable: InvalidRequestError), any JSON object otherwise.
    from xgrammar.structural_tag import TagFormat

    begin, end = _CALL_SYNTAX[fmt]
    tags = []
    for tool in tools:
        strict = tool["function"].get("strict") is True
        if strict:
            _check_enforceable(tool)
        tags.append(TagFormat(begin=begin.format(name=tool["function"]["name"]),
                              content=_arguments_format(fmt, _parameters(tool) if strict else {"type": "object"}),
                              end=end))
    return tags


# Between parallel calls, per syntax (newline where not named).
_CALL_SEPARATOR = {"llama3_json": "; "}
# Text around one call's arguments, per syntax ({name} is the function name).
_CALL_SYNTAX = {"hermes": ('<tool_call>\n{{"name": "{name}", "arguments": ', "}\n</tool_call>"),
                "llama3_json": ('{{"name": "{name}", "parameters": ', "}"),
                "qwen3_coder": ("<tool_call>\n<function={name}>\n", "</function>\n</tool_call>")}


def _arguments_format(fmt: str, schema: Mapping[str, Any]) -> Any:  # noqa: ANN401
    # A call's arguments in a structural tag: a JSON object, or Qwen3-Coder's <parameter=...> elements.
    from xgrammar.structural_tag import JSONSchemaFormat

    style = "qwen_xml" if fmt == "qwen3_coder" else "json"
    return JSONSchemaFormat(json_schema=dict(schema), max_whitespace_cnt=MAX_WHITESPACE, style=style)


# What to do about `xgrammar_mishandles`' finds (tool-call grammars are XGrammar's structural tags only).
_MISHANDLED_FIX = ("drop such a pattern (or its quote, backslash or control character), move keywords beside a $ref "
                   "into the definition it names, use additionalProperties instead of patternProperties")


def _check_enforceable(tool: Mapping[str, Any], xgrammar_only: bool = True) -> None:
    # Keywords no engine enforces are refused, as for response_format. Tool-call grammars in XGrammar's structural
    # tags (Hermes, Llama) cannot fall back to llguidance, which enforces what XGrammar leaves out of `required`.
    parameters = _parameters(tool)
    check_json_schema(parameters, source="tools")
    dropped = required_xgrammar_drops(parameters) if xgrammar_only else []
    if dropped:
        raise InvalidRequestError(f"the parameters of tool {tool['function']['name']!r} require {dropped[0]!r} in a "
                                  "way the tool-call grammar cannot enforce (a name their properties do not define, "
                                  "or one required inside anyOf / allOf / oneOf / if-then-else); define it in "
                                  "properties and require it at the top level", param="tools")
    mishandled = xgrammar_mishandles(parameters) if xgrammar_only else None
    if mishandled:
        raise InvalidRequestError(f"the parameters of tool {tool['function']['name']!r} use {mishandled}, which the "
                                  f"tool-call grammar cannot enforce; {_MISHANDLED_FIX}", param="tools")


def _parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    return dict(tool["function"].get("parameters") or {"type": "object", "properties": {}})


def template_tool_messages(fmt: str | None, messages: Sequence[Mapping[str, Any]],
                           tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Messages put the way a template that takes tools in the system message expects them (Phi-4-mini).

    For "phi4_mini": the tools' function objects ([{"name", "description", "parameters"}], as Microsoft's
    model card lists them) go, as one JSON string, into the first system message's `tools` key (a system
    message with empty content is put first when there is none; `ChatTemplate.render` has made a
    "developer" message a system one); an assistant message's `tool_calls` are
    written after its content in the model's own syntax, `<|tool_call|>[{"name": ..., "arguments": {...}}]
    <|/tool_call|>` (the template renders content only). Tool results keep their role: the template renders
    them. Other formats: the messages unchanged.

    Args:
        fmt: the template's tool-call syntax (`detect_tool_format`).
        messages: chat messages, with tool-call arguments as objects (`arguments_as_objects`) or strings.
        tools: the request's OpenAI tools, or None.

    Raises:
        InvalidRequestError: the request sends tools and a system message also carries its own `tools`
            (param "messages": give them once).
    """
    out = [dict(m) for m in messages]
    if fmt != "phi4_mini":
        return out
    for message in out:
        calls = message.pop("tool_calls", None) if message.get("role") == "assistant" else None
        if calls:
            written = [{"name": c["function"]["name"], "arguments": _arguments_object(c["function"].get("arguments"))}
                       for c in calls if isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)]
            message["content"] = (f"{message.get('content') or ''}<|tool_call|>"
                                  f"{json.dumps(written, ensure_ascii=False)}<|/tool_call|>")
    if tools:
        system = next((m for m in out if m.get("role") == "system"), None)
        if system is None:
            system = {"role": "system", "content": ""}
            out.insert(0, system)
        if system.get("tools") is not None:
            raise InvalidRequestError("the request sends tools and its system message carries its own 'tools'; give "
                                      "the tools once (the request's tools field is the OpenAI way)",
                                      param="messages")
        system["tools"] = json.dumps([{k: t["function"][k] for k in ("name", "description", "parameters")
                                       if k in t["function"]} for t in tools], ensure_ascii=False)
    return out


def check_arguments(arguments: str, where: str, param: str) -> None:
    """Refuse a tool call's arguments string that is not a JSON object (blank or null: no arguments).

    Args:
        arguments: the string a client sent.
        where: where it is, for the message ("messages[2].tool_calls[0].function.arguments", "input[1].arguments").
        param: the request field to name.

    Raises:
        InvalidRequestError: not JSON, nested too deeply, or JSON that is not an object.
    """
    # (the template would show the model broken text as its own call)
    if not isinstance(_arguments_object(arguments), dict):
        raise InvalidRequestError(f"{where} must be a JSON object string (the call's arguments by name), got "
                                  f"{arguments!r:.40}", param=param)


def _arguments_object(arguments: Any) -> Any:  # noqa: ANN401
    # A call's arguments as an object: a JSON string parsed, None, null or a blank string -> {} (as vLLM takes
    # them); text that is not JSON is kept (histories are refused before: `check_arguments`).
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return arguments
    return {} if arguments is None else arguments


def new_call_id(fmt: str | None) -> str:
    """A fresh tool-call id: "call_" + 24 hex digits, or 9 alphanumerics for Mistral's template."""
    if fmt == "mistral":
        return uuid.uuid4().hex[:9]
    return "call_" + uuid.uuid4().hex[:24]


def arguments_as_objects(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages with each assistant tool call's `arguments` JSON string turned into an object.

    OpenAI sends arguments as a JSON string; chat templates (written for transformers, where callers
    pass dicts) serialise them with `tojson`, which would quote the string again. vLLM does the same.

    Raises:
        InvalidRequestError: a message's `tool_calls` is not a list of OpenAI tool calls ({"id", "type":
            "function", "function": {"name": a string, "arguments": a JSON object string, or an object}}); the
            message names the message and the call (param "messages").
    """
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is not None:
            _check_tool_calls(i, calls)
        if isinstance(calls, list):
            fixed = []
            for call in calls:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                    call = {**call, "function": {**function, "arguments": _arguments_object(function["arguments"])}}
                fixed.append(call)
            message = {**message, "tool_calls": fixed}
        out.append(dict(message))
    return out


def _check_tool_calls(index: int, calls: Any) -> None:  # noqa: ANN401
    # A history's calls reach the template, whose expressions fail on the wrong types (they were 500s).
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise InvalidRequestError(f"{where} must be a list of tool calls, got {type(calls).__name__}",
                                  param="messages")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise InvalidRequestError(f'{where}[{j}] must be {{"id": ..., "type": "function", "function": {{"name": '
                                      '..., "arguments": ...}}}}', param="messages")
        if call.get("type", "function") != "function":
            raise InvalidRequestError(f'{where}[{j}].type must be "function", got {call.get("type")!r}',
                                      param="messages")
        if call.get("id") is not None and not isinstance(call.get("id"), str):
            raise InvalidRequestError(f"{where}[{j}].id must be a string", param="messages")
        if not isinstance(function.get("name"), str):
            raise InvalidRequestError(f"{where}[{j}].function.name must be a string, got "
                                      f"{function.get('name')!r:.40}", param="messages")
        arguments = function.get("arguments")
        if not isinstance(arguments, str | Mapping):
            raise InvalidRequestError(f"{where}[{j}].function.arguments must be the arguments as a JSON string "
                                      f"(or an object), got {arguments!r:.40}", param="messages")
        if isinstance(arguments, str):
            check_arguments(arguments, f"{where}[{j}].function.arguments", "messages")


# ---------------------------------------------------------------------------------------------- parsing

_MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3_json": "<|python_tag|>",
            "phi4_mini": "<|tool_call|>", "qwen3_coder": "<tool_call>"}
# What starts a call, per syntax: its marker; Qwen3-Coder's models sometimes leave the <tool_call> wrapper out,
# so a bare <function= starts a call too (as vLLM's qwen3_coder parser takes it).
_CALL_STARTS = {**{fmt: (marker,) for fmt, marker in _MARKERS.items()}, "qwen3_coder": ("<tool_call>", "<function=")}


# Per syntax: the text that closes a call (None: a JSON array that parses), and how a call's body starts.
_CALL_BODIES = {"hermes": ("</tool_call>", "{"), "qwen3_coder": ("</tool_call>", "<function="),
                "phi4_mini": ("<|/tool_call|>", "["), "mistral": (None, "[")}


def prefill_opens_call(fmt: str | None, prefill: str) -> bool:
    """Whether a message's text ends inside a tool call of syntax `fmt` (opened, not closed).

    Prose naming a marker (a marker not followed by a call's body) and closed calls are not; neither is
    anything in Llama 3's bare-JSON syntax (a "{" prefill asks for JSON output as often as for a call).
    """
    if fmt not in _CALL_BODIES:
        return False
    at, marker = max((prefill.rfind(m), m) for m in _CALL_STARTS[fmt])
    if at < 0:
        return False
    after = prefill[at + len(marker):]
    if marker == "<function=":  # (Qwen3-Coder's call without its wrapper)
        return "</function>" not in after
    closing, body_start = _CALL_BODIES[fmt]
    if fmt == "hermes":  # (a closing tag inside a string argument closes nothing: `_hermes_blocks`)
        _, _, body, closed = _hermes_blocks(prefill)[-1]
        return not closed and (not body.strip() or body.strip().startswith(body_start))
    body = after.strip()
    if (closing is not None and closing in after) or (body and not body.startswith(body_start)):
        return False
    if closing is None:  # (the array's end closes it; text may follow)
        try:
            json.JSONDecoder().raw_decode(body)
            return False
        except ValueError:
            return True
    return True


def check_prefill_opens_no_call(fmt: str | None, prefill: Any) -> None:  # noqa: ANN401
    """Refuse continuing a message (a prefill) whose text ends inside a tool call (`prefill_opens_call`).

    The call's start would be in the prompt and only its end in the reply, which parses as no call.

    Raises:
        InvalidRequestError: the prefill opens a call it does not close (param "messages").
    """
    if isinstance(prefill, str) and prefill_opens_call(fmt, prefill):
        raise InvalidRequestError("the last message is continued (a prefill), and its text opens a tool call it does "
                                  "not close: the reply would hold only the call's end; send the whole call as the "
                                  "message's tool_calls, or drop the prefill and force a call with tool_choice",
                                  param="messages")


class ToolCallParser:
    """Splits one choice's output into content and tool calls, streamed or whole.

    Feed it each generation event (`feed(text, token_ids)`); it returns the content that can be streamed
    now, holding back anything that may start a tool call. `finish()` parses the held-back part into calls.
    A tool call that does not parse is returned as content, as vLLM does.

    Args:
        fmt: one of `TOOL_FORMATS`.
        special_token_ids: the tokenizer's special tokens (text -> id): markers that are special tokens
            never appear in decoded text and are recognised by id.
        forced: the output was constrained to tool calls (tool_choice "required" or named): all of it is
            a call (Mistral's constrained output is the bare JSON array), and a call cut short (max_tokens, a
            stop string) is left out rather than returned as content.
        parameters: function name -> its parameters schema (`tool_parameters`): how Qwen3-Coder's text
            values are typed; None types none (every value stays text).
    """

    def __init__(self, fmt: str, special_token_ids: Mapping[str, int], forced: bool = False,
                 parameters: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.fmt = fmt
        self.parameters = parameters
        self.marker = _MARKERS[fmt]
        self.marker_id = special_token_ids.get(self.marker)
        self.markers = _CALL_STARTS[fmt]
        self.forced = forced
        self._content = ""      # content released so far
        self._pending = ""      # content held back: it may be the start of a marker
        self._calls_text: str | None = "" if forced else None
        self._lead_unknown = False  # the marker came after other tokens of its event (see `feed`)
        self._lead_limit = 0
        self.lead = ""  # after `finish`: the start of its last value that is content before the calls
        self.cut = ""  # after `finish` of a forced output: the text after its complete calls (a call cut short)

    @property
    def in_tool_call(self) -> bool:
        """True once a tool call has started (content is no longer streamed)."""
        return self._calls_text is not None

    def feed(self, text: str, token_ids: Sequence[int]) -> str:
        """Take one event's text and tokens; returns the content delta safe to stream now."""
        if self._calls_text is not None:
            self._calls_text += text
            return ""
        if self.marker_id is not None and self.marker_id in token_ids:
            # The marker decodes to nothing; with tokens before it in this event (a speculative step, released
            # hold-back) some of the text is content, split off in `finish` where the calls start.
            self._lead_unknown = list(token_ids).index(self.marker_id) > 0
            self._lead_limit = len(text)  # the content ahead of the marker lies within this event's text
            self._calls_text, pending, self._pending = text, self._pending, ""
            return self._release(pending)
        buffer = self._pending + text
        if self.fmt == "llama3_json" and not (self._content + buffer).strip():
            self._pending = buffer
            return ""
        if self.fmt == "llama3_json" and not self._content.strip() and buffer.lstrip().startswith("{"):
            self._calls_text = buffer
            self._pending = ""
            return ""
        found = [i for i in (buffer.find(m) for m in self.markers) if i >= 0]
        index = min(found) if found else -1
        if index >= 0:
            self._calls_text = buffer[index:]
            self._pending = ""
            return self._release(buffer[:index])
        keep = max(partial_suffix(buffer, m) for m in self.markers)
        self._pending = buffer[len(buffer) - keep:] if keep else ""
        return self._release(buffer[:len(buffer) - keep])

    def _release(self, text: str) -> str:
        self._content += text
        return text

    def finish(self) -> tuple[str, list[ToolCall], str]:
        """End of output: (all content, the parsed calls, content not yet streamed).

        With no call parsed, the held-back text is content (streamed last). Content not yet streamed comes
        before the calls for its first `lead` characters (text in the marker's event ahead of it), after them
        for the rest.
        """
        if self._calls_text is None:
            rest, self._pending = self._pending, ""
            self._release(rest)
            return self._content, [], rest
        text, lead, calls, rest = self._calls_text, "", [], self._calls_text
        if self._lead_unknown:  # content ahead of the marker in its event: up to the marker's text where it shows
            found = [i for i in (text.find(m) for m in self.markers) if 0 < i <= self._lead_limit]
            if found:
                lead, text = text[:min(found)], text[min(found):]
        if not self._lead_unknown or lead:
            calls, rest = complete_tool_calls(self.fmt, text, self.parameters)
        # The marker decodes to nothing (or its text split a call's JSON): search the event for the calls' start.
        # Not for a Hermes block whose tag shows: its first call did not parse, so all of it is content, as
        # when the tag starts its event (a later block taken instead lost the first one's text).
        if not calls and self._lead_unknown and not (lead and self.fmt == "hermes"):
            lead, calls, rest = _calls_after_content(self.fmt, self._calls_text, self.parameters, self._lead_limit)
        if self.forced:
            # The output was held to calls: what follows the complete ones, or is all of it when none is complete,
            # is a call that max_tokens or a stop string cut short (finish_reason says which), never content.
            self._pending, self.cut = "", rest
            if not calls:
                self._calls_text = None
            return self._content, calls, ""
        if not calls:
            rest = self._pending + self._calls_text
            self._calls_text, self._pending = None, ""
            self._release(rest)
            return self._content, [], rest
        self.lead = lead
        rest = lead + rest
        # Text after the last complete call (a call cut short by max_tokens) is content: never dropped.
        self._release(rest)
        return self._content, calls, rest


def _calls_after_content(fmt: str, text: str, parameters: Mapping[str, Mapping[str, Any]] | None = None,
                         limit: int | None = None) -> tuple[str, list[ToolCall], str]:
    # (content, calls, text after them) for the tool-call part of an event that began with content: the calls
    # start at a "[", "{" or "<" at most `limit` characters in (the marker's event, which may end with it) from
    # which the rest parses as calls, the one leaving the least text after them (JSON in the content ahead is no
    # call), the earliest of those; ("", [], text) when none does.
    best: tuple[str, list[ToolCall], str] = ("", [], text)
    end = len(text) if limit is None else limit  # (the event's text: the content ahead of the marker lies in it)
    if limit is not None:  # and the blanks after it, which follow the marker: Mistral v0.3 writes "▁[" after it
        limit += len(text[limit:]) - len(text[limit:].lstrip())
    for i, char in enumerate(text if limit is None else text[:limit + 1]):
        if char in "[{<":
            calls, rest = complete_tool_calls(fmt, text[i:], parameters)
            if calls and (not best[1] or len(rest) < len(best[2])):
                best = (text[:min(i, end)], calls, rest)
                if not rest:
                    break
    return best


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker` (text to hold back)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def complete_tool_calls(fmt: str, text: str, parameters: Mapping[str, Mapping[str, Any]] | None = None
                        ) -> tuple[list[ToolCall], str]:
    """The calls an output's tool-call part (from its marker on) makes in full, and the text after them.

    Hermes and Qwen3-Coder calls are blocks, so the complete ones before a block that is cut short
    (max_tokens) or does not parse are kept and the rest is returned as text; the JSON formats parse whole or
    not at all. `parameters` types Qwen3-Coder's values (see `ToolCallParser`).
    """
    if fmt in ("mistral", "phi4_mini"):
        # A JSON array (Phi-4-mini: in <|tool_call|> ... <|/tool_call|>, markers that decode to nothing), then
        # maybe text: the calls are the leading JSON, what follows is content.
        markers = ("[TOOL_CALLS]",) if fmt == "mistral" else ("<|tool_call|>", "<|/tool_call|>")
        end = _leading_json(text, markers)[1]
        calls = parse_tool_calls(fmt, text[:end]) if end else None
        if calls:
            return calls, text[end:] if text[end:].strip() else ""
        # An array cut short (max_tokens, a stop string): its complete items are calls, the cut one is text, as
        # a cut Hermes block is.
        first, last, cut = _complete_items(text, end)
        calls = parse_tool_calls(fmt, "[" + text[first:last] + "]") if last > first else None
        return (calls, text[cut:]) if calls else ([], text)
    if fmt == "qwen3_coder":
        calls, rest = _complete_xml_calls(text, parameters or {})
        return (calls, rest) if calls else ([], text)
    if fmt != "hermes":
        calls = parse_tool_calls(fmt, text)
        return (calls, "") if calls else ([], text)
    calls, between, i = [], [], 0
    blocks = _hermes_blocks(text)
    if blocks and text[:blocks[0][0]].strip():  # (text before the first block: no call part, whatever follows)
        return [], text
    for start, end, _, closed in blocks:
        parsed = parse_tool_calls(fmt, text[start:end]) if closed else None
        if not parsed:
            break
        calls += parsed
        between.append(text[i:start])
        i = end
    tail = text[i:].rstrip()
    tail = tail[:len(tail) - partial_suffix(tail, "</tool_call>")]
    last = parse_tool_calls(fmt, tail) if tail.lstrip().startswith("<tool_call>") else None
    if last:  # a last call whose JSON is whole but whose closing tag never came or was cut (stop, EOS, max_tokens)
        calls, i = calls + last, len(text)
    rest = "".join(between[1:]) + text[i:]  # text between calls, then after them (the first gap is "")
    return calls, rest if rest.strip() else ""


def parse_tool_calls(fmt: str, text: str, parameters: Mapping[str, Mapping[str, Any]] | None = None
                     ) -> list[ToolCall] | None:
    """Parse the tool-call part of an output (from its marker on); None when it is not valid calls.

    Raises nothing: malformed JSON, a missing name or non-object arguments give None (Qwen3-Coder: a
    function element without its end, or text between its parameters). `parameters` types Qwen3-Coder's
    values (see `ToolCallParser`).
    """
    objects: list[Any] = []
    text = text.strip()
    if fmt == "qwen3_coder":
        return _xml_calls(text, parameters or {})
    if fmt == "hermes":
        for _, _, block, _ in _hermes_blocks(text):
            if block.strip():
                objects.extend(_json_values(block))
    elif fmt in ("mistral", "phi4_mini"):
        if fmt == "mistral":
            text = text.removeprefix("[TOOL_CALLS]")
        else:  # each block's markers (they are special tokens: decoded text usually lacks them)
            text = text.replace("<|tool_call|>", " ").replace("<|/tool_call|>", " ")
        for value in _json_values(text.strip()):
            objects.extend(value if isinstance(value, list) else [value])
    else:
        text = text.removeprefix("<|python_tag|>").strip()
        objects = _json_values(text)  # parallel calls are separated by ";", which _json_values skips
    if not objects:
        return None
    calls = []
    for obj in objects:
        if obj is None:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):  # (a JSON string of the object: the same values refused as `_leading_json`)
            try:
                arguments = json.loads(arguments, strict=False, parse_constant=_reject, parse_float=_finite)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append(ToolCall(new_call_id(fmt), obj["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls


def _hermes_blocks(text: str) -> list[tuple[int, int, str, bool]]:
    """Each `<tool_call>` block of Hermes-syntax text: (start, end, body, closed), in order.

    A block whose body is JSON ends at the first `</tool_call>` outside its strings, so a string argument holding
    that tag's text (code that writes tool calls) stays inside it, whole or cut short; any other body ends at the
    first tag. A block without its closing tag runs to the end of the text.
    """
    blocks: list[tuple[int, int, str, bool]] = []
    i = 0
    while (start := text.find("<tool_call>", i)) >= 0:
        body = start + len("<tool_call>")
        close = _closing_tag(text, body)
        if close < 0:
            blocks.append((start, len(text), text[body:], False))
            break
        i = close + len("</tool_call>")
        blocks.append((start, i, text[body:close], True))
    return blocks


def _closing_tag(text: str, body: int) -> int:
    # Where the block whose body starts at `body` closes (-1: it does not): the first </tool_call> outside a JSON
    # string when the body is JSON, else the first one.
    i = len(text) - len(text[body:].lstrip())
    if not text.startswith("{", i):
        return text.find("</tool_call>", body)
    in_string = escaped = False
    while i < len(text):
        char = text[i]
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char == "<" and text.startswith("</tool_call>", i):
            return i
        i += 1
    return -1


def _json_values(text: str) -> list[Any]:
    # Every JSON value in text, in order; [None] when something that is not JSON is left over. Raw control
    # characters inside strings are taken (XGrammar 0.2.9's length-bounded strings admit them); the
    # arguments are re-serialised, escaped, so the client always gets valid JSON.
    values, end = _leading_json(text)
    return values if not text[end:].strip(_SEPARATORS) else [None]


_SEPARATORS = " \t\r\n,;"  # between JSON values: blanks, and the "," or ";" between parallel calls


def _leading_json(text: str, markers: tuple[str, ...] = ()) -> tuple[list[Any], int]:
    # The JSON values at the start of text (separated by `_SEPARATORS` and `markers`) and where the last value or
    # marker ends (0 when none parses).
    # (NaN, Infinity and 1e400 are no JSON: re-serialised they would reach the client as such; not a call then)
    decoder = json.JSONDecoder(strict=False, parse_constant=_reject, parse_float=_finite)
    values: list[Any] = []
    i, end = 0, 0
    while i < len(text):
        while i < len(text) and text[i] in _SEPARATORS:
            i += 1
        marker = next((m for m in markers if text.startswith(m, i)), None)
        if marker is not None:
            i += len(marker)
            end = i
            continue
        try:
            value, i = decoder.raw_decode(text, i)
        except ValueError:  # (json.JSONDecodeError, or a value `_finite` / `_reject` refuse)
            break
        values.append(value)
        end = i
    return values, end


_BLANKS = re.compile(r"\s*")


def _complete_items(text: str, start: int) -> tuple[int, int, int]:
    # The complete items of a JSON array that opens at `start` (after blanks) and does not close: where the first
    # starts, where the last complete one ends and where the item after it starts; (0, 0, 0) without one.
    decoder = json.JSONDecoder(strict=False, parse_constant=_reject, parse_float=_finite)
    i = _BLANKS.match(text, start).end()
    if not text.startswith("[", i):
        return 0, 0, 0
    first = last = 0
    i += 1
    while True:
        i = _BLANKS.match(text, i).end()
        if last:
            if not text.startswith(",", i):
                break
            i = _BLANKS.match(text, i + 1).end()
        try:
            _, end = decoder.raw_decode(text, i)
        except ValueError:
            break
        first, last, i = first or i, end, end
    return (first, last, i) if last else (0, 0, 0)


def tool_parameters(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Function name -> its parameters schema, for `ToolCallParser` (checked tools, as `check_tools` returns)."""
    return {t["function"]["name"]: _parameters(t) for t in tools or []}


_FUNCTION_TAG = re.compile(r"<function=([^>\n]+)>")
_PARAMETER_TAG = re.compile(r"<parameter=([^>\n]+)>")
_NEXT_TAG = re.compile(r"\s*(?:<parameter=|</function>|</tool_call>|$)")


def _complete_xml_calls(text: str, parameters: Mapping[str, Mapping[str, Any]]) -> tuple[list[ToolCall], str]:
    # (the complete calls from the start of text, the text between and after them): as complete_tool_calls.
    calls: list[ToolCall] = []
    between: list[str] = []
    i = 0
    while (start := _next_call(text, i)) >= 0:
        if not calls and text[:start].strip():
            break  # the first call begins the text
        # a <tool_call> block, or a bare <function=...> element (the wrapper left out, as vLLM takes it)
        block = _xml_block(text, start, parameters) if text.startswith("<tool_call>", start) else \
            _bare_function(text, start, parameters)
        if block is None:
            break
        calls += block[0]
        between.append(text[i:start])
        i = block[1]
    rest = "".join(between[1:]) + text[i:]  # (the first gap is "": the text starts with the marker)
    return calls, rest if rest.strip() else ""


def _next_call(text: str, i: int) -> int:
    # Where the next call starts at or after i: a <tool_call> block or a bare <function= element; -1 if none.
    found = [k for k in (text.find(m, i) for m in _CALL_STARTS["qwen3_coder"]) if k >= 0]
    return min(found) if found else -1


def _bare_function(text: str, start: int, parameters: Mapping[str, Mapping[str, Any]]
                   ) -> tuple[list[ToolCall], int] | None:
    # A <function=...> element without <tool_call> around it: a call once its </function> came.
    function = _xml_function(text, start, parameters)
    if function is None or not text[:function[1]].endswith("</function>"):
        return None
    return [function[0]], function[1]


def _xml_block(text: str, start: int, parameters: Mapping[str, Mapping[str, Any]]
               ) -> tuple[list[ToolCall], int] | None:
    # The calls of the <tool_call> block at `start` and where it ends; None if it is cut short or malformed.
    # Its </tool_call> may be missing at the end of the output (a stop string, EOS) after a whole function.
    i, calls = start + len("<tool_call>"), []
    while True:
        i = _skip_blanks(text, i)
        if text.startswith("</tool_call>", i):
            return (calls, i + len("</tool_call>")) if calls else None
        if i >= len(text) or (calls and "</tool_call>".startswith(text[i:])):  # (cut inside the closing tag)
            return (calls, len(text)) if calls else None
        function = _xml_function(text, i, parameters)
        if function is None:
            return None
        calls.append(function[0])
        i = function[1]


def _xml_function(text: str, i: int, parameters: Mapping[str, Mapping[str, Any]]) -> tuple[ToolCall, int] | None:
    # One <function=NAME> element at i, its parameters typed by the function's schema, and where it ends. As
    # vLLM's parser, a parameter may lack its </parameter> before the next tag, and the function its
    # </function> before </tool_call>; a function cut short by the end of the output is None.
    tag = _FUNCTION_TAG.match(text, i)
    if tag is None:
        return None
    name, i = tag.group(1).strip(), tag.end()
    root = parameters.get(name)
    root = root if isinstance(root, Mapping) else {}
    properties = root.get("properties") if isinstance(root.get("properties"), Mapping) else {}
    arguments: dict[str, Any] = {}
    while True:
        i = _skip_blanks(text, i)
        if text.startswith("</function>", i):
            i += len("</function>")
            break
        if text.startswith("</tool_call>", i):
            break  # its </function> left out
        tag = _PARAMETER_TAG.match(text, i)
        if tag is None:
            return None  # other text, or the output's end
        key, i = tag.group(1).strip(), tag.end()
        end = _value_end(text, i)
        if end is None:
            return None
        arguments[key] = _xml_value(text[i:end[0]], properties.get(key), root)
        i = end[1]
    return ToolCall(new_call_id("qwen3_coder"), name, json.dumps(arguments, ensure_ascii=False)), i


def _value_end(text: str, i: int) -> tuple[int, int] | None:
    # (end of the value at i, where the next tag starts): the first </parameter> followed by the next tag (a
    # value may hold "</parameter>" of its own, such as code that writes this syntax), else the next tag.
    k = i
    while (k := text.find("</parameter>", k)) >= 0:
        if _NEXT_TAG.match(text, k + len("</parameter>")):
            return k, k + len("</parameter>")
        k += 1
    tags = [m for m in (text.find(tag, i) for tag in ("<parameter=", "</function>", "</tool_call>")) if m >= 0]
    return (min(tags), min(tags)) if tags else None


def _skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def _xml_calls(text: str, parameters: Mapping[str, Mapping[str, Any]]) -> list[ToolCall] | None:
    # Every call of a tool-call part that holds calls only (blanks around them); None otherwise.
    calls, rest = _complete_xml_calls(text, parameters)
    return calls if calls and not rest.strip() else None


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict,
               "array": list, "null": type(None)}


def _resolved(schema: Any, root: Mapping[str, Any], depth: int = 0) -> Mapping[str, Any]:  # noqa: ANN401
    # A subschema with its local $ref ("#/$defs/Name") followed; {} for anything that is not a schema object
    # (true / false subschemas included: they say nothing of a type).
    if not isinstance(schema, Mapping):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and depth < 16:
        return _resolved(local_ref_target(root, ref), root, depth + 1)
    return schema


def _types(schema: Any, root: Mapping[str, Any], depth: int = 0) -> set[str]:  # noqa: ANN401
    # The JSON types a subschema allows: its `type`, its anyOf / oneOf / allOf branches', or what its enum /
    # const values, properties or items imply; empty when it says nothing.
    schema = _resolved(schema, root)
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    types: set[str] = set()
    for key in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(key)
        for branch in branches if isinstance(branches, list) and depth < 16 else []:
            types |= _types(branch, root, depth + 1)
    if types:
        return types
    values = schema.get("enum") if isinstance(schema.get("enum"), list) else []
    values = [*values, schema["const"]] if "const" in schema else values
    for value in values:
        types |= {name for name, kind in _JSON_TYPES.items() if isinstance(value, kind)
                  and not (name in ("integer", "number") and isinstance(value, bool))
                  and not (name == "integer" and isinstance(value, float))}
    if "properties" in schema:
        types.add("object")
    if "items" in schema:
        types.add("array")
    return types


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _reject(name: str) -> Any:  # noqa: ANN401
    raise ValueError(f"{name} is not JSON")


def _xml_value(text: str, schema: Any, root: Mapping[str, Any]) -> Any:  # noqa: ANN401
    # A parameter's text (one newline each side is the syntax's) as its schema's type (as vLLM's qwen3_coder
    # parser types it): one of its enum strings; JSON (or Python's True / False / None, which the real template
    # writes for such values) when it parses to a value of a type the schema allows; else the text itself.
    text = text.removeprefix("\n").removesuffix("\n")
    schema = _resolved(schema, root)
    stripped = text.strip()  # (a grammar may put blanks around a value: the syntax's)
    enum = schema.get("enum") if isinstance(schema.get("enum"), list) else []
    if stripped in [*enum, *([schema["const"]] if "const" in schema else [])]:
        return stripped
    types = _types(schema, root)
    if not types or types == {"string"}:
        return text
    if "boolean" in types and stripped.lower() in ("true", "false"):
        return stripped.lower() == "true"
    if "null" in types and stripped in ("null", "None"):
        return None
    try:
        value = json.loads(stripped, parse_float=_finite, parse_constant=_reject)
    except ValueError:
        return text
    if isinstance(value, str):
        return text  # a string allowed beside other types keeps its text, quotes and all
    for name in types:
        kind = _JSON_TYPES.get(name)
        if kind is not None and isinstance(value, kind) and not (name in ("integer", "number")
                                                                 and isinstance(value, bool)):
            return value
    return text
