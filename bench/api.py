"""The HTTP API: a fleet of long-polling workers on one ASGI process, against database workers.

Two runs of the same jobs (each sleeps a random 0 to 50 ms, the same draws in both), in a
database of their own:

- **api**: one ``uvicorn testproject.asgi:application`` process (``JOBS_API_CONNECTIONS``
  connections, plus its LISTEN) serves ``workers`` simulated workers: asyncio tasks in this
  process, each on its own keep-alive HTTP connection (a few lines of raw HTTP/1.1, so that the
  client side costs little), claiming with ``wait`` 20 s, sleeping, then finishing with
  ``claim_next``: the finish hands out the worker's next job, and only a worker it found none
  for claims (and waits) again. The jobs are
  enqueued in batches once every worker waits.
- **db**: ``runjobworker --burst`` processes (``processes`` x ``concurrency``) run the same
  jobs as ``bench.sleep``, each holding its database connections.

Every job must be done exactly once (checked in SQL: one attempt each, attempt 1, done; and by
the fleet: every job seen once, no finish refused). Reported per run: the wall time from the
first claim to the last finish and the jobs per second, the most connections to the database
(sampled every 100 ms from pg_stat_activity: all but this process's own), and the CPU the
database's backends used per job (from /proc, for every backend of the database seen during the
run; the shared background processes are left out, since other databases on the server use
them). For the api run, the claim round trip of the claims (v1/claim) that returned a job, p50 and
p99: it includes the wait of a claim that came before its job.

Run as ``python -m bench.api`` it is the probe itself (a Django process on ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from bench.core import (
    ROOT,
    Context,
    django_setup,
    emit,
    percentile,
    process_cpu_seconds,
    run_json,
    spawn,
    stop_all,
)
from bench.systems.ours import Ours

API_CONNECTIONS = 4
BATCH = 1_000


def run(
    ctx: Context,
    jobs: int,
    workers: int,
    processes: int,
    concurrency: int,
    progress: Any = print,
) -> dict[str, Any]:
    """Both runs, each in a freshly migrated ``api`` database."""
    database = ctx.server.database("api")
    ours = Ours()
    results: dict[str, Any] = {"jobs": jobs, "workers": workers, "api_connections": API_CONNECTIONS}
    for mode in ("api", "db"):
        ctx.server.recreate(database)
        env = ours.env(ctx)
        env["DATABASE_URL"] = ctx.server.url_for(database)
        run_json(ours.helper(ctx, "install"), env)
        command = [ctx.python, "-m", "bench.api", mode, "--jobs", str(jobs)]
        command += ["--workers", str(workers), "--processes", str(processes)]
        command += ["--concurrency", str(concurrency), "--logs", str(ctx.log(f"api-{mode}"))]
        row = run_json(command, env, timeout=3600)
        results[mode] = row
        progress(
            f"  api        {row['label']}: {row['jobs_per_s']:7.0f} jobs/s, {row['seconds']:.1f} s,"
            f" max {row['max_connections']} connections,"
            f" database CPU {1000 * row['db_cpu_per_job_s']:.3f} ms/job"
            + (
                f", claim p50 {1000 * row['claim_p50_s']:.1f} ms"
                f" p99 {1000 * row['claim_p99_s']:.1f} ms"
                if mode == "api"
                else ""
            )
        )
    return results


def markdown(part: dict[str, Any]) -> list[str]:
    rows = []
    for mode in ("api", "db"):
        row = part[mode]
        claim = (
            f"{1000 * row['claim_p50_s']:.1f} / {1000 * row['claim_p99_s']:.1f}"
            if mode == "api"
            else ""
        )
        rows.append(
            f"| {row['label']} | {row['jobs_per_s']:.0f} | {row['seconds']:.1f} |"
            f" {row['max_connections']} | {1000 * row['db_cpu_per_job_s']:.3f} | {claim} |"
        )
    return [
        "### HTTP API: long-polling workers on one ASGI process",
        "",
        f"{part['jobs']:,} jobs of 0 to 50 ms, each done exactly once (checked in SQL).",
        "",
        "| run | jobs/s | seconds | max connections | database CPU ms/job | claim p50 / p99 ms |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
    ]


# ------------------------------------------------------------------ the probe process


def durations(jobs: int) -> list[float]:
    """The jobs' sleeps: the same draws for both runs."""
    draw = random.Random(20_000)
    return [round(draw.uniform(0, 0.05), 4) for _ in range(jobs)]


