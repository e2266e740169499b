"""What the integration tests share that is not a fixture (their shared fixtures are in
``tests/integration/conftest.py``): a database worker's claim and finish, a logged-in test
client, clients of the HTTP API, the claim's query plans, and text read from the docs.

Test modules import from here, never from one another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import psycopg.sql
from django.db import connection
from django.test import Client

from django_jobs import store
from tests.conftest import ROOT, connect
from tests.factories import ApiTokenFactory

# ---------------------------------------------------------------------- a database worker

#: The worker id the claims below are made as.
WORKER = "test-worker:1:aaaaaa"


def claim(queues: list[str] | None = None, worker: str = WORKER) -> store.ClaimedJob | None:
    """Claim the next job of ``queues`` (every queue: None) as ``worker``."""
    with connection.cursor() as cursor:
        return store.claim(cursor, worker, queues)


def finish(job: store.ClaimedJob, outcome: str = "done") -> Any:
    """End the attempt of a claimed job; what ``store.finish`` answers (None: the lease was
    lost)."""
    with connection.cursor() as cursor:
        return store.finish(cursor, job.lease, outcome)


# ---------------------------------------------------------------------- the admin


def logged_in(user: Any, **client_options: Any) -> Client:
    """A test client (``Client(**client_options)``) logged in as ``user``."""
    client = Client(**client_options)
    client.force_login(user)
    return client


# ---------------------------------------------------------------------- the HTTP API


def make_token(queues: tuple[str, ...] = ("default", "remote"), **options: Any) -> str:
    """A new API token for ``queues`` (``options`` as ``tokens.auth.create`` takes them)."""
    return str(ApiTokenFactory(queues=queues, **options).secret)


class Api:
    """The API of one token through Django's test client: each call answers the test client's
    response, with its JSON body as ``data``."""

    def __init__(self, token: str | None) -> None:
        self.client = Client(HTTP_HOST="localhost")
        self.token = token

    def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> Any:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}
        data = raw if raw is not None else json.dumps({} if body is None else body)
        response = self.client.post(
            f"/jobs/api/v1/{path}", data, content_type="application/json", **headers
        )
        response.data = json.loads(response.content) if response.content else None
        return response

    def claim(self, worker: str = "w1", **body: Any) -> Any:
        return self.post("claim", {"worker": worker, **body})

    def job(self, job_id: int, action: str, lease: str, **body: Any) -> Any:
        return self.post(f"jobs/{job_id}/{action}", {"lease": lease, **body})


def claimed(api: Api, **body: Any) -> dict[str, Any]:
    """The job a claim of ``api`` answers (the claim must answer one)."""
    response = api.claim(**body)
    assert response.status_code == 200, response.data
    return dict(response.data["job"])


class Answer:
    """An answer of :class:`ServedApi`: its status, body, headers, and the body's JSON."""

    def __init__(self, status: int, content: bytes, headers: dict[str, str]) -> None:
        self.status = status
        self.content = content
        self.headers = headers
        self.data = json.loads(content) if content else None

    def __repr__(self) -> str:
        return f"{self.status} {self.content[:300]!r}"


class ServedApi:
    """The API of one token (none: no Authorization header), served one of two ways:
    ``"django"``, Django's URL handler (urls.py and the views, as under WSGI, through the test
    client), or ``"asgi"``, the ASGI app of ``with_api`` ahead of it (``testproject.asgi``, as
    uvicorn runs it, over httpx's ASGI transport). Paths are under ``base``.

    ``raise_request_exception=False``: a view's exception is a 500 answer rather than raised
    into the test (the Django way; the ASGI app always answers a 500).
    """

    def __init__(
        self,
        token: str | None,
        served_by: str = "django",
        *,
        base: str = "/jobs/api/v1/",
        raise_request_exception: bool = True,
    ) -> None:
        assert served_by in ("django", "asgi"), served_by
        self.token = token
        self.served_by = served_by
        self.base = base
        self.client = Client(HTTP_HOST="localhost", raise_request_exception=raise_request_exception)

    @property
    def name(self) -> str:
        return self.served_by

    def raw(self, path: str, data: bytes, headers: dict[str, str] | None = None) -> Answer:
        """POST ``data`` as it is to ``path``, with ``headers`` added."""
        sent = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        sent.update(headers or {})
        if self.served_by == "django":
            extra = {
                "HTTP_" + name.upper().replace("-", "_"): value for name, value in sent.items()
            }
            response = self.client.post(
                self.base + path, data, content_type="application/json", **extra
            )
            return Answer(response.status_code, response.content, dict(response.items()))
        from testproject.asgi import application

        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=application)
            async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
                return await client.post(self.base + path, content=data, headers=sent)

        response = asyncio.run(send())
        return Answer(response.status_code, response.content, dict(response.headers))

    def post(self, path: str, body: Any) -> Answer:
        """POST ``body`` as JSON (bytes as they are) to ``path``."""
        return self.raw(path, body if isinstance(body, bytes) else dumps(body))


def dumps(body: Any) -> bytes:
    # ensure_ascii: lone surrogates and NULs travel as \\u escapes, as any JSON encoder sends them
    return json.dumps(body).encode()


# ---------------------------------------------------------------------- the claim's plans

#: The indexes of an ordered claim of jobs without a concurrency key (any queue, one queue).
CLAIM_INDEXES = ("job_claim_free_idx",)
CLAIM_QUEUE_INDEXES = ("job_claim_free_queue_idx",)


def uses_one_of(indexes: tuple[str, ...], plan: str) -> bool:
    """Whether the EXPLAIN output ``plan`` scans one of ``indexes``."""
    return any(f"Index Scan using {index} " in plan for index in indexes)


def generic_plan(sql: str, params: dict[str, Any]) -> str:
    """The plan PostgreSQL keeps for ``sql`` prepared without its parameters' values (as a
    plpgsql function's statement), on a connection of its own."""
    names = list(params)
    for number, name in enumerate(names, start=1):
        sql = sql.replace(f"%({name})s", f"${number}")
    with connect() as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE generic_claim AS {sql}")
        values = ", ".join(psycopg.sql.Literal(params[name]).as_string(conn) for name in names)
        return "\n".join(row[0] for row in conn.execute(f"EXPLAIN EXECUTE generic_claim({values})"))


# ---------------------------------------------------------------------- the docs


def read_only_role_sql() -> str:
    """The SQL of docs/operations.md that makes Grafana's read-only role."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("### A read-only role for Grafana", 1)[1]
    return re.search(r"```sql\n(.*?)```", section, re.S)[1]  # type: ignore[index]


@contextlib.contextmanager
def silent_server() -> Iterator[tuple[tuple[str, int], list[socket.socket]]]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: its address, and
    the connections it has accepted so far (closed at the end)."""
    accepted: list[socket.socket] = []
    done = threading.Event()
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = server.getsockname()

        def accept() -> None:
            while True:
                sock = server.accept()[0]
                if done.is_set():  # the connection that ends this server
                    sock.close()
                    return
                accepted.append(sock)

        acceptor = threading.Thread(target=accept, daemon=True)
        acceptor.start()
        try:
            yield address, accepted
        finally:
            done.set()
            socket.create_connection(address).close()
            acceptor.join()
            for sock in accepted:
                sock.close()
