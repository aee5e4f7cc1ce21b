"""Structured output: every finished constrained generation parses and validates, on tiny random checkpoints
(one with a padded vocabulary) and on the bundled model; forced tokens, logprobs, seeds, stop strings and
streaming keep working; bad schemas are refused with a message naming the problem."""

from __future__ import annotations

import json
import os
import re

import jsonschema
import pytest
import torch
from checkpoints import hf_config, write_tokenizer

from solo import Engine, SamplingParams
from solo.engine.constraints import StructuredOutput
from solo.errors import InvalidRequestError

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "address": {"type": "object", "properties": {"zip": {"type": "integer", "minimum": 0, "maximum": 99},
                                                         "city": {"enum": ["Paris", "Oslo"]}},
                        "required": ["zip", "city"], "additionalProperties": False},
        },
        "required": ["name", "address"], "additionalProperties": False,
    },
    "array": {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1,
              "maxItems": 4},
    "enum": {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                              "ok": {"type": "boolean"}},
             "required": ["color", "ok"], "additionalProperties": False},
    "range": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20},
                                               "tags": {"type": "array", "items": {"type": "string", "maxLength": 3},
                                                        "maxItems": 2}},
              "required": ["n", "tags"], "additionalProperties": False},
}


@pytest.fixture(scope="module")
def padded_engine(tmp_path_factory):
    # The model's vocabulary (416) is wider than the tokenizer's (384), as in many real checkpoints.
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("padded") / "model"
    vocab = write_tokenizer(folder)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config("llama", vocab + 32), attn_implementation="eager")
    model.save_pretrained(folder)
    return Engine.load(folder, backend="eager", dtype="float32")


@pytest.fixture(scope="module")
def bundled():
    return Engine.load(None)


def _schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "test", "schema": schema, "strict": True}}


def _check(result, schema):
    if result.finish_reason == "length":
        return False
    assert result.finish_reason == "stop", result
    jsonschema.validate(json.loads(result.text), schema)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schemas_validate_on_padded_vocab(padded_engine, name):
    schema = SCHEMAS[name]
    finished = 0
    for seed in range(2):
        result = padded_engine.complete("The answer:", SamplingParams(
            max_tokens=100, temperature=1.0, seed=seed, response_format=_schema_format(schema)))
        assert all(t < 384 or t == 2 for t in result.token_ids), "a padding id was generated"
        finished += _check(result, schema)
    assert finished >= 1


@pytest.mark.parametrize("name, temperature", [("nested", 0.0), ("enum", 0.8)])
def test_schemas_validate_on_bundled_model(bundled, name, temperature):
    schema = SCHEMAS[name]
    if True:
        result = bundled.complete("config = ", SamplingParams(max_tokens=100, temperature=temperature, seed=3,
                                                              response_format=_schema_format(schema)))
        assert _check(result, schema), result.text


@pytest.mark.slow
def test_json_object_regex_choice_grammar(padded_engine):
    obj = padded_engine.complete("x", SamplingParams(max_tokens=100, seed=1, temperature=1.0,
                                                     response_format={"type": "json_object"}))
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.text), dict)
    regex = padded_engine.complete("x", SamplingParams(max_tokens=20, temperature=1.0, seed=2,
                                                       response_format={"type": "regex", "regex": r"[0-9]{3}-[ab]{2}"}))
    assert re.fullmatch(r"[0-9]{3}-[ab]{2}", regex.text) and regex.finish_reason == "stop"
    for seed in range(3):
        choice = padded_engine.complete("x", SamplingParams(
            max_tokens=20, temperature=1.0, seed=seed, response_format={"type": "choice", "choice": ["yes", "no"]}))
        assert choice.text in ("yes", "no")
    grammar = 'root ::= "(" [a-c]+ ")"'
    g = padded_engine.complete("x", SamplingParams(max_tokens=12, temperature=1.0, seed=0,
                                                   response_format={"type": "grammar", "grammar": grammar}))
    assert re.fullmatch(r"\([a-c]+\)?", g.text)


