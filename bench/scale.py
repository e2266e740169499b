"""Scale: the claim statement's time as the job table grows to a million rows.

The table holds a fixed pool of ready jobs plus, for the rest, what a long-lived queue keeps:
mostly finished jobs (done 95 %, error 2 %, cancelled 1 %, each with its attempt row), and
waiting (1 %, each on a scheduled job) and scheduled (1 %, due tomorrow) ones. After each fill
the tables are vacuumed and analysed, as autovacuum would. At each size:

- the claim, django-jobs' own ``store.claim``, run many times, each in a transaction that
  is rolled back so that every run sees the same table: the median round trip as the client
  sees it, and the median execution time and buffers touched that ``EXPLAIN (ANALYZE,
  BUFFERS)`` reports, with its plan (buffers do not depend on the machine's load);
- a reaper pass (``django_jobs.reaper.reap_pass``) over a few running jobs whose worker is alive:
  its time, and the buffers it touched (every block of django-jobs' tables and indexes the pass
  read, counted by PostgreSQL for its transaction, which is rolled back);
- at the two largest sizes, the claim function (``call_claim``) under queue controls and
  concurrency limits (``_CONTROLS``), against the same claim with none: its round trip and the
  buffers ``EXPLAIN (ANALYZE, BUFFERS)`` counts for it (the function's inner statements
  included).

``flat`` compares the two largest sizes: the ratio of buffers of the reaper pass and of each claim
case, which should stay within ``FLAT`` (1.5). A size of 10,000,000 is optional (``--sizes
1000,1000000,10000000``); bench/README.md gives its fill time.

The admin changelist and the operations views at a million rows are measured by
``bench/admin_pages.py`` and ``bench/views_cost.py``.
Run as ``python -m bench.scale`` it is the probe itself (a Django process on ``DATABASE_URL``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.core import Context, django_setup, emit, median, percentile, run_json
from bench.systems.ours import Ours

READY_POOL = 300
RUNNING = 20
#: The largest ratio of buffers, from the second largest size to the largest, that counts as flat.
FLAT = 1.5

# Rows beyond the ready pool, by g mod 100: what a long-lived queue table holds.
_FILL = """
INSERT INTO django_jobs_job
    (task, queue, priority, state, args, kwargs, attempt, max_attempts, run_after, worker_id,
     created_at, started_at, finished_at, error)
SELECT 'bench.noop', 'default', 0, s.state, '[]', '{}', s.attempt, 3, s.run_after, s.worker,
       now() - interval '2 days', s.started, s.finished, s.error
FROM generate_series(1, %(count)s) AS g
CROSS JOIN LATERAL (
    SELECT
        CASE WHEN g %% 100 = 0 THEN 'waiting'
             WHEN g %% 100 = 1 THEN 'pending'
             WHEN g %% 100 IN (2, 3) THEN 'error'
             WHEN g %% 100 = 4 THEN 'cancelled'
             ELSE 'done' END AS state,
        CASE WHEN g %% 100 IN (0, 1) THEN 0 WHEN g %% 100 IN (2, 3) THEN 3 ELSE 1 END AS attempt,
        CASE WHEN g %% 100 = 1 THEN now() + interval '1 day' + make_interval(secs => g %% 3600)
             ELSE now() - interval '2 days' END AS run_after,
        CASE WHEN g %% 100 > 1 THEN 'old-worker' END AS worker,
        CASE WHEN g %% 100 > 1 THEN now() - interval '1 day' END AS started,
        CASE WHEN g %% 100 > 1 THEN now() - interval '1 day' + interval '1 second' END AS finished,
        CASE WHEN g %% 100 IN (2, 3) THEN 'ValueError: boom' ELSE '' END AS error
) AS s
"""

_FILL_ATTEMPTS = """
INSERT INTO django_jobs_attempt (job_id, number, worker_id, started_at, finished_at, outcome,
                                 error, traceback)
SELECT id, attempt, worker_id, started_at, finished_at,
       CASE state WHEN 'done' THEN 'done' WHEN 'error' THEN 'error' ELSE 'cancelled' END,
       error, ''
