"""Chat templates: a checkpoint's Jinja template rendered the way `transformers` renders it.

transformers' `apply_chat_template` (utils/chat_template_utils.py) compiles the template in an immutable
sandboxed Jinja environment with trim_blocks and lstrip_blocks, the loop-controls extension, a `tojson`
filter that keeps non-ASCII text, and the globals `raise_exception` and `strftime_now`; the template
sees `messages`, `tools`, `documents`, `add_generation_prompt` and the named special tokens
(`bos_token`, `eos_token`, ...). Solo builds the same environment so the rendered prompt is identical.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from solo.errors import InvalidRequestError, SoloError


class _GenerationTag(jinja2.ext.Extension):
    # Templates may wrap assistant turns in {% generation %}...{% endgeneration %} (transformers uses it
    # to find assistant tokens); for rendering it is a no-op block.
    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def template_variables(source: str) -> frozenset[str]:
    """The variables a template reads from its caller (`messages`, `tools`, `bos_token`, ...).

    Found by Jinja's parser (`jinja2.meta.find_undeclared_variables`), so a name that only appears in
    text, a comment or a key of another object does not count. Cached per template: parsing one takes
    milliseconds (10 ms for Qwen3's), and every request with tools asks.

    Raises:
        jinja2.TemplateSyntaxError: the template does not parse.
    """
    return frozenset(jinja2.meta.find_undeclared_variables(_environment().parse(source)))


class ChatTemplate:
    """A compiled chat template plus the special tokens it may reference.

    Args:
        source: the Jinja template text.
        special_tokens: named special tokens as strings, e.g. {"bos_token": "<s>", "eos_token": "</s>"}.
        tool_format: the tool-call syntax to parse (`solo.engine.tool_calls.TOOL_FORMATS`; vLLM's
            `--tool-call-parser`), or None to detect it from the template.
        origin: what the template is, for errors ("the model's chat template", or one the user gave).

    Raises:
        InvalidRequestError: the template does not compile; an unknown tool_format.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str], tool_format: str | None = None,
                 origin: str = "the model's chat template") -> None:
        self.source = source
        self.special_tokens = dict(special_tokens)
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            where = f" (line {exc.lineno})" if isinstance(exc, jinja2.TemplateSyntaxError) else ""
            raise InvalidRequestError(f"{origin} does not compile: {exc}{where}") from None
        from solo.engine.tool_calls import TOOL_FORMATS, detect_tool_format  # (the engine package imports this)

        if tool_format is not None and tool_format not in TOOL_FORMATS:
            raise InvalidRequestError(f"unknown tool-call parser {tool_format!r}; choose one of "
                                      f"{', '.join(TOOL_FORMATS)}")
        self.tool_format = tool_format or detect_tool_format(source)
        """The tool-call syntax the template teaches (`solo.engine.tool_calls.TOOL_FORMATS`), or None."""
        self.single_tool_call = "only supports single tool-calls" in source
        """The template refuses an assistant turn with several calls (Llama 3.1-3.3's raise "This model only
        supports single tool-calls at once!"), so a reply gets one call whatever parallel_tool_calls asks: several
        would be refused when the conversation is sent back."""
        self.nine_char_call_ids = "alphanumeric strings with length 9" in source
        """The template refuses tool-call ids other than 9 letters or digits (Mistral v0.3's raise "Tool call IDs
        should be alphanumeric strings with length 9!"): other ids (OpenAI's call_..., Anthropic's toolu_...) are
        rewritten for it, each call and its result alike."""
        self.knows_developer_role = "developer" in source
        """The template names OpenAI's "developer" role (its newer name for "system"); one that does not
        (Qwen2.5's dropped such a message, Mistral's refused it) gets a system message, as llama.cpp's server
        maps it."""

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """Render a conversation to the prompt text.

        Args:
            messages: [{"role": ..., "content": ...}, ...]; keys whose value is None are dropped, as
                transformers does; a "developer" message is a system message unless the template names that
                role.
            add_generation_prompt: append the header that starts the assistant's reply.
            continue_final_message: end the text right after the last message's content, so the model
                continues that message (a prefill) instead of starting a new one: the template's text after it
                (its end-of-turn marker) is cut off, as transformers' `apply_chat_template` does.
            tools: OpenAI tools ({"type": "function", "function": {...}}), for templates that support them;
                a template that takes them in the system message (Phi-4-mini) gets them there, and earlier
                tool calls in its own syntax (`solo.engine.tool_calls.template_tool_messages`).
            **kwargs: extra template variables (they override special tokens of the same name).

        Returns:
            The prompt text; it may begin with the BOS token when the template writes it, so encode it
            without adding special tokens.

        Raises:
            InvalidRequestError: the messages are empty or malformed, or the template rejects them; with
                continue_final_message, add_generation_prompt too, a last message without text content, or a
                template that leaves its content out of the text.
        """
        if not messages:
            raise InvalidRequestError("messages is empty; send at least one message", param="messages")
        if continue_final_message and add_generation_prompt:
            raise InvalidRequestError("continue_final_message continues the last message, add_generation_prompt "
                                      "starts a new one: set add_generation_prompt to false",
                                      param="add_generation_prompt")
        if not self.knows_developer_role:
            messages = [{**m, "role": "system"} if isinstance(m, Mapping) and m.get("role") == "developer" else m
                        for m in messages]
        if self.tool_format == "phi4_mini":
            from solo.engine.tool_calls import template_tool_messages

            if not all(isinstance(m, Mapping) for m in messages):
                raise InvalidRequestError("messages must be objects with a 'role' and a 'content'", param="messages")
            messages = template_tool_messages(self.tool_format, messages, tools)
        cleaned = []
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message:
                raise InvalidRequestError(
                    f"messages[{i}] must be an object with a 'role' and a 'content'", param="messages"
                )
            cleaned.append({k: v for k, v in message.items() if v is not None})
        if self.nine_char_call_ids:
            cleaned = [_nine_char_call_ids(m) for m in cleaned]
        variables = {**self.special_tokens, **kwargs}

        def rendered(messages: list[dict[str, Any]]) -> str:
            return self._template.render(messages=messages, tools=tools, documents=None,
                                         add_generation_prompt=add_generation_prompt, **variables)

        try:
            text = rendered(cleaned)
            marked = rendered([*cleaned[:-1], _marked(cleaned[-1])]) if continue_final_message else None
        except jinja2.TemplateError as exc:
            raise InvalidRequestError(f"the chat template rejected the messages: {exc}", param="messages") from None
        except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as exc:
            # The template's own expressions failing on what the messages hold (a tool call's name that is a
            # number, a missing field the template concatenates): the request's content, not a server fault.
            raise InvalidRequestError(f"the chat template failed on the messages ({type(exc).__name__}: {exc}); "
                                      "check each message's fields against the OpenAI chat format",
                                      param="messages") from None
        return _cut_after_final_message(text, marked, cleaned[-1]) if continue_final_message else text


