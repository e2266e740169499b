"""What the unit tests share that is not a fixture or a fake (their fixtures are in
``tests/unit/conftest.py``, the fakes a supervisor runs on in ``tests/unit/fakes.py``): driving
the supervisor's loop, the Grafana panels' columns, the alert rules' selectors, the statements
declared with their transitions, and the masking's adversarial inputs. The integration tests and
bench/ read some of them too.

Test modules import from here, never from one another.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # imported where used: bench/masking.py reads ADVERSARIAL with bare settings
    from django_jobs.states import Transition
    from django_jobs.worker.supervisor import Supervisor
    from tests.unit.fakes import FakeExecutors, FakeQueue

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_jobs"

# ---------------------------------------------------------------------- the supervisor's loop

TASK = "tests.noop"  # registered by testproject.testjobs


def supervisor(
    queue: FakeQueue, executors: FakeExecutors, *, concurrency: int = 1, **options: Any
) -> Supervisor:
    from django_jobs.worker.supervisor import Supervisor

    return Supervisor(
        concurrency=concurrency,
        install_signals=False,
        listen=False,
        poll_interval=1.0,
        db=queue,
        duties=queue,
        pool=executors.pool(concurrency),
        **{"scheduler": False, **options},  # the scheduler step: tests/unit/test_schedules.py
    )


def start(worker: Supervisor) -> None:
    """What ``run()`` does before its loop."""
    worker.pool.start()
    worker.heartbeats.beat()


def step_until(worker: Supervisor, done: Callable[[], bool], steps: int = 1000) -> None:
    for _ in range(steps):
        if done():
            return
        worker._step()
    raise AssertionError(f"not done after {steps} steps")


# ---------------------------------------------------------------------- Grafana and alerts

# The columns each panel's query must return, in order.
EXPECTED_COLUMNS = {
    "Backlog per queue": ["queue", "ready", "scheduled", "waiting", "running"],
    "Oldest ready job": ["queue", "oldest_ready_seconds"],
    "Workers alive": ["alive", "dead", "busy_slots", "slots"],
    "Throughput: attempts done per minute": ["time", "metric", "done_per_minute"],
    "History: jobs ended per hour by task": ["time", "metric", "jobs"],
    "History: failure rate by task": ["time", "metric", "failure_rate"],
    "History: mean run time by task": ["time", "metric", "mean_seconds"],
    "Failure rate": ["time", "metric", "failure_rate"],
    "Failures per minute by task": ["time", "metric", "failed_per_minute"],
    "Duration percentiles (successful attempts, last hour)": [
        "task",
        "queue",
        "attempts",
        "p50",
        "p95",
        "max",
    ],
    "Stuck jobs": [
        "job_id",
        "queue",
        "task",
        "reason",
        "state",
        "worker_id",
        "attempt",
        "max_attempts",
        "since",
        "age_seconds",
    ],
    "Recent failures": [
        "time",
        "job_id",
        "queue",
        "task",
        "attempt",
        "max_attempts",
        "outcome",
        "job_state",
        "worker_id",
        "duration_seconds",
        "error",
    ],
    "Workers": [
        "worker_id",
        "host",
        "alive",
        "seen_seconds_ago",
        "running_jobs",
        "concurrency",
        "queues",
        "started_at",
    ],
    "Schedules": [
        "name",
        "task",
        "expression",
        "timezone",
        "paused",
        "removed_from_code",
        "next_run_at",
        "last_run_at",
        "last_job_id",
        "last_outcome",
        "late_seconds",
    ],
}

PROMETHEUS = ROOT / "deploy" / "prometheus" / "django-jobs-alerts.yaml"

#: PromQL words that are not metric names.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset",
}  # fmt: skip


def prometheus_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(PROMETHEUS.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def selectors(expr: str) -> list[tuple[str, dict[str, str]]]:
    """The metric selectors of a PromQL expression: each metric name with its label matchers
    (``name{label="value"}``; only ``=`` matchers are read). A bare name is a selector too."""
    without_ranges = re.sub(r"\[[^\]]*\]", " ", expr)  # [5m], [1h:1m]
    without_groupings = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", without_ranges)
    found = []
    for match in re.finditer(
        r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?(\s*\()?", without_groupings
    ):
        name, matchers, call = match.groups()
        if call or name in KEYWORDS or re.fullmatch(r"\d+", name):
            continue  # a function or an aggregation, a keyword
        labels = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers or ""))
        found.append((name, labels))
    return found


# ---------------------------------------------------------------------- the state machine


def package_modules() -> dict[str, Path]:
    """The package's modules by dotted name, migrations left out."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "migrations" in parts:
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def declared_statements_by_name() -> dict[str, tuple[str, Transition]]:
    """Query name, or ``module.NAME`` for one declared in Python -> (SQL, transition) for every
    statement in the package declared with its transition."""
    from django_jobs import states
    from django_jobs.store import sql

    result = {
        name: (found.text, found.transition)
        for name, found in sql.QUERIES.items()
        if found.transition is not None
    }
    for module_name, path in package_modules().items():
        if ".statement(" not in path.read_text():
            continue
        module = importlib.import_module(module_name)
        declared = states.declared_statements()
        for name, value in vars(module).items():
            if isinstance(value, str) and value in declared:
                result[f"{module_name}.{name}"] = (value, declared[value])
    return result


# ---------------------------------------------------------------------- masking

#: Inputs built to make a regular expression backtrack: the masking must stay linear on them.
ADVERSARIAL = {
    "a run of hex digits": "0123456789abcdef" * 4096,
    "a run of word characters ending in a key": "x" * 65_530 + "secret",
    "keys run together": "password" * 8192,
    "a run of =": "=" * 65_536,
    "a run of quotes": '"' * 65_536,
    "keys with open quotes": 'password="' * 6553,
    "a scheme-like run": "a." * 32_768 + "://",
    "many schemes": "a://" * 16_384,
    "a run of colons after a key": "token" + ":" * 65_531,
}
