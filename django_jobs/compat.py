"""The one place that knows where Django's Tasks framework comes from.

Django 6.0 and newer ship it as ``django.tasks``. On Django 5.2 the ``django-tasks`` backport
provides the same API as ``django_tasks`` (``pip install "django-pgjobs[tasks]"``). Everything
else in django-jobs imports the framework's names from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import django
from django.core.exceptions import ImproperlyConfigured

#: The module users import ``task`` from: ``"django.tasks"`` or ``"django_tasks"``.
TASKS_MODULE = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"

if TYPE_CHECKING or django.VERSION >= (6, 0):  # mypy reads the types of django.tasks
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django_tasks import (
            DEFAULT_TASK_QUEUE_NAME,
            TaskContext,
            TaskResult,
            TaskResultStatus,
            checks,  # noqa: F401 - registers the system check that runs JobsBackend.check()
            task,
            task_backends,
        )
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"django_jobs.backend needs Django's Tasks framework: Django 6.0 or newer, or on "
            f"Django {django.get_version()} the django-tasks backport. Install it with "
            '`pip install "django-pgjobs[tasks]"`.'
        ) from exc
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

__all__ = [
    "DEFAULT_TASK_QUEUE_NAME",
    "TASKS_MODULE",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
