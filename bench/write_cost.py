"""What a claim and a finish write, and the database CPU they take, on one or more databases.

Each database given (migrated, by django-jobs of any version) gets ``--jobs`` ready no-op jobs
and is then drained by one connection, claim and finish back to back, as a worker with one slot
would (autocommit, so each is its own durable transaction). Reported per claim and per finish:

- WAL records and bytes, and shared buffers hit, read and dirtied, from ``EXPLAIN (ANALYZE,
  BUFFERS, WAL)`` of the statement itself (this backend's own, so other sessions on the server do
  not count), medians over the first ``--explained`` jobs;
- the indexes of the job and attempt tables that hold the row version the statement wrote: a
  claim or finish that is not a HOT update adds an entry to each of them;
- the PostgreSQL backend's CPU, from ``/proc/<pid>/schedstat`` (nanoseconds) around each
  statement, means over the rest of the jobs. The databases take turns, a block of jobs each,
  so that they share whatever else the machine is doing.

The floor's two statements (``bench/systems/floor.py``) are run the same way on their own plain
table when ``--floor`` names a database for it.

    python bench/write_cost.py --jobs 3000 postgres://.../before postgres://.../after \\
        --floor postgres://.../floor
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.systems import floor as floor_system

CLAIM = "SELECT * FROM django_jobs_claim('write-cost:1:x', NULL, NULL)"
FINISH = (
    "SELECT * FROM django_jobs_finish(%s, %s, 'write-cost:1:x', %s, 'done', 'null', '', '',"
    " true, 0)"
)
BLOCK = 100


def backend_cpu_ns(pid: int) -> int:
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


class Target:
    """One database and the statements that claim and finish a job on it."""

    def __init__(self, url: str, floor: bool = False) -> None:
        self.url = url
        self.floor = floor
        self.conn = psycopg.connect(url, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.table = "floor_job" if floor else "django_jobs_job"
        self.cpu = {"claim": 0, "finish": 0}
        self.timed = 0
        self.explained: dict[str, list[dict[str, float]]] = {"claim": [], "finish": []}
        self.indexes: dict[str, list[str]] = {}

    @property
    def label(self) -> str:
        name = self.url.rsplit("/", 1)[-1]
        return f"{name} (floor table)" if self.floor else name

    def fill(self, jobs: int) -> None:
        if self.floor:
            self.conn.execute("DROP TABLE IF EXISTS floor_job")
            self.conn.execute(floor_system.SCHEMA)
            self.conn.execute(
                "INSERT INTO floor_job (args) SELECT '[]' FROM generate_series(1, %s)", [jobs]
            )
        else:
            self.conn.execute(
                "TRUNCATE django_jobs_job, django_jobs_attempt RESTART IDENTITY CASCADE"
            )
            self.conn.execute(
                "INSERT INTO django_jobs_job (task, args, kwargs, max_attempts)"
                " SELECT 'bench.noop', '[]', '{}', 1 FROM generate_series(1, %s)",
                [jobs],
            )
        self.conn.execute(f"VACUUM ANALYZE {self.table}")
        if not self.floor:
            self.conn.execute("VACUUM ANALYZE django_jobs_attempt")

    # ---------------------------------------------------------------- the two statements

    def claim_statement(self) -> tuple[str, list[Any]]:
        if self.floor:
            return floor_system.CLAIM, ["write-cost"]
        return CLAIM, []

    def finish_statement(self, job: tuple[Any, ...]) -> tuple[str, list[Any]]:
        if self.floor:
            return floor_system.FINISH, [job[0]]
        return FINISH, [job[0], job[5], job[9]]

    def claimed(self) -> tuple[Any, ...] | None:
        """The job the last claim took (after an EXPLAIN, which returns no rows)."""
        if self.floor:
            return self.conn.execute(
                "SELECT id FROM floor_job WHERE state = 'running' ORDER BY id LIMIT 1"
            ).fetchone()
        return self.conn.execute(
            "SELECT id, task, queue, args, kwargs, attempt, max_attempts, timeout, parent_id,"
            " lease FROM django_jobs_job WHERE state = 'running' ORDER BY id LIMIT 1"
        ).fetchone()

    # ---------------------------------------------------------------- measures

    def explain(self, kind: str, statement: str, params: list[Any]) -> None:
        plan = self.conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) {statement}", params
        ).fetchone()[0][0]
        top = plan["Plan"]
        self.explained[kind].append(
            {
                "wal_records": top.get("WAL Records", 0),
                "wal_bytes": top.get("WAL Bytes", 0),
                "wal_fpi": top.get("WAL FPI", 0),
                "buffers_hit": top.get("Shared Hit Blocks", 0),
                "buffers_read": top.get("Shared Read Blocks", 0),
                "buffers_dirtied": top.get("Shared Dirtied Blocks", 0),
                "execution_ms": plan["Execution Time"],
            }
        )

    def holding(self, table: str, row_id: int) -> list[str]:
        """The indexes of ``table`` whose predicate the row ``row_id`` satisfies (all of them
        for a row version that a non-HOT update wrote)."""
        names = []
        rows = self.conn.execute(
            "SELECT c.relname, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass"
            " ORDER BY c.relname",
            [table],
        ).fetchall()
        for name, predicate in rows:
            where = f" AND ({predicate})" if predicate else ""
            if self.conn.execute(
                f"SELECT EXISTS (SELECT FROM {table} WHERE id = %s{where})", [row_id]
            ).fetchone()[0]:
                names.append(name)
        return names

    def explained_job(self) -> None:
        statement, params = self.claim_statement()
        self.explain("claim", statement, params)
        job = self.claimed()
        assert job is not None
        if not self.indexes:
            self.indexes["claim: job"] = self.holding(self.table, job[0])
            if not self.floor:
                attempt = self.conn.execute(
                    "SELECT id FROM django_jobs_attempt WHERE job_id = %s", [job[0]]
                ).fetchone()
                self.indexes["claim: attempt"] = (
                    self.holding("django_jobs_attempt", attempt[0]) if attempt else []
                )
        statement, params = self.finish_statement(job)
        self.explain("finish", statement, params)
        if len(self.indexes) <= 2:
            self.indexes["finish: job"] = self.holding(self.table, job[0])
            if not self.floor:
                attempt = self.conn.execute(
                    "SELECT id FROM django_jobs_attempt WHERE job_id = %s", [job[0]]
                ).fetchone()
                self.indexes["finish: attempt"] = self.holding("django_jobs_attempt", attempt[0])

    def timed_block(self, jobs: int) -> int:
        ran = 0
        for _ in range(jobs):
            statement, params = self.claim_statement()
            cpu0 = backend_cpu_ns(self.pid)
            job = self.conn.execute(statement, params).fetchone()
            cpu1 = backend_cpu_ns(self.pid)
            if job is None:
                break
            statement, params = self.finish_statement(job)
            self.conn.execute(statement, params)
            cpu2 = backend_cpu_ns(self.pid)
            self.cpu["claim"] += cpu1 - cpu0
            self.cpu["finish"] += cpu2 - cpu1
            ran += 1
        self.timed += ran
        return ran

    def report(self) -> dict[str, Any]:
        medians = {
            kind: {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}
            for kind, samples in self.explained.items()
        }
        cpu = {kind: ns / 1000 / max(self.timed, 1) for kind, ns in self.cpu.items()}
        return {
            "database": self.label,
            "timed_jobs": self.timed,
            "cpu_us": {**cpu, "job": cpu["claim"] + cpu["finish"]},
            "explained": medians,
            "indexes": self.indexes,
        }


def run(urls: list[str], floor_url: str | None, jobs: int, explained: int) -> list[dict[str, Any]]:
    targets = [Target(url) for url in urls]
    if floor_url:
        targets.append(Target(floor_url, floor=True))
    for target in targets:
        target.fill(jobs + explained)
        for _ in range(explained):
            target.explained_job()
    live: list[Target] = list(targets)
    step: Callable[[Target], int] = lambda target: target.timed_block(BLOCK)  # noqa: E731
    while live:
        live = [target for target in live if step(target) == BLOCK]
    return [target.report() for target in targets]


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| database | CPU µs claim | finish | job | WAL rec claim | finish | WAL bytes claim |"
        " finish | buffers hit claim | finish | dirtied claim | finish | index entries claim |"
        " finish |",
        "|---" * 15 + "|",
    ]
    for row in rows:
        e, c, ix = row["explained"], row["cpu_us"], row["indexes"]
        claim_ix = len(ix.get("claim: job", [])) + len(ix.get("claim: attempt", []))
        finish_ix = len(ix.get("finish: job", [])) + len(ix.get("finish: attempt", []))
        lines.append(
            f"| {row['database']} | {c['claim']:.0f} | {c['finish']:.0f} | {c['job']:.0f}"
            f" | {e['claim']['wal_records']:.0f} | {e['finish']['wal_records']:.0f}"
            f" | {e['claim']['wal_bytes']:.0f} | {e['finish']['wal_bytes']:.0f}"
            f" | {e['claim']['buffers_hit']:.0f} | {e['finish']['buffers_hit']:.0f}"
            f" | {e['claim']['buffers_dirtied']:.0f} | {e['finish']['buffers_dirtied']:.0f}"
            f" | {claim_ix} | {finish_ix} |"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python bench/write_cost.py")
    parser.add_argument("urls", nargs="+", help="databases migrated by django-jobs")
    parser.add_argument("--floor", help="a database for the floor's own table")
    parser.add_argument("--jobs", type=int, default=3000, help="timed jobs per database")
    parser.add_argument("--explained", type=int, default=30, help="jobs run under EXPLAIN")
    parser.add_argument("--json", help="write the results here too")
    args = parser.parse_args(argv)
    started = time.time()
    rows = run(args.urls, args.floor, args.jobs, args.explained)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    for row in rows:
        print(row["database"], json.dumps(row["indexes"]))
    print(table(rows))
    print(f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