def _nine_char_id(call_id: Any) -> Any:  # noqa: ANN401
    # A 9-character alphanumeric stand-in for a tool-call id a Mistral template refuses (the same for the same id,
    # so a call and its result still pair up; as vLLM's Mistral tokenizer mode shortens them).
    if not isinstance(call_id, str) or (len(call_id) == 9 and call_id.isascii() and call_id.isalnum()):
        return call_id
    return hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:9]


def _nine_char_call_ids(message: dict[str, Any]) -> dict[str, Any]:
    out = dict(message)
    if "tool_call_id" in out:
        out["tool_call_id"] = _nine_char_id(out["tool_call_id"])
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [{**c, "id": _nine_char_id(c["id"])} if isinstance(c, Mapping) and "id" in c else c
                             for c in calls]
    return out


_END_MARK = "\ue000\ue001"  # (private-use characters: no text a client sends ends with them)


def _final_text(message: Mapping[str, Any]) -> str | None:
    # The text that ends a message: its content, or its last text part's.
    content = message.get("content")
    if isinstance(content, list):
        return content[-1].get("text") if content and isinstance(content[-1], Mapping) else None
    return content if isinstance(content, str) else None


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    # The message with `_END_MARK` after its text, to find where a template writes the text's end.
    content = message.get("content")
    if isinstance(content, list) and content and isinstance(content[-1], Mapping):
        return {**message, "content": [*content[:-1], {**content[-1], "text": f"{content[-1].get('text')}{_END_MARK}"}]}
    return {**message, "content": f"{content or ''}{_END_MARK}"} if content is None or isinstance(content, str) \
        else message


