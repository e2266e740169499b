"""One run's view of its job's checkpoint: the steps and cursors it resumes from, and the ones
it records as it goes.

The checkpoint is read once per run, on the first step or cursor the run asks for (a run of a
worker of the HTTP API gets it with its claim), so that a job that uses neither costs no
statement. A step is recorded when its function returns, in a commit of its own, durably and
fenced on the run's lease, before ``step()`` returns: a run interrupted after that point never
runs the step again. A cursor save is cheaper: in a worker's executor it goes to the worker,
which writes the newest values with the run's progress, at most once per
``JOBS_CURSOR_INTERVAL``, and always before the attempt's end or its release at shutdown
(worker/live.py); elsewhere it is written at once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from django.db import connections

from django_jobs import conf, store
from django_jobs.exceptions import InvalidStepResult, LeaseLost, StepError
from django_jobs.steps.values import checked_name, value_json
from django_jobs.store import Checkpoint, Lease


class Door(Protocol):
    """How a run reads and writes its checkpoint: the job database, or the HTTP API."""

    def load(self) -> Checkpoint: ...

    def record_step(self, name: str, result_json: str, duration: float, children: list[int]) -> str:
        """Record a step; return the result that stands (an earlier record's, if there was
        one). Raises :class:`LeaseLost` if the run no longer owns its job."""
        ...

    def save_cursors(self, cursors: dict[str, str]) -> None:
        """Write cursors now. Raises :class:`LeaseLost` if the run no longer owns its job."""
        ...

    def is_owner(self) -> bool: ...


def lease_lost(lease: Lease, what: str) -> LeaseLost:
    return LeaseLost(
        f"job {lease.job_id} attempt {lease.attempt} lost its lease (it was reaped, re-claimed"
        f" or ended under another run): {what} recorded nothing; the job should stop"
    )


class DatabaseDoor:
    """The checkpoint through the job database, on the run's own Django connection."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.alias = conf.database_alias()

    def _cursor(self, what: str) -> Any:
        connection = connections[self.alias]
        if connection.in_atomic_block or not connection.get_autocommit():
            raise StepError(
                f"{what} was called inside a transaction of the job's (transaction.atomic(), or"
                " autocommit turned off): it is recorded in a commit of its own, which a"
                " transaction of the job's would hold back or roll back. Call it outside the"
                " transaction (the step's function may open one of its own)"
            )
        return connection.cursor()

    def load(self) -> Checkpoint:
        with connections[self.alias].cursor() as cursor:
            return store.checkpoint(cursor, self.lease.job_id)

    def record_step(self, name: str, result_json: str, duration: float, children: list[int]) -> str:
        with self._cursor(f"context.step({name!r})") as cursor:
            recorded = store.record_step(cursor, self.lease, name, result_json, duration, children)
            if not recorded.owner:
                raise lease_lost(self.lease, f"step {name!r}")
            if recorded.recorded and recorded.result is not None:
                return recorded.result  # as later attempts will read it back
            return store.step_result(cursor, self.lease.job_id, name) or result_json

    def save_cursors(self, cursors: dict[str, str]) -> None:
        with self._cursor("context.save_cursor()") as cursor:
            written = store.record_live(cursor, self.lease, None, None, cursors=cursors)
        if not written.progress:
            raise lease_lost(self.lease, f"cursor {next(iter(cursors))!r}")

    def is_owner(self) -> bool:
        with connections[self.alias].cursor() as cursor:
            return store.owns_lease(cursor, self.lease)


class ApiDoor:
    """The checkpoint through the HTTP API a worker takes its jobs from."""

    def __init__(self, api: Any, job_id: int, lease: str, checkpoint: Checkpoint | None) -> None:
        self.api = api
        self.job_id = job_id
        self.lease = lease
        self.given = checkpoint

    def _post(self, endpoint: str, body: dict[str, Any], what: str) -> Any:
        status, answer = self.api.post(
            f"v1/jobs/{self.job_id}/{endpoint}", {"lease": self.lease, **body}
        )
        if status in (404, 409):
            raise LeaseLost(
                f"job {self.job_id} lost its lease (the API answered {status}: "
                f"{(answer or {}).get('error', '')}); {what} recorded nothing; the job should stop"
            )
        return answer

    def load(self) -> Checkpoint:
        # The claim's answer carries the checkpoint. A server that sent none has none to give:
        # a step it has recorded already is answered with its recorded result.
        return self.given if self.given is not None else Checkpoint()

    def record_step(self, name: str, result_json: str, duration: float, children: list[int]) -> str:
        body = {
            "name": name,
            "result": json.loads(result_json),
            "duration": duration,
            "children": children,
        }
        answer = self._post("steps", body, f"step {name!r}")
        return json.dumps(answer["result"])

    def save_cursors(self, cursors: dict[str, str]) -> None:
        for name, value in cursors.items():
            self._post("cursor", {"name": name, "value": json.loads(value)}, f"cursor {name!r}")

    def is_owner(self) -> bool:
        status, _ = self.api.post(f"v1/jobs/{self.job_id}/heartbeat", {"lease": self.lease})
        return status == 200


