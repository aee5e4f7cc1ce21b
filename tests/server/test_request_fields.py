"""Optional request fields: `null` means the default (as in OpenAI's API), and `model` may be left out."""

from __future__ import annotations

import pytest
from server_harness import MODEL_NAME

from solo.server.protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

# OpenAI's own optional fields, so the table cannot lose one when a field leaves the models; fields Solo does
# not model (metadata, store, ...) are ignored, null or not.
OPENAI_CHAT = {"model", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "max_tokens",
               "max_completion_tokens", "n", "presence_penalty", "response_format", "seed", "stop", "stream",
               "stream_options", "temperature", "top_p", "tools", "tool_choice", "user", "parallel_tool_calls",
               "metadata", "store", "service_tier", "modalities", "audio", "prediction", "reasoning_effort",
               "functions", "function_call", "web_search_options"}
OPENAI_COMPLETIONS = {"model", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
                      "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                      "top_p", "user"}


def optional(model) -> set[str]:
    return {name for name, field in model.model_fields.items() if not field.is_required()}


ROUTES = {
    CHAT: ({"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 1},
           optional(ChatCompletionRequest) | OPENAI_CHAT),
    COMPLETIONS: ({"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1},
                  optional(CompletionRequest) | OPENAI_COMPLETIONS),
    "/tokenize": ({"prompt": "hi"}, optional(TokenizeRequest) - {"prompt", "messages"}),
    "/detokenize": ({"tokens": [5, 6]}, optional(DetokenizeRequest)),
}
NULL_CASES = [(route, field) for route, (_, fields) in ROUTES.items() for field in sorted(fields)]


def null_body(route: str, fields: set[str] | list[str]) -> dict:
    body = {**ROUTES[route][0], **dict.fromkeys(fields)}
    if route == CHAT and "max_completion_tokens" in fields and "max_tokens" not in fields:
        body["max_tokens"] = 1  # keep the reply short
    return body


def test_the_table_covers_every_optional_field():
    assert optional(ChatCompletionRequest) >= {"n", "stream", "stream_options", "tools", "tool_choice", "model"}
    assert optional(CompletionRequest) >= {"n", "stream", "echo", "best_of", "suffix", "model"}
    assert len(NULL_CASES) > 60


@pytest.mark.parametrize(("route", "field"), NULL_CASES, ids=[f"{r}:{f}" for r, f in NULL_CASES])
def test_null_means_the_default(server, route, field):
    with server.http() as http:
        response = http.post(route, json=null_body(route, [field]))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")  # "stream": null is not streamed


@pytest.mark.parametrize("route", list(ROUTES))
def test_every_optional_field_null_at_once(server, route):
    with server.http() as http:
        response = http.post(route, json=null_body(route, ROUTES[route][1] - {"max_tokens", "max_completion_tokens"}))
    assert response.status_code == 200, response.text


def test_null_inside_nested_objects(server):
    body = {"model": MODEL_NAME, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": None},
            "messages": [{"role": "user", "content": "hi", "name": None}]}
    with server.http() as http, http.stream("POST", CHAT, json=body) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and '"usage":null' in lines[-2]  # include_usage defaulted to false


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS])
def test_model_may_be_left_out(server, route):
    body = dict(ROUTES[route][0])
    del body["model"]
    with server.http() as http:
        reply = http.post(route, json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == MODEL_NAME  # the served model answers
        assert http.post(route, json={**body, "model": "other"}).status_code == 404
