"""``manage.py jobs``: job control from the shell."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_jobs.models import Job
from tests.factories import AttemptFactory, JobFactory

pytestmark = pytest.mark.django_db(transaction=True)
NOW = timezone.now()


def run(capsys, *args: str) -> tuple[str, str]:
    call_command("jobs", *args)
    captured = capsys.readouterr()
    return captured.out, captured.err


def refused(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(CommandError) as error:
        call_command("jobs", *args)
    captured = capsys.readouterr()
    return error.value.returncode, str(error.value) + captured.out + captured.err


def test_list_is_newest_first_and_filters(capsys) -> None:
    old = JobFactory(task="tests.echo", queue="imports")
    failed = JobFactory(
        task="tests.fail", state=Job.State.ERROR, error="ValueError: boom", finished_at=NOW
    )
    new = JobFactory(task="tests.echo")
    out, _ = run(capsys, "list")
    ids = [line.split()[0] for line in out.splitlines()[1:]]
    assert ids == [str(new.pk), str(failed.pk), str(old.pk)]
    out, _ = run(capsys, "list", "--state", "error")
    assert [line.split()[0] for line in out.splitlines()[1:]] == [str(failed.pk)]
    assert "ValueError: boom" in out
    out, _ = run(capsys, "list", "--queue", "imports", "--json")
    assert [row["id"] for row in json.loads(out)] == [old.pk]
    out, _ = run(capsys, "list", "--task", "tests.echo", "--limit", "1", "--json")
    assert [row["id"] for row in json.loads(out)] == [new.pk]
    _, err = run(capsys, "list", "--task", "nothing.like.it")
    assert "no jobs match" in err


def test_show_has_attempts_and_tracebacks_masked(capsys) -> None:
    job = JobFactory(
        task="tests.fail",
        state=Job.State.ERROR,
        attempt=1,
        kwargs={"password": "hunter2", "n": 1},
        error="ValueError: token=s3cr3tvalue",
        finished_at=NOW,
    )
    AttemptFactory(
        job=job,
        number=1,
        outcome="error",
        error="ValueError: token=s3cr3tvalue",
        traceback=(
            'Traceback (most recent call last):\n  File "x.py", line 1\n'
            "ValueError: token=s3cr3tvalue\n"
        ),
        finished_at=timezone.now(),
    )
    out, _ = run(capsys, "show", str(job.pk))
    assert "tests.fail" in out and "attempt 1: error" in out and "Traceback" in out
    assert "hunter2" not in out and "s3cr3tvalue" not in out
    shown = json.loads(run(capsys, "show", str(job.pk), "--json")[0])
    assert shown["kwargs"]["n"] == 1 and shown["kwargs"]["password"] != "hunter2"
    assert shown["attempts"][0]["outcome"] == "error"
    code, message = refused(capsys, "show", "999999")
    assert code == 1 and "no job #999999" in message


def test_logs_prints_the_latest_attempt_and_follow_ends_with_the_job(capsys) -> None:
    job = JobFactory(task="tests.echo", state=Job.State.DONE, attempt=2, finished_at=NOW)
    AttemptFactory(job=job, number=1, outcome="error", log="first try\n")
    AttemptFactory(job=job, number=2, outcome="done", log="line one\npassword=hunter2\n")
    out, _ = run(capsys, "logs", str(job.pk))
    assert out.startswith("line one\n") and "hunter2" not in out
    out, _ = run(capsys, "logs", str(job.pk), "--attempt", "1")
    assert out == "first try\n"
    out, err = run(capsys, "logs", str(job.pk), "--follow", "--interval", "0.1")
    assert "line one" in out and f"job #{job.pk} ended done" in err
    code, message = refused(capsys, "logs", str(job.pk), "--attempt", "5")
    assert code == 1 and "no attempt 5" in message


def test_retry_and_cancel_follow_the_admin_rules(capsys) -> None:
    failed = JobFactory(state=Job.State.ERROR, attempt=3, error="x", finished_at=NOW)
    pending = JobFactory()
    out, _ = run(capsys, "retry", str(failed.pk))
    assert "1 job requeued" in out
    failed.refresh_from_db()
    assert failed.state == Job.State.PENDING and failed.max_attempts > failed.attempt
    # A pending job cannot be retried: refused, exit code 1, and nothing changes.
    code, message = refused(capsys, "retry", str(pending.pk))
    assert code == 1 and "1 skipped: 1 pending" in message
    out, _ = run(capsys, "cancel", str(pending.pk), str(failed.pk))
    assert "2 jobs cancelled" in out
    assert set(Job.objects.values_list("state", flat=True)) == {"cancelled"}
    code, message = refused(capsys, "cancel", "424242")
    assert code == 1 and "#424242" in message


def test_enqueue_validates_as_enqueue_does(capsys) -> None:
    out, _ = run(
        capsys,
        "enqueue",
        "tests.echo",
        "--args",
        "[1, 2]",
        "--kwargs",
        '{"a": "b"}',
        "--queue",
        "imports",
        "--priority",
        "10",
        "--run-after",
        "10m",
    )
    job = Job.objects.get()
    assert f"job #{job.pk} enqueued" in out
    assert (job.args, job.kwargs, job.queue, job.priority) == ([1, 2], {"a": "b"}, "imports", 10)
    assert job.run_after > timezone.now() + timedelta(minutes=9)
    for bad, words in [
        (["nothing.registered"], "jobs tasks"),
        (["tests.echo", "--args", "{"], "--args is not JSON"),
        (["tests.echo", "--args", '{"a": 1}'], "JSON array"),
        (["tests.echo", "--kwargs", "[]"], "JSON object"),
        (["tests.echo", "--priority", "1000"], "priority"),
        (["tests.echo", "--args", '["\\u0000"]'], "NUL"),
        (["tests.echo", "--run-after", "tomorrow"], "ISO 8601"),
        (["tests.echo", "--run-after", "2026-12-02T18:00:00"], "offset"),
    ]:
        code, message = refused(capsys, "enqueue", *bad)
        assert code == 2 and words in message, (bad, message)
    assert Job.objects.count() == 1


def test_tasks_lists_the_registry(capsys) -> None:
    out, _ = run(capsys, "tasks")
    assert out.splitlines()[0].split()[:2] == ["TASK", "QUEUE"]
    assert any(line.startswith("tests.echo ") for line in out.splitlines())
    rows = json.loads(run(capsys, "tasks", "--json")[0])
    echo = next(row for row in rows if row["name"] == "tests.echo")
    assert echo["max_attempts"] == 1 and echo["remote"] is False


def test_help_has_examples_and_exit_codes() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, str(root / "manage.py"), "jobs", "--help"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "jobs logs 42 --follow" in result.stdout and "exit codes" in result.stdout


def test_follow_prints_only_what_is_new_even_when_the_tail_drops_lines() -> None:
    from django_jobs.management.commands.jobs import _new_text

    assert _new_text("a\nb\n", "a\nb\nc\n") == "c\n"
    # The stored log is a tail: its oldest lines go as it grows.
    before = "".join(f"line {i}\n" for i in range(100))
    now = "".join(f"line {i}\n" for i in range(50, 130))
    assert _new_text(before, now) == "".join(f"line {i}\n" for i in range(100, 130))
    assert _new_text("", "x\n") == "x\n"
