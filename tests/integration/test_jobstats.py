"""``django_jobs.store.operations_views`` and ``manage.py jobstats``: the queues at a glance."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test.utils import override_settings

from django_jobs.store import operations_views as stats
from tests.conftest import ROOT


def by_queue(summary: stats.Summary) -> dict[str, stats.QueueSummary]:
    return {q["queue"]: q for q in summary["queues"]}


def test_summary_gives_each_queue_its_states_ages_throughput_workers_and_stuck_jobs(
    busy_queues,
) -> None:
    summary = stats.summary(window_minutes=60)
    queues = by_queue(summary)
    default = queues["default"]
    assert (default["waiting"], default["pending"], default["ready"], default["scheduled"]) == (
        1,
        7,
        5,
        2,
    )
    assert default["running"] == 3
    assert 29 * 60 < default["oldest_ready_age_seconds"] < 31 * 60
    assert 11 * 60 < default["oldest_running_age_seconds"] < 13 * 60
    # 20 echo jobs, the retried echo job's second attempt; failed: error, crashed, timeout, lost.
    assert (default["done"], default["failed"], default["cancelled"]) == (21, 4, 0)
    assert default["done_per_minute"] == pytest.approx(21 / 60, abs=1e-3)
    assert default["failure_rate"] == pytest.approx(4 / 25, abs=1e-4)
    assert default["workers_alive"] == 1  # pod-a serves every queue; pod-b only reports
    assert default["stuck"] == 2  # the late job and the orphaned one
    reports = queues["reports"]
    assert (reports["running"], reports["done"], reports["workers_alive"], reports["stuck"]) == (
        1,
        10,
        2,
        1,
    )
    assert summary["workers"] == {"alive": 2, "dead": 1, "slots": 6, "running_jobs": 3}
    assert summary["stuck"] == {"late_pending": 1, "past_timeout": 1, "worker_dead": 1}


def test_the_window_limits_which_attempts_count(busy_queues) -> None:
    queues = by_queue(stats.summary(window_minutes=10))
    # echo attempts ended 2, 4, 6, 8 minutes ago (and 10, on the window's edge); one failure.
    assert queues["default"]["done"] in (4, 5)
    assert queues["default"]["failed"] == 1


@pytest.mark.django_db
def test_configured_queues_are_listed_even_when_empty() -> None:
    with override_settings(JOBS_QUEUES=["default", "quiet"]):
        queues = by_queue(stats.summary())
    assert sorted(queues) == ["default", "quiet"]
    assert queues["quiet"]["pending"] == 0 and queues["quiet"]["failure_rate"] is None


def test_jobs_worker_timeout_decides_which_workers_count_as_alive(busy_queues) -> None:
    with override_settings(JOBS_WORKER_TIMEOUT=4):
        assert stats.summary()["workers"]["alive"] == 1  # pod-b was seen 5 s ago
    with override_settings(JOBS_WORKER_TIMEOUT=3600):
        assert stats.summary()["workers"]["alive"] == 3
        assert stats.summary()["stuck"].get("worker_dead", 0) == 0


def test_the_view_functions_return_plain_rows(busy_queues) -> None:
    workers = stats.workers()
    assert {w["name"] for w in workers} == {"pod-a", "pod-b", "pod-c"}
    assert next(w for w in workers if w["name"] == "pod-b")["queues"] == ["reports"]
    assert [r["reason"] for r in stats.stuck_jobs()] == [
        "late_pending",
        "worker_dead",
        "past_timeout",
    ]
    assert stats.recent_failures(limit=2)[0]["outcome"] == "error"
    assert {r["task"] for r in stats.task_durations()} == {"tests.echo", "tests.sleep"}
    assert sum(r["done"] for r in stats.throughput(minutes=60)) == 31
    assert {(r["queue"], r["state"]) for r in stats.queue_summary()} >= {("default", "pending")}


def test_jobstats_prints_a_table_per_queue(busy_queues) -> None:
    out = StringIO()
    call_command("jobstats", stdout=out)
    text = out.getvalue()
    assert "workers: 2 alive (3/6 slots busy), 1 dead" in text
    assert "stuck: 1 late_pending, 1 past_timeout, 1 worker_dead" in text
    default = text.split("\ndefault ·", 1)[1].split("\n\n", 1)[0]
    assert "1 worker(s) alive" in default and "2 stuck" in default
    lines = {line.split()[0]: line.split()[1:] for line in default.splitlines()[2:]}
    assert lines["pending"][:3] == ["7", "5", "2"] and lines["pending"][3].startswith(
        ("29m", "30m")
    )
    assert lines["waiting"] == ["1"] and lines["running"][0] == "3"
    assert "\nreports ·" in text and "\nimports ·" in text  # configured, even if idle


def test_jobstats_json_is_the_summary(busy_queues) -> None:
    out = StringIO()
    call_command("jobstats", "--json", "--window", "60", stdout=out)
    data = json.loads(out.getvalue())
    expected = json.loads(stats.to_json(stats.summary(window_minutes=60)))
    for volatile in ("generated_at",):
        data.pop(volatile), expected.pop(volatile)
    for queue in data["queues"] + expected["queues"]:
        queue.pop("oldest_ready_age_seconds"), queue.pop("oldest_running_age_seconds")
    assert data == expected
    assert data["window_minutes"] == 60


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--watch", "0"], "must be positive"),
        (["--window", "0"], "between 1 and 1440"),
        (["--window", "soon"], "expected whole minutes"),
    ],
)
@pytest.mark.django_db
def test_bad_options_are_refused(args, message) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("jobstats", *args)


@pytest.mark.django_db(transaction=True)
def test_jobstats_watch_redraws_until_interrupted(worker_env) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "jobstats", "--watch", "0.2", "--json"],
        cwd=ROOT,
        env=worker_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    frames = []
    deadline = time.monotonic() + 30
    while len(frames) < 3 and time.monotonic() < deadline:
        frames.append(json.loads(proc.stdout.readline()))
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert len(frames) == 3
    assert len({frame["generated_at"] for frame in frames}) == 3  # each one fresh
