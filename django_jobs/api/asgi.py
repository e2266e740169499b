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
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import Resolver404, resolve

from django_jobs.api import protocol, views

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
    """Answer one request of the API (``path``: the raw path below the API's prefix)."""
    request, refused = await _request(scope, receive)
    # Once the body is read, the next message is the client hanging up: a long poll watches
    # for it, so that it does not hand a job to nobody.
    hangup = asyncio.ensure_future(receive())

    def client_gone() -> bool:
        if not hangup.done() or hangup.cancelled() or hangup.exception() is not None:
            return False
        return bool(hangup.result().get("type") == "http.disconnect")

    request.client_gone = client_gone  # type: ignore[attr-defined]
    try:
        await _answer(request, refused, path, send)
    finally:
        hangup.cancel()


async def _answer(
    request: HttpRequest, refused: protocol.ApiError | None, path: str, send: Send
) -> None:
    if refused is not None:
        response: HttpResponse = JsonResponse(refused.body(), status=refused.status)
    else:
        try:
            match = resolve("/" + path, urlconf=URLCONF)
        except Resolver404:
            response = JsonResponse({"error": "no such endpoint", "field": None}, status=404)
        else:
            try:
                response = await match.func(request, **match.kwargs)
            except Exception:  # the views answer their own errors: this is a bug
                logger.exception("API request %s failed", request.path)
                response = views.internal_error()
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.items()]
    headers.append((b"content-length", str(len(response.content)).encode()))
    await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": response.content})


async def _request(scope: Scope, receive: Receive) -> tuple[HttpRequest, protocol.ApiError | None]:
    """The request as the views read it (method, headers, client, body); and why it is refused
    before any view sees it: a body over the limit (then not all of it is read), or one that
    was cut off (the client hung up before its end)."""
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
    limit = protocol.max_body_bytes()
    chunks, size, more, cut_off = [], 0, True, False
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            cut_off = True
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            break
        chunks.append(chunk)
        more = message.get("more_body", False)
    request = HttpRequest()
    request.method = meta["REQUEST_METHOD"]
    request.path = request.path_info = scope["path"]
    request.META = meta
    request._body = b"".join(chunks)
    if size > limit:
        too_big = f"the request body is over {protocol.max_body_bytes()} bytes"
        return request, protocol.ApiError(400, too_big)
    if cut_off:
        return request, protocol.ApiError(400, "the request body was cut off: it is not run")
    return request, None
