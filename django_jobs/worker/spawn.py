"""Starting an executor process: the pool's seam to the operating system.

Each executor is a fresh interpreter (the ``spawn`` start method: nothing of the supervisor's
state, its connection included, is inherited), given its pipe to the supervisor, the write end of
its output pipe, the database settings and the settings module.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from django.conf import settings

from django_jobs.worker.executor import executor_main

#: What starting an executor gives: its process, the supervisor's end of its pipe, and the read
#: end of its output pipe (``None``: not captured).
Spawned = tuple[BaseProcess, Connection, Connection | None]


def spawn_executor(index: int) -> Spawned:
    """Start executor process ``index``, with its pipe and its output pipe."""
    context = multiprocessing.get_context("spawn")
    parent_conn, child_conn = context.Pipe(duplex=True)
    output, child_output = context.Pipe(duplex=False)
    process = context.Process(
        target=executor_main,
        args=(
            child_conn,
            child_output,
            _picklable_databases(),
            os.environ.get("DJANGO_SETTINGS_MODULE", ""),
        ),
        name=f"django-jobs-executor-{index}",
        daemon=True,
    )
    process.start()
    child_conn.close()
    child_output.close()
    # Read without blocking: a job's output is drained as far as it goes, then the loop goes on.
    os.set_blocking(output.fileno(), False)
    return process, parent_conn, output


def _picklable_databases() -> dict[str, Any]:
    # Settings dicts are plain data; a round trip through JSON proves it before a spawn fails.
    databases = settings.DATABASES
    try:
        json.dumps(databases)
        return databases
    except TypeError:
        return {
            alias: {k: v for k, v in db.items() if _plain(v)} for alias, db in databases.items()
        }


def _plain(value: Any) -> bool:
    try:
        json.dumps(value)
        return True
    except TypeError:
        return False
