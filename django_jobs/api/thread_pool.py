"""The API's few database connections: a fixed pool of threads, each with its own connection.

Every statement the API runs (a claim, a finish, a token lookup) runs in one of
``JOBS_API_CONNECTIONS`` threads; Django's connections are per thread, so the process never
holds more connections than that, however many requests wait. A request that waits for work
holds none (see :mod:`django_jobs.api.waiting`). The connections are in autocommit mode, as
Django leaves them: each statement is its own short transaction, which pgbouncer in transaction
pooling mode can serve.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections

from django_jobs import conf

T = TypeVar("T")

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None


def executor() -> concurrent.futures.ThreadPoolExecutor:
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=conf.api_connections(), thread_name_prefix="django-jobs-api-db"
            )
        return _executor


def _guarded(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except Exception:
        # A connection that broke with the statement is replaced at the next use.
        connection = connections[conf.database_alias()]
        if connection.connection is not None and not connection.is_usable():
            with contextlib.suppress(Exception):
                connection.close()
        raise


async def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, run in a thread of the pool, with its connection."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(executor(), _guarded, functools.partial(fn, *args, **kwargs))


def submit(fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
    """``fn(*args)`` in a thread of the pool, from outside an event loop."""
    return executor().submit(_guarded, functools.partial(fn, *args))


class Late:
    """What :func:`run_before` returns when the statement had not started by its deadline."""


LATE = Late()


async def run_before(deadline: float, fn: Callable[..., T], *args: Any) -> T | Late:
    """``fn(*args)`` as :func:`run` runs it, unless no thread has started it by ``deadline``
    (``time.monotonic()``): then it never runs, and :data:`LATE` is returned at the deadline. One
    that has started is waited for (its statement is bounded): a claim that ran is never lost."""
    started = executor().submit(_guarded, functools.partial(fn, *args))
    result = asyncio.wrap_future(started)
    try:
        return await asyncio.wait_for(asyncio.shield(result), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        if started.cancel():
            return LATE
        return await result


def shutdown() -> None:
    """Stop the pool's threads (their connections close with them); the next use starts it
    again. For tests and orderly exits."""
    global _executor
    with _lock:
        pool, _executor = _executor, None
    if pool is None:
        return
    # One task per thread, held at a barrier until every thread has one: each closes its own.
    barrier = threading.Barrier(pool._max_workers)

    def close_this_threads() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=10)
        connections.close_all()

    for future in [pool.submit(close_this_threads) for _ in range(pool._max_workers)]:
        future.result()
    pool.shutdown(wait=True)
