"""The API served ahead of Django's handler (django_jobs.api.asgi.with_api): what it answers
before any view runs, and that other paths go to the project's application."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from django.http import JsonResponse

from django_jobs.api import asgi, protocol
from django_jobs.api.asgi import with_api
from django_jobs.api.authentication import FAILURE_BURST, FailureLimit, failures
from django_jobs.api.protocol import ApiError


def call(
    app: Any,
    path: str,
    body: bytes = b"{}",
    method: str = "POST",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> dict[str, Any]:
    sent: list[dict[str, Any]] = []
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]

    async def receive() -> dict[str, Any]:
        if not chunks:
            await asyncio.sleep(3600)  # the client stays until the answer
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers or [],
        "client": ("x", 1),
    }
    asyncio.run(app(scope, receive, send))
    start, content = sent[0], sent[1]["body"]
    answer = {"status": start["status"], "body": json.loads(content) if content else None}
    if (b"connection", b"close") in start["headers"]:
        answer["closes"] = True
    return answer


async def project(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_unknown_endpoints_get_a_json_404_and_other_paths_go_to_the_project() -> None:
    app = with_api(project, prefix="jobs/api")
    assert call(app, "/jobs/api/v1/nothing") == {
        "status": 404,
        "body": {"error": "no such endpoint", "field": None},
        "closes": True,  # its body was not read
    }
    assert call(app, "/admin/")["status"] == 299
    assert call(app, "/jobs/apiary")["status"] == 299


def test_a_content_length_over_the_limit_is_refused_at_once_and_the_connection_closed() -> None:
    app = with_api(project)
    length = str(protocol.max_body_bytes() + 1).encode()
    answer = call(app, "/jobs/api/v1/claim", b"", headers=[(b"content-length", length)])
    assert answer["status"] == 413 and "request body is over" in answer["body"]["error"]
    assert answer["closes"]
    answer = call(app, "/jobs/api/v1/claim", b"", headers=[(b"content-length", b"1e9")])
    assert answer["status"] == 400 and "Content-Length" in answer["body"]["error"]


def test_the_token_is_checked_before_the_body_is_read() -> None:
    # No Content-Length (a chunked body), over the limit: refused for its token, unread.
    app = with_api(project)
    answer = call(app, "/jobs/api/v1/claim", b"x" * (protocol.max_body_bytes() + 1))
    assert answer["status"] == 401 and answer["closes"]


def test_a_request_without_a_token_is_refused_by_the_view() -> None:
    answer = call(with_api(project), "/jobs/api/v1/claim")
    assert answer["status"] == 401 and answer["body"]["field"] is None


def test_a_body_cut_off_by_a_client_that_hung_up_is_not_run() -> None:
    # A whole JSON object, then the client is gone before the rest it announced: the body is
    # refused as it is read (after the token was checked), and no view runs on it.
    messages = [
        {"type": "http.request", "body": b'{"worker": "w1"}   ', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/jobs/api/v1/claim",
             "headers": [(b"content-length", b"100")], "client": ("x", 1)}  # fmt: skip
    request = asgi._request(scope)
    body = asgi._Body(request, receive)
    with pytest.raises(ApiError) as refused:
        asyncio.run(body.read())
    assert refused.value.status == 400 and "hung up" in refused.value.message
    assert not body.complete and request._body == b""


def test_the_api_routes_on_the_raw_path() -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for raw in (b"/jobs/api/v1%2Fclaim", b"/jobs%2Fapi/v1/claim", b"/jobs/api%2Fv1/claim"):
        scope = {"type": "http", "method": "POST", "path": "/jobs/api/v1/claim",
                 "raw_path": raw, "headers": [], "client": ("x", 1)}  # fmt: skip
        sent.clear()
        asyncio.run(with_api(project)(scope, receive, send))
        assert sent[0]["status"] == 404, raw  # not the claim's 401


def test_a_claimed_job_whose_client_hung_up_as_it_was_answered_is_released_not_sent() -> None:
    async def scenario() -> tuple[list[Any], list[str]]:
        lost = asyncio.Event()

        async def receive() -> dict[str, Any]:
            if not lost.is_set():
                await lost.wait()  # as uvicorn's: woken when the connection is lost
            return {"type": "http.disconnect"}

        sent: list[Any] = []
        released: list[str] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        request = asgi._request({"type": "http", "method": "POST", "path": "/", "headers": []})
        body = asgi._Body(request, receive)
        body.complete = True
        body.hangup = asyncio.ensure_future(receive())
        await asyncio.sleep(0)

        async def undelivered() -> None:
            released.append("released")

        request.undelivered = undelivered  # type: ignore[attr-defined]
        # The server has just seen the connection close: the watch learns it a turn later.
        lost.set()
        await asgi._send(request, body, JsonResponse({"job": 1}), send)
        body.close()
        return sent, released

    sent, released = asyncio.run(scenario())
    assert (sent, released) == ([], ["released"])


def test_failed_authentications_are_limited_per_address() -> None:
    limit = FailureLimit(burst=3, per_second=100.0)
    for _ in range(3):
        assert limit.retry_after("10.0.0.1") is None
        limit.failed("10.0.0.1")
    assert limit.retry_after("10.0.0.1") == 1  # refused until a failure is forgiven
    assert limit.retry_after("10.0.0.2") is None  # another address is not
    slow = FailureLimit(burst=1, per_second=0.1)
    slow.failed("x")
    assert slow.retry_after("x") == 10
    few = FailureLimit(addresses=2)
    for address in ("a", "b", "c"):
        few.failed(address)
    assert few.retry_after("a") is None and len(few._buckets) == 2


def test_a_request_over_its_addresss_budget_is_answered_429_without_a_lookup() -> None:
    app = with_api(project)
    failures.forget()
    try:
        for _ in range(FAILURE_BURST):
            assert call(app, "/jobs/api/v1/claim")["status"] == 401
        answer = call(app, "/jobs/api/v1/claim")
        assert answer["status"] == 429 and "too many requests" in answer["body"]["error"]
    finally:
        failures.forget()
