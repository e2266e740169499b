"""A client of the jobs HTTP API (``django_jobs.api``): POSTs of JSON with the API token.

Used by ``runjobworker --api`` (:mod:`django_jobs.worker.http_queue`), and by a job's
:class:`~django_jobs.context.JobContext` on such a worker, to ask whether its job was cancelled
and to spawn children without a connection to the job database. The worker passes the API's URL
and token on to its executors in the environment (:data:`URL_VARIABLE`, :data:`TOKEN_VARIABLE`).
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from django_jobs.exceptions import ApiRefused, ApiUnreachable, InvalidOption
from django_jobs.runtime import tracing

#: Seconds a request may take beyond the wait it asks of the server (a long poll).
REQUEST_TIMEOUT = 15.0

#: The longest wait of a claim the API accepts.
MAX_WAIT = 30.0

#: Where the token comes from when ``--token-file`` is not given.
TOKEN_VARIABLE = "DJANGO_JOBS_API_TOKEN"

# Errors of a kept-alive connection that the server closed while it was idle: the request never
# reached it, and is sent again at once on a new connection.
_STALE_CONNECTION = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
)

#: The refusals that ask the client to try again later (a request timeout, a rate limit): with
#: the server errors (5xx), they are outages. Every other 4xx is final: the same request would
#: be refused again, so it is never sent again.
TRY_AGAIN = (408, 429)

#: What to do about a refusal, by status.
HINTS = {
    401: "check the token (--token-file or DJANGO_JOBS_API_TOKEN); "
    "`manage.py createjobtoken NAME --queues A,B` makes one",
    403: "the token does not hold these queues: name only its queues with --queues, or make a "
    "token that holds them",
    404: "is --api the URL where django_jobs.api.urls is mounted (e.g. https://app/jobs/api/)?",
}


def read_token(path: str | None, environ: Mapping[str, str]) -> str:
    """The API token: the content of the file at ``path``, or else of the environment variable
    ``DJANGO_JOBS_API_TOKEN``, surrounding whitespace stripped. Raises
    :class:`~django_jobs.exceptions.InvalidOption` with what to do if there is none."""
    if path is None:
        token = environ.get(TOKEN_VARIABLE, "").strip()
        if not token:
            raise InvalidOption(
                f"--api needs a token: give --token-file PATH, or set {TOKEN_VARIABLE}"
            )
        return token
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidOption(f"cannot read the API token from {path}: {exc}") from None
    if not token:
        raise InvalidOption(f"the token file {path} is empty: write the API token in it")
    return token


class Api:
    """POSTs of JSON to the API at ``url``, over one kept-alive connection."""

    def __init__(self, url: str, token: str, *, timeout: float = REQUEST_TIMEOUT) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidOption(
                f"--api must be an http:// or https:// URL, e.g. https://app/jobs/api/, got {url!r}"
            )
        self.url = url
        self.https = parts.scheme == "https"
        self.netloc = parts.netloc.rpartition("@")[2]
        self.base_path = parts.path.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None
        self.broken = False

    def post(self, path: str, body: dict[str, Any], *, wait: float = 0.0) -> tuple[int, Any]:
        """POST ``body`` to ``path`` (below the API's URL); return the status and the decoded
        answer (``None`` for no content). 2xx, 404 and 409 are returned; a 5xx, 408 or 429
        raises :class:`ApiUnreachable` (try again later), any other status
        :class:`ApiRefused` (final)."""
        data = json.dumps(body).encode()
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Authorization": f"Bearer {self.token}",
            # A run's span, current while its job spawns a child: the child links to it.
            **tracing.headers(),
        }
        try:
            status, raw = self._send(self.base_path + path, data, headers, wait)
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            self.broken = True
            reason = str(exc) or type(exc).__name__
            raise ApiUnreachable(f"API unreachable at {self.url}: {reason}") from exc
        self.broken = False
        if status >= 500 or status in TRY_AGAIN:
            raise ApiUnreachable(f"API at {self.url} answered {status} to {path}: {_error(raw)}")
        if status < 300 or status in (404, 409):
            return status, _decoded(raw, status, path)
        hint = HINTS.get(status)
        raise ApiRefused(
            f"the jobs API refused {path} ({status}): {_error(raw)}"
            + (f"; {hint}" if hint else ""),
            status,
        )

    def _send(
        self, path: str, data: bytes, headers: dict[str, str], wait: float
    ) -> tuple[int, bytes]:
        for fresh in (self._conn is None, True):
            conn = self._connection(wait)
            try:
                conn.request("POST", path, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except _STALE_CONNECTION:
                self.close()
                if fresh:
                    raise
                continue
            if response.will_close:
                self.close()
            return response.status, raw
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self, wait: float) -> http.client.HTTPConnection:
        if self._conn is None:
            kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = kind(self.netloc, timeout=self.timeout)
        # The socket's timeout covers the wait the server was asked for, and a margin.
        self._conn.timeout = self.timeout + wait
        if self._conn.sock is not None:
            self._conn.sock.settimeout(self.timeout + wait)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _decoded(raw: bytes, status: int, path: str) -> Any:
    if status == 204 or not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ApiRefused(
            f"the jobs API answered {status} to {path} with something not JSON: {raw[:200]!r}; "
            f"{HINTS[404]}",
            status,
        ) from None


def _error(raw: bytes) -> str:
    """The ``error`` of an error answer, or the start of whatever came instead."""
    try:
        answer = json.loads(raw)
    except ValueError:  # a proxy's or the framework's page: its words, on one line
        return " ".join(raw.decode("utf-8", "replace").split())[:200] or "no details"
    if isinstance(answer, dict) and "error" in answer:
        field = answer.get("field")
        return f"{answer['error']}" + (f" (field {field})" if field else "")
    return str(answer)[:200]


#: Where a worker's executors find the API's URL (set by ``runjobworker --api``).
URL_VARIABLE = "DJANGO_JOBS_API_URL"


def from_environment(environ: Mapping[str, str] = os.environ) -> Api | None:
    """The API this process's worker uses, or None on a database-connected worker."""
    url, token = environ.get(URL_VARIABLE, ""), environ.get(TOKEN_VARIABLE, "")
    return Api(url, token) if url and token else None
