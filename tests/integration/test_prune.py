"""Retention: ``django_jobs.prune`` and ``manage.py prunejobs``."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test.utils import override_settings
from django.utils import timezone

from django_jobs import conf
from django_jobs.models import Attempt, Dependency, Job
from django_jobs.prune import prune
from django_jobs.store.sql import query
from support.history import fill_history
from tests.conftest import connect
from tests.factories import AttemptFactory, JobFactory
from tests.timing import BUSY_MACHINE_MARGIN, LOCK_WAIT_MS


def old_job(days: float = 30, state: str = "done", **fields) -> Job:
    """A job that finished ``days`` ago, with one attempt."""
    finished_at = timezone.now() - timedelta(days=days)
    job = JobFactory(
        finished=True, state=state, started_at=finished_at, finished_at=finished_at, **fields
    )
    AttemptFactory(
        job=job,
        outcome="done" if state == "done" else "error",
        started_at=finished_at,
        finished_at=finished_at,
    )
    return job


def exists(*jobs: Job) -> list[bool]:
    present = set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", flat=True))
    return [job.pk in present for job in jobs]


@pytest.mark.django_db
def test_old_finished_jobs_go_with_their_attempts_and_dependency_rows() -> None:
    first, second = old_job(), old_job(state="error")
    Dependency.objects.create(job=second, depends_on=first)
    recent = old_job(days=1)

    result = prune(older_than=timedelta(days=14))

    assert exists(first, second, recent) == [False, False, True]
    assert Attempt.objects.filter(job__in=[first.pk, second.pk]).count() == 0
    assert Attempt.objects.filter(job=recent).count() == 1
    assert Dependency.objects.count() == 0
    assert (result.jobs, result.attempts, result.dependencies, result.kept) == (2, 2, 1, 0)


@pytest.mark.django_db
def test_unfinished_jobs_are_never_pruned_however_old() -> None:
    long_ago = timezone.now() - timedelta(days=300)
    pending = JobFactory(run_after=long_ago)
    running = JobFactory(claimed=True, started_at=long_ago)
    waiting = JobFactory(state="waiting")
    prune(older_than=timedelta(0))
    assert exists(pending, running, waiting) == [True, True, True]


@pytest.mark.django_db
def test_only_the_chosen_states_are_pruned() -> None:
    done, error, cancelled = old_job(), old_job(state="error"), old_job(state="cancelled")
    prune(older_than=timedelta(days=14), states=["error", "cancelled"])
    assert exists(done, error, cancelled) == [True, False, False]


@pytest.mark.django_db
def test_a_job_that_an_unfinished_job_depends_on_is_kept() -> None:
    needed, not_needed = old_job(), old_job()
    waiting = JobFactory(state="waiting")
    Dependency.objects.create(job=waiting, depends_on=needed)
    finished_dependent = old_job()
    Dependency.objects.create(job=finished_dependent, depends_on=not_needed)

    result = prune(older_than=timedelta(days=14))

    assert exists(needed, not_needed, waiting, finished_dependent) == [True, False, True, False]
    assert list(Dependency.objects.values_list("job", "depends_on")) == [(waiting.pk, needed.pk)]
    assert result.kept == 1


@pytest.mark.django_db
def test_every_ancestor_of_an_unfinished_job_is_kept() -> None:
    grandparent = old_job(days=90)
    parent = old_job(days=60, parent=grandparent)
    child = JobFactory(parent=parent)  # pending: still to run
    lone = old_job(days=90)
    result = prune(older_than=timedelta(days=14))
    assert exists(grandparent, parent, child, lone) == [True, True, True, False]
    assert result.kept == 2


@pytest.mark.django_db(transaction=True)
@override_settings(JOBS_LOCK_TIMEOUT_MS=LOCK_WAIT_MS)  # a wait for the lock would take 30 s
def test_a_job_whose_staying_child_is_locked_is_left_for_later_without_waiting() -> None:
    import time

    parent = old_job(days=90)
    child = old_job(days=1, parent=parent)
    other = old_job(days=90)
    with connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [child.pk])
        started = time.monotonic()
        prune(older_than=timedelta(days=14))
        elapsed = time.monotonic() - started
        holder.execute("ROLLBACK")
    assert exists(parent, child, other) == [True, True, False]
    # A few statements; a prune that waited for the child's lock would wait the lock timeout.
    assert elapsed < BUSY_MACHINE_MARGIN < conf.lock_timeout_ms() / 1000
    prune(older_than=timedelta(days=14))
    assert exists(parent, child) == [False, True]


@pytest.mark.django_db
def test_a_tree_whose_jobs_all_finished_goes_and_children_that_stay_lose_their_parent() -> None:
    root = old_job(days=90)
    old_child = old_job(days=80, parent=root)
    grandchild = old_job(days=70, parent=old_child)
    recent_child = old_job(days=1, parent=root)

    prune(older_than=timedelta(days=14))

    assert exists(root, old_child, grandchild, recent_child) == [False, False, False, True]
    recent_child.refresh_from_db()
    assert recent_child.parent_id is None


@pytest.mark.django_db
def test_dry_run_counts_and_changes_nothing() -> None:
    jobs = [old_job() for _ in range(3)]
    Dependency.objects.create(job=jobs[1], depends_on=jobs[0])
    kept = old_job()
    Dependency.objects.create(job=JobFactory(), depends_on=kept)

    result = prune(older_than=timedelta(days=14), dry_run=True)

    assert (result.jobs, result.attempts, result.dependencies, result.kept) == (3, 3, 1, 1)
    assert all(exists(*jobs, kept))
    assert "would delete 3 job(s)" in result.summary()


@pytest.mark.parametrize("batch_size", [1, 2, 100])
@pytest.mark.django_db
def test_a_dry_run_predicts_exactly_what_the_run_deletes(batch_size) -> None:
    jobs = [old_job(days=40 - i) for i in range(6)]
    # Dependents usually finish after what they depend on, but not always (a retried job).
    for dependent, dependency in [(1, 0), (2, 0), (5, 3), (4, 1), (0, 4)]:
        Dependency.objects.create(job=jobs[dependent], depends_on=jobs[dependency])
    Dependency.objects.create(job=old_job(days=1), depends_on=jobs[2])  # stays, link goes
    Dependency.objects.create(job=JobFactory(state="waiting"), depends_on=jobs[3])  # kept
    counts = []
    for dry_run in (True, False):
        result = prune(older_than=timedelta(days=14), batch_size=batch_size, dry_run=dry_run)
        counts.append((result.jobs, result.attempts, result.dependencies, result.kept))
    assert counts[0] == counts[1] == (5, 5, 6, 1)


@pytest.mark.django_db
def test_batches_resume_where_the_last_one_stopped_and_report_progress() -> None:
    jobs = [old_job(days=30 - i) for i in range(7)]
    Dependency.objects.create(job=JobFactory(), depends_on=jobs[0])  # kept, in batch 1
    seen = []
    result = prune(
        older_than=timedelta(days=14), batch_size=2, progress=lambda r: seen.append(r.jobs)
    )
    assert seen == [1, 3, 5, 6]
    assert (result.batches, result.jobs, result.kept) == (4, 6, 1)
    assert exists(*jobs) == [True] + [False] * 6


@pytest.mark.django_db
def test_jobs_retention_gives_the_defaults() -> None:
    done, error = old_job(days=2), old_job(days=2, state="error")
    with override_settings(JOBS_RETENTION={"older_than": "36h", "states": ["error"]}):
        assert conf.retention() == conf.Retention(timedelta(hours=36), ("error",))
        prune()
    assert exists(done, error) == [True, False]
    assert conf.retention() == conf.Retention(timedelta(days=14), ("done", "cancelled", "error"))


@pytest.mark.django_db
def test_prunejobs_command_prunes_with_its_options_and_reports() -> None:
    done, error = old_job(days=20), old_job(days=20, state="error")
    out = StringIO()
    call_command("prunejobs", "--older-than", "14d", "--state", "done", "--dry-run", stdout=out)
    assert "dry run: would delete 1 job(s) (done)" in out.getvalue()
    assert exists(done, error) == [True, True]

    out = StringIO()
    call_command(
        "prunejobs",
        "--older-than",
        "14d",
        "--state",
        "done",
        "--batch-size",
        "1",
        "-v",
        "2",
        stdout=out,
    )
    assert "batch 1: deleted 1 job(s) so far" in out.getvalue()
    assert "deleted 1 job(s) (done) finished before" in out.getvalue()
    assert exists(done, error) == [False, True]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--older-than", "soon"], "expected a duration"),
        (["--state", "pending"], "only finished jobs can be pruned"),
        (["--batch-size", "0"], "between 1 and 100000"),
    ],
)
@pytest.mark.django_db
def test_prunejobs_refuses_bad_options(args, message) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("prunejobs", *args)


@pytest.mark.django_db(transaction=True)
def test_a_job_locked_by_someone_else_is_skipped_not_waited_for() -> None:
    locked, free = old_job(), old_job()
    with connect() as other:
        other.execute("BEGIN")
        other.execute("SELECT 1 FROM django_jobs_job WHERE id = %s FOR UPDATE", [locked.pk])
        result = prune(older_than=timedelta(days=14))
        other.execute("ROLLBACK")
    assert exists(locked, free) == [True, False]
    assert result.kept == 1


@pytest.mark.django_db(transaction=True)
def test_each_batch_commits_on_its_own() -> None:
    jobs = [old_job(days=30 - i) for i in range(4)]
    seen_from_outside = []

    def look(result) -> None:
        # Another session sees each batch's deletions at once: no transaction spans batches.
        with connect() as other:
            seen_from_outside.append(
                other.execute(
                    "SELECT count(*) FROM django_jobs_job WHERE id = ANY(%s)",
                    [[j.pk for j in jobs]],
                ).fetchone()[0]
            )

    prune(older_than=timedelta(days=14), batch_size=1, progress=look)
    assert seen_from_outside == [3, 2, 1, 0]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_batch_statement_reads_indexes_only_at_200k_jobs() -> None:
    with connection.cursor() as cursor:
        fill_history(cursor, finished=200_000, pending=2_000, waiting=500)
        cursor.execute("VACUUM ANALYZE")
        cursor.execute(
            "EXPLAIN " + query("prune_batch"),
            {
                "states": ["done", "cancelled", "error"],
                "cutoff": timezone.now() - timedelta(days=14),
                "after_at": "-infinity",
                "after_id": 0,
                "batch_size": 1000,
            },
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "job_finished_idx" in plan, plan
    assert "Seq Scan on django_jobs_job" not in plan, plan
    assert "Seq Scan on django_jobs_attempt" not in plan, plan


@pytest.mark.django_db(transaction=True)
def test_pruning_a_month_of_history_keeps_what_unfinished_jobs_need() -> None:
    with connection.cursor() as cursor:
        fill_history(cursor, finished=20_000, pending=500, waiting=200, running=10)
        cursor.execute("ANALYZE")
    unfinished = Job.objects.filter(state__in=["pending", "running", "waiting"])
    needs = sorted(
        [*unfinished.filter(parent__isnull=False).values_list("id", "parent_id")],
    )
    links = sorted(Dependency.objects.filter(job__in=unfinished).values_list("job", "depends_on"))
    assert len(needs) == 20 and len(links) == 200  # old finished parents; pending dependencies

    old_parents = Job.objects.filter(
        pk__in=[parent for _, parent in needs], finished_at__lt=timezone.now() - timedelta(days=7)
    ).count()

    result = prune(older_than=timedelta(days=7), batch_size=500)

    assert result.jobs > 14_000 and result.batches > 20
    assert result.kept == old_parents > 0
    assert sorted(unfinished.filter(parent__isnull=False).values_list("id", "parent_id")) == needs
    assert Job.objects.filter(pk__in=[parent for _, parent in needs]).count() == 20
    assert (
        sorted(Dependency.objects.filter(job__in=unfinished).values_list("job", "depends_on"))
        == links
    )
