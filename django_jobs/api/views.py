"""The endpoints of API v1 (the contract is docs/http-api.md).

Each view is asynchronous: a request that waits for work holds no thread and no connection.
What it needs of the database runs in the API's pool (:mod:`django_jobs.api.thread_pool`); every
check comes first, so a request refused with a 4xx has written nothing. No endpoint imports
anything a request names: a task is looked up in the registry, or refused.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, DataError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from django_jobs import conf
from django_jobs.api import authentication, operations, protocol, thread_pool
from django_jobs.api.protocol import ApiError
from django_jobs.api.waiting import dispatcher
from django_jobs.models.api_token import ALL_QUEUES
from django_jobs.registry import registry
from django_jobs.runtime import tracing
from django_jobs.tokens.auth import Grant

logger = logging.getLogger("django_jobs.api")

Answer = tuple[int, dict[str, Any] | None]
Handler = Callable[..., Awaitable[Answer]]

#: Seconds a client is asked to wait before it tries again after a 503.
RETRY_AFTER = 2

# The database's errors that mean it cannot be reached, or a bounded wait ran out (psycopg's
# own too: with server-side binding, the store runs its statements on a client-side psycopg
# cursor of the same connection, whose errors Django does not wrap).
_UNAVAILABLE = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
# A value the database refused: the request's data, which the checks did not catch.
_REFUSED_DATA = (DataError, psycopg.DataError)


def endpoint(handler: Handler) -> Any:
    """A view: POST only, a valid token, a JSON object in; JSON (or 204) out. Every error is
    JSON: a 4xx for the client's mistakes, a 503 (with ``Retry-After``) when the database
    cannot be reached, and a 500 for a bug."""

    @csrf_exempt
    @functools.wraps(handler)
    async def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
        try:
            if _encoded_path(request):
                raise not_found_error()
            if request.method != "POST":
                raise ApiError(405, "use POST")
            grant = await _authenticate(request)
            # Served by with_api, the body is read now, once the token is known to be good.
            read_body = getattr(request, "read_body", None)
            if read_body is not None:
                await read_body()
            body = _body(request)
            status, data = await handler(request, grant, body, **kwargs)
        except ApiError as error:
            return error_response(error)
        except _UNAVAILABLE as error:
            logger.warning("API request failed on the database: %s", error)
            response = JsonResponse(
                {"error": "the job database is unavailable; try again", "field": None}, status=503
            )
            response["Retry-After"] = str(RETRY_AFTER)
            return response
        except _REFUSED_DATA as error:
            logger.warning("the database refused a value of an API request: %s", error)
            message = "a value of the request is out of the range the database stores"
            return JsonResponse({"error": message, "field": None}, status=400)
        except Exception:
            logger.exception("API request %s failed", request.path)
            return internal_error()
        if data is None:
            return HttpResponse(status=status)
        return JsonResponse(data, status=status)

    return view


def error_response(error: ApiError) -> HttpResponse:
    response = JsonResponse(error.body(), status=error.status)
    if error.status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="django-jobs"'
    for name, value in getattr(error, "headers", {}).items():  # Retry-After of a 429 or a 503
        response[name] = value
    return response


def internal_error() -> HttpResponse:
    """The answer to a request that failed on a bug: JSON, as every other error."""
    message = "the server failed on this request: a bug, logged there with its traceback"
    return JsonResponse({"error": message, "field": None}, status=500)


def not_found_error() -> ApiError:
    return ApiError(404, "no such endpoint")


@csrf_exempt
async def not_found(request: HttpRequest, rest: str = "") -> HttpResponse:
    """Any other path under the API's mount point: a JSON 404."""
    return error_response(not_found_error())


def _encoded_path(request: HttpRequest) -> bool:
    """Whether the path, as the client sent it, is percent-encoded: no path of the API is, and
    routing a decoded one would sidestep a proxy's rule on raw paths."""
    scope = getattr(request, "scope", None)  # Django's ASGI request
    raw = scope.get("raw_path") if isinstance(scope, dict) else None
    if isinstance(raw, bytes):
        return b"%" in raw
    uri = request.META.get("RAW_URI") or request.META.get("REQUEST_URI")  # WSGI servers
    return isinstance(uri, str) and "%" in uri.split("?", 1)[0]


