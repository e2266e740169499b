"""The job state machine, declared once.

A job is ``waiting`` for its dependencies (or, once it has run, for the children it spawned),
``pending`` until a worker claims it, ``running``, and ends ``done``, ``error`` or ``cancelled``;
an operator's retry brings the last two back to ``pending``. The database holds ``state`` to
:class:`State` with a CHECK constraint.

Every write to ``state`` makes one of the :class:`Transition` s declared below, and the rules
everywhere else are checked against them:

- each statement that writes ``state`` is declared with its transition (a ``-- transition:
  claim`` line under its name in django_jobs/store/sql/, which the loader passes to
  :meth:`Transition.statement`). Its guard is written by hand in the SQL, where a reviewer
  reads it, and must be spelled exactly as the transition renders it
  (:meth:`~Transition.guard`, the ``WHERE state ...`` of its source states): the statement
  check fails, naming the statement, when the two drift apart;
- the admin, the operators' actions, the workflows and the Tasks backend ask the transitions and
  the named sets of states and outcomes here, and spell out no set of their own;
- ``tests/unit/test_states.py`` finds every statement in the package that writes ``state`` and
  checks that it is declared and writes only its transition's states;
  ``tests/integration/test_state_machine.py`` runs each statement on jobs in every state and
  checks that the moves it makes are exactly the declared ones.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from django.db import models


class State(models.TextChoices):
    #: Waiting for its dependencies (``attempt = 0``), or for the children its finished
    #: attempt spawned (``attempt > 0``); not claimable.
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


# ---------------------------------------------------------------------- named sets

#: Unfinished: such a job holds its unique key, keeps its parent waiting, and can be cancelled.
ACTIVE_STATES: frozenset[str] = frozenset({State.WAITING, State.PENDING, State.RUNNING})
#: Unfinished but not running (queued, or a parent waiting for its children): cancelling such a
#: job ends it at once, where a running one is asked to stop.
QUEUED_STATES: frozenset[str] = frozenset({State.WAITING, State.PENDING})
#: Finished: only an operator's retry moves a job out of one of these.
TERMINAL_STATES: frozenset[str] = frozenset({State.DONE, State.ERROR, State.CANCELLED})
#: Finished without success: the job's dependents are cancelled, and an operator may retry it.
UNSUCCESSFUL_STATES: frozenset[str] = frozenset({State.ERROR, State.CANCELLED})

#: Attempts that failed: the operations views, the failure rate and ``attempt_failed_idx``
#: (migration 0003 spells the set out as ``FAILED``; tests/unit/test_states.py checks that the
#: two agree). A cancelled attempt did not fail.
FAILED_OUTCOMES: frozenset[str] = frozenset(
    {Outcome.ERROR, Outcome.CRASHED, Outcome.TIMEOUT, Outcome.LOST}
)
#: Attempts that ended without success: the failed ones and the cancelled ones. Each is an error
#: of the Tasks framework's ``TaskResult`` (backend.py).
UNSUCCESSFUL_OUTCOMES: frozenset[str] = FAILED_OUTCOMES | {Outcome.CANCELLED}


# ---------------------------------------------------------------------- transitions

_ORDER = {state.value: index for index, state in enumerate(State)}


def sql_in(states: Iterable[str]) -> str:
    """Render states as a SQL ``IN`` list, in :class:`State`'s order (the order in which the
    claim and finish functions of the migrations spell them); the values are fixed identifiers,
    never input."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(states, key=_ORDER.__getitem__)) + ")"


def sql_condition(column: str, states: Iterable[str]) -> str:
    """``column = 'a'`` for one state, ``column IN ('a', 'b')`` for several."""
    states = list(states)
    return f"{column} = '{states[0]}'" if len(states) == 1 else f"{column} IN {sql_in(states)}"


#: Statement text -> the transition it makes; filled by :meth:`Transition.statement`.
_STATEMENTS: dict[str, Transition] = {}


@dataclasses.dataclass(frozen=True)
class Transition:
    """One kind of write to ``Job.state``: the states it applies to (``sources``; none for a
    new job) and those it may leave a job in (``targets``). A source in ``unchanged`` keeps its
    state: the write changes other columns of it (cancelling a running job only flags it)."""

    name: str
    sources: frozenset[str]
    targets: frozenset[str]
    unchanged: frozenset[str] = frozenset()

    @property
    def moves(self) -> frozenset[tuple[str | None, str]]:
        """Every ``(from, to)`` pair this write may make; ``from`` is ``None`` for a new job."""
        starts: Iterable[str | None] = self.sources - self.unchanged if self.sources else [None]
        pairs = {(source, target) for source in starts for target in self.targets}
        return frozenset(pairs | {(state, state) for state in self.unchanged})

    def guard(self, alias: str = "") -> str:
        """The SQL condition that a row (of table alias ``alias``) is in one of ``sources``:
        ``state = 'pending'``, or ``j.state IN ('error', 'cancelled')``."""
        return sql_condition(f"{alias}.state" if alias else "state", self.sources)

    def statement(self, sql: str) -> str:
        """Declare ``sql`` as a statement that makes this transition; return it as it is. (The
        loader of django_jobs/store/sql/ declares the statements of the ``.sql`` files.)"""
        _STATEMENTS[sql] = self
        return sql


