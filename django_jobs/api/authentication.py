"""A request's token, checked from its headers before its body is read, in a way no client can
turn against the pool.

- A token whose grant is cached costs no statement. One read more than half of
  :data:`~django_jobs.tokens.auth.CACHE_SECONDS` ago is read again in the background while the
  request goes on with it; one read longer ago waits for that read for at most
  :data:`STALE_WAIT` seconds, and goes on with the grant it has if the token table cannot answer
  by then (a migration's lock, an outage), for up to
  :data:`~django_jobs.tokens.auth.STALE_SECONDS`.
- Tokens the process does not know are looked up by at most a quarter of the pool's threads
  (:func:`lookup_slots`), and at most :data:`MAX_QUEUED_LOOKUPS` more wait for them; beyond
  that a request is answered 503 at once. Made-up tokens can hold those threads, never the rest.
- Failed authentications are counted per client address (:class:`FailureLimit`); an address
  over its budget is answered 429 with ``Retry-After`` without a lookup. A token known to be
  good is never refused for its address: a fleet behind the same proxy as an attacker goes on.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict

from django.http import HttpRequest

from django_jobs import conf
from django_jobs.api import thread_pool
from django_jobs.api.protocol import ApiError
from django_jobs.tokens.auth import CACHE_SECONDS, Fresh, Grant, Stale, cache

logger = logging.getLogger("django_jobs.api")

#: Seconds a request whose cached grant is past CACHE_SECONDS waits for the token to be read
#: again, before it goes on with that grant (while it is within STALE_SECONDS).
STALE_WAIT = 0.5
#: Lookups of unknown tokens that may wait for a thread, beyond those running.
MAX_QUEUED_LOOKUPS = 64
#: Failed authentications an address may make at once, and how many a second after that.
FAILURE_BURST = 20
FAILURES_PER_SECOND = 2.0
#: Client addresses whose failures are counted (the least recently failed go first).
ADDRESSES = 10_000


class RateLimited(ApiError):
    """429: this address failed to authenticate too often."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            429,
            "too many requests with a missing, unknown or revoked token from this address;"
            f" wait {retry_after} s, and check the worker's token",
        )
        self.headers = {"Retry-After": str(retry_after)}


class Busy(ApiError):
    """503: too many lookups of unknown tokens wait already."""

    def __init__(self) -> None:
        super().__init__(503, "too many token lookups are waiting; try again")
        self.headers = {"Retry-After": "1"}