@pytest.mark.parametrize("response_format", [
    {"type": "choice", "choice": ["</s>", "abc"]},  # XGrammar
    {"type": "regex", "regex": "(</s>|abc)!"},  # XGrammar
    {"type": "grammar", "grammar": 'root ::= ("</s>" | "abc") "!"'},  # GBNF: XGrammar
])
def test_a_stop_tokens_text_in_a_grammar_is_written_not_stopped_on(padded_engine, response_format):
    # From a break test: XGrammar let the EOS token stand for its own text ("</s>" here, "<|im_end|>" on Qwen), so
    # sampling it there ended the output before the grammar did, its text skipped: "" came back as "stop".
    eos = padded_engine.tokenizer.backend.token_to_id("</s>")
    result = padded_engine.complete("x", SamplingParams(max_tokens=40, temperature=0, logit_bias={eos: 100},
                                                        response_format=response_format))
    assert result.finish_reason == "stop" and result.text in ("</s>", "abc", "</s>!", "abc!"), result.text
    assert eos not in result.token_ids[:-1]  # (the EOS that ended it, only at the end)


def test_special_tokens_never_come_inside_a_grammar(padded_engine):
    # From a break test: XGrammar matched special tokens by their text, so under a strong logit_bias "<s>" came
    # inside a JSON string, and decoding (which skips special tokens) dropped it from the text the grammar held.
    bos = padded_engine.tokenizer.backend.token_to_id("<s>")
    assert bos in padded_engine.tokenizer.special_token_ids().values()
    for response_format in ({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string"}}},
                            {"type": "regex", "regex": "[<>/a-z]{1,8}"}):
        result = padded_engine.complete("x", SamplingParams(max_tokens=12, temperature=0, logit_bias={bos: 100},
                                                            response_format=response_format))
        assert bos not in result.token_ids, result.token_ids


def test_a_regex_from_re_escape_stays_on_xgrammar(bundled):
    # re.escape writes "\\ " and "\\\n", which XGrammar matches as the characters, with a warning that sent the
    # regex to llguidance, whose mask then let through an added token its matcher refused (a 500 on Qwen's
    # <tool_call>, a trial found it).
    for text in ("<tool_call> x", "<tool_call>\n", "a#b~c"):
        pattern = re.escape(text)
        request = bundled.make_request("x", SamplingParams(max_tokens=12, response_format={
            "type": "regex", "regex": pattern}))
        assert request.constraint.compiled.backend == "xgrammar", text
        assert bundled.complete("x", SamplingParams(max_tokens=40, response_format={
            "type": "regex", "regex": pattern})).text == text


def test_length_cut_says_length(padded_engine):
    result = padded_engine.complete("x", SamplingParams(max_tokens=3, temperature=0,
                                                        response_format=_schema_format(SCHEMAS["nested"])))
    assert result.finish_reason == "length" and len(result.token_ids) == 3


def test_forced_tokens_skip_sampling_and_seeds_reproduce(padded_engine):
    params = SamplingParams(max_tokens=60, temperature=1.0, seed=7, logprobs=2,
                            response_format=_schema_format(SCHEMAS["enum"]))
    request = padded_engine.make_request("x", params)
    events = list(padded_engine.run(request))
    assert request.constraint.forced_tokens > 0  # '{"color": "' is forced after the first brace
    again = padded_engine.complete("x", params)
    assert again.token_ids == [t for e in events for t in e.token_ids]
    # logprobs are the model's own (before the mask): finite, and as many as tokens.
    assert len(again.logprobs) == len(again.token_ids)
    assert all(torch.isfinite(torch.tensor(lp.logprob)) for lp in again.logprobs)
    streamed = "".join(e.text for e in padded_engine.generate("x", params))
    assert streamed == again.text


def test_stop_string_cuts_constrained_output(padded_engine):
    result = padded_engine.complete("x", SamplingParams(
        max_tokens=40, temperature=0, stop=[":"], response_format=_schema_format(SCHEMAS["enum"])))
    assert result.finish_reason == "stop" and ":" not in result.text
    assert result.text.replace(" ", "").replace("\n", "").replace("\t", "") == '{"color"'


@pytest.mark.parametrize("response_format, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}, "invalid"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}}},
     "uniqueItems"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}, "not"),
    ({"type": "regex", "regex": "(["}, "regex"),
    ({"type": "grammar", "grammar": "root ::= nothing_defined"}, "grammar"),
])
def test_bad_constraints_are_refused(padded_engine, response_format, words):
    with pytest.raises(InvalidRequestError, match=words) as info:
        padded_engine.make_request("x", SamplingParams(response_format=response_format))
    assert info.value.param == "response_format"


