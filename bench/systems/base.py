"""What the suite needs of each system it measures, and what they all do alike.

Every system gets its own database. Its schema is installed once per suite run; then one job
of each workload is enqueued through the system's own API and kept as a template, and each
throughput run pre-enqueues its jobs by cloning that template row with ``INSERT ... SELECT``,
so the queue is filled the same fast way for everyone. (The enqueue benchmark measures each
system's own enqueue API.) Completion is read from the system's own tables: the time each job
finished, and how many failed.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Any

from psycopg import sql

from bench.core import WORKLOADS, Context, Workload, python_env, run_json


class System:
    key: str = ""
    label: str = ""
    #: The module that must be importable for this system to run (None: always available).
    requires: str | None = None
    #: The table whose rows are the jobs.
    jobs_table: str = ""
    #: Tables emptied before each run.
    tables: tuple[str, ...] = ()
    #: ``SELECT <epoch seconds> AS t ...``: one row per successfully finished job.
    finished_sql: str = ""
    #: ``SELECT count(*) ...``: jobs that failed.
    failed_sql: str = ""
    #: Multiple worker processes, each with ``slots / processes`` slots, are supported.
    multi_process: bool = True

    def unavailable(self) -> str | None:
        """Why this system cannot run here, or None."""
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"{self.requires} is not installed (pip install -e '.[bench]')"
        return None

    def database(self, ctx: Context) -> str:
        return ctx.server.database(self.key)

    def url(self, ctx: Context) -> str:
        return ctx.server.url_for(self.database(ctx))

    def env(self, ctx: Context) -> dict[str, str]:
        return python_env(DATABASE_URL=self.url(ctx))

    def connect(self, ctx: Context) -> Any:
        return ctx.server.connect(self.database(ctx))

    # -------------------------------------------------------------- set-up, once per suite run

    def setup(self, ctx: Context) -> None:
        ctx.server.recreate(self.database(ctx))
        self.install(ctx)
        with self.connect(ctx) as conn:
            for workload in WORKLOADS.values():
                self.reset(conn)
                run_json(
                    self.helper(ctx, "enqueue-one", "--seconds", str(workload.seconds)),
                    self.env(ctx),
                )
                template = sql.Identifier(f"bench_template_{workload.key}")
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(template))
                conn.execute(
                    sql.SQL("CREATE TABLE {} AS SELECT * FROM {}").format(
                        template, sql.Identifier(self.jobs_table)
                    )
                )
                count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(template))
                if count.fetchone()[0] != 1:
                    raise RuntimeError(f"{self.label}: enqueue-one did not store exactly one job")
            self.reset(conn)

    def install(self, ctx: Context) -> None:
        """Create the system's tables in its (new, empty) database."""
        run_json(self.helper(ctx, "install"), self.env(ctx))

    def helper(self, ctx: Context, *args: str) -> list[str]:
        """The command line of this system's helper process (its module's ``main``)."""
        return [ctx.python, "-m", type(self).__module__, *args]

    # -------------------------------------------------------------- each run

    def reset(self, conn: Any) -> None:
        conn.execute(
            sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(
                sql.SQL(", ").join(sql.Identifier(t) for t in self.tables)
            )
        )

    def prefill(self, conn: Any, workload: Workload, count: int) -> None:
        """Add ``count`` ready jobs of ``workload``, cloned from its template."""
        columns, key, key_expression = _clone_columns(conn, self.jobs_table)
        target = [sql.Identifier(c) for c in columns]
        source = [sql.Identifier(c) for c in columns]
        if key_expression is not None:
            target.append(sql.Identifier(key))
            source.append(sql.SQL(key_expression))
        conn.execute(
            sql.SQL(
                "INSERT INTO {table} ({target}) SELECT {source} FROM {template}"
                " CROSS JOIN generate_series(1, %s)"
            ).format(
                table=sql.Identifier(self.jobs_table),
                target=sql.SQL(", ").join(target),
                source=sql.SQL(", ").join(source),
                template=sql.Identifier(f"bench_template_{workload.key}"),
            ),
            [count],
        )
        conn.execute(sql.SQL("ANALYZE {}").format(sql.Identifier(self.jobs_table)))

    def worker_commands(
        self, ctx: Context, workload: Workload, slots: int, processes: int
    ) -> list[list[str]]:
        """Commands that start workers with ``slots`` slots in all, over ``processes``
        processes, that exit once the queue is empty."""
        raise NotImplementedError

    def finish_times(self, conn: Any) -> list[float]:
        return [float(row[0]) for row in conn.execute(self.finished_sql)]

    def any_finished(self, conn: Any) -> bool:
        query = sql.SQL("SELECT EXISTS ({})").format(sql.SQL(self.finished_sql))
        return bool(conn.execute(query).fetchone()[0])

    def failed(self, conn: Any) -> int:
        return int(conn.execute(self.failed_sql).fetchone()[0])

    # -------------------------------------------------------------- the enqueue benchmark

    def enqueue_bench(self, ctx: Context, single: int, bulk: int) -> dict[str, float | None]:
        """Rates of single enqueues (each its own transaction) and of bulk enqueue rows."""
        with self.connect(ctx) as conn:
            self.reset(conn)
        return run_json(
            self.helper(ctx, "enqueue-bench", "--single", str(single), "--bulk", str(bulk)),
            self.env(ctx),
        )


def _clone_columns(conn: Any, table: str) -> tuple[list[str], str, str | None]:
    """The columns to copy from a template row; the primary key, and the expression that
    makes a new one when the table has no default for it (a UUID key filled by the app)."""
    key, default, identity = conn.execute(
        """
        SELECT a.attname, pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE i.indrelid = %s::regclass AND i.indisprimary
        """,
        [table],
    ).fetchone()
    columns = [
        row[0]
        for row in conn.execute(
            """
            SELECT attname FROM pg_attribute
            WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped
              AND attgenerated = '' AND attname <> %s
            ORDER BY attnum
            """,
            [table, key],
        )
    ]
    has_default = default is not None or identity in ("a", "d")
    return columns, key, None if has_default else "gen_random_uuid()"


def helper_parser(prog: str) -> tuple[argparse.ArgumentParser, Any]:
    """The command line every system's helper process answers (``System.helper`` runs it):
    ``install``, ``enqueue-one`` and ``enqueue-bench``. A system adds its own commands (its
    ``worker``) to the subparsers returned with the parser."""
    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install")
    one = sub.add_parser("enqueue-one")
    one.add_argument("--seconds", type=float, default=0.0)
    bench = sub.add_parser("enqueue-bench")
    bench.add_argument("--single", type=int, required=True)
    bench.add_argument("--bulk", type=int, required=True)
    return parser, sub
