"""parse_json_body: a request body as JSON, or a BadRequest naming what is wrong with it and where."""

from __future__ import annotations

import json

import pytest

from hyflow.serving.body import MAX_JSON_DEPTH, parse_json_body
from hyflow.serving.errors import BadRequest


def nested(depth: int) -> bytes:
    """A JSON object whose values nest `depth` containers deep in all."""
    return b'{"a": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_an_escaped_surrogate_pair_is_text_and_reads_as_its_character():
    assert parse_json_body(b'{"messages": [{"content": "\\ud83d\\ude00 ok"}]}') == {"messages": [{"content": "😀 ok"}]}


def test_a_lone_surrogate_names_its_path_through_lists_and_objects():
    body = b'{"messages": [{"content": [{"text": "fine"}, {"text": "x\\udc00"}]}]}'
    with pytest.raises(BadRequest, match=r"messages\[0\]\.content\[1\]\.text holds a lone surrogate") as error:
        parse_json_body(body)
    assert error.value.param == "messages[0].content[1].text"


def test_a_lone_surrogate_in_a_key_names_the_object_holding_it():
    with pytest.raises(BadRequest, match=r"a key of tools\[0\] holds a lone surrogate"):
        parse_json_body(b'{"tools": [{"\\ud800": 1}]}')


def test_json_as_deep_as_the_limit_is_read_and_one_level_deeper_is_refused():
    assert json.loads(nested(MAX_JSON_DEPTH)) == parse_json_body(nested(MAX_JSON_DEPTH))
    with pytest.raises(BadRequest, match=f"nests deeper than {MAX_JSON_DEPTH} levels"):
        parse_json_body(nested(MAX_JSON_DEPTH + 1))


def test_text_that_is_not_json_raises_the_decode_error_fastapi_answers():
    with pytest.raises(json.JSONDecodeError):
        parse_json_body(b'{"model": }')