LOOP = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize("response_format, words", [
    ({"type": "regex", "regex": r"[^\s\S]"}, "regex in response_format admits no output"),
    ({"type": "grammar", "grammar": r"root ::= [^\x00-\U0010FFFF]"}, "grammar in response_format admits no output"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$defs": {"a": {"$ref": "#/$defs/a"}},
                                                                     "$ref": "#/$defs/a"}}}, "admits no JSON value"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": LOOP}}, "admits no JSON value"),
])
def test_a_grammar_that_admits_nothing_is_refused_before_any_step(bundled, response_format, words):
    # Break tests: these compiled, then failed at the first token (a 500 that also ended every request in the
    # same server step) or "finished" with an empty output that no JSON parser takes.
    with pytest.raises(InvalidRequestError, match=words) as info:
        bundled.make_request("x", SamplingParams(response_format=response_format))
    assert info.value.param == "response_format"


@pytest.mark.parametrize("response_format", [
    {"type": "regex", "regex": r"ab[^\s\S]"},  # XGrammar: no token allowed after "ab"
    {"type": "grammar", "grammar": r'start: "a" /[^\s\S]/'},  # llguidance offered only EOS after "a"
])
def test_a_grammar_that_runs_dead_ends_with_an_error_not_a_stop(bundled, response_format):
    # The llguidance one used to end as a normal stop with "a", an output its grammar does not match.
    with pytest.raises(InvalidRequestError, match="regex|grammar") as info:
        bundled.complete("x", SamplingParams(max_tokens=8, response_format=response_format))
    assert info.value.param == "response_format" and "allows no next token" in str(info.value)


def test_a_dead_grammars_error_names_its_own_requests_field(bundled):
    # A break test: equal grammars share one compilation, and its errors named the field of whichever request
    # compiled it first (a response_format request was told to fix guided_regex).
    dead = r"abc[^\s\S]"
    for source in ("guided_regex", "response_format"):
        params = SamplingParams(max_tokens=8, response_format=StructuredOutput("regex", dead, source=source))
        with pytest.raises(InvalidRequestError, match=f"the regex in {source} allows no next token") as info:
            bundled.complete("x", params)
        assert info.value.param == source


@pytest.mark.parametrize("value", [{"type": "xml"}, {"type": "json_schema"}, {"type": "regex"},
                                   {"type": "choice", "choice": []}, "json"])
def test_malformed_response_format(value):
    with pytest.raises(InvalidRequestError, match="response_format"):
        SamplingParams(response_format=value)


def test_text_means_no_constraint():
    assert SamplingParams(response_format={"type": "text"}).response_format is None
    assert SamplingParams(response_format={"type": "json_object"}).response_format == StructuredOutput("json_object")


def _format(kind, value):
    if kind == "json_schema":
        return _schema_format(value)
    return {"type": kind, kind: value}


