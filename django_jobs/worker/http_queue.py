"""The queue over the jobs HTTP API: what ``runjobworker --api URL`` uses instead of a database
connection.

Each call of the :class:`~django_jobs.worker.postgres_queue.Queue` protocol is one POST of the API's
version 1 (``django_jobs.api``), with the worker's token. A lease is the opaque string the claim
handed out, kept in ``Lease.token`` and sent back verbatim. An idle worker's claim waits on the
server for a job (long polling), up to the ``wait`` the supervisor allows it.

Errors keep the protocol's meaning: a lost lease (409, or 404 once the job was deleted) makes a
write return ``None`` (``False`` for a release); no answer, a timeout, a server error (5xx), a
408 or a 429 raises :class:`~django_jobs.exceptions.ApiUnreachable`, which the
:class:`~django_jobs.worker.postgres_queue.QueueGate` backs off as an outage; any other refusal
raises :class:`~django_jobs.exceptions.ApiRefused`, which it logs, and which is final: the
outbox never sends a refused write again (a finish falls back to a plain error at once).

The server does the rest itself: it settles workflows (parents, children, dependents) inside
each finish, and recovers what its reaper finds. A worker of the API fires no periodic jobs and
LISTENs to nothing: it has none of a database worker's duties (:mod:`django_jobs.worker.duties`).
"""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django_jobs import store
from django_jobs.apiclient import HINTS, MAX_WAIT, Api, read_token
from django_jobs.exceptions import ApiRefused, ApiUnreachable
from django_jobs.progress import Progress
from django_jobs.registry import registry
from django_jobs.states import Outcome
from django_jobs.store import (
    Beat,
    Checkpoint,
    ClaimedJob,
    Ended,
    HandBack,
    Lease,
    LeaseStatus,
    Recorded,
    WorkerInfo,
)

logger = logging.getLogger("django_jobs.worker")

_FINISH_OPTIONS = ("result_json", "error", "traceback", "retryable", "retry_delay")


def finish_body(lease: Lease, outcome: str, **options: Any) -> dict[str, Any]:
    """The body of ``v1/jobs/<id>/finish`` for the supervisor's finish of ``lease`` (the keyword
    arguments of :func:`django_jobs.store.finish`)."""
    unknown = set(options) - set(_FINISH_OPTIONS)
    if unknown:
        raise TypeError(f"unknown options of the end of an attempt: {', '.join(sorted(unknown))}")
    body: dict[str, Any] = {
        "lease": lease.token,
        "outcome": outcome,
        "error": options.get("error", ""),
        "traceback": options.get("traceback", ""),
        "retry": bool(options.get("retryable", True)),
        "retry_after": max(0.0, float(options.get("retry_delay", 0.0))),
    }
    result_json = options.get("result_json")
    if outcome == Outcome.DONE and result_json is not None:
        body["result"] = json.loads(result_json)
    return body


def claimed_job(worker_id: str, job: dict[str, Any]) -> ClaimedJob:
    """The claimed job of a claim's answer, with the recorded steps and cursors it carries (a
    server older than them sends none: its runs find none), and the trace context it was
    enqueued in (an older server sends none: its runs' spans have no link)."""
    checkpoint = None
    if "steps" in job or "cursors" in job:
        checkpoint = Checkpoint.of(job.get("steps"), job.get("cursors"))
    trace_context = job.get("trace_context")
    return ClaimedJob(
        lease=Lease(job["id"], job["attempt"], worker_id, job["lease"]),
        attempt_id=0,  # the API does not say, and a worker does not need it
        task=job["task"],
        queue=job["queue"],
        args_json=json.dumps(job["args"]),
        kwargs_json=json.dumps(job["kwargs"]),
        max_attempts=job["max_attempts"],
        timeout=job["timeout"],
        parent_id=job["parent_id"],
        checkpoint=checkpoint,
        trace_context=trace_context if isinstance(trace_context, dict) else None,
    )


def ended_of(lease: Lease, answer: dict[str, Any]) -> Ended:
    """Where a finish's answer says the job went. The server has settled the job's workflow
    already: nothing for the worker to follow."""
    return Ended(lease.job_id, answer["state"], parent_id=None, has_dependents=False)


def beat(worker_id: str, answer: dict[str, Any]) -> Beat:
    """The :class:`~django_jobs.store.Beat` of a batch heartbeat's answer."""
    leases = {
        lease: LeaseStatus(status["job_id"], bool(status["held"]), bool(status["cancel_requested"]))
        for lease, status in answer["leases"].items()
    }
    orphans = [
        Lease(orphan["job_id"], orphan["attempt"], worker_id, orphan["lease"])
        for orphan in answer["orphans"]
    ]
    return Beat(leases, orphans)


def open_queue(url: str, token_file: str | None, environ: Mapping[str, str]) -> HttpQueue:
    """The queue of a worker of the API at ``url``, with the token of ``token_file`` (or of the
    environment), for the tasks registered in this process."""
    return HttpQueue(Api(url, read_token(token_file, environ)), registry.local_names())


