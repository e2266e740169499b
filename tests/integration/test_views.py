"""The operations views: their documented columns, what they report, and what they cost."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from support.history import fill_history
from tests.conftest import ROOT

VIEWS = [
    "django_jobs_queue_summary",
    "django_jobs_throughput",
    "django_jobs_task_durations",
    "django_jobs_workers",
    "django_jobs_stuck_jobs",
    "django_jobs_recent_failures",
    "django_jobs_schedules",
    "django_jobs_running",
    "django_jobs_queue_demand",
    "django_jobs_steps",
    "django_jobs_alerts",
    "django_jobs_rollups",
    "django_jobs_rate_limits",
]

# format_type() names, as the contract in docs/operations.md writes them.
SHORT_TYPES = {
    "character varying": "varchar",
    "double precision": "float8",
    "timestamp with time zone": "timestamptz",
    "bigint[]": "bigint[]",
}


def rows(sql: str, params: Any = None) -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [c[0] for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def documented_columns() -> dict[str, list[tuple[str, str]]]:
    """Each view's ``(column, type)`` rows from the contract tables in docs/operations.md."""
    text = (ROOT / "docs" / "operations.md").read_text()
    contract: dict[str, list[tuple[str, str]]] = {}
    for match in re.finditer(r"^### `(django_jobs_\w+)`\n(.*?)(?=^#)", text, re.M | re.S):
        table = re.search(r"^\| column \| type \|.*?\n\|[-| ]+\|\n((?:\|.*\n)+)", match[2], re.M)
        assert table, f"no column table under {match[1]}"
        contract[match[1]] = [
            tuple(cell.strip().strip("`") for cell in line.split("|")[1:3])
            for line in table[1].splitlines()
        ]
    return contract


def actual_columns(view: str) -> list[tuple[str, str]]:
    found = rows(
        """
        SELECT attname AS name, format_type(atttypid, NULL) AS type
        FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 ORDER BY attnum
        """,
        [view],
    )
    return [(r["name"], SHORT_TYPES.get(r["type"], r["type"])) for r in found]


@pytest.mark.django_db
def test_each_view_has_exactly_the_documented_columns_in_order() -> None:
    contract = documented_columns()
    assert sorted(contract) == sorted(VIEWS)
    for view in VIEWS:
        assert actual_columns(view) == contract[view], view


def test_queue_summary_counts_unfinished_jobs_per_queue_and_state(busy_queues) -> None:
    summary = {(r["queue"], r["state"]): r for r in rows("SELECT * FROM django_jobs_queue_summary")}
    assert sorted(summary) == [
        ("default", "pending"),
        ("default", "running"),
        ("default", "waiting"),
        ("reports", "pending"),
        ("reports", "running"),
    ]
    pending = summary["default", "pending"]
    assert (pending["jobs"], pending["ready"], pending["scheduled"]) == (7, 5, 2)
    assert 29 * 60 < pending["oldest_age_seconds"] < 31 * 60  # the late job
    assert pending["oldest_at"] == busy_queues["late"].run_after
    running = summary["default", "running"]
    assert (running["jobs"], running["ready"], running["scheduled"]) == (3, 0, 0)
    assert 11 * 60 < running["oldest_age_seconds"] < 13 * 60  # the orphaned job
    assert summary["default", "waiting"]["jobs"] == 1
    assert summary["reports", "pending"]["jobs"] == 3


def test_throughput_counts_ended_attempts_per_minute_task_and_outcome(busy_queues) -> None:
    per_task = rows(
        """
        SELECT queue, task, sum(attempts) AS attempts, sum(done) AS done,
               sum(failed) AS failed, sum(cancelled) AS cancelled, count(*) AS minutes
        FROM django_jobs_throughput GROUP BY queue, task ORDER BY queue, task
        """
    )
    assert [
        (r["queue"], r["task"], r["attempts"], r["done"], r["failed"], r["minutes"])
        for r in per_task
    ] == [
        ("default", "tests.echo", 22, 21, 1, 22),
        ("default", "tests.fail", 3, 0, 3, 3),
        ("reports", "tests.sleep", 10, 10, 0, 10),
    ]
    minutes = rows("SELECT minute FROM django_jobs_throughput")
    assert all(r["minute"].second == 0 and r["minute"].microsecond == 0 for r in minutes)