FROM django_jobs_job
WHERE id > %(after)s AND state IN ('done', 'error', 'cancelled')
"""

# A waiting job waits for something: here, for one of the scheduled jobs (due tomorrow).
_FILL_DEPENDENCIES = """
INSERT INTO django_jobs_dependency (job_id, depends_on_id)
SELECT w.id, (SELECT s.id FROM django_jobs_job s
              WHERE s.state = 'pending' AND s.run_after > now() ORDER BY s.id LIMIT 1)
FROM django_jobs_job w
WHERE w.id > %(after)s AND w.state = 'waiting'
"""

_READY = """
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, max_attempts, run_after)
SELECT 'bench.noop', 'default', 0, 'pending', '[]', '{}', 3, now() - interval '1 hour'
FROM generate_series(1, %(count)s)
"""

_LIVE_WORKER = """
INSERT INTO django_jobs_worker (id, name, host, pid, queues, concurrency, started_at,
                                last_seen_at, boot_id)
VALUES ('scale-worker', 'scale', 'bench', 1, '[]', 1, now(), now(), '')
"""

_RUNNING = """
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, attempt, max_attempts,
                             run_after, worker_id, started_at)
SELECT 'bench.noop', 'default', 0, 'running', '[]', '{}', 1, 3, now(), 'scale-worker', now()
FROM generate_series(1, %(count)s)
"""


def run(ctx: Context, sizes: Sequence[int], claims: int, progress: Any = print) -> dict[str, Any]:
    """Fill a ``scale`` database to each size in turn and measure there."""
    database = ctx.server.database("scale")
    ctx.server.recreate(database)
    scale = Ours()
    env = scale.env(ctx)
    env["DATABASE_URL"] = ctx.server.url_for(database)
    run_json(scale.helper(ctx, "install"), env)
    result = run_json(
        [
            ctx.python,
            "-m",
            "bench.scale",
            "--sizes",
            ",".join(map(str, sizes)),
            "--claims",
            str(claims),
        ],
        env,
        # About a minute a million rows to fill, on a small machine; the rest is the probe's.
        timeout=900 + max(sizes) // 5_000,
    )
    for row in result["sizes"]:
        progress(
            f"  scale      {row['rows']:>9,} rows: claim {1000 * row['claim_s']:6.2f} ms"
            f" (server {1000 * row['claim_server_s']:5.2f} ms),"
            f" reaper pass {1000 * row['reaper_s']:6.1f} ms, {row['reaper_buffers']} buffers"
        )
        for name, case in row.get("controls", {}).items():
            progress(
                f"  scale      {row['rows']:>9,} rows: claim with {name}:"
                f" {1000 * case['claim_s']:6.2f} ms, {case['claim_buffers']:.0f} buffers"
            )
    for name, ratio in result["flat"]["ratios"].items():
        progress(f"  scale      buffers ratio, {name}: {ratio:.2f}x")
    return result


# ------------------------------------------------------------------ the probe


def _grow(conn: Any, rows_now: int, target: int) -> float:
    """Add rows until the job table holds ``target``; return the seconds it took."""
    start = time.perf_counter()
    with conn.cursor() as cursor:
        if rows_now == 0:
            cursor.execute(_READY, {"count": READY_POOL})
            cursor.execute(_LIVE_WORKER)
            cursor.execute(_RUNNING, {"count": RUNNING})
            rows_now = READY_POOL + RUNNING
        after = cursor.execute("SELECT coalesce(max(id), 0) FROM django_jobs_job").fetchone()[0]
        cursor.execute(_FILL, {"count": max(0, target - rows_now)})
        cursor.execute(_FILL_ATTEMPTS, {"after": after})
        cursor.execute(_FILL_DEPENDENCIES, {"after": after})
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE django_jobs_job")
    conn.execute("VACUUM ANALYZE django_jobs_attempt")
    conn.execute("VACUUM ANALYZE django_jobs_dependency")
    conn.autocommit = False
    return time.perf_counter() - start


def _measure_claim(conn: Any, claims: int) -> dict[str, Any]:
    from django_jobs import store

    round_trips = []
    for _ in range(claims):
        with conn.cursor() as cursor:
            start = time.perf_counter()
            job = store.claim(cursor, "scale-probe:1:x", None)
            round_trips.append(time.perf_counter() - start)
        conn.rollback()
        if job is None:
            raise RuntimeError("the claim found no ready job")

    sql, params = store.claim_sql(None)
    executions = []
    buffers = []
    plan = ""
    for _ in range(max(5, claims // 10)):
        with conn.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS) " + sql, {"worker_id": "scale-probe:1:x", **params}
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
        conn.rollback()
        found = re.search(r"Execution Time: ([\d.]+) ms", plan)
        if found:
            executions.append(float(found.group(1)) / 1000)
        touched = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
        if touched:
            buffers.append(int(touched.group(1)) + int(touched.group(2) or 0))
    return {
        "claim_s": median(round_trips),
        "claim_p90_s": percentile(round_trips, 90),
        "claim_server_s": median(executions),
        "claim_buffers": median(buffers),
        "claim_plan": plan,
        "claim_uses_index": "job_claim_free_idx" in plan,
    }


# The claim under queue controls and concurrency limits (queues/controls.py). Each case adds its
# rows (the 10,000 held-back or paused jobs are ahead of every other ready job in claim order),
# runs the claims, and removes them again.
_HELD = """
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, max_attempts, run_after,
                             concurrency_key, concurrency_limit, rate_key, rate_limit,
                             rate_period, expires_at)
