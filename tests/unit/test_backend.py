"""The backend of Django's Tasks framework, what needs no database: its capabilities, the allow
list of tasks, option checks and the system checks."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test.utils import override_settings
from django.utils import timezone

from django_jobs import job
from django_jobs.backend import JobsBackend
from django_jobs.compat import InvalidTask, InvalidTaskBackend, task, task_backends
from django_jobs.registry import registry
from testproject.testjobs import tasks
from testproject.testjobs.jobs import echo


def test_the_backend_supports_defer_priority_results_and_async_tasks() -> None:
    backend = task_backends["default"]
    assert isinstance(backend, JobsBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task


def test_a_task_is_on_the_workers_allow_list_once_its_module_is_imported() -> None:
    entry = registry.get(tasks.send_digest.module_path)
    assert entry.func is tasks.send_digest.func
    assert (entry.queue, entry.priority, entry.max_attempts, entry.timeout) == (
        "reports",
        10,
        2,
        120,
    )
    assert registry.get(tasks.async_double.module_path).is_async


def test_a_plain_function_in_a_tasks_module_is_not_on_the_allow_list() -> None:
    assert registry.find(f"{tasks.__name__}.not_a_task") is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"queue_name": "imports"}, "Queue 'imports' is not valid for backend"),
        ({"priority": 101}, "priority must be a whole number between -100 and 100"),
        ({"run_after": timezone.now().replace(tzinfo=None)}, "run_after must be an aware"),
    ],
)
def test_invalid_task_options_are_refused_by_validate_task(change: dict, message: str) -> None:
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**change)


def test_a_task_must_be_a_module_level_function_that_names_its_context() -> None:
    def local() -> None: ...

    with pytest.raises(InvalidTask, match="module level"):
        task(local)
    with pytest.raises(InvalidTask, match="first argument of 'context'"):
        task(takes_context=True)(tasks.not_a_task)


def plain_function() -> None: ...


def test_a_task_cannot_take_the_name_of_a_job_function() -> None:
    job(name=f"{__name__}.plain_function")(echo.func)
    with pytest.raises(InvalidTask, match="two different functions are registered"):
        task(plain_function)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attemps": 3}, "unknown option.*max_attemps.*takes max_attempts"),
        ({"max_attempts": 0}, "max_attempts must be an integer from 1 to"),
        ({"timeout": "1h"}, "timeout must be a whole number of seconds"),
        ({"retry_backoff": "fast"}, "retry_backoff must be a"),
    ],
)
def test_bad_options_fail_when_the_backend_is_created(options: dict, message: str) -> None:
    with pytest.raises(InvalidTaskBackend, match=message):
        JobsBackend("broken", {"OPTIONS": options})


def test_the_check_passes_when_the_app_is_installed() -> None:
    assert list(task_backends["default"].check()) == []


def test_the_system_check_fails_clearly_without_django_jobs_in_installed_apps() -> None:
    from django.conf import settings

    without = [app for app in settings.INSTALLED_APPS if app != "django_jobs"]
    with override_settings(INSTALLED_APPS=without):
        messages = list(task_backends["default"].check())
        assert [m.id for m in messages] == ["django_jobs.E001"]
        assert "'django_jobs' is not in INSTALLED_APPS" in messages[0].msg
        with pytest.raises(SystemCheckError, match=r"django_jobs\.E001"):
            call_command("check")


def test_the_check_fails_when_jobs_database_is_not_configured() -> None:
    with override_settings(JOBS_DATABASE="elsewhere"):
        messages = list(task_backends["default"].check())
    assert [m.id for m in messages] == ["django_jobs.E002"]