def test_throughput_keeps_only_the_last_24_hours(busy_queues) -> None:
    from django.utils import timezone

    from tests.factories import AttemptFactory

    old = timezone.now() - timezone.timedelta(hours=25)
    AttemptFactory(outcome="done", started_at=old, finished_at=old)
    assert (
        rows(
            "SELECT count(*) AS n FROM django_jobs_throughput WHERE minute < now() - "
            "interval '24 hours'"
        )[0]["n"]
        == 0
    )


def percentile(values: list[float], fraction: float) -> float:
    """PostgreSQL's percentile_cont: linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def test_task_durations_are_percentiles_of_successful_attempts_in_the_last_hour(
    busy_queues,
) -> None:
    durations = {r["task"]: r for r in rows("SELECT * FROM django_jobs_task_durations")}
    assert sorted(durations) == ["tests.echo", "tests.sleep"]  # failed attempts do not count
    echo = durations["tests.echo"]
    seconds = [float(s) for s in range(1, 21)] + [3.0]  # 20 jobs, and the retried one
    assert echo["attempts"] == 21
    assert echo["p50_seconds"] == pytest.approx(percentile(seconds, 0.5))
    assert echo["p95_seconds"] == pytest.approx(percentile(seconds, 0.95))
    assert echo["max_seconds"] == pytest.approx(20.0)
    assert durations["tests.sleep"]["p95_seconds"] == pytest.approx(30.0)


def test_workers_are_alive_by_the_worker_timeout_session_setting(busy_queues) -> None:
    def alive() -> dict[str, bool]:
        return {r["name"]: r["alive"] for r in rows("SELECT * FROM django_jobs_workers")}

    assert alive() == {"pod-a": True, "pod-b": True, "pod-c": False}  # default 60 s
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('django_jobs.worker_timeout', '4', true)")
    assert alive() == {"pod-a": True, "pod-b": False, "pod-c": False}
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('django_jobs.worker_timeout', '3600', true)")
    assert alive() == {"pod-a": True, "pod-b": True, "pod-c": True}


def test_workers_view_counts_each_workers_running_jobs(busy_queues) -> None:
    workers = {r["name"]: r for r in rows("SELECT * FROM django_jobs_workers")}
    assert {name: w["running_jobs"] for name, w in workers.items()} == {
        "pod-a": 2,
        "pod-b": 1,
        "pod-c": 1,
    }
    assert workers["pod-b"]["queues"] in (["reports"], '["reports"]')
    assert 4 < workers["pod-b"]["seen_seconds_ago"] < 30


def test_stuck_jobs_are_overdue_orphaned_or_long_ready_jobs(busy_queues) -> None:
    stuck = {r["job_id"]: r for r in rows("SELECT * FROM django_jobs_stuck_jobs")}
    assert {job_id: r["reason"] for job_id, r in stuck.items()} == {
        busy_queues["overdue"].pk: "past_timeout",
        busy_queues["orphaned"].pk: "worker_dead",
        busy_queues["late"].pk: "late_pending",
    }
    orphaned = stuck[busy_queues["orphaned"].pk]
    assert orphaned["worker_last_seen_at"] == busy_queues["pod_c"].last_seen_at
    assert orphaned["since"] == busy_queues["orphaned"].started_at
    late = stuck[busy_queues["late"].pk]
    assert late["worker_id"] is None and 29 * 60 < late["age_seconds"] < 31 * 60


def test_stuck_job_thresholds_follow_their_session_settings(busy_queues) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT set_config('django_jobs.late_pending_after', '90', true), "
            "set_config('django_jobs.timeout_grace', '600', true)"
        )
    reasons = [r["reason"] for r in rows("SELECT reason FROM django_jobs_stuck_jobs")]
    # The ready jobs of 2, 3 and 4 minutes (and 3 in reports) are late now; the overdue job,
    # 4 minutes past its timeout, is within a 10 minute grace.
    assert sorted(reasons) == ["late_pending"] * 7 + ["worker_dead"]


def test_recent_failures_list_failed_attempts_with_their_error(busy_queues) -> None:
    failures = rows("SELECT * FROM django_jobs_recent_failures ORDER BY finished_at DESC")
    assert [(r["task"], r["outcome"], r["job_state"]) for r in failures] == [
        ("tests.fail", "error", "error"),
        ("tests.fail", "crashed", "error"),
        ("tests.fail", "timeout", "error"),
        ("tests.echo", "lost", "done"),  # retried, then done
    ]
    assert failures[0]["error"] == "error: it broke"
    assert failures[0]["duration_seconds"] == pytest.approx(2.0)


@pytest.mark.django_db
def test_migrations_give_high_churn_tables_their_storage_parameters() -> None:
    options = {
        r["relname"]: dict(o.split("=") for o in r["reloptions"])
        for r in rows(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN "
            "('django_jobs_job', 'django_jobs_attempt', 'django_jobs_worker')"
        )
    }
    assert options["django_jobs_worker"]["fillfactor"] == "50"  # heartbeats stay HOT
    assert options["django_jobs_job"]["fillfactor"] == "85"
    assert float(options["django_jobs_job"]["autovacuum_vacuum_scale_factor"]) <= 0.02
    assert "autovacuum_vacuum_insert_scale_factor" in options["django_jobs_attempt"]


def _plan(sql: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


# What people and the dashboard run; each must read indexes only, never a whole job or attempt
# table. (An unfiltered read of the throughput view may hash-join the job table once the last
# 24 hours hold tens of thousands of attempts; the docs say to filter on minute.)
TYPICAL = {
    "django_jobs_queue_summary": "SELECT * FROM django_jobs_queue_summary",
    "django_jobs_throughput": (
        "SELECT * FROM django_jobs_throughput WHERE minute >= now() - interval '1 hour'"
    ),
    "django_jobs_task_durations": "SELECT * FROM django_jobs_task_durations",
    "django_jobs_queue_demand": (
        "SELECT coalesce(sum(slots_wanted), 0) FROM django_jobs_queue_demand"
        " WHERE queue IN ('default', 'q1')"
    ),
    "django_jobs_workers": "SELECT * FROM django_jobs_workers",
    "django_jobs_stuck_jobs": "SELECT * FROM django_jobs_stuck_jobs",
    "django_jobs_recent_failures": (
        "SELECT * FROM django_jobs_recent_failures ORDER BY finished_at DESC LIMIT 50"
    ),
}
# Each entry: an index the plan must use, or a tuple of partial indexes of which one will do
# (both serve running jobs: the planner picks by their sizes).
RUNNING = ("job_running_worker_idx", "job_admin_state_idx")
INDEXES = {
    "django_jobs_queue_summary": [
        "job_claim_free_queue_idx",
        "job_claim_key_idx",
        RUNNING,
        "job_waiting_idx",
    ],
    "django_jobs_throughput": ["attempt_finished_minute_idx"],
    "django_jobs_task_durations": ["attempt_finished_minute_idx"],
    "django_jobs_workers": [RUNNING],
    "django_jobs_queue_demand": [
        ("job_claim_free_queue_idx", "job_claim_free_idx"),
        "job_claim_key_idx",
        RUNNING,
    ],
    "django_jobs_stuck_jobs": [RUNNING, ("job_claim_free_idx", "job_claim_free_queue_idx")],
    "django_jobs_recent_failures": ["attempt_failed_idx"],
}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_view_plans_use_their_indexes_and_never_scan_the_job_or_attempt_table() -> None:
    with connection.cursor() as cursor:
        fill_history(cursor, finished=200_000, pending=5_000, waiting=1_000)
        cursor.execute("VACUUM ANALYZE django_jobs_job")
        cursor.execute("VACUUM ANALYZE django_jobs_attempt")
        cursor.execute("ANALYZE django_jobs_worker")
    plans = {}
    for view, sql in TYPICAL.items():
        plans[view] = plan = _plan(sql)
        for table in ("django_jobs_job", "django_jobs_attempt"):
            assert not re.search(rf"Seq Scan on {table}\b", plan), f"{view}:\n{plan}"
        for index in INDEXES[view]:
            choices = index if isinstance(index, tuple) else (index,)
            assert any(i in plan for i in choices), f"{view} does not use {index}:\n{plan}"
    print("\n\n".join(f"{view}\n{plan}" for view, plan in plans.items()))


@pytest.mark.django_db(transaction=True)
def test_migrating_back_drops_the_views_and_migrating_forward_restores_them() -> None:
    def present() -> set[str]:
        return {
            r["table_name"]
            for r in rows(
                "SELECT table_name FROM information_schema.views "
                "WHERE table_name LIKE 'django_jobs_%%'"
            )
        }

    assert present() == set(VIEWS)
    try:
        call_command("migrate", "django_jobs", "0002", verbosity=0)
        assert present() == set()
        assert (
            rows("SELECT to_regprocedure('django_jobs_setting(text, float8)') AS f")[0]["f"] is None
        )
    finally:
        call_command("migrate", "django_jobs", verbosity=0)
    assert present() == set(VIEWS)
