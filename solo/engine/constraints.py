r"""Grammar-constrained decoding: JSON, JSON Schema, regex, choice, grammar and tool-call formats.

A `StructuredOutput` says what the output must match. `ConstraintCompiler` (one per engine) compiles it
with XGrammar (Dong et al. 2024, "XGrammar: Flexible and Efficient Structured Generation Engine for Large
Language Models") or llguidance (guidance-ai, the engine behind OpenAI's structured outputs), each
falling back to the other where the first rejects a grammar. XGrammar goes first (its masks measured
10-15x faster), except for JSON Schemas with string minLength / maxLength, which go to llguidance first
(XGrammar 0.2.9 lets raw control characters into such strings, which is not JSON), and those with what
`xgrammar_mishandles` or `required_xgrammar_drops` names; tool-call formats
(XGrammar structural tags) go to XGrammar only. A compiled grammar makes
one `TokenConstraint` per request: a matcher plus a packed bitmask (int32 [ceil(vocab / 32)], bit i of
word i // 32 set when token i is allowed).

The mask is on the decode critical path, so where a core is free for it (a GPU runtime, or a CPU runtime
using fewer threads than cores) the next mask is computed on a host thread while the runtime's decode
step runs (`TokenConstraint.accept` starts it, `apply` waits for it); otherwise it is computed inline in
`apply`. When a single token is allowed, sampling is skipped (`apply` returns it as forced).

JSON Schemas are checked before compiling: llguidance reports keywords that no engine here enforces
("Unimplemented keys", e.g. uniqueItems, not, if/then, contains); those are refused rather than ignored,
so an output always validates against the schema it was promised. XGrammar compiles some constructs
while only logging that it ignores them (allOf with several subschemas, multipleOf on numbers, regex
escapes it does not know such as \A or \z, lookaheads); its log is read while it compiles, and a grammar
it warned about goes to llguidance instead, which enforces it or rejects it (a 400 naming the problem). A
tool-call grammar (XGrammar only) that XGrammar warned about is refused. Whitespace between JSON tokens is
bounded (`MAX_WHITESPACE`), so a constrained output cannot run away in blanks. Either engine closes objects
the same way: XGrammar's strict mode is written into the schema llguidance gets (`strict_schema`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from solo.errors import InvalidRequestError

MAX_WHITESPACE = 4
"""Most consecutive whitespace characters allowed between JSON tokens (XGrammar's max_whitespace_cnt)."""

MAX_GRAMMAR_CHARS = 131_072
"""Most characters a regex, a grammar or a choice list (all its strings) may hold: a break test's 150,000
choices (2.7 MB) compiled for 96 s and held 200 MB, every other structured-output request waiting."""
_CACHE_CHARS = 2 * 2**20  # the compiled constraints kept hold at most this many characters of sources

Kind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "structural_tag"]
KINDS: tuple[str, ...] = ("json_object", "json_schema", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True)
class StructuredOutput:
    """What a generation's output must match.

    Attributes:
        kind: "json_object" (any JSON object), "json_schema" (`value` is the schema, a dict), "regex"
            (`value` is a regular expression), "choice" (`value` is a list of strings, output is one of
            them), "grammar" (`value` is an EBNF / GBNF grammar with a `root` rule, or a Lark grammar), or
            "structural_tag" (`value` is an XGrammar `StructuralTag`, e.g. a model's tool-call format).
        value: see `kind`.
        name: the schema's name (OpenAI's json_schema.name), for messages.
        source: the request field it came from (`response_format`, or vLLM's `guided_regex`, ...), which
            errors name; not part of equality.
    """

    kind: Kind
    value: Any = None
    name: str | None = None
    source: str = field(default="response_format", compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"{self.source} type {self.kind!r} is unknown; use one of "
                                      f"{', '.join(KINDS[:-1])}", param=self.source)
        checks = {
            "json_schema": (lambda v: isinstance(v, Mapping | bool), "a JSON Schema object"),
            "regex": (lambda v: isinstance(v, str) and v != "", "a non-empty regular expression string"),
            "choice": (lambda v: isinstance(v, list | tuple) and v and all(isinstance(c, str) for c in v),
                       "a non-empty list of strings"),
            "grammar": (lambda v: isinstance(v, str) and v.strip() != "", "a non-empty grammar string"),
        }
        if self.kind in checks:
            ok, what = checks[self.kind]
            where = self.source if self.source == self.kind else f"{self.source} {self.kind}"
            if not ok(self.value):
                raise InvalidRequestError(f"{where} must be {what}, got {self.value!r:.80}", param=self.source)
            # (a choice counts one more for its separator: 600,000 empty ones are no small list)
            size = sum(len(c) + 1 for c in self.value) if self.kind == "choice" else len(self.value) \
                if isinstance(self.value, str) else 0
            if size > MAX_GRAMMAR_CHARS:
                raise InvalidRequestError(f"{where} holds {size} characters; at most {MAX_GRAMMAR_CHARS} are "
                                          "compiled (its compile time and memory grow with it, and compiles take "
                                          "turns): send a shorter one", param=self.source)

    @classmethod
    def parse(cls, value: StructuredOutput | Mapping[str, Any] | None) -> StructuredOutput | None:
        """Read OpenAI's `response_format` shape (plus Solo's extension types) into a `StructuredOutput`.

        Accepted: None or {"type": "text"} (no constraint); {"type": "json_object"}, or with a "schema"
        (llama.cpp's server form: the same as json_schema); {"type": "json_schema", "json_schema": {"name",
        "schema", "strict", "description"}}; {"type": "regex", "regex": ...}; {"type": "choice", "choice":
        [...]}; {"type": "grammar", "grammar": ...}.

        Raises:
            InvalidRequestError: an unknown type, a missing / malformed field, or a field the type does not
                take (refused rather than ignored).
        """
        if value is None or isinstance(value, StructuredOutput):
            return value
        if not isinstance(value, Mapping) or not isinstance(value.get("type"), str):
            raise InvalidRequestError('response_format must be an object with a "type" (text, json_object, '
                                      f"json_schema, regex, choice or grammar), got {value!r}",
                                      param="response_format")
        kind = value["type"]
        fields = {"text": (), "json_object": ("schema",), "json_schema": ("json_schema",), "regex": ("regex",),
                  "choice": ("choice",), "grammar": ("grammar",)}.get(kind)
        extra = sorted(set(value) - {"type", *fields}) if fields is not None else []
        if extra:
            raise InvalidRequestError(f"response_format type {kind} does not take {', '.join(map(repr, extra))}; "
                                      f"its fields are type{''.join(', ' + f for f in fields)}",
                                      param="response_format")
        if kind == "text":
            return None
        if kind == "json_object":
            if "schema" not in value:
                return cls("json_object")
            return cls("json_schema", value["schema"], source="response_format.schema")
        if kind == "json_schema":
            spec = value.get("json_schema")
            if not isinstance(spec, Mapping) or "schema" not in spec:
                raise InvalidRequestError('response_format json_schema needs "json_schema": {"name": ..., '
                                          '"schema": {...}}', param="response_format")
            extra = sorted(set(spec) - {"name", "schema", "strict", "description"})
            if extra:
                raise InvalidRequestError(f"response_format json_schema does not take {', '.join(map(repr, extra))}; "
                                          "its fields are name, schema, strict and description",
                                          param="response_format")
            for name, kind_, what in (("name", str, "a string"), ("strict", bool, "true or false"),
                                      ("description", str, "a string")):
                if spec.get(name) is not None and not isinstance(spec[name], kind_):
                    raise InvalidRequestError(f"response_format json_schema.{name} must be {what}, got "
                                              f"{spec[name]!r:.40}", param="response_format")
            return cls("json_schema", spec["schema"], spec.get("name"))
        if kind in ("regex", "choice", "grammar"):
            if kind not in value:
                raise InvalidRequestError(f'response_format type {kind} needs a "{kind}" field',
                                          param="response_format")
            return cls(kind, value[kind])  # type: ignore[arg-type]
        raise InvalidRequestError(f"response_format type {kind!r} is not supported; use text, json_object, "
                                  "json_schema, regex, choice or grammar", param="response_format")


