"""How a worker waits before trying again: the one retry policy of its connections and writes.

A failure is tried again after a delay that doubles from about half a second up to a cap, with
jitter so that many workers do not retry in step. The queue connection and the LISTEN
connection use it with a short cap (:data:`OUTAGE_RETRY_CAP`), so that a worker serves jobs
within seconds of its database coming (back); each write in the outbox backs off on its own.
What keeps failing is reported at once, then once a minute (:class:`Complaints`).
"""

from __future__ import annotations

import random
import time

#: The longest wait between two tries of a database that is away or failing: short, so that a
#: worker serves jobs within seconds of its database coming (back); a try costs little.
OUTAGE_RETRY_CAP = 5.0


def backoff(failures: int, cap: float = 30.0) -> float:
    """Seconds to wait after the ``failures``-th failure in a row: doubling from about half a
    second up to ``cap``, with jitter so that many workers do not retry in step."""
    return min(cap, 0.5 * 2 ** min(failures, 6)) * random.uniform(0.5, 1.0)


class Backoff:
    """The failures in a row of one thing, and when (monotonic) to try it again."""

    def __init__(self, cap: float = 30.0) -> None:
        self.cap = cap
        self.failures = 0
        self.retry_at = 0.0
        self.complaints = Complaints()

    def waiting(self) -> bool:
        """Whether it is too early to try again."""
        return time.monotonic() < self.retry_at

    def failed(self) -> float:
        """Count a failure; return the seconds until the next try."""
        self.failures += 1
        delay = backoff(self.failures, self.cap)
        self.retry_at = time.monotonic() + delay
        return delay

    def succeeded(self) -> int:
        """Start afresh after a success; return how many failures it ended."""
        failures = self.failures
        if failures:
            self.complaints.reset()
        self.failures = 0
        self.retry_at = 0.0
        return failures

    def wait_until(self, moment: float) -> None:
        """Try again at ``moment``, with no failure counted (work that goes on later)."""
        self.failures = 0
        self.retry_at = moment


class Complaints:
    """How often a retry loop logs its failures: a new kind of failure at once, then the same
    kind at most once per ``interval``, saying how many went unlogged. A database that is away
    for an hour costs a line a minute, not one per try."""

    def __init__(self, interval: float = 60.0) -> None:
        self.interval = interval
        self.logged_at = float("-inf")
        self.kind: str | None = None
        self.unlogged = 0

    def due(self, exc: BaseException) -> int | None:
        """Whether to log ``exc``: ``None`` if not (it is counted), else how many failures since
        the last line were not logged."""
        now = time.monotonic()
        kind = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
        if kind == self.kind and now - self.logged_at < self.interval:
            self.unlogged += 1
            return None
        self.logged_at, self.kind = now, kind
        unlogged, self.unlogged = self.unlogged, 0
        return unlogged

    def reset(self) -> None:
        """The loop succeeded: the next failure is news again."""
        self.logged_at = float("-inf")
        self.kind = None
        self.unlogged = 0


def unlogged_note(unlogged: int) -> str:
    """The end of a complaint's line: how many failures went unlogged before it."""
    return f" ({unlogged} more failed tries since the last report)" if unlogged else ""


def first_line(exc: BaseException) -> str:
    """The first line of an error's message, for a one-line log."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""