async def _authenticate(request: HttpRequest) -> Grant:
    header = request.headers.get("Authorization", "")
    if "," in header:  # servers join repeated headers with commas; no token has one
        raise ApiError(400, "send one Authorization header", "Authorization")
    grant = await authentication.authenticate(request, _client(request))
    refusal = grant.refusal()  # expired, or its user deactivated: known from the grant
    if refusal is not None:
        raise ApiError(401, refusal)
    return grant


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > protocol.max_body_bytes():
        raise ApiError(413, f"the request body is over {protocol.max_body_bytes()} bytes")
    try:
        raw = request.body
    except RequestDataTooBig:
        raise ApiError(413, f"the request body is over {protocol.max_body_bytes()} bytes") from None
    if len(raw) < length:
        # The client hung up mid-body: what came may still parse, but it is not the request.
        raise ApiError(400, f"the request body was cut off: {len(raw)} of {length} bytes came")
    return protocol.parse_body(raw)


def _queues(grant: Grant, queues: list[str] | None, label: str = "queues") -> list[str] | None:
    """The queues a claim serves (None: every queue), each held by the token; ``queues`` as the
    request names them (None: the token's), its field named ``label`` in errors."""
    if queues is None:
        return None if grant.all_queues else list(grant.queues)
    if ALL_QUEUES in queues:
        if not grant.all_queues:
            raise ApiError(403, "this token does not hold every queue", label)
        return None
    for queue in queues:
        if not grant.holds(queue):
            raise ApiError(403, f"this token does not hold queue {queue!r}", label)
    return queues


def _skipped(tasks: list[str] | None) -> list[str]:
    """The registered tasks a claim for ``tasks`` (None: any) passes over."""
    return [] if tasks is None else sorted(set(registry.names()) - set(tasks))


def _client(request: HttpRequest) -> str:
    return str(request.META.get("REMOTE_ADDR") or "")


# ---------------------------------------------------------------------- claim


@endpoint
async def claim(request: HttpRequest, grant: Grant, body: dict[str, Any]) -> Answer:
    worker = protocol.worker(body)
    queues = _queues(grant, protocol.strings(body, "queues"))
    tasks = protocol.strings(body, "tasks")
    wait = protocol.seconds(body, "wait", 0.0, conf.api_max_wait())
    skip = _skipped(tasks)
    info = operations.worker_info(
        grant.worker_prefix + worker, _client(request), queues, name=worker, tasks=tasks
    )
    if wait <= 0:
        now = await thread_pool.run(operations.claim, info, queues, skip)
        return (204, None) if now is None else await _hand_out(request, now)
    # The wait counts from the request's arrival (served by with_api): a wait for a token's
    # first read or a busy pool is part of it.
    deadline = getattr(request, "arrived", time.monotonic()) + wait
    waiter = dispatcher.join(queues)
    passed_on: list[str] = []
    try:
        while True:
            if _gone(request):
                return 204, None  # nobody to answer: claim nothing
            woken = dispatcher.take(waiter)
            # A claim no thread has started by the deadline is not made: the wait ends on time
            # however busy the pool is (wakes not claimed for are passed on as it leaves).
            job = await thread_pool.run_before(deadline, operations.claim, info, queues, skip)
            if isinstance(job, thread_pool.Late):
                return 204, None
            if job is not None:
                # Woken for work and found some: there may be more (one notification may
                # stand for many jobs), so the next waiter looks too.
                passed_on = [job.queue] if woken else []
                return await _hand_out(request, job)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return 204, None
            await waiter.wait(remaining, getattr(request, "hangup", None))
    finally:
        dispatcher.leave(waiter, passed_on)


