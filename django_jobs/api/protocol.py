"""The wire format of API v1: request bodies read and checked, answers written.

Every check raises :class:`ApiError` with the status and a message that names the bad field;
the views turn it into ``{"error": ..., "field": ...}``. Nothing here touches the database.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

from django_jobs import conf
from django_jobs.store import ClaimedJob, Lease


class ApiError(Exception):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "field": self.field}


def lease_lost() -> ApiError:
    return ApiError(409, "lease lost: the job was reaped, cancelled or claimed again", "lease")


#: A worker's own name for itself, as it sends it; the registry stores ``api:TOKEN:WORKER``.
WORKER = re.compile(r"^[A-Za-z0-9._:@/-]{1,90}$")
#: A body may hold arguments up to JOBS_MAX_PAYLOAD_BYTES, and this much more.
BODY_SLACK = 64 * 1024
#: The outcomes a worker may end an attempt with.
OUTCOMES = ("done", "error", "timeout", "crashed", "cancelled")
#: The longest error and traceback texts kept from a finish.
MAX_ERROR = 10_000
MAX_TRACEBACK = 100_000


def max_body_bytes() -> int:
    return conf.max_payload_bytes() + MAX_TRACEBACK * 4 + BODY_SLACK


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object; a 400 for anything else."""
    if len(raw) > max_body_bytes():
        raise ApiError(400, f"the request body is over {max_body_bytes()} bytes", None)
    try:
        body = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"the request body is not JSON: {exc}", None) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None)
    return body


def field(
    body: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    """``body[name]``, of type ``kind``; required unless a ``default`` is given."""
    if name not in body or body[name] is None:
        if default is ...:
            raise ApiError(400, f"{name} is required", name)
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ApiError(400, f"{name} must be {_kind_name(kinds)}, not {value!r}", name)
    if not isinstance(value, kinds):
        raise ApiError(400, f"{name} must be {_kind_name(kinds)}, not {_shown(value)}", name)
    return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "an object"}  # fmt: skip
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def strings(body: dict[str, Any], name: str, *, required: bool = False) -> list[str] | None:
    """A list of non-empty strings, or None when absent (and not required)."""
    value = field(body, name, list, ... if required else None)
    if value is None:
        return None
    if not all(isinstance(item, str) and item and len(item) <= 200 for item in value):
        raise ApiError(400, f"{name} must be a list of non-empty strings", name)
    return list(dict.fromkeys(value))


def seconds(body: dict[str, Any], name: str, default: float, most: float) -> float:
    value = field(body, name, (int, float), default)
    if not math.isfinite(value) or not 0 <= value <= most:
        raise ApiError(400, f"{name} must be a number of seconds from 0 to {most:g}", name)
    return float(value)


def worker(body: dict[str, Any]) -> str:
    name = field(body, "worker", str)
    if not WORKER.match(name):
        raise ApiError(
            400, "worker must be 1 to 90 letters, digits or . _ : @ / - (say, a pod name)", "worker"
        )
    return name


# ---------------------------------------------------------------------- leases


def lease_text(lease: Lease) -> str:
    """The opaque lease a worker of the API holds: the job, the claim's token, the attempt and
    the worker id, which every fenced statement matches."""
    return f"{lease.job_id}.{lease.token}.{lease.attempt}.{lease.worker_id}"


def read_lease(text: str, worker_prefix: str, job_id: int | None = None) -> Lease | None:
    """The lease ``text`` stands for; None for one that cannot be this token's (a lease of
    another token is as good as lost to this one) or another job's."""
    parts = text.split(".", 3)
    if len(parts) != 4:
        return None
    job, token, attempt, worker_id = parts
    if not (job.isdigit() and _UUID.match(token) and attempt.isdigit()):
        return None
    if not worker_id.startswith(worker_prefix) or (job_id is not None and int(job) != job_id):
        return None
    return Lease(job_id=int(job), attempt=int(attempt), worker_id=worker_id, token=token)


def parse_lease(body: dict[str, Any], job_id: int, worker_prefix: str) -> Lease:
    """The lease a request about job ``job_id`` sends back; a 409 if it is not one."""
    lease = read_lease(field(body, "lease", str), worker_prefix, job_id)
    if lease is None:
        raise lease_lost()
    return lease


_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# ---------------------------------------------------------------------- answers


