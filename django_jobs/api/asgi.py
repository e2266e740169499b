"""The API served straight from the ASGI server, ahead of Django's request handling.

Through Django's ASGI handler, every request of an async view runs the project's middleware
and the request signals, and Django gives each request a thread of its own for the synchronous
parts: at a fleet's request rates that costs more than the API's own work. :func:`with_api`
wraps the project's ASGI application so that requests under the API's prefix go straight to
the same views (the same checks, answers and errors; no middleware, no session, no CSRF, which
the API does not use), and every other request to the project as before::

    # myproject/asgi.py
    from django.core.asgi import get_asgi_application
    from django_jobs.api.asgi import with_api

    application = with_api(get_asgi_application(), prefix="/jobs/api/")

Keep ``path("jobs/api/", include("django_jobs.api.urls"))`` in urls.py too: it serves the API
under WSGI, and names the views. The views are found with Django's URL resolver, over
:mod:`django_jobs.api.urls` alone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from django_jobs import conf
from django_jobs.api import protocol, views
from django_jobs.api.protocol import ApiError

logger = logging.getLogger("django_jobs.api")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Application = Callable[[Scope, Receive, Send], Awaitable[None]]

URLCONF = "django_jobs.api.urls"


def with_api(app: Application, prefix: str = "/jobs/api/") -> Application:
    """``app``, with the requests whose path starts with ``prefix`` answered by the API."""
    prefix = "/" + prefix.strip("/") + "/"

    async def application(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(prefix):
            raw = _raw_path(scope)
            # The prefix itself sent percent-encoded: no endpoint either.
            await serve(scope, receive, send, raw[len(prefix) :] if raw.startswith(prefix) else "%")
        else:
            await app(scope, receive, send)

    return application


def _raw_path(scope: Scope) -> str:
    """The path as the client sent it: the API routes on it, not on the decoded ``path``, so
    that ``v1%2Fclaim`` is no endpoint (a proxy's rule on raw paths would not see it as one)."""
    raw = scope.get("raw_path")
    if not isinstance(raw, bytes):
        return str(scope["path"])
    return raw.decode("latin-1").split("?", 1)[0]


async def serve(scope: Scope, receive: Receive, send: Send, path: str) -> None:
    """Answer one request of the API. Its token is checked from the headers before its body is
    read; a ``Content-Length`` over the limit is refused at once (413), and a body that does not
    arrive within ``JOBS_API_BODY_TIMEOUT`` seconds is refused then (408)."""
    request = _request(scope)
    body = _Body(request, receive)
    request.read_body = body.read  # type: ignore[attr-defined]
    request.client_gone = body.client_gone  # type: ignore[attr-defined]
    try:
        try:
            body.check_length()
            response = await _response(request, path)
        except ApiError as error:
            response = JsonResponse(error.body(), status=error.status)
        await _send(request, body, response, send)
    finally:
        body.close()


async def _response(request: HttpRequest, path: str) -> HttpResponse:
    try:
        match = resolve("/" + path, urlconf=URLCONF)
    except Resolver404:
        return JsonResponse({"error": "no such endpoint", "field": None}, status=404)
    try:
        response: HttpResponse = await match.func(request, **match.kwargs)
    except Exception:  # the views answer their own errors: this is a bug
        logger.exception("API request %s failed", request.path)
        return views.internal_error()
    return response


async def _send(request: HttpRequest, body: _Body, response: HttpResponse, send: Send) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    headers.append((b"content-length", str(len(response.content)).encode()))
    if not body.complete:
        # Refused before its body was read (or while it came): what is left of it is not read.
        headers.append((b"connection", b"close"))
    undelivered = getattr(request, "undelivered", None)
    if undelivered is not None:
        # A claimed job: the last moment to learn that its worker hung up. Give the loop a few
        # turns to deliver a hang-up the server has seen, to the watch of the client.
        for _ in range(4):
            await asyncio.sleep(0)
    try:
        for message in (
            {"type": "http.response.start", "status": response.status_code, "headers": headers},
            {"type": "http.response.body", "body": response.content},
        ):
            if undelivered is not None and body.client_gone():
                # The server would drop the answer: nobody would run the job. Release it now
                # (its attempt not counted) rather than leave it to the reaper.
                await undelivered()
                return
            await send(message)
    except Exception:  # a server that raises for a closed connection
        if undelivered is not None:
            await undelivered()
        raise


class _Body:
    """A request's body, read when the view asks (after the token is checked), within a
    deadline; then the watch for the client hanging up."""

    def __init__(self, request: HttpRequest, receive: Receive) -> None:
        self.request = request
        self.receive = receive
        self.limit = protocol.max_body_bytes()
        self.complete = False
        #: Once the body is read, the next message is the client hanging up: a long poll
        #: watches for it, so that it does not hand a job to nobody.
        self.hangup: asyncio.Future[Any] | None = None

    def check_length(self) -> None:
        raw = self.request.META.get("CONTENT_LENGTH")
        if raw is None:
            return
        if not raw.strip().isascii() or not raw.strip().isdigit():
            raise ApiError(400, "Content-Length is not a number of bytes")
        if int(raw) > self.limit:
            raise ApiError(413, f"the request body is over {self.limit} bytes")

    async def read(self) -> None:
        """Read the body into the request; a 413 or 408 :class:`ApiError` if it is over the
        limit or late, a 400 if the client hung up before sending it all."""
        timeout = conf.api_body_timeout()
        chunks: list[bytes] = []
        size, more = 0, True
        try:
            async with asyncio.timeout(timeout):
                while more:
                    message = await self.receive()
                    if message["type"] == "http.disconnect":
                        raise ApiError(400, "the client hung up before sending the whole body")
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.limit:
                        raise ApiError(413, f"the request body is over {self.limit} bytes")
                    chunks.append(chunk)
                    more = message.get("more_body", False)
        except TimeoutError:
            raise ApiError(
                408, f"the request body did not arrive within {timeout:g} s; send it at once"
            ) from None
        self.complete = True
        self.request._body = b"".join(chunks)
        self.hangup = asyncio.ensure_future(self.receive())
        self.request.hangup = self.hangup  # type: ignore[attr-defined]

    def client_gone(self) -> bool:
        hangup = self.hangup
        if hangup is None or not hangup.done() or hangup.cancelled():
            return False
        if hangup.exception() is not None:
            return False
        return bool(hangup.result().get("type") == "http.disconnect")

    def close(self) -> None:
        if self.hangup is not None:
            self.hangup.cancel()


def _request(scope: Scope) -> HttpRequest:
    """The request as the views read it (method, headers, client); its body is read later."""
    meta: dict[str, Any] = {
        "REQUEST_METHOD": scope.get("method", "GET"),
        "PATH_INFO": scope["path"],
        "REMOTE_ADDR": (scope.get("client") or ("", 0))[0],
    }
    for raw_name, raw_value in scope.get("headers", []):
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        key = name if name in ("CONTENT_LENGTH", "CONTENT_TYPE") else f"HTTP_{name}"
        # A repeated header is joined with commas, as Django's own handler does: a second
        # Authorization header does not replace the first (the views refuse the pair).
        meta[key] = f"{meta[key]},{value}" if key in meta else value
    request = HttpRequest()
    request.arrived = time.monotonic()  # type: ignore[attr-defined]
    request.method = meta["REQUEST_METHOD"]
    request.path = request.path_info = scope["path"]
    request.META = meta
    request._body = b""
    return request