@pytest.mark.parametrize("kind, value", [
    ("json_schema", {"allOf": [{"type": "integer"}, {"minimum": 5, "maximum": 9}]}),
    ("json_schema", {"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 10}),
    ("json_schema", {"type": "string", "pattern": r"^\Aab\z$"}),
    ("regex", r"\Aab\z"),
    # A required name its properties do not define: XGrammar's strict mode silently leaves it out.
    ("json_schema", {"type": "object", "properties": {"a": {"enum": [1]}}, "required": ["a", "zz"],
                     "additionalProperties": {"enum": [2]}, "maxProperties": 2}),
    # A requirement inside a branch: XGrammar accepts {} here.
    ("json_schema", {"type": "object", "properties": {"a": {"enum": [1]}, "b": {"enum": [2]}},
                     "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]}),
    # A break test: XGrammar wrote a pattern's quote or backslash raw between the string's quotes (not JSON:
    # `{"q": "say "ab""}`), and ignored keywords beside a $ref.
    ("json_schema", {"type": "object", "properties": {"q": {"type": "string", "pattern": '^say "[a-z]{1,3}"$'}},
                     "required": ["q"], "additionalProperties": False}),
    ("json_schema", {"type": "object", "properties": {"q": {"type": "string", "pattern": r"^C:\\[a-z]{1,3}$"}},
                     "required": ["q"], "additionalProperties": False}),
    ("json_schema", {"type": "object", "properties": {"c": {"$ref": "#/$defs/s", "enum": ["red", "blue"]}},
                     "required": ["c"], "additionalProperties": False, "$defs": {"s": {"type": "string"}}}),
    ("json_schema", {"$defs": {"a": {"type": "integer"}}, "$ref": "#/$defs/a", "minimum": 5, "maximum": 6}),
])
def test_what_xgrammar_would_ignore_goes_to_llguidance(bundled, kind, value):
    # XGrammar 0.2.9 compiles these while logging that it ignores part of them (allOf with several
    # subschemas, multipleOf on numbers, \A and \z), or without a word (required names outside properties):
    # they must be enforced all the same.
    request = bundled.make_request("x = ", SamplingParams(response_format=_format(kind, value)))
    assert request.constraint.compiled.backend == "llguidance"
    finished = 0
    for seed in range(4):
        result = bundled.complete("x = ", SamplingParams(max_tokens=24, temperature=1.0, seed=seed,
                                                         response_format=_format(kind, value)))
        if result.finish_reason == "length":
            continue
        finished += 1
        if kind == "regex" or r"\A" in value.get("pattern", ""):  # (Python's re, which jsonschema uses, lacks \z)
            assert result.text == ("ab" if kind == "regex" else '"ab"')
        else:
            jsonschema.validate(json.loads(result.text), value)
    assert finished >= 1


@pytest.mark.parametrize("response_format, words", [
    ({"type": "regex", "regex": r"ab\Z"}, r"\\Z"),  # neither engine knows \Z: refused, not matched as "Z"
    ({"type": "regex", "regex": "(?=a)ab"}, "ook"),
    (_schema_format(False), "false"),
])
def test_what_no_engine_enforces_is_refused(bundled, response_format, words):
    with pytest.raises(InvalidRequestError, match=words) as info:
        bundled.make_request("x", SamplingParams(response_format=response_format))
    assert info.value.param == "response_format"


def test_json_object_with_a_schema_is_that_schema():
    # llama.cpp's server form of a schema; other fields a type does not take are refused, not ignored.
    schema = {"type": "integer"}
    assert StructuredOutput.parse({"type": "json_object", "schema": schema}) == StructuredOutput("json_schema", schema)
    for value, words in [({"type": "regex", "regex": "a", "flags": "i"}, "flags"),
                         ({"type": "text", "schema": schema}, "schema"),
                         ({"type": "json_schema", "json_schema": {"schema": schema, "strictt": True}}, "strictt")]:
        with pytest.raises(InvalidRequestError, match=words):
            StructuredOutput.parse(value)


def test_a_refused_grammar_stays_refused(bundled):
    # XGrammar warns only when it compiles (its own cache would hand back the grammar silently next time).
    spec = {"type": "regex", "regex": r"ab\Z"}
    for _ in range(2):
        with pytest.raises(InvalidRequestError, match=r"\\Z"):
            bundled.make_request("x", SamplingParams(response_format=spec))
    warned = _schema_format({"type": "number", "multipleOf": 0.5})
    for clear in (False, True):
        if clear:
            bundled.constraints._cache.clear()
        assert bundled.make_request("x", SamplingParams(response_format=warned)).constraint.compiled.backend \
            == "llguidance"


def test_what_xgrammar_mishandles_is_named():
    from solo.engine.constraints import xgrammar_mishandles

    def pattern(regex):
        return {"type": "object", "properties": {"q": {"type": "string", "pattern": regex}}}

    for regex in ['^say "[a-z]+"$', r"^C:\\", r"^a\tb$", r"^a[\t ]b$", r"^a\u0022b$", r"^\x01$", '^["]$',
                  r"^a[\t-\r]b$", r"^[\x01-\x1f]$", r"^x\u{22}y$", r"^[\b]$", "^a\tb$", "^a[\n ]b$"]:
        assert "pattern" in xgrammar_mishandles(pattern(regex)), regex
    # Ranges, negated classes, "." and escapes of other characters are kept to JSON's string characters.
    for regex in [r"^\d{4}-\d{2}$", r"^\S+@\S+$", "^[!-#]+$", "^[^a-z]$", "^.{3}$", r"^\x41\[$", '^[^"]*$',
                  r"^[^\\]*$", r"^[ -~]+$", r"\bword\b", r'^[^<>:"/\\|?*]+$']:
        assert xgrammar_mishandles(pattern(regex)) is None, regex
    assert xgrammar_mishandles({"items": {"$ref": "#/$defs/a", "minimum": 1}}) == "keywords beside a $ref (minimum)"
    assert xgrammar_mishandles({"$ref": "#/$defs/a", "description": "d", "title": "t", "default": 1}) is None
    # zod-to-json-schema's shape: the definitions beside the root's $ref (a verification round: a 400 for tools).
    assert xgrammar_mishandles({"$ref": "#/definitions/P", "definitions": {"P": {"type": "object"}},
                                "$schema": "http://json-schema.org/draft-07/schema#"}) is None
    assert xgrammar_mishandles({"patternProperties": {"^x": {}}}) == "patternProperties"
    # A property named "pattern" is a name; data is not a schema.
    assert xgrammar_mishandles({"properties": {"pattern": {"type": "string"}}, "enum": [{"pattern": '"'}]}) is None


def test_a_text_stop_token_id_stays_writable_in_a_grammar(bundled):
    # A break test: a stop_token_ids id the grammar needs (the bundled vocabulary's '"') was made one of its end
    # tokens, so it was banned where the grammar needed it: "the output grammar allows no next token", a 500.
    # As in vLLM, it is written where the grammar puts it and the output stops there.
    quote = bundled.tokenizer.encode('"', add_special_tokens=False)
    assert len(quote) == 1
    result = bundled.complete("x = ", SamplingParams(max_tokens=16, stop_token_ids=quote,
                                                      response_format={"type": "regex", "regex": '"[0-9]+"'}))
    assert (result.text, result.finish_reason, result.stop_reason) == ("", "stop", quote[0])


def test_required_names_xgrammar_leaves_out():
    from solo.engine.constraints import required_xgrammar_drops

    assert required_xgrammar_drops({"type": "object", "required": ["zz"]}) == ["zz"]
    nested = {"type": "array", "items": {"properties": {"a": {}, "required": {"type": "boolean"}},
                                         "required": ["a", "required", "b"]}}
    assert required_xgrammar_drops(nested) == ["b"]
    # Inside a branch XGrammar enforces no requirement, defined or not (it accepts {} for this one).
    either = {"properties": {"city": {}, "zip": {}}, "anyOf": [{"required": ["city"]}, {"required": ["zip"]}]}
    assert required_xgrammar_drops(either) == ["city", "zip"]
    # Data is not a schema; a property named like a data keyword is.
    assert required_xgrammar_drops({"const": {"required": ["x"]}, "examples": [{"required": ["y"]}]}) == []
    assert required_xgrammar_drops({"properties": {"default": {"type": "object", "required": ["x"]}}}) == ["x"]
    assert required_xgrammar_drops(SCHEMAS["nested"]) == []


@pytest.mark.parametrize("schema, keys", [
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "allOf": [{"required": ["a"]}]},
     {"a"}),
    ({"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 6}}, "required": ["s"]},
     {"s"}),
    # From a review: closing these left nothing to write, and the XGrammar fallback dropped a required name.
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}, "required": ["a", "b"]},
     {"a", "b"}),
    ({"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
      "type": "object", "allOf": [{"$ref": "#/$defs/Base"}], "properties": {"name": {"type": "string", "minLength": 1}},
      "required": ["name"]}, None),
])
def test_objects_stay_closed_whichever_engine_compiles_them(bundled, schema, keys):
    # A break test: these go to llguidance (a branch's requirement, a string's length), which left undeclared
    # keys open where XGrammar's strict mode closes them; the model wrote keys until max_tokens.
    assert bundled.make_request("x", SamplingParams(response_format=_schema_format(schema))).constraint.compiled \
        .backend == "llguidance"
    finished = 0
    for seed in range(3):
        result = bundled.complete("give json", SamplingParams(max_tokens=40, temperature=0.0 if seed == 0 else 1.0,
                                                              seed=seed, response_format=_schema_format(schema)))
        if result.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(result.text), schema)
            assert keys is None or set(json.loads(result.text)) == keys, result.text
    assert finished >= 1


