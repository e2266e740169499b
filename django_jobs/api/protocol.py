"""The wire format of API v1: request bodies read and checked, answers written.

Every check raises :class:`ApiError` with the status and a message that names the bad field;
the views turn it into ``{"error": ..., "field": ...}``. Nothing here touches the database.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import re
from collections.abc import Sequence
from typing import Any

from django_jobs import conf
from django_jobs.exceptions import InvalidStepResult, StepError
from django_jobs.progress import BadProgress, Progress, checked
from django_jobs.storable import may_hold_unstorable, storable_text, storable_value, unstorable
from django_jobs.store import ClaimedJob, Lease, StepInfo
from django_jobs.store.job_reads import JobView


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
WORKER = re.compile(r"[A-Za-z0-9._:@/-]{1,90}", re.ASCII)
#: The name a worker shows in the registry (a heartbeat's ``info.name``): its pod's or host's.
NAME = re.compile(r"[A-Za-z0-9._:@/-]{1,200}", re.ASCII)
#: A host name or address (IPv6 and its zone included), as a heartbeat's ``info.host`` gives it.
HOST = re.compile(r"[A-Za-z0-9._:%\[\]-]{1,255}", re.ASCII)
#: A Kubernetes pod's name, as a heartbeat's ``info.pod`` gives it (empty: none).
POD = re.compile(r"[A-Za-z0-9._-]{0,253}", re.ASCII)
#: The largest values of PostgreSQL's ``integer`` and ``bigint`` columns.
INT_MAX = 2**31 - 1
BIGINT_MAX = 2**63 - 1
#: The deepest nesting of arrays and objects a request body may have.
MAX_DEPTH = 64
#: The fields of a finish whose text is made storable rather than refused (NUL written as
#: ``\x00``, invalid Unicode as U+FFFD): the attempt has run, and its outcome must be kept.
REPAIRED = ("result", "error", "traceback")
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
    """The request's JSON object (UTF-8, as RFC 8259 has it); a 400 for anything else. Every
    string in it (keys included) is one PostgreSQL can store, except in the fields of
    :data:`REPAIRED`, and it nests at most :data:`MAX_DEPTH` levels: a 400 naming the field
    otherwise."""
    if len(raw) > max_body_bytes():
        raise ApiError(400, f"the request body is over {max_body_bytes()} bytes", None)
    try:
        # Strict UTF-8: a surrogate can then come only from a \u escape, which the quick test
        # of _check_texts sees.
        text = (raw or b"{}").decode("utf-8")
        body = json.loads(text, parse_constant=_not_a_number)
    except RecursionError:
        raise ApiError(400, _too_deep("the request body"), None) from None
    except (ValueError, UnicodeDecodeError) as exc:
        # ValueError includes an integer over Python's limit of digits for a conversion.
        raise ApiError(400, f"the request body is not JSON: {exc}", None) from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None)
    _check_texts(body, text)
    return body


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is no JSON number")  # Python's json reads NaN and Infinity


def _too_deep(what: str) -> str:
    return f"{what} nests arrays and objects more than {MAX_DEPTH} levels deep"


def _check_texts(body: dict[str, Any], text: str) -> None:
    """Refuse a body nested too deep, or holding a string PostgreSQL cannot store. ``text`` is
    the body's JSON: where it has no escape of a NUL or a surrogate and too few brackets to
    nest too deep (a claim's, a heartbeat's), there is nothing to walk."""
    check = may_hold_unstorable(text)
    if not check and (
        text.count("[") + text.count("{") <= MAX_DEPTH or _deepest(text) <= MAX_DEPTH
    ):
        return
    stack: list[tuple[Any, str, int, bool]] = [(body, "", 0, check)]
    while stack:
        value, path, depth, check = stack.pop()
        if depth >= MAX_DEPTH and isinstance(value, dict | list):  # depth: its containers
            raise ApiError(400, _too_deep(path), path)
        if isinstance(value, dict):
            for key, item in value.items():
                if check and (why := unstorable(key)) is not None:
                    name = path or storable_text(key, note=False)
                    raise ApiError(400, f"a key of {name} {why}", _field_name(name))
                repaired = path == "" and key in REPAIRED
                if check or isinstance(item, dict | list):
                    where = f"{path}.{key}" if path else key
                    stack.append((item, where, depth + 1, check and not repaired))
        elif isinstance(value, list):
            stack.extend(
                (item, path, depth + 1, check)
                for item in value
                if check or isinstance(item, dict | list)
            )
        elif check and isinstance(value, str) and (why := unstorable(value)) is not None:
            raise ApiError(400, f"{_field_name(path)} {why}", _field_name(path))


_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Every byte but the brackets, deleted; the brackets made steps: 2 opens, 0 closes (less one).
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def _deepest(text: str) -> int:
    """How deep the arrays and objects of JSON ``text`` nest (its strings left out)."""
    steps = _STRING.sub("", text).encode("utf-8").translate(_STEPS, _NOT_BRACKETS)
    return max(itertools.accumulate(step - 1 for step in steps), default=0)


def _field_name(path: str) -> str:
    return path if len(path) <= 100 else path[:100] + "..."


def field(
    body: dict[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    default: Any = ...,
    *,
    label: str | None = None,
) -> Any:
    """``body[name]``, of type ``kind``; required unless a ``default`` is given. ``label`` is
    the field's name in errors (``info.pid``, say), ``name`` by default."""
    label = label or name
    if name not in body or body[name] is None:
        if default is ...:
            raise ApiError(400, f"{label} is required", label)
        return default
    value = body[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ApiError(400, f"{label} must be {_kind_name(kinds)}, not {value!r}", label)
    if not isinstance(value, kinds):
        raise ApiError(400, f"{label} must be {_kind_name(kinds)}, not {_shown(value)}", label)
    return value


def integer(
    body: dict[str, Any],
    name: str,
    least: int,
    most: int,
    default: Any = ...,
    *,
    label: str | None = None,
) -> Any:
    """``body[name]``, an integer from ``least`` to ``most`` (a column's range)."""
    label = label or name
    value = field(body, name, int, default, label=label)
    if value is not default and not least <= value <= most:
        raise ApiError(400, f"{label} must be an integer from {least} to {most}", label)
    return value


def job_ids(body: dict[str, Any], name: str, *, label: str | None = None) -> list[int]:
    """A list of job ids (absent: empty)."""
    label = label or name
    ids = field(body, name, list, [], label=label)
    if not all(
        isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= BIGINT_MAX for i in ids
    ):
        raise ApiError(400, f"{label} must be a list of job ids", label)
    return list(ids)


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
             list: "a list", dict: "an object"}  # fmt: skip
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _shown(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def strings(
    body: dict[str, Any],
    name: str,
    *,
    required: bool = False,
    label: str | None = None,
    longest: int = 200,
) -> list[str] | None:
    """A list of non-empty strings of ``longest`` characters at most, or None when absent (and
    not required)."""
    label = label or name
    value = field(body, name, list, ... if required else None, label=label)
    if value is None:
        return None
    if not all(isinstance(item, str) and item and len(item) <= longest for item in value):
        raise ApiError(
            400, f"{label} must be a list of non-empty strings of {longest} at most", label
        )
    return list(dict.fromkeys(value))


def seconds(
    body: dict[str, Any], name: str, default: float, most: float, *, label: str | None = None
) -> float:
    label = label or name
    value = field(body, name, (int, float), default, label=label)
    try:
        number = float(value)
    except OverflowError:  # an integer of hundreds of digits
        number = math.inf
    if not math.isfinite(number) or not 0 <= number <= most:
        raise ApiError(400, f"{label} must be a number of seconds from 0 to {most:g}", label)
    return number


_WORKER_RULE = "1 to 90 letters, digits or . _ : @ / - (say, a pod name)"


def worker(body: dict[str, Any]) -> str:
    name = field(body, "worker", str)
    if not WORKER.fullmatch(name):
        raise ApiError(400, f"worker must be {_WORKER_RULE}", "worker")
    return name


def info(body: dict[str, Any]) -> dict[str, Any]:
    """A batch heartbeat's ``info``: what the worker registry shows of the worker, checked
    (absent parts are left out; other keys are ignored)."""
    given = field(body, "info", dict, {})
    checked_info: dict[str, Any] = {}
    for name, pattern, rule in (
        ("name", NAME, "1 to 200 letters, digits or . _ : @ / - (a pod's or host's name)"),
        ("host", HOST, "1 to 255 letters, digits or . _ : % [ ] - (a host name or address)"),
        ("pod", POD, "up to 253 letters, digits or . _ - (a Kubernetes pod's name)"),
    ):
        text = field(given, name, str, None, label=f"info.{name}")
        if text is not None:
            if not pattern.fullmatch(text):
                raise ApiError(400, f"info.{name} must be {rule}", f"info.{name}")
            checked_info[name] = text
    pid = integer(given, "pid", 0, INT_MAX, None, label="info.pid")
    concurrency = integer(given, "concurrency", 1, INT_MAX, None, label="info.concurrency")
    for name, number in (("pid", pid), ("concurrency", concurrency)):
        if number is not None:
            checked_info[name] = number
    for name in ("queues", "tasks"):
        names = strings(given, name, label=f"info.{name}")
        if names is not None:
            checked_info[name] = names
    return checked_info


def progress(body: dict[str, Any], job_id: int) -> Progress | None:
    """A progress report's ``progress`` (None when absent)."""
    report = field(body, "progress", dict, None)
    if report is None:
        return None
    for name in ("done", "total"):
        value = field(report, name, (int, float), None, label=f"progress.{name}")
        try:
            finite = value is None or math.isfinite(float(value))
        except OverflowError:
            finite = False
        if not finite:
            raise ApiError(400, f"progress.{name} must be a finite number", f"progress.{name}")
    if report.get("done") is None:
        raise ApiError(400, "progress.done is required", "progress.done")
    message = field(report, "message", str, "", label="progress.message")
    try:
        return checked(job_id, report["done"], report.get("total"), message)
    except BadProgress as error:
        raise ApiError(400, str(error), "progress") from None


# ---------------------------------------------------------------------- leases


#: The longest lease: a job id, a UUID, an attempt and a worker id (``api:`` and a token's name
#: of 100 characters, ``:`` and a worker's of 90), with their dots.
LONGEST_LEASE = 19 + 1 + 36 + 1 + 10 + 1 + 195


def lease_text(lease: Lease) -> str:
    """The opaque lease a worker of the API holds: the job, the claim's token, the attempt and
    the worker id, which every fenced statement matches."""
    return f"{lease.job_id}.{lease.token}.{lease.attempt}.{lease.worker_id}"


def read_lease(
    text: str, worker_prefix: str, job_id: int | None = None, *, label: str = "lease"
) -> Lease | None:
    """The lease ``text`` stands for; None for one that cannot be this token's (a lease of
    another token is as good as lost to this one) or another job's. A 400 naming ``label`` for
    text that is no lease the API hands out (a made-up worker part, numbers out of range)."""
    match = _LEASE.fullmatch(text)
    if match is None:
        raise ApiError(400, f"{label} is not a lease: send back the claim's lease as it is", label)
    job, token, attempt, worker_id = match.groups()
    if not (1 <= int(job) <= BIGINT_MAX and 1 <= int(attempt) <= INT_MAX):
        raise ApiError(400, f"{label} is not a lease: its numbers are out of range", label)
    if not worker_id.startswith(worker_prefix):
        return None
    if not WORKER.fullmatch(worker_id[len(worker_prefix) :]):
        raise ApiError(400, f"{label} is not a lease: its worker is not a worker's name", label)
    if job_id is not None and int(job) != job_id:
        return None
    return Lease(job_id=int(job), attempt=int(attempt), worker_id=worker_id, token=token)


def parse_lease(body: dict[str, Any], job_id: int, worker_prefix: str) -> Lease:
    """The lease a request about job ``job_id`` sends back; a 409 if it is not one."""
    if not 1 <= job_id <= BIGINT_MAX:
        raise ApiError(400, f"the job id in the path must be from 1 to {BIGINT_MAX}", "job_id")
    lease = read_lease(field(body, "lease", str), worker_prefix, job_id)
    if lease is None:
        raise lease_lost()
    return lease


# The job's id, the claim's token (a UUID), the attempt and the worker's id; ASCII digits only.
_LEASE = re.compile(
    r"([0-9]{1,19})\.([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
    r"\.([0-9]{1,10})\.(.{1,200})",
    re.ASCII | re.DOTALL,
)


# ---------------------------------------------------------------------- answers


def claimed(job: ClaimedJob) -> dict[str, Any]:
    """A claim's answer: the job, its lease, what it resumes from (its recorded steps' results
    and its cursors' values, by name; empty objects for a job that has none), and the W3C trace
    context it was enqueued in (null: none), which the run's span links to."""
    checkpoint = job.checkpoint.decoded() if job.checkpoint is not None else _NO_CHECKPOINT
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
            "steps": checkpoint["steps"] or {},
            "cursors": checkpoint["cursors"] or {},
            "trace_context": job.trace_context,
        }
    }