def claimed(job: ClaimedJob) -> dict[str, Any]:
    return {
        "job": {
            "id": job.id,
            "task": job.task,
            "queue": job.queue,
            "args": json.loads(job.args_json),
            "kwargs": json.loads(job.kwargs_json),
            "attempt": job.attempt,
            "max_attempts": job.max_attempts,
            "timeout": job.timeout,
            "parent_id": job.parent_id,
            "lease": lease_text(job.lease),
        }
    }


@dataclasses.dataclass(frozen=True)
class Finish:
    outcome: str
    result_json: str | None
    error: str
    traceback: str
    retryable: bool
    #: None: the task's backoff (``retry_backoff``, else ``JOBS_RETRY_BACKOFF``).
    retry_delay: float | None


def finish(body: dict[str, Any]) -> Finish:
    from django_jobs.storable import storable_json, storable_value

    outcome = field(body, "outcome", str)
    if outcome not in OUTCOMES:
        raise ApiError(400, f"outcome must be one of {', '.join(OUTCOMES)}", "outcome")
    result_json = None
    if outcome == "done" and "result" in body:
        try:
            result_json, _ = storable_json(body["result"])
        except (TypeError, ValueError, RecursionError):
            raise ApiError(400, "result is not JSON that can be stored", "result") from None
        if len(result_json) > conf.max_payload_bytes():
            raise ApiError(
                400, f"result is over JOBS_MAX_PAYLOAD_BYTES ({conf.max_payload_bytes()})", "result"
            )
    error = field(body, "error", str, "")
    traceback = field(body, "traceback", str, "")
    return Finish(
        outcome=outcome,
        result_json=result_json,
        error=storable_value(error[:MAX_ERROR])[0],
        traceback=storable_value(traceback[:MAX_TRACEBACK])[0],
        retryable=field(body, "retry", bool, True),
        retry_delay=None
        if body.get("retry_after") is None
        else seconds(body, "retry_after", 0.0, 366 * 86400),
    )


# ---------------------------------------------------------------------- enqueue and spawn

#: The options of an enqueue or a spawn, as ``Task.using()`` takes them; ``run_after`` is an
#: ISO 8601 time with its zone, ``delay`` seconds from now, ``depends_on`` job ids.
OPTIONS = (
    "queue",
    "priority",
    "max_attempts",
    "timeout",
    "unique_key",
    "concurrency_key",
    "concurrency_limit",
    "run_after",
    "delay",
    "depends_on",
)


@dataclasses.dataclass(frozen=True)
class Call:
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: dict[str, Any]


def call(body: dict[str, Any]) -> Call:
    """The task, arguments and options of an enqueue or a spawn, read but not yet checked
    against the registry (the enqueue does that)."""
    import datetime

    task = field(body, "task", str)
    args = field(body, "args", list, [])
    kwargs = field(body, "kwargs", dict, {})
    raw = field(body, "options", dict, {})
    if "unique_key" in body:
        raw = {**raw, "unique_key": field(body, "unique_key", str)}
    unknown = sorted(set(raw) - set(OPTIONS))
    if unknown:
        raise ApiError(
            400, f"unknown option {unknown[0]!r}; options are {', '.join(OPTIONS)}", "options"
        )
    options = {name: value for name, value in raw.items() if value is not None}
    if "run_after" in options and "delay" in options:
        raise ApiError(400, "give run_after or delay, not both", "options.delay")
    if "run_after" in options:
        text = options["run_after"]
        try:
            moment = datetime.datetime.fromisoformat(text) if isinstance(text, str) else None
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise ApiError(
                400, "run_after must be an ISO 8601 time with its zone", "options.run_after"
            )
        options["run_after"] = moment
    if "delay" in options:
        delay = seconds(options, "delay", 0.0, 366 * 86400 * 100)
        options["run_after"] = datetime.timedelta(seconds=delay)
        del options["delay"]
    if "depends_on" in options:
        ids = options["depends_on"]
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            raise ApiError(400, "depends_on must be a list of job ids", "options.depends_on")
    return Call(task, args, kwargs, options)


def option_field(message: str) -> str:
    """The field an option's error message is about (they start with the option's name)."""
    first = message.split(" ", 1)[0]
    if first in OPTIONS:
        return f"options.{first}"
    return "args" if message.startswith(("job arguments", "args", "kwargs")) else "options"


def enqueued(job: Any) -> dict[str, Any]:
    return {"job": {"id": job.pk, "task": job.task, "queue": job.queue, "state": job.state}}
