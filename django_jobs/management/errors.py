"""How the management commands meet a database that is not ready: one line that says what to
do, never a traceback (``--traceback`` still shows one).

- :func:`database_errors` turns the job tables missing and a database that is down or refuses
  the connection into a ``CommandError`` (exit code 1) naming ``manage.py migrate``, or the
  alias and host (see :mod:`django_jobs.store.diagnosis`).
- :func:`wait_for_tables` is the start-up check of the long-running commands (the worker, the
  scheduler): a ``--burst`` worker stops at once without the job tables; the others wait for
  them, and for the database, with a line a minute, as a running worker does for an outage.
- :func:`unnamed_queues` finds the queues a worker was told to serve that nothing names: a typo.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import psycopg
from django.core.management.base import CommandError
from django.db import DatabaseError, connections

from django_jobs import conf
from django_jobs import queues as controls
from django_jobs.exceptions import DatabaseUnreachable, JobsError, JobTablesMissing
from django_jobs.registry import registry
from django_jobs.runtime.backoff import OUTAGE_RETRY_CAP, backoff
from django_jobs.schedules import declarations
from django_jobs.store import diagnosis

#: How often a start-up check that waits says so again.
COMPLAINT_INTERVAL = 60.0


@contextlib.contextmanager
def database_errors(alias: str | None = None) -> Iterator[None]:
    """Run a command's body; a database without the job tables, or down, ends it with one line
    (``CommandError``, exit code 1). Other errors go through unchanged."""
    try:
        yield
    except (JobTablesMissing, DatabaseUnreachable) as exc:
        raise CommandError(str(exc)) from exc
    except (DatabaseError, psycopg.Error) as exc:  # psycopg's: a server-side binding cursor's
        message = diagnosis.explain(exc, alias or conf.database_alias())
        if message is None:
            raise
        raise CommandError(message) from exc


def wait_for_tables(
    alias: str, *, burst: bool, logger: logging.Logger, what: str = "worker"
) -> bool:
    """Check, before a long-running command starts, that the database answers and holds every
    django_jobs migration. Without them a ``burst`` run raises ``CommandError`` at once; any
    other waits, trying again every few seconds and saying so once a minute, until they are
    there (True) or SIGTERM or SIGINT comes (False). While the database is away, every run
    waits, as a running worker does."""
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda *_: stop.set())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    last_kind, logged_at, failures = "", float("-inf"), 0
    try:
        while True:
            try:
                unapplied = diagnosis.unapplied_migrations(alias)
            except DatabaseError as exc:
                line = kind = diagnosis.describe(exc, alias)
            else:
                if not unapplied:
                    if failures:
                        logger.info("%s: the database %s is ready", what, diagnosis.where(alias))
                    return True
                line = diagnosis.missing_tables_message(alias, unapplied=unapplied)
                kind = "missing"  # however many are missing: a migrate under way is no news
                if burst:
                    raise CommandError(line)
            finally:
                with contextlib.suppress(DatabaseError):
                    connections[alias].close()
            failures += 1
            delay = backoff(failures, OUTAGE_RETRY_CAP)
            now = time.monotonic()
            if kind != last_kind or now - logged_at >= COMPLAINT_INTERVAL:
                last_kind, logged_at = kind, now
                logger.warning("%s waiting: %s (a line a minute until then)", what, line)
            if stop.wait(delay):
                return False
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def named_queues() -> set[str]:
    """The queues something in the settings or the code names: the default queue, the
    registered tasks' (remote ones too), ``JOBS_QUEUES``, ``JOBS_QUEUE_LIMITS``, the Tasks
    framework's ``QUEUES`` and the declared periodic jobs'."""
    names = {conf.default_queue(), *registry.queues(), *(t.queue for t in registry.all())}
    names.update(conf.queues() or ())
    names.update(_keys(conf.queue_limits()))
    for backend in conf.tasks_backends().values():
        names.update(str(q) for q in backend.get("QUEUES") or ())
    names.update(d.queue for d in declarations.declared()[0] if d.queue)
    return names


def _keys(value: Any) -> Iterable[str]:
    return [str(k) for k in value] if isinstance(value, Mapping) else []


def unnamed_queues(queues: Iterable[str], alias: str | None = None) -> list[str]:
    """Those of ``queues`` that nothing names: not the settings or the code
    (:func:`named_queues`), nor, when ``alias`` is given and answers, the database (jobs,
    queue controls; :func:`django_jobs.queues.states`)."""
    unnamed = sorted(set(queues) - named_queues())
    if unnamed and alias is not None:
        try:
            # A worker's own row names its queues, typos too: only jobs and controls count.
            known = {
                q.name
                for q in controls.states(alias)
                if q.pending or q.running or q.paused or q.concurrency_limit is not None
            }
        except (DatabaseError, JobsError):
            known = set()
        finally:
            with contextlib.suppress(DatabaseError):
                connections[alias].close()
        unnamed = [name for name in unnamed if name not in known]
    return unnamed