_NO_CHECKPOINT: dict[str, dict[str, Any]] = {"steps": {}, "cursors": {}}


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


#: What a finish's ``claim_next`` may hold: the claim's own fields but ``worker`` (the lease's
#: worker claims) and ``wait`` (a finish answers at once; a worker with nothing left claims).
CLAIM_NEXT_FIELDS = ("queues", "tasks")


@dataclasses.dataclass(frozen=True)
class ClaimNext:
    """A finish's ``claim_next``: claim the worker's next job in the finish's transaction."""

    #: None: the token's queues (the claim's default); checked against the token by the view.
    queues: list[str] | None
    #: None: any task.
    tasks: list[str] | None


def claim_next(body: dict[str, Any]) -> ClaimNext | None:
    """A finish's ``claim_next`` (None when absent): an object with the claim's ``queues`` and
    ``tasks``, each optional, read as the claim reads them."""
    given = field(body, "claim_next", dict, None)
    if given is None:
        return None
    unknown = sorted(set(given) - set(CLAIM_NEXT_FIELDS))
    if unknown:
        raise ApiError(
            400,
            f"claim_next has no field {_shown(unknown[0])}; it takes"
            f" {' and '.join(CLAIM_NEXT_FIELDS)} (the lease's worker claims, without a wait)",
            "claim_next",
        )
    return ClaimNext(
        queues=strings(given, "queues", label="claim_next.queues"),
        tasks=strings(given, "tasks", label="claim_next.tasks"),
    )