def _transition(
    name: str,
    sources: Iterable[str],
    targets: Iterable[str],
    unchanged: Iterable[str] = (),
) -> Transition:
    return Transition(name, frozenset(sources), frozenset(targets), frozenset(unchanged))


# The declaration. Each transition says where a job may go, and who moves it there.

#: A new job: pending; waiting for its dependencies; or cancelled at once, if one of them has
#: already ended without success (enqueue.py).
ENQUEUE = _transition("enqueue", [], [State.PENDING, State.WAITING, State.CANCELLED])
#: A worker takes a ready job (store.claim).
CLAIM = _transition("claim", [State.PENDING], [State.RUNNING])
#: The worker's finish, or the reaper, ends the running attempt: done; waiting for the children
#: it spawned; cancelled, if asked to; pending again, for a retry; or error.
END_ATTEMPT = _transition(
    "end attempt",
    [State.RUNNING],
    [State.DONE, State.WAITING, State.CANCELLED, State.PENDING, State.ERROR],
)
#: Handed back unfinished, without using up the attempt: at shutdown, a claim whose reply was
#: lost, a task the worker has not registered.
RELEASE = _transition("release", [State.RUNNING], [State.PENDING])
#: Cancel an unfinished job: a queued one ends at once, a running one stays running, flagged,
#: until its worker stops it and ends the attempt (store.cancel_without_cascade, and the
#: cascade to children in workflows.py).
CANCEL = _transition("cancel", ACTIVE_STATES, [State.CANCELLED], unchanged=[State.RUNNING])
#: A pending job whose deadline (``expires_at``) passed before it started ends cancelled, as
#: expired (store.expire_due).
EXPIRE = _transition("expire", [State.PENDING], [State.CANCELLED])
#: The queued dependents of a job that ended without success are cancelled (a dependent runs
#: only once its dependencies are all done).
CANCEL_DEPENDENTS = _transition("cancel dependents", QUEUED_STATES, [State.CANCELLED])
#: A dependent whose dependencies are all done becomes pending (``attempt = 0``).
PROMOTE = _transition("promote", [State.WAITING], [State.PENDING])
#: A new dependent, checked again once its enqueue has committed: promoted, or cancelled if a
#: dependency ended without success meanwhile.
SETTLE_NEW = _transition("settle new dependent", [State.WAITING], [State.PENDING, State.CANCELLED])
#: A parent whose children have all finished (``attempt > 0``): done; error or cancelled as the
#: first child that was.
FINALIZE_PARENT = _transition(
    "finalize parent", [State.WAITING], [State.DONE, State.ERROR, State.CANCELLED]
)
#: An operator's retry: back to pending with a fresh budget of attempts.
RETRY = _transition("retry", UNSUCCESSFUL_STATES, [State.PENDING])
#: An operator's run-now: a pending job scheduled for later is made ready; its state stays.
RUN_NOW = _transition("run now", [State.PENDING], [], unchanged=[State.PENDING])

TRANSITIONS: tuple[Transition, ...] = (
    ENQUEUE,
    CLAIM,
    END_ATTEMPT,
    RELEASE,
    CANCEL,
    EXPIRE,
    CANCEL_DEPENDENTS,
    PROMOTE,
    SETTLE_NEW,
    FINALIZE_PARENT,
    RETRY,
    RUN_NOW,
)

#: The states a job may be created in.
INITIAL_STATES: frozenset[str] = ENQUEUE.targets

#: The state graph, derived: source -> the states a job may move to from it. (A write that keeps
#: the state, such as a cancellation that flags a running job, is no move.)
NEXT_STATES: dict[str, frozenset[str]] = {
    state: frozenset(
        target
        for transition in TRANSITIONS
        for source, target in transition.moves
        if source == state and target != state
    )
    for state in State
}


def can_transition(source: str, target: str) -> bool:
    """Whether some transition moves a job from ``source`` to ``target``."""
    return target in NEXT_STATES.get(source, frozenset())


def declared_statements() -> dict[str, Transition]:
    """Every statement declared with :meth:`Transition.statement` by the modules imported so
    far, with the transition it makes."""
    return dict(_STATEMENTS)