SELECT 'bench.noop', %(queue)s, 5, 'pending', '[]', '{}', 3, now() - interval '2 hours',
       %(key)s::text || CASE WHEN %(keys)s::int > 1 THEN (g %% %(keys)s::int)::text ELSE '' END,
       CASE WHEN %(key)s::text IS NOT NULL THEN %(limit)s::int END,
       %(rate_key)s::text, %(rate_limit)s::int, %(rate_period)s::int,
       CASE WHEN %(expired)s THEN now() - interval '1 minute' END
FROM generate_series(1, %(count)s) AS g
"""
_HELD_DEFAULTS = {"rate_key": None, "rate_limit": None, "rate_period": None, "expired": False}
# A rate key whose window is full for the next hour.
_FULL_WINDOW = """
INSERT INTO django_jobs_rate (key, starts, rate_limit, rate_period, free_at, updated_at)
VALUES ('key:held', ARRAY[now()], 1, 3600, now() + interval '1 hour', now())
"""
_SATURATE = """
INSERT INTO django_jobs_job (task, queue, priority, state, args, kwargs, attempt, max_attempts,
                             run_after, worker_id, started_at, concurrency_key, concurrency_limit)
VALUES ('bench.noop', 'default', 0, 'running', '[]', '{}', 1, 3, now(), 'scale-worker', now(),
        'busy', 1)