# ---------------------------------------------------------------------- steps and cursors

#: The longest duration a step may report, in seconds (ten years).
MAX_STEP_DURATION = 10 * 366 * 86400


@dataclasses.dataclass(frozen=True)
class Step:
    """A step a worker recorded (``v1/jobs/<id>/steps``), checked as ``context.step()`` checks
    one: its name, its result as the JSON text stored, how long it ran, and the children it
    spawned."""

    name: str
    result_json: str
    duration: float
    children: list[int]


def step(body: dict[str, Any]) -> Step:
    """The step of a ``v1/jobs/<id>/steps`` request: ``name`` (1 to 200 characters), ``result``
    (plain JSON up to JOBS_MAX_PAYLOAD_BYTES, ``null`` included), ``duration`` (seconds,
    optional) and ``children`` (job ids, optional)."""
    from django_jobs.steps.values import value_json  # imports the models

    name = _step_name(body.get("name"), "step", "name")
    if "result" not in body:
        raise ApiError(400, "result is required (null is a result)", "result")
    # Refused, not repaired as a finish's result is: a client's text that PostgreSQL cannot
    # store is its mistake, and a step's result is given back to every later attempt.
    if storable_value(body["result"])[1]:
        raise ApiError(
            400,
            "result holds a NUL character or invalid Unicode, which PostgreSQL cannot store",
            "result",
        )
    try:
        result_json = value_json(body["result"], f"the result of step {name!r}")
    except InvalidStepResult as error:
        raise ApiError(400, str(error), "result") from None
    return Step(
        name=name,
        result_json=result_json,
        duration=seconds(body, "duration", 0.0, MAX_STEP_DURATION),
        children=job_ids(body, "children"),
    )