def _gone(request: HttpRequest) -> bool:
    """Whether the client hung up (known when served by :func:`django_jobs.api.asgi.with_api`)."""
    gone = getattr(request, "client_gone", None)
    return bool(gone is not None and gone())


async def _hand_out(request: HttpRequest, job: Any) -> Answer:
    """The answer of a claim that got ``job``; or, if the worker hung up while it waited (a
    long poll it gave up on, a worker stopped), the job released unused: no worker would ever
    run or heartbeat it, and only the reaper would find it. Served by ``with_api``, an answer
    that cannot be sent (the client hangs up as it is) releases the job too. The token is checked
    again first: one revoked (or expired) while its claim waited gets no job, which it could
    neither heartbeat nor finish."""
    try:
        await _authenticate(request)
    except Exception:
        # Refused (401), or the check could not be made (503): either way nobody runs the job.
        reason = "its token was refused before the claim's answer"
        try:
            await thread_pool.run(operations.release, job.lease, reason)
        except (DatabaseError, psycopg.Error) as error:
            logger.warning("job %s: not released (%s); the reaper will", job.id, error)
        raise
    delivered = await _deliver(request, job)
    return (204, None) if delivered is None else (200, delivered)


async def _deliver(request: HttpRequest, job: Any) -> dict[str, Any] | None:
    """The answer's ``{"job": ...}`` for a job claimed for the request; None, the job released
    unused, if the worker hung up already. An answer that cannot be sent releases it too (served
    by ``with_api``)."""
    reason = "its worker hung up before the claim's answer"

    async def undelivered() -> None:
        await thread_pool.run(operations.release, job.lease, reason)

    if _gone(request):
        await undelivered()
        return None
    request.undelivered = undelivered  # type: ignore[attr-defined]
    return protocol.claimed(job)


# ---------------------------------------------------------------------- a claimed job


def _lease(grant: Grant, body: dict[str, Any], job_id: int) -> Any:
    return protocol.parse_lease(body, job_id, grant.worker_prefix)


def _worker_of(request: HttpRequest, lease: Any) -> Any:
    return operations.worker_info(lease.worker_id, _client(request), None)


@endpoint
async def job_heartbeat(
    request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int
) -> Answer:
    lease = _lease(grant, body, job_id)
    beat = await thread_pool.run(operations.heartbeat, _worker_of(request, lease), [lease], [])
    status = beat.leases.get(str(lease.token))
    if status is None or not status.held:
        raise protocol.lease_lost()
    return 200, {"cancel_requested": status.cancel_requested}


@endpoint
async def heartbeat(request: HttpRequest, grant: Grant, body: dict[str, Any]) -> Answer:
    worker_id = grant.worker_prefix + protocol.worker(body)
    texts = protocol.strings(body, "leases", longest=protocol.LONGEST_LEASE) or []
    unwritten = protocol.job_ids(body, "unwritten")
    extra = protocol.info(body)
    leases, known = [], {}
    for text in texts:
        lease = protocol.read_lease(text, grant.worker_prefix, label="leases")
        if lease is not None and lease.worker_id == worker_id:
            leases.append(lease)
            known[str(lease.token)] = text
    queues = extra.pop("queues", None)
    info = operations.worker_info(worker_id, _client(request), queues, **extra)
    beat = await thread_pool.run(operations.heartbeat, info, leases, unwritten)
    answer = {
        known[token]: {
            "job_id": status.job_id,
            "held": status.held,
            "cancel_requested": status.cancel_requested,
        }
        for token, status in beat.leases.items()
        if token in known
    }
    orphans = [
        {"job_id": o.job_id, "attempt": o.attempt, "lease": protocol.lease_text(o)}
        for o in beat.orphans
    ]
    return 200, {"leases": answer, "orphans": orphans}