def _cut_after_final_message(text: str, marked: str | None, final: Mapping[str, Any]) -> str:
    # The rendered text up to the end of the last message's content, as transformers' continue_final_message
    # cuts it: where the template writes the content's end (found by a mark after it: a content that also occurs
    # in the end-of-turn marker, "<" or "end", is not cut inside that marker as transformers would cut it, and
    # one the template rewrites, a <think> block it reformats, is cut where it ends), else its last occurrence.
    content = _final_text(final) if final.get("content") is not None else ""
    thinking = final.get("reasoning_content")
    thinking = thinking.strip() if isinstance(thinking, str) else ""
    if not isinstance(content, str) or not (content.strip() or thinking):
        raise InvalidRequestError("continuing the last message (a prefill) needs text in it: give its text, or its "
                                  "thinking", param="messages")
    end = marked.find(_END_MARK) if marked is not None and _END_MARK not in content else -1
    if end >= 0:
        for prefix in (marked[:end], marked[:end].rstrip()):
            if text.startswith(prefix):  # (a template that trims contents: the trimmed one)
                if not content.strip() and thinking not in prefix:
                    raise InvalidRequestError("the last message, continued (a prefill), is thinking only, and the "
                                              "chat template leaves thinking out of the prompt; send it in the text "
                                              "as <think>...</think>", param="messages")
                return prefix
    for piece in (content, content.strip()) if content.strip() else ():
        end = text.rfind(piece)
        if end >= 0:
            return text[:end + len(piece)]
    raise InvalidRequestError("the last message is continued (a prefill), but the chat template leaves its text out "
                              "of the prompt: there is nothing to continue", param="messages")


RESERVED_TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "continue_final_message", "tools", "documents")
"""Template variables Solo sets itself: chat_template_kwargs may not name them."""


def check_template_kwargs(kwargs: Mapping[str, Any] | None, template_source: str | None = None,
                          thinks: bool = False) -> dict[str, Any]:
    """A request's chat_template_kwargs, refused (not dropped) where they would change nothing or clash.

    Args:
        kwargs: the variables, or None.
        template_source: the chat template they go to; a name it never reads is refused (it would be
            silently ignored), except `enable_thinking` for a model that does not think (clients send it to
            every model; such a model is as asked already), which is left out.
        thinks: the model writes a reasoning block (`solo.engine.reasoning.detect_reasoning`).

    Raises:
        InvalidRequestError: not an object, a name among `RESERVED_TEMPLATE_VARIABLES`, a name the template
            never reads, or an enable_thinking that is not a boolean (param "chat_template_kwargs").
    """
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise InvalidRequestError(f"chat_template_kwargs must be an object, got {kwargs!r:.40}",
                                  param="chat_template_kwargs")
    for name in kwargs or {}:
        if name == "documents":
            raise InvalidRequestError("chat_template_kwargs cannot set 'documents': Solo does not pass retrieval "
                                      "documents to templates; put their text in the messages",
                                      param="chat_template_kwargs")
        if name in RESERVED_TEMPLATE_VARIABLES:
            raise InvalidRequestError(f"chat_template_kwargs cannot set {name!r}: Solo passes it to the template "
                                      f"itself (it has a field of its own)", param="chat_template_kwargs")
    checked = dict(kwargs or {})
    if "enable_thinking" in checked and not isinstance(checked["enable_thinking"], bool):
        raise InvalidRequestError(f"chat_template_kwargs.enable_thinking must be true or false, got "
                                  f"{checked['enable_thinking']!r:.40}", param="chat_template_kwargs")
    for name in list(checked):
        if template_source is not None and name not in template_variables(template_source):
            if name == "enable_thinking" and not thinks:
                del checked[name]  # (a model that does not think: as asked already)
                continue
            what = " (the model thinks whatever it is asked)" if name == "enable_thinking" else ""
            raise InvalidRequestError(f"chat_template_kwargs names {name!r}, which the model's chat template never "
                                      f"reads{what}; leave it out", param="chat_template_kwargs")
    return checked


def allows_parallel_calls(template: ChatTemplate | None, asked: bool) -> bool:
    """Whether a reply may hold several tool calls.

    As `parallel_tool_calls` (`asked`) says, unless the template takes one call per assistant turn
    (`ChatTemplate.single_tool_call`: several would be refused when the conversation is sent back).
    """
    return asked and not (template is not None and template.single_tool_call)


def check_continued(last: Mapping[str, Any], response_format: Any) -> None:  # noqa: ANN401
    """Refuse what cannot go with continuing the last message (continue_final_message, a prefill).

    Args:
        last: the message continued.
        response_format: the output's grammar (a response_format, forced or strict tool calls), or None.

    Raises:
        InvalidRequestError: the message holds tool calls (only its text is continued), or there is an output
            grammar (it would start over inside the continued text).
    """
    if last.get("tool_calls"):
        raise InvalidRequestError("the last message is continued (continue_final_message, a prefill), and it holds "
                                  "tool calls (tool_calls; Anthropic's tool_use blocks): only its text is continued; "
                                  "leave the calls out", param="messages")
    if response_format is not None:
        source = getattr(response_format, "source", "response_format")
        raise InvalidRequestError(f"continuing the last message (continue_final_message, a prefill) cannot be "
                                  f"combined with {source}: its grammar would start over inside the continued text; "
                                  f"drop one of them", param=source)


