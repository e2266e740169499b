"""Connection budget: how many PostgreSQL connections workers use, directly and via pgbouncer.

    python bench/connections.py            # prints a Markdown table

For 1, 4 and 16 executor slots in one worker process, and for 4 worker processes of 4 slots,
it keeps every slot busy with a job that uses the ORM (so each executor holds a connection of
its own), then counts, from ``pg_stat_activity`` and pgbouncer's console:

- queue: connections of the workers' queue machinery (claim, heartbeat, finish; named after the
  worker id), with LISTEN on or off;
- jobs: connections opened by the jobs' own ORM queries in executor processes;
- server: what PostgreSQL actually serves; behind pgbouncer, its server pool.

Uses ``DATABASE_URL`` (default: a ``bench_connections`` database on the local server).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support import pgbouncer as launcher  # noqa: E402 - after the path is set

URL = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/bench_connections")
SETUPS = [(1, 1), (1, 4), (1, 16), (4, 4)]  # (worker processes, slots each)


def dsn(url: str, dbname: str | None = None) -> str:
    parts = urlsplit(url)
    name = dbname or parts.path[1:]
    return f"host={parts.hostname} port={parts.port or 5432} user={parts.username} dbname={name}"


def prepare() -> None:
    from bench.core import ensure_migrated

    ensure_migrated(URL, "testproject.settings")


def measure(processes: int, slots: int, listen: bool, bouncer, pooled: bool) -> dict:
    """Run ``processes`` workers of ``slots`` slots, directly or through ``bouncer``."""
    database = urlsplit(URL).path[1:]
    name = f"conn-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(dsn(URL), autocommit=True) as conn:
        conn.execute(
            "TRUNCATE django_jobs_job, django_jobs_attempt, django_jobs_dependency,"
            " django_jobs_worker, django_jobs_step, testjobs_execution"
        )
        conn.execute(
            "INSERT INTO django_jobs_job (task, args, kwargs, max_attempts)"
            " SELECT 'tests.record', '[]', '{\"seconds\": 6}', 1 FROM generate_series(1, %s)",
            [processes * slots],
        )
    env = {
        **os.environ,
        "DATABASE_URL": bouncer.url(database) if pooled else URL,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "JOBS_LISTEN": "true" if listen else "false",
        "JOBS_LISTEN_DATABASE_URL": URL if (listen and pooled) else "",
        "DATABASE_POOLER": "transaction" if pooled else "",
    }
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "runjobworker",
                "--burst",
                "--concurrency",
                str(slots),
                "--worker-id",
                f"{name}-{i}",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(processes)
    ]
    try:
        with psycopg.connect(dsn(URL), autocommit=True) as conn:
            deadline = time.monotonic() + 60
            while (
                conn.execute(
                    "SELECT count(*) FROM django_jobs_job WHERE state = 'running'"
                ).fetchone()[0]
                < processes * slots
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the workers did not fill their slots")
                time.sleep(0.1)
            time.sleep(1.0)
            sessions = conn.execute(
                "SELECT application_name, query ILIKE '%%listen%%', client_port"
                " FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        # pgbouncer keeps its server connections open between setups: they count only when
        # this setup goes through it.
        servers = {
            s["local_port"] for s in bouncer.console("SHOW SERVERS") if s["database"] == database
        }
        direct = [(app, is_listen) for app, is_listen, port in sessions if port not in servers]
        listening = sum(1 for _, is_listen in direct if is_listen)
        if pooled:
            clients = [c for c in bouncer.console("SHOW CLIENTS") if c["database"] == database]
            pooled_queue = sum(1 for c in clients if c["application_name"].startswith(name))
            queue = pooled_queue + listening  # LISTEN goes to the server directly
            jobs = len(clients) - pooled_queue
            server = len(sessions)
        else:
            queue = sum(1 for app, _ in direct if app.startswith(name))
            jobs = len(direct) - queue
            server = len(direct)
        return {"queue": queue, "jobs": jobs, "server": server, "listening": listening}
    finally:
        for worker in workers:
            worker.wait(120)


def main() -> None:
    prepare()
    parts = urlsplit(URL)
    bouncer = launcher.start(parts.hostname, parts.port or 5432, parts.username, pool_size=5)
    try:
        print("| workers x slots | path | LISTEN | queue conns | job conns | server conns |")
        print("|---|---|---|---|---|---|")
        for processes, slots in SETUPS:
            for label, pooled in [("direct", False), ("pgbouncer", True)]:
                for listen in (False, True):
                    r = measure(processes, slots, listen, bouncer, pooled)
                    print(
                        f"| {processes} x {slots} | {label} | {'on' if listen else 'off'} |"
                        f" {r['queue']} ({r['queue'] / processes:.0f}/process) | {r['jobs']} |"
                        f" {r['server']} |",
                        flush=True,
                    )
    finally:
        bouncer.stop()


if __name__ == "__main__":
    main()