# ------------------------------------------------------------------------------------------- compiling

@dataclass
class CompiledConstraint:
    """A grammar compiled for one tokenizer; makes per-request matchers.

    Attributes:
        backend: "xgrammar" or "llguidance".
        grammar: the backend's compiled grammar (xgrammar.CompiledGrammar, or llguidance grammar text).
        vocab_size: logits width the masks cover.
        source: the request field the grammar first came from ("response_format", "tools", ...): a matcher's
            errors name its own request's field (`matcher`), since equal grammars share one compilation.
        what: what the field held ("regex", "JSON schema", "grammar", ...), for errors.
    """

    backend: str
    grammar: Any
    vocab_size: int
    _compiler: ConstraintCompiler = field(repr=False, default=None)  # type: ignore[assignment]
    source: str = "response_format"
    what: str = "grammar"

    def matcher(self, stop_token_ids: Sequence[int], source: str | None = None) -> TokenConstraint:
        """A fresh per-request matcher that ends on one of `stop_token_ids` (or, with none, by itself).

        `source`: the request's field holding the grammar, named in its errors (default: `self.source`).
        """
        return TokenConstraint(self, sorted(set(stop_token_ids)), source or self.source)


class ConstraintCompiler:
    """Compiles `StructuredOutput`s for one tokenizer (thread-safe; compiled grammars are cached).

    Args:
        tokenizer: the model's `solo.tokenizer.Tokenizer`.
        vocab_size: the model's logits width; ids the tokenizer lacks (padding) are never allowed.
        stop_token_ids: the model's EOS ids.
        overlap: compute each next mask on a host thread while the decode step runs. Worth it only with a
            core the decode step leaves free (a GPU runtime, or fewer torch threads than cores): on a CPU
            whose every core runs the step's OpenMP team, the extra thread preempts one of them and the
            whole team waits at its next barrier (measured: slower than computing the mask inline).
    """

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: Sequence[int],  # noqa: ANN401
                 overlap: bool = True) -> None:
        self.tokenizer = tokenizer
        self.overlap = overlap
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)
        self.logits_width = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self._lock = threading.Lock()
        self._hf = None
        self._xgr_compiler = None
        self._ll_tokenizer = None
        self._cache: dict[str, CompiledConstraint] = {}

    def _hf_tokenizer(self) -> Any:  # noqa: ANN401
        # Both grammar engines read the vocabulary through transformers' fast-tokenizer wrapper.
        if self._hf is None:
            from transformers import PreTrainedTokenizerFast

            self._hf = PreTrainedTokenizerFast(tokenizer_object=self.tokenizer.backend)
        return self._hf

    def _xgrammar(self) -> Any:  # noqa: ANN401
        if self._xgr_compiler is None:
            import xgrammar as xgr

            info = xgr.TokenizerInfo.from_huggingface(self._hf_tokenizer(), vocab_size=self.vocab_size,
                                                      stop_token_ids=self.stop_token_ids or None)
            # XGrammar matches an added token by its text, a stop token's too ("<|im_end|>" in a choice or a
            # regex): sampled there, it ended the output before the grammar did, and its text was skipped. Other
            # special tokens ("<|im_start|>", "<s>") it let into JSON strings, whose text decoding then drops. With
            # no text (XGrammar's mark of a special token) a stop token only ends a complete output and the others
            # never come, as with llguidance, which tells special tokens from text.
            blank = set(self.stop_token_ids) | set(self.tokenizer.special_token_ids().values())
            if blank:
                vocab = list(info.decoded_vocab)
                for t in blank:
                    if t < len(vocab):
                        vocab[t] = b""
                info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=self.vocab_size,
                                         stop_token_ids=self.stop_token_ids or list(info.stop_token_ids),
                                         add_prefix_space=info.add_prefix_space)
            # No cache of XGrammar's own: it would return a grammar it warned about once without warning again
            # (the warning is how such a grammar is turned away); this class caches what it accepts.
            self._xgr_compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._xgr_compiler

    def _llguidance(self) -> Any:  # noqa: ANN401
        if self._ll_tokenizer is None:
            import llguidance.hf

            self._ll_tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer(), n_vocab=self.vocab_size,
                                                              eos_token=self.stop_token_ids or None)
        return self._ll_tokenizer

    def compile(self, spec: StructuredOutput) -> CompiledConstraint:
        """Compile `spec` (cached by its content).

        Raises:
            InvalidRequestError: an invalid JSON Schema, a schema keyword no engine enforces, a regex or
                grammar neither engine accepts, or one that admits no output at all (an empty character
                class, a schema whose $refs never end); the message names the problem.
        """
        key = _cache_key(spec)
        with self._lock:
            if key is not None and key in self._cache:
                self._cache[key] = self._cache.pop(key)  # (most recently used last)
                return self._cache[key]
            compiled = self._compile(spec)
            if key is not None and len(key) <= _CACHE_CHARS // 8:  # (a huge one would flush the others)
                # Bounded in count and in the sources' size, which the compiled grammars' memory follows.
                while self._cache and (len(self._cache) > 256 or sum(map(len, self._cache)) + len(key) > _CACHE_CHARS):
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = compiled
            return compiled

    def _compile(self, spec: StructuredOutput) -> CompiledConstraint:
        if spec.kind == "json_schema":
            check_json_schema(spec.value, spec.source)
        if spec.kind == "structural_tag":
            try:
                return CompiledConstraint("xgrammar", self._compile_xgrammar(spec), self.logits_width, self, "tools",
                                          "tool-call grammar")
            except XGrammarWarning as exc:
                raise InvalidRequestError(f"a tool's parameters use JSON Schema features Solo cannot enforce in "
                                          f"a tool call ({exc}); remove them from the tool's parameters",
                                          param="tools") from None
            except Exception as exc:  # XGrammar raises RuntimeError / ValueError / its own types
                raise InvalidRequestError(f"the tool-call grammar does not compile: {_first_line(exc)}",
                                          param="tools") from None
        # XGrammar first: its masks measured 10-15x faster here (p50 17-25 us against 250-350 us for
        # llguidance on an 8k vocabulary). But XGrammar 0.2.9 lets raw control characters into strings that
        # have a minLength / maxLength (not valid JSON), so such schemas go to llguidance.
        # XGrammar also leaves some `required` names unenforced (`required_xgrammar_drops`); llguidance writes them.
        # So do schemas with the keywords `xgrammar_mishandles` names.
        llguidance_first = spec.kind == "json_schema" and (_has_string_length(spec.value)
                                                           or bool(required_xgrammar_drops(spec.value))
                                                           or xgrammar_mishandles(spec.value) is not None)
        order = ("llguidance", "xgrammar") if llguidance_first else ("xgrammar", "llguidance")
        errors = []
        what = {"json_schema": "JSON schema", "regex": "regex", "grammar": "grammar", "choice": "choice list",
                "json_object": "JSON grammar"}[spec.kind]
        for backend in order:
            try:
                grammar = self._compile_xgrammar(spec) if backend == "xgrammar" else self._compile_llguidance(spec)
            except Exception as exc:  # either engine's own error types
                errors.append(f"{backend}: {_first_line(exc)}")
                continue
            compiled = CompiledConstraint(backend, grammar, self.logits_width, self, spec.source, what)
            self._check_start(compiled, spec)
            return compiled
        raise InvalidRequestError(f"the {what} in {spec.source} is not supported ({'; '.join(errors)})",
                                  param=spec.source)

    def _check_start(self, compiled: CompiledConstraint, spec: StructuredOutput) -> None:
        # A grammar that allows no first token (an empty character class) would fail at the request's first
        # token, and a JSON grammar that allows only the end (a schema whose $refs never reach a value) would
        # "finish" with an empty output that no JSON parser takes: both are refused here, before any step.
        # (A grammar that runs dead later, "ab[^\s\S]", ends its request with an error at that token.)
        allowed, what = compiled.matcher(self.stop_token_ids).first_allowed(), compiled.what
        if spec.kind in ("json_schema", "json_object") and allowed <= set(self.stop_token_ids):
            raise InvalidRequestError(f"the {what} in {spec.source} admits no JSON value (a $ref that only leads "
                                      "to itself, or no type that can be written); give every $ref a way to end "
                                      "in a value", param=spec.source)
        if not allowed:
            raise InvalidRequestError(f"the {what} in {spec.source} admits no output at all: no text matches it "
                                      "(an empty character class, or a rule that can never end); fix the "
                                      f"{what}", param=spec.source)

    def _compile_llguidance(self, spec: StructuredOutput) -> str:
        import llguidance

        # Closed as XGrammar's strict mode first; where that leaves nothing to write (strict_schema cannot see
        # through a $ref), as the schema says: better open objects than a fallback that drops requirements.
        for strict in (True, False) if spec.kind == "json_schema" else (False,):
            try:
                grammar = _llguidance_grammar(spec, strict)
            except InvalidRequestError as exc:  # (too many $refs to write out: llguidance reads them as they are)
                messages = [str(exc)]
                continue
            is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self._llguidance())
            if not is_error:
                return grammar
        raise ValueError("; ".join(messages) or "rejected")

    def _compile_xgrammar(self, spec: StructuredOutput) -> Any:  # noqa: ANN401
        compiler = self._xgrammar()
        with _native_stderr() as log:
            compiled = self._compile_xgrammar_quietly(compiler, spec)
        warnings = _xgrammar_warnings(log.text)
        if warnings:
            raise XGrammarWarning("; ".join(warnings))
        return compiled

    @staticmethod
    def _compile_xgrammar_quietly(compiler: Any, spec: StructuredOutput) -> Any:  # noqa: ANN401
        if spec.kind == "json_object":
            return compiler.compile_json_schema({"type": "object"}, any_whitespace=True,
                                                max_whitespace_cnt=MAX_WHITESPACE)
        if spec.kind == "json_schema":
            schema = {} if spec.value is True else spec.value  # (false is refused before compiling)
            return compiler.compile_json_schema(json.dumps(schema), any_whitespace=True,
                                                max_whitespace_cnt=MAX_WHITESPACE, strict_mode=True)
        if spec.kind == "regex":
            return compiler.compile_regex(spec.value)
        if spec.kind == "choice":
            return compiler.compile_regex("|".join(_regex_escape(c) for c in spec.value))
        if spec.kind == "grammar":
            return compiler.compile_grammar(spec.value)
        return compiler.compile_structural_tag(spec.value)