"""
_CONTROLS: dict[str, dict[str, Any]] = {
    "no controls": {},
    "a queue limit (not reached)": {"limit": ("default", 1000)},
    "10,000 jobs of a paused queue ahead": {
        "held": {"queue": "paused", "key": None, "keys": 1, "limit": None, "count": 10_000},
        "pause": "paused",
    },
    "10,000 jobs behind one saturated key ahead": {
        "held": {"queue": "default", "key": "busy", "keys": 1, "limit": 1, "count": 10_000},
        "saturate": True,
    },
    "10,000 jobs over 20 open keys (limit 2)": {
        "held": {"queue": "default", "key": "customer:", "keys": 20, "limit": 2, "count": 10_000},
    },
    "a queue rate limit (window open)": {"rate": ("default", 100_000, 1)},
    "10,000 jobs of a full rate key ahead": {
        "held": {
            "queue": "default",
            "key": "rate:held",
            "keys": 1,
            "limit": 2**31 - 1,
            "count": 10_000,
            "rate_key": "held",
            "rate_limit": 1,
            "rate_period": 3600,
        },
        "full_window": True,
    },
    "a fair queue, 10,000 jobs over 1,000 keys": {
        "held": {"queue": "default", "key": "tenant:", "keys": 1000, "limit": 100, "count": 10_000},
        "fair": "default",
    },
    "10,000 expired jobs not yet ended, ahead": {
        "held": {
            "queue": "default",
            "key": None,
            "keys": 1,
            "limit": None,
            "count": 10_000,
            "expired": True,
        },
    },
}


def _measure_controls(conn: Any, claims: int) -> dict[str, Any]:
    from django_jobs.store.sql import query

    results = {}
    for name, case in _CONTROLS.items():
        with conn.cursor() as cursor:
            if "held" in case:
                cursor.execute(_HELD, {**_HELD_DEFAULTS, **case["held"]})
            if case.get("full_window"):
                cursor.execute(_FULL_WINDOW)
            if "rate" in case:
                cursor.execute(
                    "INSERT INTO django_jobs_queue (name, rate_limit, rate_period)"
                    " VALUES (%s, %s, %s)",
                    list(case["rate"]),
                )
            if "fair" in case:
                cursor.execute(
                    "INSERT INTO django_jobs_queue (name, fair) VALUES (%s, true)", [case["fair"]]
                )
            if case.get("saturate"):
                cursor.execute(_SATURATE)
            if "pause" in case:
                cursor.execute(
                    "INSERT INTO django_jobs_queue (name, paused) VALUES (%s, true)",
                    [case["pause"]],
                )
            if "limit" in case:
                cursor.execute(
                    "INSERT INTO django_jobs_queue (name, concurrency_limit) VALUES (%s, %s)",
                    list(case["limit"]),
                )
        conn.commit()
        conn.autocommit = True
        conn.execute("ANALYZE django_jobs_job")
        conn.autocommit = False
        params = {"worker_id": "scale-probe:1:x", "queues": None, "skip_tasks": None}
        round_trips, buffers, claimed_held = [], [], 0
        for _ in range(claims):
            with conn.cursor() as cursor:
                start = time.perf_counter()
                row = cursor.execute(query("call_claim"), params).fetchone()
                round_trips.append(time.perf_counter() - start)
                if row is None:
                    raise RuntimeError(f"{name}: the claim found no ready job")
                held = cursor.execute(
                    "SELECT queue = 'paused' OR concurrency_key IS NOT DISTINCT FROM 'busy'"
                    " OR rate_key IS NOT DISTINCT FROM 'held' OR expires_at < now()"
                    " FROM django_jobs_job WHERE id = %s",
                    [row[0]],
                ).fetchone()[0]
                claimed_held += bool(held)
            conn.rollback()
        for _ in range(max(8, claims // 10)):  # plpgsql keeps its plans after the first runs
            with conn.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + query("call_claim"), params)
                plan = "\n".join(row[0] for row in cursor.fetchall())
            conn.rollback()
            touched = re.search(r"Buffers: shared hit=(\d+)(?: read=(\d+))?", plan)
            if touched:
                buffers.append(int(touched.group(1)) + int(touched.group(2) or 0))
        with conn.cursor() as cursor:
            cursor.execute(
                "DELETE FROM django_jobs_job WHERE concurrency_key IS NOT NULL OR queue = 'paused'"
                " OR expires_at IS NOT NULL"
            )
            cursor.execute("DELETE FROM django_jobs_queue")
            cursor.execute("DELETE FROM django_jobs_rate")
        conn.commit()
        # Before the next case (and the next size), the case's own rows leave no trace: the
        # index entries of its 10,000 deleted jobs go too. A plain VACUUM skips the indexes
        # when the dead rows are on few of the table's pages (under 2 %, so always at millions
        # of rows), and the next cases would then read those dead entries of job_claim_key_idx.
        conn.autocommit = True
        conn.execute("VACUUM (ANALYZE, INDEX_CLEANUP ON) django_jobs_job")
        conn.autocommit = False
        if claimed_held:
            raise RuntimeError(
                f"{name}: a claim took a paused queue's, a full key's or an expired job"
            )
        results[name] = {
            "claim_s": median(round_trips),
            "claim_p90_s": percentile(round_trips, 90),
            "claim_buffers": median(buffers[-5:]),
        }
    return results


# Every block of django-jobs' tables and indexes that the current transaction has read (hits
# and reads): what a reaper pass touched, whatever the machine's load.
_BLOCKS_READ = r"""
SELECT coalesce(sum(pg_stat_get_xact_blocks_fetched(c.oid)), 0)::bigint FROM pg_class c
WHERE c.relname LIKE 'django\_jobs\_%' AND c.relkind IN ('r', 'i')
"""


def reaper_buffers() -> int:
    """The buffers one reaper pass touches: the pass runs in a transaction that is rolled back,
    and PostgreSQL counts the blocks that transaction read of django-jobs' tables and indexes."""
    from django.db import connection, transaction

    from django_jobs.reaper import reap_pass

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_BLOCKS_READ)
            before = cursor.fetchone()[0]
        report = reap_pass()
        with connection.cursor() as cursor:
            cursor.execute(_BLOCKS_READ)
            after = cursor.fetchone()[0]
        transaction.set_rollback(True)
    if report.reaped:
        raise RuntimeError("the reaper reaped jobs of a live worker")
    return int(after - before)


