"""The HTTP API over raw HTTP, served by a real uvicorn process: what only the bytes on the wire
can show. A body cut off by a client that hung up is not run; two ``Authorization`` headers are
refused; a percent-encoded path is routed as sent, not decoded (the in-process cases are in
tests/integration/test_api_hostile.py)."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

import pytest

from django_jobs.models import Job, Worker
from django_jobs.tokens import auth
from tests.conftest import ApiServer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def token() -> str:
    return auth.create("raw", ["*"], can_enqueue=True)[1]


def request(api_server: ApiServer, head: bytes, body: bytes = b"") -> tuple[int, Any]:
    """Send ``head`` (the request line and headers, without the blank line) and ``body`` as
    they are; the answer's status and JSON."""
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=30) as sock:
        sock.sendall(head + b"\r\nConnection: close\r\n\r\n" + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        content = response.read()
    if response.status != 204:
        assert response.getheader("Content-Type") == "application/json", content
    return response.status, json.loads(content) if content else None


def post(path: str, token: str, body: bytes, *headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: localhost", f"Content-Length: {len(body)}"]
    lines += ["Content-Type: application/json", f"Authorization: Bearer {token}", *headers]
    return "\r\n".join(lines).encode()


def test_an_enqueue_whose_client_hung_up_mid_body_creates_nothing(
    api_server: ApiServer, token: str
) -> None:
    # A complete JSON object, then spaces: but the client declared more than it sent.
    body = json.dumps({"task": "tests.echo", "args": ["cut"]}).encode() + b" " * 1000
    head = post("/jobs/api/v1/enqueue", token, body).replace(
        f"Content-Length: {len(body)}".encode(), f"Content-Length: {len(body) + 5000}".encode()
    )
    with socket.create_connection(("127.0.0.1", api_server.port), timeout=30) as sock:
        sock.sendall(head + b"\r\n\r\n" + body)
    # A complete enqueue after it, on a connection of its own: once it is done, and the server
    # has stopped (uvicorn waits for the requests under way), the cut-off one has been handled.
    whole = json.dumps({"task": "tests.echo", "args": ["whole"]}).encode()
    status, answer = request(api_server, post("/jobs/api/v1/enqueue", token, whole), whole)
    assert status == 201, answer
    api_server.stop()
    assert [job.args for job in Job.objects.all()] == [["whole"]]


def test_two_authorization_headers_are_refused_whichever_comes_last(
    api_server: ApiServer, token: str
) -> None:
    body = json.dumps({"worker": "w1"}).encode()
    for first, last in (("djt_forged", token), (token, "djt_forged")):
        head = post("/jobs/api/v1/claim", first, body, f"Authorization: Bearer {last}")
        status, answer = request(api_server, head, body)
        assert (status, answer["field"]) == (400, "Authorization"), answer
    assert not Worker.objects.exists()


def test_a_percent_encoded_path_is_no_endpoint(api_server: ApiServer, token: str) -> None:
    body = json.dumps({"worker": "w1"}).encode()
    for path in ("/jobs/api/v1%2Fclaim", "/jobs/api/v1/cl%61im", "/jobs/api/v1/%63laim"):
        status, answer = request(api_server, post(path, token, body), body)
        assert (status, answer) == (404, {"error": "no such endpoint", "field": None})
    # The same request, its path as the API names it, is served.
    status, _ = request(api_server, post("/jobs/api/v1/claim", token, body), body)
    assert status == 204 and Worker.objects.exists()