class XGrammarWarning(ValueError):
    """XGrammar compiled a grammar but logged that it ignores part of it (the message lists what)."""


class _CapturedLog:
    text = ""


_stderr_lock = threading.Lock()
# XGrammar's log lines: "[hh:mm:ss] /path/json_schema_converter.cc:3159: Warning: ..."
_XGRAMMAR_LOG = re.compile(r"^(?:\[[0-9:]+\] )?\S+\.cc:\d+: (.*)$")


@contextlib.contextmanager
def _native_stderr() -> Iterator[_CapturedLog]:
    """Capture what native code writes to file descriptor 2 while the block runs.

    XGrammar logs its warnings to std::cerr, with no Python API to read them. Other output that lands there
    meanwhile (another thread's log line) is written back to the real stderr afterwards, not lost.
    """
    log = _CapturedLog()
    with _stderr_lock, tempfile.TemporaryFile(mode="w+b") as sink:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        try:
            saved = os.dup(2)
        except OSError:  # no descriptor 2 (a daemon without stderr): nothing to read, compile anyway
            yield log
            return
        os.dup2(sink.fileno(), 2)
        try:
            yield log
        finally:
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            log.text = sink.read().decode("utf-8", "replace")
            others = [line for line in log.text.splitlines(keepends=True) if not _XGRAMMAR_LOG.match(line)]
            if others:
                with contextlib.suppress(OSError):
                    os.write(2, "".join(others).encode())


