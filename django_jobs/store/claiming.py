"""The claim: a worker takes the next ready job, and gets back the job and its lease.

The worker runs the ``django_jobs_claim()`` function (django_jobs/store/sql/functions/, its
newest version) through ``call_claim`` of django_jobs/store/sql/claim.sql. :func:`claim_branch`
reads the function's branches out of that one file, as statements of their own, for reading
their plans.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.sql import query


@dataclasses.dataclass(frozen=True)
class Lease:
    """What identifies one claim of a job; every later write is fenced on it."""

    job_id: int
    attempt: int
    worker_id: str
    #: The claim's random token (``None`` only for rows claimed before tokens existed).
    token: str | None


def lease_params(lease: Lease) -> dict[str, Any]:
    """The parameters that fence a statement on ``lease``."""
    return {
        "job_id": lease.job_id,
        "attempt": lease.attempt,
        "worker_id": lease.worker_id,
        "lease": lease.token,
    }


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """What a run resumes from: each recorded step's result and each cursor's value, by name,
    as JSON text (decoded when a step or cursor is asked for, so that a job that reads one
    decodes only that one). Read by :func:`~django_jobs.store.checkpoint`, or with the claim of
    the HTTP API (:func:`claim` with ``with_checkpoint``)."""

    steps: dict[str, str] = dataclasses.field(default_factory=dict)
    cursors: dict[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, steps: dict[str, Any] | None, cursors: dict[str, Any] | None) -> Checkpoint:
        """From decoded values (the HTTP API's answer)."""
        return cls(
            {name: json.dumps(value) for name, value in (steps or {}).items()},
            {name: json.dumps(value) for name, value in (cursors or {}).items()},
        )

    @classmethod
    def of_texts(cls, steps: str | None, cursors: str | None) -> Checkpoint:
        """From the JSON objects' texts a statement read (NULL: none), each of name -> value."""
        return cls(_split(steps), _split(cursors))

    def decoded(self) -> dict[str, dict[str, Any]]:
        """``{"steps": {...}, "cursors": {...}}`` with the values decoded: the HTTP API's form."""
        return {
            "steps": {name: json.loads(text) for name, text in self.steps.items()},
            "cursors": {name: json.loads(text) for name, text in self.cursors.items()},
        }


def _split(text: str | None) -> dict[str, str]:
    """A JSON object's members as JSON texts of their own."""
    if text is None:
        return {}
    return {name: json.dumps(value) for name, value in json.loads(text).items()}


@dataclasses.dataclass(frozen=True)
class ClaimedJob:
    lease: Lease
    attempt_id: int
    task: str
    queue: str
    args_json: str
    kwargs_json: str
    max_attempts: int
    timeout: int | None
    parent_id: int | None
    #: The job's recorded steps and cursors, where the claim read them (the HTTP API's); None:
    #: not read (a worker's run reads them if it asks for a step or a cursor).
    checkpoint: Checkpoint | None = None
    #: The W3C trace context the job was enqueued in (``traceparent``, ``tracestate``), which
    #: its run's span links to; None: it was enqueued outside a traced span.
    trace_context: dict[str, str] | None = None

    @property
    def id(self) -> int:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt


class ClaimRow(NamedTuple):
    """A row of ``django_jobs_claim``, its columns in the order of the function's ``RETURNS
    TABLE`` (tests/unit/test_sql.py checks the two agree). The claim's row also arrives as one
    result of :func:`~django_jobs.store.db.execute_together`, which has no column names; a
    NamedTuple reads it by name at the cost of a tuple."""

    id: int
    task: str
    queue: str
    args: str
    kwargs: str
    attempt: int
    max_attempts: int
    timeout: int | None
    parent_id: int | None
    lease: Any
    #: JSON text, or None.
    trace_context: str | None
    attempt_id: int


def claimed_job(
    worker_id: str, row: Sequence[Any] | None, *, with_checkpoint: bool = False
) -> ClaimedJob | None:
    """The job a claim's row describes; ``None`` for no row (no job was ready).
    ``with_checkpoint``: the row has two columns more, the job's recorded steps and its cursors
    as JSON text (``call_claim_with_checkpoint``), which fill :attr:`ClaimedJob.checkpoint`."""
    if row is None:
        return None
    width = len(ClaimRow._fields)
    claimed = ClaimRow._make(row[:width] if with_checkpoint else row)
    lease = Lease(claimed.id, claimed.attempt, worker_id, str(claimed.lease))
    return ClaimedJob(
        lease,
        claimed.attempt_id,
        claimed.task,
        claimed.queue,
        claimed.args,
        claimed.kwargs,
        claimed.max_attempts,
        claimed.timeout,
        claimed.parent_id,
        Checkpoint.of_texts(row[width], row[width + 1]) if with_checkpoint else None,
        None if claimed.trace_context is None else json.loads(claimed.trace_context),
    )


#: The PL/pgSQL function the worker claims with (django_jobs/store/sql/functions/).
CLAIM_FUNCTION = "django_jobs_claim"

#: What tells each branch of the claim function from the others: the condition it adds.
_BRANCH_MARKS = {
    "claim_one_queue": "queue = v_queues[1]",
    "claim_some_queues": "queue = ANY(v_queues)",
    "claim_keyed_job": "id = v_keyed.id",
    "claim_free_job": "v_free.queue",
}

#: The function's arguments and variables that the branches read, and the parameter each
#: becomes in a statement of its own; longer names first, so that none is cut in two.
_PARAMETERS = (
    ("p_worker_id", "%(worker_id)s"),
    ("p_skip_tasks", "%(skip_tasks)s"),
    ("v_queues[1]", "%(queue)s"),
    ("v_queues", "%(queues)s"),
    ("v_keyed.id", "%(job_id)s"),
    ("v_free.queue", "%(queue)s"),
)


def claim_branch(name: str) -> str:
    """The branch ``name`` of the claim function, as the statement it runs, with the function's
    variables made parameters (``%(worker_id)s``, ``%(skip_tasks)s``, and ``%(queue)s``,
    ``%(queues)s`` or ``%(job_id)s``): ``claim_any_queue``, ``claim_one_queue``,
    ``claim_some_queues``, ``claim_keyed_job`` (the claim of a keyed candidate, once its key's
    slot is secured) or ``claim_free_job`` (the claim of a candidate without a key, from its
    queue, under queue controls). For reading its plan: the worker runs the function."""
    branches = re.findall(r"RETURN QUERY\n(.*?)\n;", query(CLAIM_FUNCTION), re.S)
    if name == "claim_any_queue":
        # The one branch that reads none of the function's own variables.
        found = [branch for branch in branches if not re.search(r"\bv_", branch)]
    elif name in _BRANCH_MARKS:
        found = [branch for branch in branches if _BRANCH_MARKS[name] in branch]
    else:
        raise KeyError(f"the claim function has no branch {name!r}")
    (branch,) = found
    for variable, parameter in _PARAMETERS:
        branch = branch.replace(variable, parameter)
    return branch


def claim_sql(queues: Sequence[str] | None) -> tuple[str, dict[str, Any]]:
    """The claim statement for a worker serving ``queues`` (``None``: every queue), as the claim
    function runs it, with its parameters but ``worker_id``: for reading its plan."""
    if not queues:
        return claim_branch("claim_any_queue"), {"skip_tasks": None}
    if len(queues) == 1:
        return claim_branch("claim_one_queue"), {"queue": queues[0], "skip_tasks": None}
    return claim_branch("claim_some_queues"), {"queues": list(queues), "skip_tasks": None}


def claim(
    cursor: Cursor,
    worker_id: str,
    queues: Sequence[str] | None,
    skip_tasks: Sequence[str] = (),
    *,
    first: Sequence[tuple[str, Any]] = (),
    with_checkpoint: bool = False,
) -> ClaimedJob | None:
    """Claim one ready job for ``worker_id``, or return ``None`` if none is ready. Jobs of
    ``skip_tasks`` (tasks the worker has found it does not have) are passed over. ``first``:
    statements (SQL and parameters) run before the claim in its transaction and round trip, their
    rows not read (the HTTP API's registration of its worker, :func:`~django_jobs.store.
    registration`). ``with_checkpoint``: read the job's recorded steps and cursors in the same
    statement (``call_claim_with_checkpoint``, the HTTP API's claim, whose worker resumes from its
    answer), into :attr:`ClaimedJob.checkpoint`."""
    # The commit is durable: a claim that a server crash lost would make a job that is running
    # claimable again, and a second executor would run it at the same time as the first.
    params = claim_params(worker_id, queues, skip_tasks)
    statement = query("call_claim_with_checkpoint" if with_checkpoint else "call_claim")
    if first:
        *_, rows = db.execute_together(cursor, [*first, (statement, params)])
        row = rows[0] if rows else None
    else:
        row = db.execute(cursor, statement, params).fetchone()
    return claimed_job(worker_id, row, with_checkpoint=with_checkpoint)


def claim_params(
    worker_id: str, queues: Sequence[str] | None, skip_tasks: Sequence[str] = ()
) -> dict[str, Any]:
    """The parameters of ``call_claim``."""
    return {
        "worker_id": worker_id,
        "queues": list(queues) if queues else None,
        "skip_tasks": list(skip_tasks) if skip_tasks else None,
    }


def ready_queues(cursor: Cursor, queues: Sequence[str], any_queue: bool) -> set[str]:
    """Those of ``queues`` that have a ready job (paused ones left out), and ``""`` when
    ``any_queue`` and any queue has one: the hint the HTTP API's idle long polls are woken on."""
    params = {"queues": list(queues), "any": any_queue}
    return {row[0] for row in db.execute(cursor, query("ready_queues"), params).fetchall()}
