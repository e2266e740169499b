"""The API served ahead of Django's handler (django_jobs.api.asgi.with_api): what it answers
before any view runs, and that other paths go to the project's application."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from django_jobs.api import protocol
from django_jobs.api.asgi import with_api


def call(app: Any, path: str, body: bytes = b"{}", method: str = "POST") -> dict[str, Any]:
    sent: list[dict[str, Any]] = []
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)] or [b""]

    async def receive() -> dict[str, Any]:
        if not chunks:
            await asyncio.sleep(3600)  # the client stays until the answer
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "client": ("x", 1)}
    asyncio.run(app(scope, receive, send))
    start, content = sent[0], sent[1]["body"]
    return {"status": start["status"], "body": json.loads(content) if content else None}


async def project(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_unknown_endpoints_get_a_json_404_and_other_paths_go_to_the_project() -> None:
    app = with_api(project, prefix="jobs/api")
    assert call(app, "/jobs/api/v1/nothing") == {
        "status": 404,
        "body": {"error": "no such endpoint", "field": None},
    }
    assert call(app, "/admin/")["status"] == 299
    assert call(app, "/jobs/apiary")["status"] == 299


def test_a_body_over_the_limit_is_refused_before_a_view_reads_it() -> None:
    app = with_api(project)
    answer = call(app, "/jobs/api/v1/claim", b"x" * (protocol.max_body_bytes() + 1))
    assert answer["status"] == 400 and "request body is over" in answer["body"]["error"]


def test_a_request_without_a_token_is_refused_by_the_view() -> None:
    answer = call(with_api(project), "/jobs/api/v1/claim")
    assert answer["status"] == 401 and answer["body"]["field"] is None


def test_a_body_cut_off_by_a_client_that_hung_up_is_not_run() -> None:
    # A whole JSON object, then the client is gone before the rest it announced.
    messages = [
        {"type": "http.request", "body": b'{"worker": "w1"}   ', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/jobs/api/v1/claim",
             "headers": [(b"content-length", b"100")], "client": ("x", 1)}  # fmt: skip
    asyncio.run(with_api(project)(scope, receive, send))
    assert sent[0]["status"] == 400
    assert "cut off" in json.loads(sent[1]["body"])["error"]


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
