"""The job state machine, declared once.

Every write that changes ``Job.state`` goes through :mod:`django_jobs.transitions`, whose SQL
checks the source state in its ``WHERE`` clause; the database enforces the set of states with a
CHECK constraint. This module is the single list both are derived from.
"""

from __future__ import annotations

from django.db import models


class State(models.TextChoices):
    #: Waiting for its dependencies; not claimable yet.
    WAITING = "waiting", "Waiting"
    #: Ready to be claimed once ``run_after`` has passed.
    PENDING = "pending", "Pending"
    #: Claimed by a worker; ``lease`` (a random token per claim) identifies the run.
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    ERROR = "error", "Error"
    CANCELLED = "cancelled", "Cancelled"


class Outcome(models.TextChoices):
    """How one attempt (one claim) of a job ended."""

    RUNNING = "running", "Running"
    DONE = "done", "Done"
    ERROR = "error", "Error"
    #: The worker disappeared; found by the reaper.
    LOST = "lost", "Lost"
    #: The job ran past its timeout and was stopped.
    TIMEOUT = "timeout", "Timed out"
    #: The process running the job died (os._exit, segfault, OOM kill).
    CRASHED = "crashed", "Crashed"
    CANCELLED = "cancelled", "Cancelled"
    #: Handed back unfinished (at shutdown, or a claim whose reply never reached its worker);
    #: did not use up an attempt.
    RELEASED = "released", "Released"


ACTIVE_STATES: frozenset[str] = frozenset({State.WAITING, State.PENDING, State.RUNNING})
TERMINAL_STATES: frozenset[str] = frozenset({State.DONE, State.ERROR, State.CANCELLED})
#: Attempt outcomes that count as failures in the operations views and the failure rate.
FAILED_OUTCOMES: frozenset[str] = frozenset(
    {Outcome.ERROR, Outcome.CRASHED, Outcome.TIMEOUT, Outcome.LOST}
)

#: Legal transitions: source state -> states it may move to.
TRANSITIONS: dict[str, frozenset[str]] = {
    State.WAITING: frozenset({State.PENDING, State.CANCELLED}),
    State.PENDING: frozenset({State.RUNNING, State.CANCELLED, State.WAITING}),
    # running -> pending is a retry, a release at shutdown, or a reaped job with attempts left.
    State.RUNNING: frozenset({State.DONE, State.ERROR, State.CANCELLED, State.PENDING}),
    # Terminal states only leave through an operator's retry.
    State.DONE: frozenset(),
    State.ERROR: frozenset({State.PENDING}),
    State.CANCELLED: frozenset({State.PENDING}),
}


def can_transition(source: str, target: str) -> bool:
    return target in TRANSITIONS.get(source, frozenset())


def sql_in(states: frozenset[str] | set[str]) -> str:
    """Render a state set as a SQL ``IN`` list; the values are fixed identifiers, never input."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(states)) + ")"
