"""The worker registry: a worker's heartbeat (which reports on its leases and its orphans), what
the reaper reads of running jobs, and forgetting a worker.

The statements are in django_jobs/store/sql/workers.sql. The pods that workers recorded, which
the Kubernetes liveness check reads, are here too.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from django_jobs.cursor import Cursor
from django_jobs.store import db
from django_jobs.store.claiming import Lease
from django_jobs.store.sql import query


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    id: str
    name: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    #: The Kubernetes pod the worker runs in (``POD_NAME``), or "".
    pod: str = ""
    #: The task names the worker has registered.
    tasks: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class LeaseStatus:
    job_id: int
    held: bool
    cancel_requested: bool


@dataclasses.dataclass(frozen=True)
class Beat:
    """What a heartbeat read back: the status of each lease, by token (a missing token: the
    job was deleted), and the leases of the worker's orphans."""

    leases: dict[str, LeaseStatus]
    orphans: list[Lease]


class _BeatRow(NamedTuple):
    job_id: int
    held: bool
    cancel_requested: bool
    orphan: bool
    token: str
    attempt: int


def heartbeat(
    cursor: Cursor, worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int] = ()
) -> Beat:
    """Record that ``worker`` is alive; report on its leases, and on its orphans: jobs running
    under its id that are neither leased nor ``unwritten`` (ended by the worker, with the write
    saying so still to be made). A lease is held only if all of it matches: its job, token,
    worker and attempt number."""
    job_ids = [lease.job_id for lease in leases]
    attempts = {lease.token: lease.attempt for lease in leases}
    result = db.execute(
        cursor,
        query("heartbeat"),
        {
            **dataclasses.asdict(worker),
            "queues": json.dumps(worker.queues),
            "tasks": json.dumps(worker.tasks),
            "job_ids": job_ids,
            "leases": [lease.token for lease in leases],
            "known_ids": [*job_ids, *unwritten],
        },
    )
    statuses, orphans = {}, []
    for row in db.fetch_all_as(result, _BeatRow):
        if row.orphan:
            orphans.append(Lease(row.job_id, row.attempt, worker.id, row.token))
        else:
            held = bool(row.held) and attempts.get(row.token) == row.attempt
            statuses[row.token] = LeaseStatus(row.job_id, held, bool(row.cancel_requested))
    return Beat(statuses, orphans)


def registration(worker: WorkerInfo) -> tuple[str, dict[str, Any]]:
    """``register_worker`` for ``worker``, with its parameters: a statement to send first in a
    claim's round trip and transaction (the ``first`` of :func:`~django_jobs.store.claim` and of
    :func:`~django_jobs.store.finish_then_claim`)."""
    params = {
        **dataclasses.asdict(worker),
        "queues": json.dumps(worker.queues),
        "tasks": json.dumps(worker.tasks),
    }
    return query("register_worker"), params


def unregister_worker(cursor: Cursor, worker_id: str) -> None:
    db.execute(cursor, query("unregister_worker"), {"id": worker_id})


class RunningJob(NamedTuple):
    """A running job as the reaper sees it (``running_jobs``, one row, read by column name)."""

    job_id: int
    attempt: int
    worker_id: str
    token: str
    task: str
    max_attempts: int
    timeout: int | None
    queue: str
    running_for: float | None
    unregistered: bool
    host: str | None
    pid: int | None
    silent_for: float | None
    overdue: bool

    @property
    def lease(self) -> Lease:
        return Lease(self.job_id, self.attempt, self.worker_id, self.token)


def running_jobs(cursor: Cursor, timeout_grace: float) -> list[RunningJob]:
    """Every running job, with what the reaper judges it by: its worker's silence, whether it
    overran its timeout plus ``timeout_grace``."""
    result = db.execute(cursor, query("running_jobs"), {"timeout_grace": timeout_grace})
    return db.fetch_all_as(result, RunningJob)


def delete_worker_if_idle(cursor: Cursor, worker_id: str, silence: float) -> bool:
    """Forget a dead worker once none of its jobs runs, if it is still silent (see
    ``delete_silent_worker`` in workers.sql). True if its row was deleted."""
    params = {"id": worker_id, "silence": silence}
    return db.execute(cursor, query("delete_silent_worker"), params).fetchone() is not None


class WorkerPod(NamedTuple):
    """The pod a worker recorded as its own, and the boot of it that was seen first."""

    worker_id: str
    pod: str
    #: The pod's uid and the worker container's id when first seen, or "".
    boot_id: str


def worker_pods(cursor: Cursor, worker_ids: Iterable[str]) -> list[WorkerPod]:
    """The pods of those of ``worker_ids`` that recorded one."""
    result = db.execute(cursor, query("worker_pods"), {"ids": sorted(worker_ids)})
    return db.fetch_all_as(result, WorkerPod)


def record_worker_boot(cursor: Cursor, worker_id: str, boot_id: str) -> None:
    """Remember ``boot_id`` as the first boot seen of the worker's pod (a later one is kept
    out: a restart is told by comparing with the first)."""
    db.execute(cursor, query("record_worker_boot"), {"id": worker_id, "boot_id": boot_id})