def test_strict_schema_writes_xgrammars_strict_mode_out():
    from solo.engine.constraints import strict_schema

    closed = strict_schema({"type": "object", "properties": {"a": {"type": "object", "properties": {}}},
                            "$defs": {"P": {"properties": {"x": {}}}}, "if": {"properties": {"a": {}}},
                            "not": {"properties": {"b": {}}}})
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert closed["$defs"]["P"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["if"] and "additionalProperties" not in closed["not"]  # conditions
    # Open objects stay open: no properties listed, or additionalProperties / patternProperties given.
    for schema in ({"type": "object"}, {"properties": {"a": {}}, "additionalProperties": {"type": "string"}},
                   {"properties": {"a": {}}, "patternProperties": {"^x": {}}}, {"enum": [{"properties": {}}]}):
        assert strict_schema(schema) == schema
    # Each side of a composition lists the names the other declares, since llguidance intersects them.
    either = strict_schema({"properties": {"a": {}}, "anyOf": [{"properties": {"b": {}}}, {"properties": {"c": {}}}],
                            "allOf": [{"properties": {"d": {}}}]})
    assert list(either["properties"]) == ["a", "b", "c", "d"]
    assert [list(branch["properties"]) for branch in either["anyOf"]] == [["b", "a", "d"], ["c", "a", "d"]]
    assert list(either["allOf"][0]["properties"]) == ["d", "a"]
    # A name only required is listed too, so closing cannot forbid it.
    assert list(strict_schema({"properties": {"a": {}}, "required": ["a", "b"]})["properties"]) == ["a", "b"]
    assert strict_schema({"prefixItems": [{}]})["items"] is False
    # A base named by $ref in a composition is written out, so its names are the object's too.
    from solo.engine.constraints import inline_branch_refs

    based = {"$defs": {"B": {"properties": {"id": {}}}}, "allOf": [{"$ref": "#/$defs/B"}], "properties": {"n": {}}}
    assert strict_schema(inline_branch_refs(based))["allOf"][0] == {"properties": {"id": {}, "n": {}},
                                                                     "additionalProperties": False}
    looped = {"$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}]}}, "allOf": [{"$ref": "#/$defs/A"}]}
    assert inline_branch_refs(looped)["allOf"][0] == {"allOf": [{"$ref": "#/$defs/A"}]}  # (expanded once)
    # Definitions that each name the next twice write out 2 ** depth copies: refused past a bound, at once (a
    # 1.5 KB schema of depth 19 took 69 s and 1.5 GB; 30 would never end).
    chain = {f"D{k}": {"anyOf": [{"$ref": f"#/$defs/D{k + 1}"}] * 2} for k in range(30)}
    chain["D30"] = {"type": "string", "minLength": 1}
    with pytest.raises(InvalidRequestError, match="write out past 200000 objects and arrays"):
        inline_branch_refs({"anyOf": [{"$ref": "#/$defs/D0"}], "$defs": chain})
    assert strict_schema({"prefixItems": [{}], "items": {}}) == {"prefixItems": [{}], "items": {}}


def test_other_stderr_output_survives_the_capture(capfd):
    from solo.engine.constraints import _native_stderr, _xgrammar_warnings

    with _native_stderr() as log:
        os.write(2, b"[12:00:00] /src/json_schema_converter.cc:1: Warning: ignoring multipleOf\n")
        os.write(2, b"another thread's line\n")
    assert _xgrammar_warnings(log.text + log.text) == ["ignoring multipleOf"]  # each warning once
    assert capfd.readouterr().err == "another thread's line\n"


def test_grammar_sources_are_bounded_and_so_is_the_cache(bundled, monkeypatch):
    # 150,000 choices compiled for 96 s and held 200 MB, every other structured-output request waiting; the
    # cache of compiled grammars was bounded in count only.
    from solo.engine import constraints
    from solo.engine.constraints import MAX_GRAMMAR_CHARS

    StructuredOutput("choice", ["x" * 999] * (MAX_GRAMMAR_CHARS // 1000))  # (each counts one more)
    choices = [f"w{i:07d}" for i in range(20_000)]
    big = MAX_GRAMMAR_CHARS
    for kind, value, size in (("choice", choices, 180_000), ("choice", [""] * (big + 1), big + 1),
                              ("regex", "a" * (big + 1), big + 1),
                              ("grammar", 'root ::= "' + "a" * big + '"', big + 11)):
        with pytest.raises(InvalidRequestError, match=f"holds {size} characters; at most"):
            StructuredOutput(kind, value)
    monkeypatch.setattr(constraints, "_CACHE_CHARS", 17 * 8)  # eight keys 'choice:["wordNN"]'

    def ask(word):
        bundled.make_request("x", SamplingParams(response_format={"type": "choice", "choice": [word]}))

    bundled.constraints._cache.clear()
    for i in range(10):
        ask(f"word{i:02d}")
        ask("word00")  # (a hit keeps it: the least recently used go first)
    assert [key[9:15] for key in bundled.constraints._cache] == [f"word{i:02d}" for i in (*range(3, 10), 0)]
    ask("x" * 40)  # one larger than an eighth of the bound is not kept, and evicts nothing
    assert len(bundled.constraints._cache) == 8


def test_a_schema_too_large_to_write_out_stays_with_llguidance(bundled):
    # Its strict copy is refused (inline_branch_refs); llguidance then reads the $refs as they are, where the
    # refusal sent the schema (routed away from XGrammar by its minLength) to XGrammar.
    chain = {f"D{k}": {"anyOf": [{"$ref": f"#/$defs/D{k + 1}"}] * 2} for k in range(30)}
    chain["D30"] = {"type": "string", "minLength": 1}
    spec = StructuredOutput("json_schema", {"anyOf": [{"$ref": "#/$defs/D0"}], "$defs": chain})
    assert bundled.constraints.compile(spec).backend == "llguidance"
