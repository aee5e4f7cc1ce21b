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
