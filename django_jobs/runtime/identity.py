"""Worker ids: a readable base name plus the pid and a short random id.

The base name is ``--worker-id``, ``JOBS_WORKER_ID``, ``POD_NAME`` or the host name, in that
order. The random part makes every boot distinct, so a restarted container in the same pod can
tell its own earlier jobs from live ones.
"""

from __future__ import annotations

import os
import secrets
import socket

from django_jobs import conf

MAX_ID_LENGTH = 63  # PostgreSQL's application_name limit, so the id shows in pg_stat_activity


def base_name(explicit: str | None = None) -> str:
    return explicit or conf.worker_name() or os.environ.get("POD_NAME") or socket.gethostname()


def new_worker_id(name: str) -> str:
    suffix = f":{os.getpid()}:{secrets.token_hex(3)}"
    return name[: MAX_ID_LENGTH - len(suffix)] + suffix


def name_of(worker_id: str) -> str:
    """The base name of a worker id made by :func:`new_worker_id`."""
    return worker_id.rsplit(":", 2)[0]