@endpoint
async def finish(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    lease = _lease(grant, body, job_id)
    ending = protocol.finish(body)
    claim_next = protocol.claim_next(body)
    if claim_next is None:
        ended = await thread_pool.run(operations.finish, lease, ending)
        if ended is None:
            raise protocol.lease_lost()
        return 200, {"state": ended.state}
    # The next claim is checked as v1/claim checks its own, before anything is written.
    queues = _queues(grant, claim_next.queues, "claim_next.queues")
    worker = lease.worker_id[len(grant.worker_prefix) :]
    info = operations.worker_info(
        lease.worker_id, _client(request), queues, name=worker, tasks=claim_next.tasks
    )
    ended, job = await thread_pool.run(
        operations.finish_then_claim, lease, ending, info, queues, _skipped(claim_next.tasks)
    )
    if ended is None:
        raise protocol.lease_lost()  # and nothing was claimed
    # No second look at the token, as a long poll's claim takes before it hands out a job: this
    # one was checked as the request came, and nothing waited since.
    delivered = None if job is None else await _deliver(request, job)
    return 200, {"state": ended.state, "job": None if delivered is None else delivered["job"]}


@endpoint
async def release(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    lease = _lease(grant, body, job_id)
    reason = protocol.field(body, "reason", str, "released by its worker of the HTTP API")
    if not await thread_pool.run(operations.release, lease, reason[:1000]):
        raise protocol.lease_lost()
    return 200, {"released": True}


@endpoint
async def progress(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    lease = _lease(grant, body, job_id)
    shown = protocol.progress(body, job_id)
    log = protocol.field(body, "log", str, None)
    cursors = protocol.cursors(body)
    recorded = await thread_pool.run(operations.record_live, lease, shown, log, cursors)
    # "progress" is the job row's part: the progress and the cursors, written together or not
    # at all. Whatever was sent, a part that matched means the lease holds.
    if not (recorded.progress or recorded.log):
        raise protocol.lease_lost()
    return 200, {"progress": recorded.progress, "log": recorded.log}


@endpoint
async def job_step(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    lease = _lease(grant, body, job_id)
    step = protocol.step(body)
    answer = await thread_pool.run(operations.record_step, lease, step)
    if answer is None:
        raise protocol.lease_lost()
    result = json.loads(answer.result_json)
    return (201 if answer.recorded else 200), {"result": result, "recorded": answer.recorded}


@endpoint
async def job_cursor(
    request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int
) -> Answer:
    lease = _lease(grant, body, job_id)
    cursor = protocol.cursor(body)
    recorded = await thread_pool.run(operations.record_live, lease, None, None, cursor)
    if not recorded.progress:
        raise protocol.lease_lost()
    return 200, {"saved": True}


@endpoint
async def job(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    found = await thread_pool.run(operations.job_view, protocol.path_job_id(job_id), grant)
    if found is None:
        raise protocol.job_not_found()
    return 200, protocol.job_view(*found)


@endpoint
async def outcome(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    lease = _lease(grant, body, job_id)
    found = await thread_pool.run(operations.attempt_outcome, lease)
    if found is None:
        raise protocol.lease_lost()  # no attempt carries all of this lease
    return 200, {"outcome": found}


@endpoint
async def spawn(request: HttpRequest, grant: Grant, body: dict[str, Any], job_id: int) -> Answer:
    if not grant.can_enqueue:
        raise ApiError(403, "this token may not spawn children (createjobtoken --can-enqueue)")
    lease = _lease(grant, body, job_id)
    call = protocol.call(body)
    trace_context = tracing.request_context(request.headers)
    child = await thread_pool.run(operations.spawn, lease, call, grant, trace_context)
    return 201, protocol.enqueued(child)


# ---------------------------------------------------------------------- enqueue


@endpoint
async def enqueue(request: HttpRequest, grant: Grant, body: dict[str, Any]) -> Answer:
    if not grant.can_enqueue:
        raise ApiError(403, "this token may not enqueue (createjobtoken --can-enqueue)")
    call = protocol.call(body)
    trace_context = tracing.request_context(request.headers)
    job = await thread_pool.run(operations.enqueue, call, grant, trace_context)
    return 201, protocol.enqueued(job)