def cursor(body: dict[str, Any]) -> dict[str, str]:
    """The cursor of a ``v1/jobs/<id>/cursor`` request, as ``{name: the value's JSON text}``:
    ``name`` as a step's, ``value`` plain JSON up to JOBS_MAX_PAYLOAD_BYTES (``null`` too)."""
    name = _step_name(body.get("name"), "cursor", "name")
    if "value" not in body:
        raise ApiError(400, "value is required (null is a value)", "value")
    return {name: _cursor_value(body["value"], name, "value")}


def cursors(body: dict[str, Any]) -> dict[str, str] | None:
    """A progress report's ``cursors`` (None when absent or empty): an object of cursor names
    and values, each checked as ``v1/jobs/<id>/cursor`` checks one."""
    given = field(body, "cursors", dict, None)
    if not given:
        return None
    return {
        _step_name(name, "cursor", "cursors"): _cursor_value(value, name, "cursors")
        for name, value in given.items()
    }


def _step_name(name: Any, what: str, label: str) -> str:
    from django_jobs.steps.values import checked_name  # imports the models

    try:
        return checked_name(name, what)
    except StepError as error:
        raise ApiError(400, str(error), label) from None


def _cursor_value(value: Any, name: str, label: str) -> str:
    from django_jobs.steps.values import value_json  # imports the models

    try:
        return value_json(value, f"cursor {name!r}")
    except InvalidStepResult as error:
        raise ApiError(400, str(error), label) from None