@dataclasses.dataclass
class RunCheckpoint:
    """What one run has of its job's checkpoint, and what it has recorded since."""

    door: Door
    #: Where a cursor save goes in a worker's executor (to the worker, which writes it); None:
    #: written at once, through the door.
    send_cursor: Callable[[str, str], None] | None = None
    loaded: Checkpoint | None = None
    #: The names of the steps this attempt has run or replayed.
    used: set[str] = dataclasses.field(default_factory=set)
    #: The children spawned by the step running now (None: no step is running).
    spawned: list[int] | None = None
    #: The cursors this attempt saved, as JSON text.
    saved: dict[str, str] = dataclasses.field(default_factory=dict)
    #: The size of all of the job's cursors together, as JSON (None: not counted yet).
    cursor_bytes: int | None = None

    def checkpoint(self) -> Checkpoint:
        if self.loaded is None:
            self.loaded = self.door.load()
        return self.loaded

    def step(self, name: Any, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        name = checked_name(name, "step")
        if self.spawned is not None:
            raise StepError(
                f"step {name!r} was started inside another step: steps do not nest; make the"
                " inner work part of the outer step's function, or a step of its own after it"
            )
        if name in self.used:
            raise StepError(
                f"step {name!r} was already run in this attempt: a step's name names its result"
                " in the job's checkpoint, so each step of a job needs a name of its own (add"
                " the item's key to it, e.g. f'fetch:{page}')"
            )
        self.used.add(name)
        recorded = self.checkpoint().steps.get(name)
        if recorded is not None:
            return json.loads(recorded)
        self.spawned = []
        started = time.monotonic()
        try:
            try:
                value = fn(*args, **kwargs)
            finally:
                children, self.spawned = self.spawned, None
            result_json = value_json(value, f"the result of step {name!r}")
            stored = self.door.record_step(name, result_json, time.monotonic() - started, children)
        except BaseException:
            # Nothing was recorded under the name: the job may try the step again.
            self.used.discard(name)
            raise
        self.checkpoint().steps[name] = stored
        return json.loads(stored)

    def spawned_child(self, job_id: int) -> None:
        """A child was spawned: if a step is running, it is the step's."""
        if self.spawned is not None:
            self.spawned.append(job_id)

    def cursor(self, name: Any, default: Any) -> Any:
        name = checked_name(name, "cursor")
        text = self.saved.get(name)
        if text is None:
            text = self.checkpoint().cursors.get(name)
        return default if text is None else json.loads(text)

    def save_cursor(self, name: Any, value: Any) -> None:
        name = checked_name(name, "cursor")
        text = value_json(value, f"cursor {name!r}")
        total = self._cursor_bytes_with(name, text)
        if self.send_cursor is None:
            self.door.save_cursors({name: text})
        else:
            self.send_cursor(name, text)
        self.saved[name] = text
        self.cursor_bytes = total

    def _cursor_bytes_with(self, name: str, text: str) -> int:
        """The size of the job's cursors together once ``name`` is ``text``: at most
        ``JOBS_MAX_PAYLOAD_BYTES``, as each value is, or the job row, which holds them all and
        is rewritten with them all on each write, would grow with every new name."""
        if self.cursor_bytes is None:
            known = {**self.checkpoint().cursors, **self.saved}
            self.cursor_bytes = sum(_cursor_size(n, t) for n, t in known.items())
        old = self.saved.get(name)
        if old is None:
            old = self.checkpoint().cursors.get(name)
        total = self.cursor_bytes + _cursor_size(name, text)
        if old is not None:
            total -= _cursor_size(name, old)
        limit = conf.max_payload_bytes()
        if total > limit:
            raise InvalidStepResult(
                f"cursor {name!r} cannot be saved: the job's cursors would be {total} bytes of"
                f" JSON together, over JOBS_MAX_PAYLOAD_BYTES ({limit}). A cursor is a position"
                " to resume from: save a few, each small, and store large data elsewhere."
            )
        return total


def _cursor_size(name: str, text: str) -> int:
    """What a cursor adds to the JSON object of a job's cursors: ``"name":value,``."""
    return len(name) + len(text) + 4
