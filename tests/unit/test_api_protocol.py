"""The API's checks of a request body (django_jobs.api.protocol.parse_body), without a server:
the nesting limit, text PostgreSQL cannot store, and what is not JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_jobs.api.protocol import MAX_DEPTH, ApiError, parse_body


def nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def refusal(raw: bytes) -> tuple[int, str | None]:
    with pytest.raises(ApiError) as raised:
        parse_body(raw)
    return raised.value.status, raised.value.field


def test_bodies_nest_at_most_max_depth_levels_the_body_included() -> None:
    assert parse_body(json.dumps({"args": nested(MAX_DEPTH - 1)}).encode())
    assert refusal(json.dumps({"args": nested(MAX_DEPTH)}).encode()) == (400, "args")
    assert refusal(b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}") == (400, None)  # RecursionError


def test_brackets_inside_strings_do_not_count() -> None:
    text = "[{" * 100 + '\\"' + "]}" * 40
    body = parse_body(json.dumps({"args": [text, {"k": [text]}]}).encode())
    assert body["args"] == [text, {"k": [text]}]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"log": "a\x00"}, "log"),
        ({"info": {"host": "\ud800"}}, "info.host"),
        ({"kwargs": {"k\x00": 1}}, "kwargs"),
        ({"args": [["\udfff"]]}, "args"),
    ],
)
def test_text_postgresql_cannot_store_is_refused_naming_its_field(
    body: dict[str, Any], field: str
) -> None:
    assert refusal(json.dumps(body).encode()) == (400, field)


def test_a_finishs_result_and_texts_are_left_to_be_made_storable() -> None:
    body = {"result": {"k\x00": "\ud800"}, "error": "a\x00", "traceback": "\udc00"}
    assert parse_body(json.dumps(body).encode()) == body


@pytest.mark.parametrize(
    "raw",
    [
        b'{"wait": NaN}',
        b'{"wait": -Infinity}',
        '{"a": "b"}'.encode("utf-16"),
        b'{"a": "\xed\xa0\x80"}',
        b'{"wait": ' + b"9" * 5000 + b"}",
    ],
)
def test_what_is_not_json_in_utf_8_is_refused(raw: bytes) -> None:
    assert refusal(raw) == (400, None)