# ---------------------------------------------------------------------- the job view


def path_job_id(job_id: int) -> int:
    """The job id of a request's path, within a job id's range."""
    if not 1 <= job_id <= BIGINT_MAX:
        raise ApiError(400, f"the job id in the path must be from 1 to {BIGINT_MAX}", "job_id")
    return job_id


def job_not_found() -> ApiError:
    """The one answer for a job that does not exist and a job of a queue the token does not
    hold: it says nothing of the jobs of other queues."""
    return ApiError(404, "no such job among the jobs of this token's queues", "job_id")


def job_view(job: JobView, steps: Sequence[StepInfo]) -> dict[str, Any]:
    """The answer of ``v1/jobs/<id>``: the job's state, attempts, times, last error, progress,
    its recorded steps (not their results: each one's size) and its cursors."""
    progress = None
    if job.progress_done is not None:
        progress = {
            "done": job.progress_done,
            "total": job.progress_total,
            "message": job.progress_message,
        }
    return {
        "job": {
            "id": job.id,
            "task": job.task,
            "queue": job.queue,
            "state": job.state,
            "attempt": job.attempt,
            "max_attempts": job.max_attempts,
            "created_at": _moment(job.created_at),
            "started_at": _moment(job.started_at),
            "finished_at": _moment(job.finished_at),
            "error": job.error,
            "cancel_requested": job.cancel_requested,
            "progress": progress,
            "steps": [
                {
                    "name": info.name,
                    "attempt": info.attempt,
                    "recorded_at": _moment(info.recorded_at),
                    "duration": info.duration,
                    "result_bytes": info.result_bytes,
                }
                for info in steps
            ],
            "cursors": json.loads(job.cursors) if job.cursors is not None else {},
        }
    }


def _moment(moment: datetime.datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


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
    "rate_key",
    "rate_limit",
    "expires_at",
    "expires_after",
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
    for name in ("run_after", "expires_at"):
        if name in options:
            options[name] = _moment_option(options[name], name)
    if "delay" in options:
        delay = seconds(options, "delay", 0.0, 366 * 86400 * 100, label="options.delay")
        options["run_after"] = datetime.timedelta(seconds=delay)
        del options["delay"]
    if "depends_on" in options:
        options["depends_on"] = job_ids(options, "depends_on", label="options.depends_on")
    return Call(task, args, kwargs, options)


def _moment_option(text: Any, name: str) -> datetime.datetime:
    try:
        moment = datetime.datetime.fromisoformat(text) if isinstance(text, str) else None
        if moment is not None and moment.tzinfo is not None:
            # In UTC, as it is stored: a time of year 1 or 9999 in a zone may fall outside.
            moment = moment.astimezone(datetime.UTC)
    except (ValueError, OverflowError):
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ApiError(
            400,
            f"{name} must be an ISO 8601 time with its zone, from year 1 to 9999 in UTC",
            f"options.{name}",
        )
    return moment


def option_field(message: str) -> str:
    """The field an option's error message is about (they start with the option's name)."""
    first = message.split(" ", 1)[0]
    if first in OPTIONS:
        return f"options.{first}"
    return "args" if message.startswith(("job arguments", "args", "kwargs")) else "options"


def enqueued(job: Any) -> dict[str, Any]:
    return {"job": {"id": job.pk, "task": job.task, "queue": job.queue, "state": job.state}}
