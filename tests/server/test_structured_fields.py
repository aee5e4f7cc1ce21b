"""vLLM's structured-output fields and OpenAI's response_format map to one StructuredOutput (no server)."""

from __future__ import annotations

import pytest

from solo.engine.constraints import StructuredOutput
from solo.errors import InvalidRequestError
from solo.server.protocol import ChatCompletionRequest, CompletionRequest

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


@pytest.mark.parametrize("fields, expected", [
    ({"response_format": {"type": "text"}}, None),
    ({"response_format": {"type": "json_object"}}, StructuredOutput("json_object")),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA, "strict": True}}},
     StructuredOutput("json_schema", SCHEMA, "x")),
    ({"guided_json": SCHEMA}, StructuredOutput("json_schema", SCHEMA)),
    ({"guided_json": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
     StructuredOutput("json_schema", SCHEMA)),
    ({"guided_regex": "a+"}, StructuredOutput("regex", "a+")),
    ({"guided_choice": ["x", "y"]}, StructuredOutput("choice", ["x", "y"])),
    ({"guided_grammar": 'root ::= "a"'}, StructuredOutput("grammar", 'root ::= "a"')),
    ({"structured_outputs": {"json_object": True}}, StructuredOutput("json_object")),
    ({"structured_outputs": {"regex": "[0-9]+"}}, StructuredOutput("regex", "[0-9]+")),
    ({"structured_outputs": {"choice": ["a"]}}, StructuredOutput("choice", ["a"])),
])
def test_fields_map_to_one_constraint(fields, expected):
    assert CompletionRequest(prompt="hi", **fields).structured_output() == expected
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **fields)
    assert chat.structured_output() == expected


@pytest.mark.parametrize("fields, param", [
    ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
    ({"structured_outputs": {"xml": "<a/>"}}, "structured_outputs"),
    ({"guided_choice": []}, "guided_choice"),
])
def test_conflicts_and_unknowns_are_refused(fields, param):
    with pytest.raises(InvalidRequestError) as info:
        CompletionRequest(prompt="hi", **fields).structured_output()
    assert info.value.param == param


def test_response_format_errors_name_the_field_once():
    from pydantic import ValidationError

    from solo.server.errors import validation_error

    for value, words in (({"type": "json_schema"}, 'response_format json_schema needs "json_schema"'),
                         ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "strict": "yes"}},
                          "response_format json_schema.strict must be true or false, got 'yes'"),
                         ({"type": "json_schema", "json_schema": {"schema": SCHEMA, "name": 7}},
                          "response_format json_schema.name must be a string")):
        with pytest.raises(ValidationError) as info:
            ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], response_format=value)
        message = validation_error(info.value.errors()).message
        assert message.startswith(words) and message.count("response_format") == 1, message
    # A message that only begins with the field's letters is still prefixed.
    from solo.server.errors import validation_error as errors_of

    error = errors_of([{"loc": ("body", "n"), "msg": "Value error, not an integer", "type": "value_error"}])
    assert error.message == "n: not an integer"