class FailureLimit:
    """A token bucket of failed authentications per client address."""

    def __init__(
        self,
        burst: float = FAILURE_BURST,
        per_second: float = FAILURES_PER_SECOND,
        addresses: int = ADDRESSES,
    ) -> None:
        self.burst = burst
        self.per_second = per_second
        self.addresses = addresses
        self._lock = threading.Lock()
        #: address -> (tokens left, when counted)
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def _left(self, address: str, now: float) -> float:
        left, at = self._buckets.get(address, (self.burst, now))
        return min(self.burst, left + (now - at) * self.per_second)

    def retry_after(self, address: str) -> int | None:
        """Seconds until ``address`` may try again, or None if it may now."""
        now = time.monotonic()
        with self._lock:
            if address not in self._buckets:
                return None
            left = self._left(address, now)
        if left >= 1:
            return None
        return max(1, math.ceil((1 - left) / self.per_second))

    def failed(self, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            left = self._left(address, now)
            self._buckets[address] = (max(0.0, left - 1), now)
            self._buckets.move_to_end(address)
            while len(self._buckets) > self.addresses:
                self._buckets.popitem(last=False)

    def forget(self) -> None:
        with self._lock:
            self._buckets.clear()


failures = FailureLimit()


def lookup_slots() -> int:
    """Threads of the pool that lookups of unknown tokens may hold at once; as many for the
    background reads of known ones."""
    return max(1, conf.api_connections() // 4)


class _Slots:
    """Semaphores of the running event loop (a test may run several loops in turn)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self.unknown = asyncio.Semaphore(1)
        self.known = asyncio.Semaphore(1)
        self.queued = 0
        #: Reads of tokens under way (first reads, and background reads of known ones).
        self.looking_up: dict[str, asyncio.Future[Grant | None]] = {}
        self.refreshing: dict[str, tuple[float, asyncio.Future[Grant | None]]] = {}
        #: When each token's last background read failed, if its last one did.
        self.unreadable: dict[str, float] = {}

    def of_this_loop(self) -> _Slots:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self.unknown = asyncio.Semaphore(lookup_slots())
            self.known = asyncio.Semaphore(lookup_slots())
            self.queued = 0
            self.looking_up = {}
            self.refreshing = {}
            self.unreadable = {}
        return self


_slots = _Slots()


async def authenticate(request: HttpRequest, client: str) -> Grant:
    """The grant of the request's bearer token (from its headers alone); an :class:`ApiError`
    (401, 429 or 503) otherwise."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    token = token.strip()
    known = cache.peek(token) if scheme.lower() == "bearer" and token else None
    if isinstance(known, Fresh):
        if known.refresh:
            _refresh(token)
        return known.grant
    if isinstance(known, Stale):
        return await _read_again(token, known.grant)
    retry_after = failures.retry_after(client)
    if retry_after is not None:
        raise RateLimited(retry_after)
    if scheme.lower() != "bearer" or not token:
        failures.failed(client)
        raise ApiError(401, "send Authorization: Bearer <token>")
    grant = None if known is None else await _look_up(token)
    if grant is None:
        failures.failed(client)
        raise ApiError(401, "unknown or revoked token")
    return grant


async def _look_up(token: str) -> Grant | None:
    """The first read of a token: one at a time per token (a fleet that starts at once reads its
    token once), on the threads lookups of unknown tokens may hold."""
    slots = _slots.of_this_loop()
    running = slots.looking_up.get(token)
    if running is None:
        if slots.unknown.locked() and slots.queued >= MAX_QUEUED_LOOKUPS:
            raise Busy()
        running = asyncio.ensure_future(_look_up_now(slots, token))
        running.add_done_callback(lambda done: done.cancelled() or done.exception())
        slots.looking_up[token] = running
    return await asyncio.shield(running)


async def _look_up_now(slots: _Slots, token: str) -> Grant | None:
    try:
        slots.queued += 1
        try:
            await slots.unknown.acquire()
        finally:
            slots.queued -= 1
        try:
            return await thread_pool.run(cache.lookup, token)
        finally:
            slots.unknown.release()
    finally:
        slots.looking_up.pop(token, None)


def _refresh(token: str) -> tuple[float, asyncio.Future[Grant | None]]:
    """The background read of a known token (one at a time per token), and when it began."""
    slots = _slots.of_this_loop()
    running = slots.refreshing.get(token)
    if running is not None:
        return running

    async def read() -> Grant | None:
        try:
            async with slots.known:
                grant = await thread_pool.run(cache.lookup, token)
        except Exception:
            slots.unreadable[token] = time.monotonic()
            raise
        finally:
            slots.refreshing.pop(token, None)
        slots.unreadable.pop(token, None)
        return grant

    task = asyncio.ensure_future(read())
    # Its failure is seen by a request that waits for it, or by none: not an unhandled error.
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    slots.refreshing[token] = (time.monotonic(), task)
    return slots.refreshing[token]


async def _read_again(token: str, grant: Grant) -> Grant:
    """The token read again, if the table answers within :data:`STALE_WAIT` of the read's start;
    ``grant`` otherwise (a read that fails waits no longer)."""
    began, reading = _refresh(token)
    timeout = max(0.0, began + STALE_WAIT - time.monotonic())
    slots = _slots.of_this_loop()
    if time.monotonic() - slots.unreadable.get(token, float("-inf")) < CACHE_SECONDS:
        timeout = 0.0  # its last read failed lately: no request waits for this one
    done, _ = await asyncio.wait([reading], timeout=timeout)
    if done and not reading.cancelled() and reading.exception() is None:
        fresh = reading.result()
        if fresh is None:
            raise ApiError(401, "unknown or revoked token")
        return fresh
    logger.info("token %s is used as read earlier: the token table does not answer", grant.name)
    return grant
