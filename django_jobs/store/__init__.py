"""The hot statements on jobs: claim, finish, release, heartbeat, reap, cancel, retry.

Each function runs one statement, which PostgreSQL runs as one short transaction when the
connection is in autocommit mode; the statement locks at most one job row, for milliseconds, and
commits durably (see db.py). Every write to a claimed job is *fenced*: it matches
``state = 'running'`` together with the claim's *lease*, a random token that the claim stores on
the job and its attempt row, so a worker whose job was reaped and re-run cannot overwrite the new
run. Attempt numbers alone would not do: a server crash that lost a claim would hand the same
number out again, while a token is never handed out twice. A fenced write that matches no row
means "lease lost": callers log it.

Functions take a DB-API cursor (a Django cursor or a psycopg one), so the worker can use its own
connection and the admin or the reaper can use Django's. The statements are in
django_jobs/store/sql/ (claim.sql, ending.sql, workers.sql, control.sql, functions/); the
modules:

- ``claiming``: the claim, and the :class:`Lease` and :class:`ClaimedJob` it returns;
- ``ending``: finish, reap, release and hand back, the ends of a claim;
- ``workers``: heartbeats, the reaper's view of running jobs, workers' pods, forgetting a worker;
- ``live_attempts``: a running attempt's progress, cursors and captured log;
- ``steps``: a long job's checkpoint, its recorded steps and its cursors, and its lease's owner;
- ``control``: operators' actions over batches of ids (cancel, retry, run now);
- ``job_reads``: what a running job, and the API serving its worker, read of one job;
- ``job_inserts``: writing new jobs, one row or many (``COPY``);
- ``api_tokens``: the API's token lookups, use stamps and revoking;
- ``operations_views`` and ``overview``: reads of the operations views, for ``jobstats``,
  :mod:`django_jobs.stats` and the admin's dashboard;
- ``diagnosis``: a database error told in one line that says what to do (missing tables, a
  database out of reach).

No module outside this package holds SQL text (tests/unit/test_store_owns_sql.py). Rows are
read by column name (``db.fetch_one_as``, ``db.fetch_all_as``) into a NamedTuple or a
dataclass, whose fields must be the statement's columns.
"""

from django_jobs.store.claiming import (
    CLAIM_FUNCTION,
    ClaimedJob,
    Lease,
    claim,
    claim_branch,
    claim_sql,
)
from django_jobs.store.control import (
    BUSY_PAUSE,
    BUSY_RETRIES,
    EXPIRE_BATCH,
    Cancelled,
    Changes,
    cancel_without_cascade,
    changes_of,
    expire_due,
    retry,
    retry_many,
    run_now,
    run_now_many,
    unique_key_holders,
    until_free,
)
from django_jobs.store.ending import (
    EXPIRED,
    FINISH_FUNCTION,
    HANDED_BACK,
    Ended,
    HandBack,
    attempt_outcome,
    finish,
    finish_and_claim,
    finish_then_claim,
    hand_back,
    reap,
    release,
)
from django_jobs.store.live_attempts import Recorded, record_live
from django_jobs.store.steps import (
    Checkpoint,
    LatestSteps,
    StepInfo,
    StepRecord,
    checkpoint,
    clear_checkpoint,
    job_steps,
    latest_steps,
    owns_lease,
    record_step,
    step_result,
)
from django_jobs.store.workers import (
    Beat,
    LeaseStatus,
    RunningJob,
    WorkerInfo,
    WorkerPod,
    delete_worker_if_idle,
    heartbeat,
    record_worker_boot,
    registration,
    running_jobs,
    unregister_worker,
    worker_pods,
)

__all__ = [
    "BUSY_PAUSE",
    "BUSY_RETRIES",
    "CLAIM_FUNCTION",
    "EXPIRED",
    "EXPIRE_BATCH",
    "FINISH_FUNCTION",
    "HANDED_BACK",
    "Beat",
    "Cancelled",
    "Changes",
    "Checkpoint",
    "ClaimedJob",
    "Ended",
    "HandBack",
    "LatestSteps",
    "Lease",
    "LeaseStatus",
    "Recorded",
    "RunningJob",
    "StepInfo",
    "StepRecord",
    "WorkerInfo",
    "WorkerPod",
    "attempt_outcome",
    "cancel_without_cascade",
    "changes_of",
    "checkpoint",
    "claim",
    "claim_branch",
    "claim_sql",
    "clear_checkpoint",
    "delete_worker_if_idle",
    "expire_due",
    "finish",
    "finish_and_claim",
    "finish_then_claim",
    "hand_back",
    "heartbeat",
    "job_steps",
    "latest_steps",
    "owns_lease",
    "reap",
    "record_live",
    "record_step",
    "record_worker_boot",
    "registration",
    "release",
    "retry",
    "retry_many",
    "run_now",
    "run_now_many",
    "running_jobs",
    "step_result",
    "unique_key_holders",
    "unregister_worker",
    "until_free",
    "worker_pods",
]