def _measure_reaper(passes: int = 5) -> dict[str, Any]:
    from django_jobs.reaper import reap_pass

    times = []
    for _ in range(passes):
        start = time.perf_counter()
        report = reap_pass()
        times.append(time.perf_counter() - start)
        if report.reaped:
            raise RuntimeError("the reaper reaped jobs of a live worker")
    return {
        "reaper_s": median(times),
        "reaper_buffers": median([reaper_buffers() for _ in range(passes)]),
    }


def probe(sizes: Sequence[int], claims: int) -> dict[str, Any]:
    import psycopg
    from django.db import connection

    params = dict(connection.get_connection_params())
    params.pop("cursor_factory", None)
    params.pop("context", None)
    conn = psycopg.connect(**params)
    rows_now = 0
    results = []
    controlled = set(sorted(sizes)[-2:])
    for size in sizes:
        fill_s = _grow(conn, rows_now, size)
        rows_now = conn.execute("SELECT count(*) FROM django_jobs_job").fetchone()[0]
        conn.rollback()
        with conn.cursor() as cursor:
            cursor.execute("UPDATE django_jobs_worker SET last_seen_at = now()")
        conn.commit()
        results.append(
            {
                "rows": rows_now,
                "fill_s": fill_s,
                **_measure_claim(conn, claims),
                **_measure_reaper(),
            }
        )
        if size in controlled:
            results[-1]["controls"] = _measure_controls(conn, claims)
    conn.close()
    first, last = results[0], results[-1]
    return {
        "sizes": results,
        "controls": {"rows": last["rows"], "cases": last["controls"]},
        "claim_ratio": last["claim_s"] / first["claim_s"],
        "claim_server_ratio": last["claim_server_s"] / first["claim_server_s"],
        "flat": flatness(results),
    }


def flatness(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ratio of buffers from the second largest size to the largest, of the plain claim, the
    reaper pass and each claim case; flat when each is within ``FLAT``."""
    before, after = (results[-2], results[-1]) if len(results) > 1 else (results[0], results[0])

    def ratio(old: float, new: float) -> float:
        return new / max(old, 1)

    ratios = {
        "claim": ratio(before["claim_buffers"], after["claim_buffers"]),
        "reaper pass": ratio(before["reaper_buffers"], after["reaper_buffers"]),
    }
    for name, case in after.get("controls", {}).items():
        old = before.get("controls", {}).get(name)
        if old is not None:
            ratios[f"claim with {name}"] = ratio(old["claim_buffers"], case["claim_buffers"])
    return {
        "from_rows": before["rows"],
        "to_rows": after["rows"],
        "ratios": ratios,
        "flat": all(value <= FLAT for value in ratios.values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument(
        "--sizes",
        default="1000,100000,1000000",
        help="table sizes, in rows, in increasing order; 10000000 is the optional largest",
    )
    parser.add_argument("--claims", type=int, default=200)
    args = parser.parse_args(argv)
    django_setup()
    emit(probe([int(s) for s in args.sizes.split(",")], args.claims))


if __name__ == "__main__":
    main(sys.argv[1:])
