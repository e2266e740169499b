"""The systems the suite measures: django-jobs, the raw floor, and the peers."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.systems.base import System

PEERS = ("procrastinate", "tasks_db", "pgqueuer")


def all_systems() -> dict[str, System]:
    """Every system, by key. (Imported here, not at the top, so that ``python -m`` can run
    each system's module as a helper process without importing it twice.)"""
    from bench.systems.floor import Floor
    from bench.systems.ours import Ours
    from bench.systems.pgqueuer_peer import PgQueuer
    from bench.systems.procrastinate_peer import Procrastinate
    from bench.systems.tasks_db_peer import TasksDB

    systems = (Ours(), Floor(), Procrastinate(), TasksDB(), PgQueuer())
    return {system.key: system for system in systems}