class Sampler:
    """Every 100 ms: the connections to this database but this process's own, and the CPU of
    each of its backends (the last reading of each, and the first of those there at the start)."""

    def __init__(self, url: str, own: list[int]) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.own = [*own, self.conn.info.backend_pid]
        self.connections: list[int] = []
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._sample(start=True)

    def _sample(self, start: bool = False) -> None:
        rows = self.conn.execute(
            "SELECT pid, backend_type = 'client backend' FROM pg_stat_activity"
            " WHERE datname = current_database()"
        ).fetchall()
        clients = 0
        for pid, client in rows:
            with contextlib.suppress(OSError, IndexError, ValueError):
                cpu = process_cpu_seconds(pid)
                self.last[pid] = cpu
                self.first.setdefault(pid, cpu if start else 0.0)
            clients += bool(client) and pid not in self.own
        self.connections.append(clients)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()
        self.conn.close()

    def cpu_seconds(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


class Connection:
    """One keep-alive HTTP/1.1 connection: POST JSON, read the answer."""

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self.headers = (
            f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\n"
        )
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        data = json.dumps(body).encode()
        head = f"POST {path} HTTP/1.1\r\n{self.headers}Content-Length: {len(data)}\r\n\r\n"
        self.writer.write(head.encode() + data)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        payload = await self.reader.readexactly(length) if length else b""
        return status, json.loads(payload) if payload else None


async def fleet(
    port: int, token: str, workers: int, jobs: int, ready: threading.Event
) -> dict[str, Any]:
    """``workers`` workers until ``jobs`` jobs are finished; what they saw."""
    seen: Counter[int] = Counter()
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    claimed_at: list[float] = []
    finished_at: list[float] = []
    all_done = asyncio.Event()

    async def worker(n: int) -> None:
        connection = Connection("127.0.0.1", port, token)
        body = {"worker": f"w{n}", "tasks": ["remote.upper"], "wait": 20}
        job = None
        while not all_done.is_set():
            if job is None:
                start = time.perf_counter()
                status, answer = await connection.post("/jobs/api/v1/claim", body)
                statuses[f"claim {status}"] += 1
                if status != 200:
                    continue
                latencies.append(time.perf_counter() - start)
                job = answer["job"]
            claimed_at.append(time.time())
            seen[job["id"]] += 1
            await asyncio.sleep(job["args"][1])
            # The finish claims the worker's next job too, as runjobworker --api does: only a
            # worker that the finish found nothing for long-polls a claim.
            finish = {"lease": job["lease"], "outcome": "done", "result": job["args"][0].upper(),
                      "claim_next": {"tasks": ["remote.upper"]}}  # fmt: skip
            status, answer = await connection.post(f"/jobs/api/v1/jobs/{job['id']}/finish", finish)
            statuses[f"finish {status}"] += 1
            finished_at.append(time.time())
            job = answer["job"] if status == 200 else None
            if len(finished_at) >= jobs:
                all_done.set()

    tasks = [asyncio.create_task(worker(n)) for n in range(workers)]
    await asyncio.sleep(3)  # every worker in its long poll
    ready.set()
    await all_done.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "seen": seen,
        "statuses": dict(statuses),
        "latencies": latencies,
        "first_claim": min(claimed_at),
        "last_finish": max(finished_at),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def verify(jobs: int, task: str) -> None:
    """Every job done exactly once: done, attempt 1, one attempt row, which is done."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE j.state = 'done' AND j.attempt = 1),"
            " (SELECT count(*) FROM django_jobs_attempt a JOIN django_jobs_job k ON k.id = a.job_id"
            "  WHERE k.task = %s AND a.outcome = 'done')"
            " FROM django_jobs_job j WHERE j.task = %s",
            [task, task],
        )
        done, attempts = cursor.fetchone()
    if (done, attempts) != (jobs, jobs):
        raise SystemExit(f"not every job done exactly once: {done} done, {attempts} attempts")


def api_run(args: argparse.Namespace) -> dict[str, Any]:
    from django_jobs.enqueue import enqueue_many
    from django_jobs.registry import registry
    from django_jobs.tokens import auth

    _, token = auth.create("bench", ["remote"])
    port = free_port()
    env = {**os.environ, "JOBS_API_CONNECTIONS": str(API_CONNECTIONS)}
    server = spawn(
        [
            *(sys.executable, "-m", "uvicorn", "testproject.asgi:application"),
            *("--port", str(port), "--log-level", "warning", "--backlog", "4096"),
            *("--timeout-keep-alive", "60"),
        ],
        env,
        args.logs.with_suffix(".uvicorn.log"),
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                break
            if time.monotonic() > deadline or not server.running():
                raise SystemExit("uvicorn did not start: see " + str(args.logs))
            time.sleep(0.2)
        upper = registry.get("remote.upper")
        calls = [([f"job{i}", s], {}) for i, s in enumerate(durations(args.jobs))]
        ready = threading.Event()
        outcome: dict[str, Any] = {}
        loop = asyncio.new_event_loop()
        thread = threading.Thread(
            target=lambda: outcome.update(
                loop.run_until_complete(fleet(port, token, args.workers, args.jobs, ready))
            )
        )
        from django.db import connection

        with connection.cursor() as cursor:  # this process's connection enqueues: not counted
            cursor.execute("SELECT pg_backend_pid()")
            own = [cursor.fetchone()[0]]
        with Sampler(os.environ["DATABASE_URL"], own) as sampler:
            thread.start()
            ready.wait()
            for start in range(0, len(calls), BATCH):
                enqueue_many(upper, calls[start : start + BATCH])
            thread.join()
        connection.close()
    finally:
        stop_all([server])
    verify(args.jobs, "remote.upper")
    seen = outcome["seen"]
    if len(seen) != args.jobs or set(seen.values()) != {1}:
        raise SystemExit("a job was claimed twice, or not at all")
    if set(outcome["statuses"]) - {"claim 200", "claim 204", "finish 200"}:
        raise SystemExit(f"unexpected answers: {outcome['statuses']}")
    seconds = outcome["last_finish"] - outcome["first_claim"]
    latencies = outcome["latencies"]
    return {
        "label": f"HTTP API, {args.workers} workers, 1 uvicorn ({API_CONNECTIONS}+1 connections)",
        "jobs_per_s": args.jobs / seconds,
        "seconds": seconds,
        "max_connections": max(sampler.connections),
        "db_cpu_per_job_s": sampler.cpu_seconds() / args.jobs,
        "claim_p50_s": percentile(latencies, 50),
        "claim_p99_s": percentile(latencies, 99),
        "answers": outcome["statuses"],
    }


def db_run(args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection

    from bench.jobs import sleep
    from django_jobs.enqueue import enqueue_many

    calls = [([s], {}) for s in durations(args.jobs)]
    for start in range(0, len(calls), BATCH):
        enqueue_many(sleep, calls[start : start + BATCH])
    connection.close()
    command = [sys.executable, str(ROOT / "manage.py"), "runjobworker", "--burst"]
    command += ["--concurrency", str(args.concurrency)]
    with Sampler(os.environ["DATABASE_URL"], []) as sampler:
        workers = [
            spawn(
                [*command, "--worker-id", f"bench-{n}"],
                dict(os.environ),
                args.logs.with_suffix(f".worker-{n}.log"),
            )
            for n in range(args.processes)
        ]
        try:
            for worker in workers:
                if not worker.wait(3600):
                    raise SystemExit("a worker did not finish its burst")
        finally:
            stop_all(workers)
    verify(args.jobs, "bench.sleep")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at))"
            " FROM django_jobs_job WHERE task = 'bench.sleep'"
        )
        seconds = float(cursor.fetchone()[0])
    return {
        "label": f"runjobworker, {args.processes} processes x concurrency {args.concurrency}",
        "jobs_per_s": args.jobs / seconds,
        "seconds": seconds,
        "max_connections": max(sampler.connections),
        "db_cpu_per_job_s": sampler.cpu_seconds() / args.jobs,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.api")
    parser.add_argument("mode", choices=["api", "db"])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", type=int, default=1_000)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--logs", type=Path, required=True)
    args = parser.parse_args(argv)
    args.logs.parent.mkdir(parents=True, exist_ok=True)
    django_setup()
    emit(api_run(args) if args.mode == "api" else db_run(args))


if __name__ == "__main__":
    main()
