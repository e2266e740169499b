"""Tasks of Django's Tasks framework that the test suite enqueues, and signal receivers that
record what the framework's signals carried."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from django.dispatch import receiver

from django_jobs.compat import (
    TaskContext,
    TaskResult,
    task,
    task_enqueued,
    task_finished,
    task_started,
)
from testproject.testjobs.models import Execution, TaskSignal


@task(priority=10, queue_name="reports")
def send_digest(user_id: int) -> dict:
    return {"sent_to": user_id}


@task()
def add(a: int, b: int) -> int:
    return a + b


@task()
async def async_double(value: int) -> int:
    await asyncio.sleep(0.01)
    return value * 2


@task(takes_context=True)
def flaky(context: TaskContext, succeed_on: int = 2) -> dict:
    """Fails until attempt ``succeed_on``; reports what its TaskContext said."""
    if context.attempt < succeed_on:
        raise ValueError(f"attempt {context.attempt} fails on purpose")
    return {
        "attempt": context.attempt,
        "result_id": context.task_result.id,
        "worker_ids": context.task_result.worker_ids,
    }


@task()
def always_fails(message: str = "boom") -> None:
    raise ValueError(message)


@task()
def returns_a_set() -> Any:
    return {1, 2}


def not_a_task(note: str = "") -> None:
    """A plain function: a job row naming it must not make a worker run it."""
    Execution.objects.create(job_id=0, attempt=0, worker_id="", pid=os.getpid(), note=note)


def _record(signal: str, sender: type, task_result: TaskResult) -> None:
    TaskSignal.objects.create(
        signal=signal,
        sender=f"{sender.__module__}.{sender.__qualname__}",
        result_id=task_result.id,
        status=str(task_result.status),
        attempts=task_result.attempts,
        errors=[e.exception_class_path for e in task_result.errors],
        worker_ids=list(task_result.worker_ids),
        pid=os.getpid(),
    )


@receiver(task_enqueued)
def record_enqueued(sender: type, task_result: TaskResult, **kwargs: Any) -> None:
    _record("task_enqueued", sender, task_result)


@receiver(task_started)
def record_started(sender: type, task_result: TaskResult, **kwargs: Any) -> None:
    _record("task_started", sender, task_result)


@receiver(task_finished)
def record_finished(sender: type, task_result: TaskResult, **kwargs: Any) -> None:
    _record("task_finished", sender, task_result)