# An escaped character that is no regex operator matches itself, as in Python's `re` (whose `re.escape` escapes
# spaces and newlines): XGrammar warns and does so. Not a reason to fall back to llguidance, whose mask then let
# an added token through that its own matcher refused (a 500; a trial found it with re.escape of "<tool_call> x").
_IDENTITY_ESCAPE = re.compile(r"Regex parsing warning at position \d+: Escape sequence '\\(?:[^A-Za-z0-9\\]|"
                              r"\\[ntrfv])' is not recognized\. The character itself will be matched")


def _xgrammar_warnings(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        match = _XGRAMMAR_LOG.match(line.strip())
        warning = match.group(1).removeprefix("Warning: ") if match else None
        if warning and warning not in found and not _IDENTITY_ESCAPE.fullmatch(warning):
            found.append(warning)
    return found


def check_json_schema(schema: Any, source: str = "response_format") -> None:  # noqa: ANN401
    """Refuse a JSON Schema that is invalid or holds a keyword the grammar engines do not enforce.

    llguidance's schema compiler is the judge: it reports invalid schemas and "Unimplemented keys" (for
    example uniqueItems, not, if/then/else, contains, propertyNames, dependentRequired). `source`: the
    request field the schema came from, named as the error's param.

    Raises:
        InvalidRequestError: naming the problem (the keywords, or the compiler's message).
    """
    if schema is False:
        raise InvalidRequestError("the JSON schema is false, which no output satisfies; send a schema that some "
                                  "JSON value matches", param=source)
    if schema is True:
        return
    if not isinstance(schema, Mapping):
        raise InvalidRequestError(f"the JSON schema must be an object, got {type(schema).__name__}",
                                  param=source)
    import llguidance

    try:
        grammar = llguidance.grammar_from("json_schema", json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"the JSON schema cannot be read: {exc}", param=source) from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if not is_error:
        return
    text = "; ".join(messages) or "rejected"
    if "Unimplemented keys" in text:
        raise InvalidRequestError(
            f"the JSON schema uses keywords Solo cannot enforce while generating ({text}); remove them",
            param=source)
    raise InvalidRequestError(f"the JSON schema is invalid: {text}", param=source)


# llguidance's JSON options: whitespace between tokens, bounded like XGrammar's max_whitespace_cnt.
_LLG_JSON_OPTIONS = {"whitespace_flexible": True, "whitespace_pattern": f"[ \\n\\t]{{0,{MAX_WHITESPACE}}}"}


def _has_string_length(schema: Any) -> bool:  # noqa: ANN401
    if isinstance(schema, Mapping):
        return "minLength" in schema or "maxLength" in schema or any(_has_string_length(v) for v in schema.values())
    if isinstance(schema, list):
        return any(_has_string_length(v) for v in schema)
    return False


# Keywords whose values are data, not subschemas: a "required" inside them is not a schema's.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose value maps names to subschemas (the names are not keywords).
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Branches that add constraints to the schema they sit in.
_BRANCHES = frozenset({"anyOf", "allOf", "oneOf", "if", "then", "else"})


def required_xgrammar_drops(schema: Any, in_branch: bool = False) -> list[str]:  # noqa: ANN401
    """`required` names XGrammar would leave out of an output: a JSON Schema's requirement it does not enforce.

    Two kinds, both checked against XGrammar 0.2.9 here: a name an object (sub)schema requires without defining
    it in its `properties` (JSON Schema lets it take any value, or `additionalProperties`' schema; XGrammar's
    strict mode, which Solo compiles with, admits no undeclared property), and any name required inside an
    anyOf / allOf / oneOf / if / then / else branch (XGrammar accepts `{}` for
    `{"properties": {"a": ...}, "anyOf": [{"required": ["a"]}]}`). llguidance enforces both.

    Args:
        schema: a JSON Schema (any JSON value).
        in_branch: (recursion) the schema is such a branch.

    Returns:
        The names, in the order found (empty when XGrammar enforces every requirement).
    """
    found: list[str] = []
    if isinstance(schema, list):
        for value in schema:
            found += required_xgrammar_drops(value, in_branch)
        return found
    if not isinstance(schema, Mapping):
        return found
    properties = schema.get("properties")
    defined = properties if isinstance(properties, Mapping) else {}
    required = schema.get("required")
    if isinstance(required, list):
        found += [name for name in required if isinstance(name, str) and (in_branch or name not in defined)]
    for key, value in schema.items():
        if key in _DATA_KEYWORDS or key == "required":
            continue
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            for sub in value.values():
                found += required_xgrammar_drops(sub)
        else:
            found += required_xgrammar_drops(value, key in _BRANCHES)
    return found


# Keywords that describe a schema without constraining its values (JSON Schema's annotations, definitions, and
# OpenAPI's nullable, which neither engine reads).
_ANNOTATIONS = frozenset({"$ref", "$schema", "$id", "$comment", "$anchor", "$defs", "definitions", "title",
                          "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "nullable"})


def xgrammar_mishandles(schema: Any) -> str | None:  # noqa: ANN401
    r"""What in a JSON Schema XGrammar would let an output break, or None (llguidance holds all three).

    Checked against XGrammar 0.2.9 by random walks through its masks: a `pattern` that spells a quote, a
    backslash or a control character, alone, in a character class or as a range's end (`^say "[a-z]+"$`,
    `^C:\\`, `[\t ]`, `[\x01-\x1f]`; negated classes, "." and ranges between printable characters are kept
    to JSON's string characters): XGrammar matches it against the
    raw text between the quotes, so it writes the character unescaped (not JSON) or an escape that decodes
    to another string; keywords beside a `$ref` (`{"$ref": ..., "enum": [...]}`: JSON Schema applies both
    since 2019-09, XGrammar only the reference); `patternProperties` (XGrammar repeats a key and lets
    whitespace past `MAX_WHITESPACE`).

    Args:
        schema: a JSON Schema (any JSON value).

    Returns:
        A phrase naming the first such keyword found, for an error message; None when there is none.
    """
    if isinstance(schema, list):
        return next((found for value in schema if (found := xgrammar_mishandles(value))), None)
    if not isinstance(schema, Mapping):
        return None
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and _matches_raw_json_text(pattern):
        return f"a pattern ({pattern!r}) that spells a quote, a backslash or a control character"
    if isinstance(schema.get("$ref"), str):
        beside = sorted(k for k in schema if k not in _ANNOTATIONS)
        if beside:
            return f"keywords beside a $ref ({', '.join(beside)})"
    if "patternProperties" in schema:
        return "patternProperties"
    for key, value in schema.items():
        if key in _DATA_KEYWORDS:
            continue
        values = value.values() if key in _SCHEMA_MAPS and isinstance(value, Mapping) else [value]
        found = next((found for sub in values if (found := xgrammar_mishandles(sub))), None)
        if found:
            return found
    return None


# Regex escapes of characters JSON writes escaped: \\ \" \t \n \r \f \v \0 \cX; \x / \u by their value.
_RAW_JSON_ESCAPES = frozenset('\\"tnrfv0c')


def _matches_raw_json_text(pattern: str) -> bool:
    # Whether a regex spells a quote, a backslash or a control character, alone, as a member of a character
    # class or as a range's end (XGrammar keeps negated classes, "." and ranges between printable characters
    # to JSON's string characters, not those).
    def atom(i: int) -> tuple[str, int]:  # one character or escape at i, and where the next starts
        if pattern[i] != "\\" or i + 1 == len(pattern):
            return pattern[i], i + 1
        if pattern[i + 1] == "u" and pattern[i + 2:i + 3] == "{":  # \u{22}
            close = pattern.find("}", i + 3)
            return (pattern[i:close + 1], close + 1) if close > 0 else (pattern[i:i + 2], i + 2)
        digits = {"x": 2, "u": 4}.get(pattern[i + 1], 0)
        return pattern[i:i + 2 + digits], i + 2 + digits

    def raw(text: str, in_class: bool) -> bool:
        if text == '"' or (len(text) == 1 and ord(text) < 0x20):  # (a tab itself, as JSON's "\t" decodes to)
            return True
        if len(text) < 2 or text[0] != "\\":
            return False
        if text[1] in _RAW_JSON_ESCAPES or (in_class and text[1] == "b"):  # ([\b] is a backspace)
            return True
        code = text[2:].strip("{}")
        return text[1] in "xu" and 1 <= len(code) <= 6 and re.fullmatch(r"[0-9a-fA-F]+", code) is not None and (
            int(code, 16) < 0x20 or int(code, 16) in (0x22, 0x5C))

    i = 0
    while i < len(pattern):
        if pattern[i] != "[":
            text, i = atom(i)
            if raw(text, False):
                return True
            continue
        i += 1
        negated = i < len(pattern) and pattern[i] == "^"
        i += negated
        while i < len(pattern) and pattern[i] != "]":
            text, i = atom(i)
            if i + 1 < len(pattern) and pattern[i] == "-" and pattern[i + 1] != "]":
                end, i = atom(i + 1)
                if not negated and (raw(text, True) or raw(end, True)):  # ([\t-\r] writes them raw)
                    return True
            elif raw(text, True) and not negated:
                return True
        i += 1
    return False


_OPENERS = frozenset({"additionalProperties", "unevaluatedProperties", "patternProperties"})


def _own_names(schema: Mapping[str, Any]) -> set[str]:
    # The names an object schema lists in its properties or requires.
    properties, required = schema.get("properties"), schema.get("required")
    names = set(properties) if isinstance(properties, Mapping) else set()
    return names | ({n for n in required if isinstance(n, str)} if isinstance(required, list) else set())


def _declared_names(schema: Any) -> set[str]:  # noqa: ANN401
    # The names an object schema and its allOf / anyOf / oneOf / then / else branches list or require.
    if not isinstance(schema, Mapping):
        return set()
    names = _own_names(schema)
    for key in ("allOf", "anyOf", "oneOf", "then", "else"):
        branches = schema.get(key)
        for branch in branches if isinstance(branches, list) else [branches]:
            names |= _declared_names(branch)
    return names


def local_ref_target(root: Any, ref: str) -> Any:  # noqa: ANN401
    """What a local JSON Schema reference ("#/$defs/Name": a JSON pointer into `root`) points at, or None."""
    if not ref.startswith("#/"):
        return None
    target = root
    for part in ref[2:].split("/"):
        if not isinstance(target, Mapping):
            return None
        target = target.get(part.replace("~1", "/").replace("~0", "~"))
    return target


def _resolved(branch: Any, root: Any, seen: frozenset[str]) -> tuple[Any, frozenset[str]]:  # noqa: ANN401
    # A composition branch that is a local $ref ("#/$defs/Base"), as the schema it names (its other keys kept).
    ref = branch.get("$ref") if isinstance(branch, Mapping) else None
    if not isinstance(ref, str) or ref in seen:
        return branch, seen
    target = local_ref_target(root, ref)
    if not isinstance(target, Mapping):
        return branch, seen
    return {**target, **{k: v for k, v in branch.items() if k != "$ref"}}, seen | {ref}


_MAX_INLINED_NODES = 200_000
"""Most objects and arrays `inline_branch_refs` writes out: definitions that each name the next twice grow as
2 ** depth (a break test: a 1.5 KB schema took 69 s and 1.5 GB, every structured-output request waiting)."""


def inline_branch_refs(schema: Any, seen: frozenset[str] = frozenset(), root: Any = None) -> Any:  # noqa: ANN401
    """A copy of a JSON Schema whose allOf / anyOf / oneOf branches that are local `$ref`s are written out.

    So `strict_schema` sees the names a referenced base declares (`{"allOf": [{"$ref": "#/$defs/Base"}],
    "properties": {...}}`, the inheritance pattern of OpenAPI and zod schemas). A reference inside its own
    expansion is left as it is.

    Args:
        schema: a JSON Schema (any JSON value); not modified.
        seen, root: the references being expanded; the whole schema, which they point into (default: `schema`).

    Returns:
        The copy.

    Raises:
        InvalidRequestError: the copy would hold more than 200,000 objects and arrays (references that name the
            same definitions over and over).
    """
    written = 0

    def inline(schema: Any, seen: frozenset[str]) -> Any:  # noqa: ANN401
        nonlocal written
        if not isinstance(schema, list | Mapping):
            return schema
        written += 1
        if written > _MAX_INLINED_NODES:
            raise InvalidRequestError(f"a JSON Schema's $refs in allOf / anyOf / oneOf write out past "
                                      f"{_MAX_INLINED_NODES} objects and arrays (definitions that name the same "
                                      "others over and over); send a schema with fewer repeated references")
        if isinstance(schema, list):
            return [inline(value, seen) for value in schema]
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _DATA_KEYWORDS:
                out[key] = value
            elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
                out[key] = [inline(*_resolved(branch, whole, seen)) for branch in value]
            else:
                out[key] = inline(value, seen)
        return out

    whole = schema if root is None else root
    return inline(schema, seen)


def strict_schema(schema: Any, inherited: frozenset[str] = frozenset()) -> Any:  # noqa: ANN401
    """A copy of a JSON Schema with XGrammar's strict mode written out in it, for llguidance.

    XGrammar's strict mode, which Solo compiles every JSON Schema with, admits no property an object schema
    with `properties` does not declare and no item past an array's `prefixItems`; llguidance follows JSON
    Schema, where both are open unless the schema closes them. Without this, a schema's objects would close or
    open with the engine that compiled it (a break test: a `minLength` sent a schema to llguidance, and the
    model's objects gained keys until max_tokens). So every object schema with `properties` and none of
    additionalProperties / unevaluatedProperties / patternProperties gets `additionalProperties: false`, and
    every array with `prefixItems` and no `items` / `unevaluatedItems` gets `items: false`. llguidance
    intersects an object with its allOf / anyOf / oneOf branches, so each side also lists the names the other
    declares or requires, and the names it requires itself (as `{}`, the declaring side's schema still
    applying): a required name or a branch's property stays allowed. `if` and `not` subschemas (conditions)
    are left open. A schema this makes unsatisfiable (a `$ref`'d base closed on its own) is compiled open
    (`ConstraintCompiler._compile_llguidance`).

    Args:
        schema: a JSON Schema (any JSON value); not modified.
        inherited: (recursion) the names declared beside a composition branch.

    Returns:
        The closed copy.
    """
    if isinstance(schema, list):
        return [strict_schema(value) for value in schema]
    if not isinstance(schema, Mapping):
        return schema
    properties = schema.get("properties")
    own = set(properties) if isinstance(properties, Mapping) else set()
    level = _own_names(schema) | inherited
    for branch in schema.get("allOf") if isinstance(schema.get("allOf"), list) else []:
        level |= _declared_names(branch)
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _DATA_KEYWORDS or key in ("required", "if", "not", "x-guidance"):
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: strict_schema(sub) for name, sub in value.items()}
        elif key in ("allOf", "anyOf", "oneOf") and isinstance(value, list):
            out[key] = [strict_schema(branch, frozenset(level)) for branch in value]
        elif key in ("then", "else"):
            out[key] = strict_schema(value, frozenset(level))
        else:
            out[key] = strict_schema(value)
    if isinstance(properties, Mapping) and not _OPENERS & set(schema):
        branches = {k: v for k, v in schema.items() if k in ("anyOf", "oneOf", "then", "else")}
        extra = (level | _declared_names(branches)) - own
        out["properties"] = {**out["properties"], **{name: {} for name in sorted(extra)}}
        out["additionalProperties"] = False
    if "prefixItems" in schema and not {"items", "unevaluatedItems", "additionalItems"} & set(schema):
        out["items"] = False
    return out


def _llguidance_grammar(spec: StructuredOutput, strict: bool = True) -> str:
    import llguidance

    if spec.kind in ("json_object", "json_schema"):
        schema = {"type": "object"} if spec.kind == "json_object" else (
            strict_schema(inline_branch_refs(spec.value)) if strict else spec.value)
        if isinstance(schema, bool):
            schema = {} if schema else {"not": {}}
        return llguidance.grammar_from("json_schema", json.dumps({**schema, "x-guidance": _LLG_JSON_OPTIONS}))
    if spec.kind == "choice":
        return llguidance.grammar_from("choice", json.dumps(list(spec.value)))
    return llguidance.grammar_from("regex" if spec.kind == "regex" else "grammar", spec.value)


def _cache_key(spec: StructuredOutput) -> str | None:
    if spec.kind == "structural_tag":
        try:
            return "tag:" + spec.value.model_dump_json()
        except AttributeError:
            return None
    try:
        return f"{spec.kind}:" + json.dumps(spec.value, sort_keys=True)
    except (TypeError, ValueError):
        return None


def _regex_escape(text: str) -> str:
    # XGrammar's regex dialect (ECMAScript-like): escape every metacharacter.
    return "".join("\\" + c if c in r"\^$.|?*+()[]{}/-" else c for c in text)


def _first_line(exc: Exception) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else type(exc).__name__
    # XGrammar prefixes "[hh:mm:ss] /path/file.cc:123: "
    if text.startswith("[") and ": " in text:
        text = text.split(": ", 1)[1]
    return text


# -------------------------------------------------------------------------------------------- matching

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _mask_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="solo-mask")
        return _executor


def _forget_executor() -> None:
    # In a forked child the pool's threads are gone (a job submitted there would wait forever): a new one.
    global _executor, _executor_lock
    _executor, _executor_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_executor)