class HttpQueue:
    """:class:`~django_jobs.worker.postgres_queue.Queue` over the jobs HTTP API. Claims ask only for
    ``tasks`` (the worker's registered tasks): the server never hands out a job whose task the
    worker lacks."""

    label = "API"

    def __init__(self, api: Api, tasks: Sequence[str]) -> None:
        self.api = api
        self.tasks = list(tasks)

    def trouble(self, exc: BaseException) -> str:
        return "API unreachable" if isinstance(exc, ApiUnreachable) else "API error"

    @property
    def broken(self) -> bool:
        return self.api.broken

    def _post(self, path: str, body: dict[str, Any], *, wait: float = 0.0) -> tuple[int, Any]:
        status, answer = self.api.post(path, body, wait=wait)
        if status == 404:
            raise ApiRefused(f"the jobs API has no {path} (404); {HINTS[404]}", status)
        return status, answer

    def _job_call(self, lease: Lease, action: str, body: dict[str, Any]) -> Any:
        """POST to ``v1/jobs/<id>/<action>``; ``None`` if the lease was lost (409) or the job
        deleted (404)."""
        status, answer = self.api.post(
            f"v1/jobs/{lease.job_id}/{action}", {"lease": lease.token, **body}
        )
        return None if status in (404, 409) else answer

    def claim(
        self, worker_id: str, queues: Sequence[str], skip_tasks: Sequence[str], *, wait: float = 0.0
    ) -> ClaimedJob | None:
        wait = round(min(max(wait, 0.0), MAX_WAIT), 3)
        body = {"worker": worker_id, **self._claim_body(queues, skip_tasks), "wait": wait}
        status, answer = self._post("v1/claim", body, wait=wait)
        if status == 204 or answer is None:
            return None
        return claimed_job(worker_id, answer["job"])

    def finish(self, lease: Lease, outcome: str, **options: Any) -> Ended | None:
        answer = self._job_call(lease, "finish", finish_body(lease, outcome, **options))
        return None if answer is None else ended_of(lease, answer)

    def finish_and_claim(
        self,
        lease: Lease,
        outcome: str,
        queues: Sequence[str],
        skip_tasks: Sequence[str],
        **options: Any,
    ) -> tuple[Ended | None, ClaimedJob | None]:
        """The finish with ``claim_next``: the server claims the worker's next job in the
        finish's transaction, and answers it with the finish. A lost lease (409) claims nothing.
        A server that refuses the request (one that does not hold these queues, say) is asked
        again for the finish alone, then for a claim, as one without ``claim_next`` would be."""
        body = finish_body(lease, outcome, **options)
        body["claim_next"] = self._claim_body(queues, skip_tasks)
        try:
            answer = self._job_call(lease, "finish", body)
        except ApiRefused:
            answer = {}  # not written: the finish is sent again alone
        if answer is None:
            return None, None
        if "job" in answer:
            job = answer["job"]
            claimed = None if job is None else claimed_job(lease.worker_id, job)
            return ended_of(lease, answer), claimed
        # Refused, or a server older than claim_next (which ignores it): two requests.
        ended = ended_of(lease, answer) if answer else self.finish(lease, outcome, **options)
        try:
            claimed = self.claim(lease.worker_id, queues, skip_tasks)
        except ApiUnreachable:
            # The finish is recorded; the next claim, from the loop, meets the outage.
            claimed = None
        return ended, claimed

    def _claim_body(self, queues: Sequence[str], skip_tasks: Sequence[str]) -> dict[str, Any]:
        """What a claim asks for: the worker's tasks but ``skip_tasks``, from ``queues`` (none:
        every queue of the token)."""
        body: dict[str, Any] = {"tasks": [task for task in self.tasks if task not in skip_tasks]}
        if queues:
            body["queues"] = list(queues)
        return body

    def attempt_outcome(self, lease: Lease) -> str | None:
        answer = self._job_call(lease, "outcome", {})
        return None if answer is None or answer["outcome"] is None else str(answer["outcome"])

    def record_live(
        self,
        lease: Lease,
        progress: Progress | None,
        log: str | None,
        cursors: dict[str, str] | None = None,
    ) -> Recorded:
        body: dict[str, Any] = {
            "progress": None
            if progress is None
            else {"done": progress.done, "total": progress.total, "message": progress.message},
            "log": log,
        }
        if cursors:
            body["cursors"] = {name: json.loads(value) for name, value in cursors.items()}
        answer = self._job_call(lease, "progress", body)
        if answer is None:
            return Recorded(False, False)
        return Recorded(bool(answer["progress"]), bool(answer["log"]))

    def release(self, lease: Lease, reason: str) -> bool:
        return self._job_call(lease, "release", {"reason": reason}) is not None

    def hand_back(
        self,
        lease: Lease,
        task: str,
        *,
        give_up_after: float,
        worker_timeout: float,
        seen_since: datetime.datetime | None,
    ) -> HandBack | None:
        # Rare: the server hands out only the tasks a claim lists. A release does not count the
        # attempt either; the server's reaper decides when nobody has the task.
        reason = f"waiting for a worker that has registered task {task!r}"
        if not self.release(lease, reason):
            return None
        now = datetime.datetime.now(datetime.UTC)
        return HandBack(store.HANDED_BACK, seen_since or now)

    def heartbeat(
        self, worker: WorkerInfo, leases: Sequence[Lease], unwritten: Sequence[int]
    ) -> Beat:
        body = {
            "worker": worker.id,
            "leases": [lease.token for lease in leases],
            "unwritten": list(unwritten),
            "info": {
                "name": worker.name,
                "host": worker.host,
                "pid": worker.pid,
                "concurrency": worker.concurrency,
                "queues": worker.queues,
                "tasks": worker.tasks,
                "pod": worker.pod,
            },
        }
        _, answer = self._post("v1/heartbeat", body)
        return beat(worker.id, answer)

    def check(self, worker: WorkerInfo) -> None:
        """Before the worker starts: a first heartbeat, which raises
        :class:`~django_jobs.exceptions.ApiRefused` if the API refuses the token or the URL
        (an outage is left to the worker, which waits it out)."""
        try:
            self.heartbeat(worker, [], [])
        except ApiUnreachable as exc:
            logger.warning("%s; the worker starts, and tries again", exc)

    def unregister(self, worker_id: str) -> None:
        pass  # the API has no endpoint for it: the row goes once the worker is silent

    def close(self) -> None:
        self.api.close()
