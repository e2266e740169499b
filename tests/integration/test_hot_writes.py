"""What a claim and a finish write: the indexes that get an entry.

A claim or a finish changes the job's state, which the job table's indexes key on, so neither is
a HOT update: the row version it writes gets an entry in every index whose condition it meets,
each entry a WAL record and some of the database's CPU per job (bench/write_cost.py measures
both, and the WAL records of each statement, which a test cannot count exactly: a page pruned on
the way adds one). These tests list those indexes, so that an index that adds to every job's
cost is a choice made here, in the open, and not a side effect of serving some other query.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from django_jobs import store
from django_jobs.states import Outcome
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

WORKER = "test-worker:1:aaaaaa"

#: The indexes of a plain job's row version written by its claim (pending -> running): the
#: primary key, the reaper's running jobs by worker, the admin's states (which the fenced
#: writes of a running job find it by, exactly: state and id) and its task and worker searches
#: (and the BRIN on created_at, which adds nothing while its range is unsummarized).
CLAIMED = {
    "django_jobs_job_pkey",
    "job_admin_state_idx",
    "job_running_worker_idx",
    "job_admin_task_idx",
    "job_admin_worker_idx",
    "job_created_brin",
}
#: ... and by its finish (running -> done): pruning's finished jobs instead of running ones.
FINISHED = {
    "django_jobs_job_pkey",
    "job_finished_idx",
    "job_admin_task_idx",
    "job_admin_worker_idx",
    "job_created_brin",
}
#: The attempt row's, opened by the claim and closed by the finish.
ATTEMPT = {"django_jobs_attempt_pkey", "attempt_job_number_idx", "attempt_finished_minute_idx"}


def _holding(table: str, row_id: int) -> set[str]:
    """The indexes of ``table`` whose condition the row ``row_id`` meets."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass",
            [table],
        )
        indexes = cursor.fetchall()
        holding = set()
        for name, predicate in indexes:
            where = f" AND ({predicate})" if predicate else ""
            cursor.execute(f"SELECT EXISTS (SELECT FROM {table} WHERE id = %s{where})", [row_id])
            if cursor.fetchone()[0]:
                holding.add(name)
    return holding


def _was_hot(table: str, action: Any) -> bool:
    """Whether ``action`` updated rows of ``table`` in place only (HOT updates)."""
    with connection.cursor() as cursor:
        query = (
            "SELECT pg_stat_get_xact_tuples_updated(%s::regclass),"
            " pg_stat_get_xact_tuples_hot_updated(%s::regclass)"
        )
        cursor.execute(query, [table, table])
        before = cursor.fetchone()
        action(cursor)
        cursor.execute(query, [table, table])
        after = cursor.fetchone()
    return after[0] > before[0] and after[0] - before[0] == after[1] - before[1]


def test_a_claim_and_a_finish_write_into_these_indexes_only() -> None:
    job = JobFactory()
    claimed: list[Any] = []
    assert not _was_hot(
        "django_jobs_job", lambda cursor: claimed.append(store.claim(cursor, WORKER, None))
    )
    lease = claimed[0].lease
    assert _holding("django_jobs_job", job.pk) == CLAIMED
    assert _holding("django_jobs_attempt", claimed[0].attempt_id) == ATTEMPT

    assert not _was_hot("django_jobs_job", lambda cursor: store.finish(cursor, lease, Outcome.DONE))
    assert _holding("django_jobs_job", job.pk) == FINISHED
    assert _holding("django_jobs_attempt", claimed[0].attempt_id) == ATTEMPT