class TokenConstraint:
    """One request's grammar state: which tokens may come next, as a packed bitmask.

    Call `apply(logits)` before sampling each token and `accept(token)` after; with `overlap` (see
    `ConstraintCompiler`), `accept` starts the next mask on a host thread so it overlaps the decode step.

    Args:
        compiled: the compiled grammar.
        stop_token_ids: ids that end the generation once the grammar is complete; with none, the grammar's
            completion itself ends it (`terminated`).
        source: the request field that holds the grammar, named in errors (default: the compiled one's).

    Attributes:
        bitmask: int32 [1, ceil(vocab / 32)] on the host, the next token's mask.
        mask_wait_s: per token, seconds `apply` spent on the critical path (waiting for the mask, applying
            it, looking for a forced token).
        mask_compute_s: per token, seconds the mask computation itself took (on the host thread).
        forced_tokens: tokens chosen without sampling (the only allowed token).
    """

    overlap: bool | None = None
    """Force the mask onto a host thread (True) or inline in `apply` (False); None: the compiler's choice."""

    def __init__(self, compiled: CompiledConstraint, stop_token_ids: list[int], source: str | None = None) -> None:
        self.compiled = compiled
        self.source = source or compiled.source
        self.vocab_size = compiled.vocab_size
        self.stop_token_ids = stop_token_ids
        words = (compiled._compiler.vocab_size + 31) // 32
        self.bitmask = torch.zeros((1, words), dtype=torch.int32)
        self._words = self.bitmask.numpy()[0]
        self.mask_wait_s: list[float] = []
        self.mask_compute_s: list[float] = []
        self.forced_tokens = 0
        self._future: Future | None = None
        self._terminated = False
        self._overlap = compiled._compiler.overlap if TokenConstraint.overlap is None else TokenConstraint.overlap
        if compiled.backend == "xgrammar":
            import xgrammar as xgr

            self._matcher = xgr.GrammarMatcher(compiled.grammar, override_stop_tokens=stop_token_ids or None,
                                               terminate_without_stop_token=not stop_token_ids)
        else:
            import llguidance

            self._matcher = llguidance.LLMatcher(compiled._compiler._llguidance(), compiled.grammar)
            self._model_stops = np.array(compiled._compiler.stop_token_ids, dtype=np.int64)
        if self._overlap:
            self._start()

    @property
    def terminated(self) -> bool:
        """True once the grammar is complete and, with stop tokens, one was accepted."""
        return self._terminated

    def _check_terminated(self) -> bool:
        # Called between tokens only: the matcher is not thread-safe while a mask is being computed.
        if self.compiled.backend == "xgrammar":
            return self._matcher.is_terminated()
        return self._matcher.is_stopped() or (not self.stop_token_ids and self._matcher.is_accepting())

    def _fill(self) -> float:
        start = time.perf_counter()
        if self.compiled.backend == "xgrammar":
            self._matcher.fill_next_token_bitmask(self.bitmask)
        else:
            import llguidance.torch

            llguidance.torch.fill_next_token_bitmask(self._matcher, self.bitmask, 0)
            # The tokenizer's EOS ids stand for "the grammar may end"; the request's own stop ids replace them.
            # (A Lark string naming the EOS token, "<|im_end|>", is that token to llguidance: `"x" "<|im_end|>"`
            # ends there, as meant, but `"<|im_end|>" "!"` ends before its "!".)
            words = self._words.view(np.uint32)
            stops = self._model_stops
            # llguidance also offers EOS where the grammar has no way on ('"a" /[^\s\S]/' after "a"): not an end.
            accepting = self._matcher.is_accepting() and (
                bool((words[stops // 32] & (1 << (stops % 32)).astype(np.uint32)).any()) if len(stops) else True)
            for t in self._model_stops:
                words[t // 32] &= ~np.uint32(1 << (t % 32))
            if accepting:
                for t in self.stop_token_ids:
                    words[t // 32] |= np.uint32(1 << (t % 32))
        return time.perf_counter() - start

    def _start(self) -> None:
        self._future = _mask_executor().submit(self._fill)

    def apply(self, logits: torch.Tensor) -> int | None:
        """Mask disallowed tokens of `logits` to -inf, in place.

        Args:
            logits: float32 [vocab] logits of this request (host or device).

        Returns:
            The forced token id when exactly one token is allowed (sampling can be skipped), else None.

        Raises:
            InvalidRequestError: the grammar allows no token after the text so far (a regex or grammar that
                runs dead: an empty character class after some text); the engine ends this request alone.
        """
        start = time.perf_counter()
        future, self._future = self._future, None
        self.mask_compute_s.append(future.result() if future is not None else self._fill())
        counts = np.bitwise_count(self._words.view(np.uint32))
        allowed = int(counts.sum())
        forced = None
        if allowed == 1:
            word = int(np.flatnonzero(counts)[0])
            bit = int(self._words[word].view(np.uint32)).bit_length() - 1
            forced = word * 32 + bit
            if forced >= logits.shape[-1]:
                forced = None
            else:
                self.forced_tokens += 1
        if forced is None:
            if allowed == 0:
                what, source = self.compiled.what, self.source
                raise InvalidRequestError(
                    f"the {what} in {source} allows no next token after the text generated so far: the output took "
                    "a part of it that can never be completed (an empty character class, an impossible pattern, a "
                    "$ref that only leads to itself), which the grammar engine does not rule out in advance; "
                    f"remove that part of the {what}", param=source)
            self._apply_mask(logits)
        self.mask_wait_s.append(time.perf_counter() - start)
        return forced

    def first_allowed(self) -> set[int]:
        """The token ids the grammar allows first (its request stop ids where it may end at once).

        Call before any `apply`; waits for a mask already being computed.
        """
        future, self._future = self._future, None
        future.result() if future is not None else self._fill()
        # (bit b of 32-bit word w is token 32 w + b: little-endian words, so bytes and their bits in order)
        return set(np.flatnonzero(np.unpackbits(self._words.view(np.uint8), bitorder="little")).tolist())

    def _apply_mask(self, logits: torch.Tensor) -> None:
        # Both engines write the same packed layout; XGrammar's kernel applies it (its CPU kernel measured
        # ~100x faster than llguidance's torch implementation).
        import xgrammar as xgr

        mask = self.bitmask if logits.device.type == "cpu" else self.bitmask.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[-1])

    def accept(self, token: int) -> None:
        """Advance the grammar by the generated token and start computing the next mask.

        Raises:
            RuntimeError: the grammar rejects the token (it was not chosen under the mask; a bug).
        """
        if self.compiled.backend == "xgrammar":
            ok = self._matcher.accept_token(token)
        elif token in self.stop_token_ids:  # a request stop id the grammar allowed at its end
            ok = True
        else:
            ok = self._matcher.consume_token(token) and not self._matcher.is_error()
        if not ok:
            raise RuntimeError(f"the output grammar rejected token {token}")
        self._terminated = self._check_terminated()
        if not self._terminated and self._overlap:
            self._start()