def read_chat_template(value: str | Path) -> str:
    """A chat template given as a file's path or as the template text itself (vLLM's `--chat-template`).

    Raises:
        SoloError: neither a readable file nor text with Jinja tags in it, a missing file, an empty one, or a
            value that is neither a string nor a path.
    """
    if isinstance(value, Path):
        value = str(value)
    if not isinstance(value, str):
        raise SoloError(f"chat_template must be the template text or a file's path (str or pathlib.Path), got "
                        f"{type(value).__name__}")
    if "{{" in value or "{%" in value:  # (before the file system: text longer than a file name raises there)
        return value
    if not value.strip():  # (Path("") is the working folder)
        raise SoloError("--chat-template is empty; give the path of a .jinja file or the template text")
    path = Path(value).expanduser()
    if path.is_dir():
        raise SoloError(f"--chat-template {value!r} is a folder; give the template file in it (e.g. its "
                        "chat_template.jinja)")
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SoloError(f"--chat-template: cannot read {path}: {exc}") from None
        if not text.strip():  # (every chat request would then be refused: the messages render to nothing)
            raise SoloError(f"--chat-template {path} is empty; give a file that holds the template")
        return text
    if path.suffix in (".jinja", ".j2", ".jinja2", ".txt", ".json") or "/" in value:
        raise SoloError(f"--chat-template {value!r}: no such file; check the path (or give the template text)")
    raise SoloError(f"--chat-template {value!r} is neither a file nor a Jinja template (no {{{{ or {{% in it); give "
                    "the path of a .jinja file or the template text")


def chat_template_origin(value: str) -> str:
    """What a `--chat-template` value is, for errors: the file, or text given inline."""
    if "{{" in value or "{%" in value:
        return "the chat template given as text"
    return f"the chat template {value}"


ROLES = ("system", "developer", "user", "assistant", "tool")
"""Message roles a chat request may carry (OpenAI's, as the server's `ChatMessage` takes them)."""


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages checked and put the way templates take them (what the server's `ChatMessage` does).

    A content given as a list of text parts ({"type": "text", "text": ...}) is joined into one string, one
    part per line (as vLLM joins them); other keys (name, tool_calls, tool_call_id, ...) pass through.

    Raises:
        InvalidRequestError: an unknown role, a content that is neither a string nor a list of text parts
            (images and other parts included: Solo's models take text only), or a missing / null content on
            a message other than an assistant's (param "messages").
    """
    checked = []
    for i, message in enumerate(messages):
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
                                      param="messages")
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if not (isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                    raise InvalidRequestError(f"messages[{i}].content[{j}] must be a text part {{'type': 'text', "
                                              f"'text': ...}} (Solo's models take text only), got {part!r:.80}",
                                              param="messages")
            message = {**message, "content": "\n".join(part["text"] for part in content)}
        elif content is None and role != "assistant":
            raise InvalidRequestError(f"messages[{i}] ({role}) needs a content (a string or a list of text parts); "
                                      "only assistant messages may leave it out", param="messages")
        elif content is not None and not isinstance(content, str):
            raise InvalidRequestError(f"messages[{i}].content must be a string or a list of text parts, got "
                                      f"{type(content).__name__}", param="messages")
        checked.append(dict(message))
    return checked


def system_prompt_ids(engine: Any, system: str, kwargs: Mapping[str, Any] | None) -> list[int]:  # noqa: ANN401
    """The prompt of a system message and a one-word user message, checked to show the system message to the model.

    Args:
        engine: a loaded `Engine` with a chat template.
        system: the system message.
        kwargs: the chat template's variables of every turn.

    Raises:
        InvalidRequestError: the template refuses a system message (Gemma's raise an exception).
        SoloError: the template renders the same prompt whatever the system message says (it leaves system
            messages out: Phi-3-mini's first template).
    """
    def ids(text: str) -> list[int]:
        return engine.encode_prompt([{"role": "system", "content": text}, {"role": "user", "content": "hi"}],
                                    kwargs)

    try:
        prompt = ids(system)
    except SoloError as exc:
        engine.encode_prompt([{"role": "user", "content": "hi"}], kwargs)  # (an error of every prompt: its own)
        raise InvalidRequestError(f"this model's chat template refuses a system message ({exc}); put the "
                                  "instructions in your message instead", param="messages") from None
    # (an empty one loses nothing; another text, not none, is compared: a template may put its own in its place)
    if system.strip() and ids(system + " x") == prompt:
        raise SoloError("this model's chat template leaves system messages out (the prompt is the same whatever "
                        "they say), so the model would never see it; put the instructions in your message instead")
    return prompt
