"""The benchmark jobs as Django tasks, for django-tasks-db (Django 6 or the django-tasks
backport)."""

from __future__ import annotations

import time
from typing import Any

try:
    from django.tasks import task  # type: ignore[import-not-found, unused-ignore]
except ImportError:
    from django_tasks import task


@task()
def noop(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def sleep(seconds: float) -> None:
    time.sleep(seconds)
