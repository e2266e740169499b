from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from django_jobs import InvalidOption, JobsError, Task, UnknownTask, job
from django_jobs.registry import registry
from django_jobs.tasks import declare_remote_tasks
from testproject.examples.jobs import build_report


def test_bare_decorator_registers_under_module_and_qualname() -> None:
    @job
    def tidy_up() -> None: ...

    assert isinstance(tidy_up, Task)
    assert (
        tidy_up.name
        == f"{__name__}.test_bare_decorator_registers_under_module_and_qualname.<locals>.tidy_up"
    )
    assert registry.get(tidy_up.name) is tidy_up
    assert tidy_up.queue == "default"


def test_decorator_options_are_kept() -> None:
    assert build_report.queue == "reports"
    assert build_report.timeout == 120
    assert build_report.max_attempts == 2
    assert build_report(1, pages=0) == {"report_id": 1, "pages": 0, "url": "/reports/1.pdf"}


def test_using_returns_a_copy_with_call_options() -> None:
    custom = build_report.using(priority=50, queue="urgent", run_after=timedelta(minutes=5))
    assert (custom.priority, custom.queue, custom.run_after) == (50, "urgent", timedelta(minutes=5))
    assert (build_report.priority, build_report.queue, build_report.run_after) == (
        0,
        "reports",
        None,
    )
    assert custom.name == build_report.name


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 101}, "priority must be an integer from -100 to 100"),
        ({"priority": "high"}, "priority must be an integer"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to"),
        ({"timeout": 0}, "timeout must be a whole number of seconds"),
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"run_after": datetime(2030, 1, 1)}, "run_after must be an aware datetime"),
        ({"run_after": "tomorrow"}, "run_after must be a datetime or a timedelta"),
        # Past what the database's columns or Python's datetimes hold.
        ({"max_attempts": 2**31}, "max_attempts must be an integer from 1 to 2147483647"),
        ({"timeout": 2**31}, "timeout must be a whole number of seconds from 1 to 2147483647"),
        ({"run_after": timedelta(days=10**8)}, "run_after=.* is out of range"),
        ({"run_after": timedelta(days=-(10**6))}, "run_after=.* is out of range"),
        ({"unique_key": "a\x00b"}, "unique_key contains a NUL character"),
        ({"unique_key": "a\ud800"}, "unique_key contains invalid Unicode"),
        ({"queue": "q\x00"}, "queue must be .*NUL"),
    ],
)
def test_bad_options_are_refused_with_a_clear_message(options: dict, message: str) -> None:
    with pytest.raises(InvalidOption, match=message):
        build_report.using(**options)


def test_expected_duration_is_kept_and_checked_like_timeout() -> None:
    @job(name="tests.registry.expected", expected_duration=600)
    def expected() -> None: ...

    assert expected.expected_duration == 600
    assert expected.using(priority=5).expected_duration == 600
    for bad in (0, -1, 1.5, True, "10m", 2**31):
        with pytest.raises(InvalidOption, match="expected_duration must be a whole number of"):
            job(name="tests.registry.bad_expected", expected_duration=bad)(lambda: None)
    assert "tests.registry.bad_expected" not in registry


def test_a_remote_task_takes_an_expected_duration() -> None:
    (train,) = declare_remote_tasks({"tests.registry.train": {"expected_duration": 7200}})
    assert train.expected_duration == 7200
    with pytest.raises(InvalidOption, match=r"JOBS_REMOTE_TASKS\['tests.registry.gpu'\]: exp"):
        declare_remote_tasks({"tests.registry.gpu": {"expected_duration": -5}})


def test_two_functions_cannot_share_a_name() -> None:
    @job(name="tests.clash")
    def first() -> None: ...

    with pytest.raises(JobsError, match="two different functions are registered"):

        @job(name="tests.clash")
        def second() -> None: ...


def test_unknown_name_raises_with_advice() -> None:
    with pytest.raises(UnknownTask, match="no @job function is registered under that name"):
        registry.get("nope.missing")


def test_backoff_grows_exponentially_within_jitter_and_cap() -> None:
    task = Task(func=lambda: None, name="unregistered", queue="q", retry_backoff=(2.0, 10.0))
    for attempt, ceiling in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 10.0), (9, 10.0)]:
        delays = [task.backoff(attempt) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)


def test_retry_policy_by_name_falls_back_for_a_task_this_process_does_not_know(settings) -> None:
    settings.JOBS_RETRY_BACKOFF = (7, 100)
    assert registry.backoff_for("gone.after.a.deploy", 3) == 7.0
    assert registry.max_attempts_for("gone.after.a.deploy", 4) == 4
    # A registered task's own policy: build_report allows two attempts; after a second failure
    # the delay is 2 * 7 s, jittered over its upper half.
    assert registry.max_attempts_for(build_report.name, 9) == 2
    assert 7 <= registry.backoff_for(build_report.name, 2) <= 14
