"""Turning a suite run's results into tables: medians, ratios, and the targets the suite is held to.

Ratios are taken within a repetition (ours and the other system ran one after the other, under
the same load) and the median of those ratios is reported, which holds better than a ratio of
medians on a shared machine.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench import api
from bench.core import median

LABELS = {
    "ours": "django-jobs",
    "floor": "floor",
    "procrastinate": "Procrastinate",
    "tasks_db": "django-tasks-db",
    "pgqueuer": "PgQueuer",
}


@dataclasses.dataclass(frozen=True)
class Target:
    text: str
    value: float | None
    shown: str
    met: bool | None  # None: reported, not a target


def _by(rows: list[dict[str, Any]], *keys: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    grouped: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        grouped[tuple(row[k] for k in keys)].append(row)
    return grouped


def throughput_summary(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per configuration: median jobs/s of each system, and median ratios of ours to each."""
    part = results.get("throughput")
    if not part:
        return []
    runs = _by(part["runs"], "config", "system")
    summary = []
    for config in part["configs"]:
        rates = {
            system: median([r["jobs_per_s"] for r in runs[(config["key"], system)]])
            for system in config["systems"]
            if runs.get((config["key"], system))
        }
        ratios = {}
        for other in rates:
            if other == "ours" or "ours" not in rates:
                continue
            pairs = []
            ours_runs = {r["repetition"]: r for r in runs[(config["key"], "ours")]}
            for r in runs[(config["key"], other)]:
                if r["repetition"] in ours_runs and r["jobs_per_s"] > 0:
                    pairs.append(ours_runs[r["repetition"]]["jobs_per_s"] / r["jobs_per_s"])
            if pairs:
                ratios[other] = median(pairs)
        summary.append({**config, "rates": rates, "ratios": ratios})
    return summary


def enqueue_summary(results: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    rows = results.get("enqueue") or []
    summary: dict[str, dict[str, float | None]] = {}
    for (system,), runs in _by(rows, "system").items():
        summary[system] = {}
        for field in ("single", "bulk", "bulk_executemany"):
            values = [r[field] for r in runs if r.get(field)]
            summary[system][field] = median(values) if values else None
    return summary


def _ratio_within_repetitions(
    rows: list[dict[str, Any]], field: str, other: str, other_field: str
) -> float | None:
    mine = {r["repetition"]: r for r in rows if r["system"] == "ours"}
    pairs = [
        mine[r["repetition"]][field] / r[other_field]
        for r in rows
        if r["system"] == other and r["repetition"] in mine and r.get(other_field)
    ]
    return median(pairs) if pairs else None


def targets(results: dict[str, Any]) -> list[Target]:
    found: list[Target] = []
    summary = {row["key"]: row for row in throughput_summary(results)}

    def ratio_target(config: str, other: str, at_least: float | None, text: str) -> None:
        row = summary.get(config)
        value = row["ratios"].get(other) if row else None
        if value is None:
            found.append(Target(text, None, "not measured", None))
            return
        met = None if at_least is None else value >= at_least
        found.append(Target(text, value, f"{value:.2f}x", met))

    ratio_target("noop-4x1", "floor", 0.5, "No-op, 4 slots: django-jobs ≥ 0.5x the floor")
    ratio_target("noop-4x1", "procrastinate", 3.0, "No-op, 4 slots: ≥ 3x Procrastinate")
    ratio_target("noop-4x1", "tasks_db", 3.0, "No-op, 4 slots: ≥ 3x django-tasks-db")
    ratio_target("noop-4x1", "pgqueuer", None, "No-op, 4 slots: ratio to PgQueuer (reported)")
    ratio_target("sleep-8x1", "floor", 0.9, "10 ms jobs, 8 slots: ≥ 0.9x the floor")
    rows = results.get("enqueue") or []
    for field, other_field, limit, text in (
        ("bulk", "bulk", 0.5, "Bulk enqueue ≥ 0.5x raw COPY"),
        ("single", "single", 0.6, "Single enqueue (autocommit) ≥ 0.6x raw single-row INSERT"),
    ):
        value = _ratio_within_repetitions(rows, field, "floor", other_field)
        if value is None:
            found.append(Target(text, None, "not measured", None))
        else:
            found.append(Target(text, value, f"{value:.2f}x", value >= limit))
    found += _cost_targets(results)
    scale = results.get("scale")
    if scale:
        sizes = scale["sizes"]
        text = (
            f"Claim time flat from {sizes[0]['rows']:,} to {sizes[-1]['rows']:,} rows (ratio ≤ 1.5)"
        )
        value = scale["claim_ratio"]
        found.append(
            Target(
                text,
                value,
                f"{value:.2f}x (server time {scale['claim_server_ratio']:.2f}x; buffers"
                f" {sizes[0]['claim_buffers']:.0f} -> {sizes[-1]['claim_buffers']:.0f})",
                value <= 1.5,
            )
        )
        flat = scale.get("flat")
        if flat:
            worst = max(flat["ratios"], key=flat["ratios"].get)
            value = flat["ratios"][worst]
            found.append(
                Target(
                    f"Buffers flat from {flat['from_rows']:,} to {flat['to_rows']:,} rows: the"
                    " reaper pass and every claim case (ratio ≤ 1.5)",
                    value,
                    f"{value:.2f}x at most ({worst})",
                    flat["flat"],
                )
            )
    return found


def _cost_targets(results: dict[str, Any]) -> list[Target]:
    """The cost part's targets (database and supervisor CPU per no-op job, 4 slots), and the
    HTTP API's database CPU per job against a database worker's."""
    found: list[Target] = []
    workers = {row["setup"]: row for row in (results.get("cost") or {}).get("workers", [])}
    ours, floor = workers.get("ours-4"), workers.get("floor")
    text = "Database CPU per no-op job (4 slots) ≤ 0.5 ms, and ≤ 1.3x the floor's"
    if ours and floor:
        db_ms = ours["db_cpu_ms_per_1000"] / 1000
        ratio = ours["db_cpu_ms_per_1000"] / floor["db_cpu_ms_per_1000"]
        found.append(
            Target(
                text,
                db_ms,
                f"{db_ms:.2f} ms ({ratio:.2f}x the floor)",
                db_ms <= 0.5 and ratio <= 1.3,
            )
        )
        sup_ms = ours["supervisor_cpu_ms_per_1000"] / 1000
        found.append(
            Target(
                "Supervisor CPU per no-op job (4 slots, default log level) ≤ 0.35 ms",
                sup_ms,
                f"{sup_ms:.2f} ms",
                sup_ms <= 0.35,
            )
        )
    else:
        found.append(Target(text, None, "not measured", None))
    api = results.get("api") or {}
    text = "HTTP API: database CPU per job ≤ 1.2x a database worker's"
    if "api" in api and "db" in api and api["db"]["db_cpu_per_job_s"]:
        ratio = api["api"]["db_cpu_per_job_s"] / api["db"]["db_cpu_per_job_s"]
        found.append(Target(text, ratio, f"{ratio:.2f}x", ratio <= 1.2))
    else:
        found.append(Target(text, None, "not measured", None))
    return found


# ------------------------------------------------------------------ markdown


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _num(value: float | None, fmt: Callable[[float], str] = lambda v: f"{v:,.0f}") -> str:
    return "-" if value is None else fmt(value)


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    load = meta.get("load_average")
    out = [
        f"Measured {meta['finished']} on {meta['machine']}"
        + (f"; load average {load[2]} over the last 15 minutes." if load else "."),
        "",
        f"Command: `{meta['command']}`",
        "",
    ]
    if results.get("skipped"):
        for key, reason in results["skipped"].items():
            out.append(f"- {LABELS.get(key, key)} skipped: {reason}")
        out.append("")

    found = targets(results)
    if found:
        out += ["### Targets", ""]
        marks = {True: "met", False: "**missed**", None: "reported"}
        out += _table(
            ["target", "measured", ""],
            [[t.text, t.shown, marks[t.met]] for t in found],
        )
        out.append("")

    summary = throughput_summary(results)
    if summary:
        part = results["throughput"]
        settings = part["settings"]
        others = [k for k in LABELS if k != "ours" and any(k in r["rates"] for r in summary)]
        out += [
            "### Throughput (jobs/s)",
            "",
            f"{settings['jobs']:,} jobs pre-enqueued per run; rate counted over a "
            f"{settings['window']:g} s window starting {settings['warmup']:g} s (or as long as "
            "start-up took, if longer) after the first job finished; median of "
            f"{settings['repetitions']} interleaved runs. Ratios are django-jobs ÷ the other "
            "system, median of the per-run ratios.",
            "",
        ]
        headers = ["jobs, slots", "django-jobs", *(LABELS[k] for k in others)]
        headers += [f"÷ {LABELS[k]}" for k in others]
        headers.append("django-jobs, each run")
        each = _by(part["runs"], "config", "system")
        rows = []
        for row in summary:
            cells = [row["label"], _num(row["rates"].get("ours"))]
            cells += [_num(row["rates"].get(k)) for k in others]
            cells += [_num(row["ratios"].get(k), lambda v: f"{v:.2f}") for k in others]
            runs = sorted(each.get((row["key"], "ours"), []), key=lambda r: r["repetition"])
            cells.append(" / ".join(f"{r['jobs_per_s']:.0f}" for r in runs))
            rows.append(cells)
        out += _table(headers, rows)
        out.append("")

    enqueue = enqueue_summary(results)
    if enqueue:
        out += [
            "### Enqueue",
            "",
            "Single: one job per transaction (autocommit). Bulk: one call for "
            f"{results['enqueue_settings']['bulk']:,} jobs. The floor writes raw rows into "
            "django-jobs' table: single-row `INSERT ... RETURNING id`, `COPY`, `executemany`.",
            "",
        ]
        rows = []
        for key in LABELS:
            if key not in enqueue:
                continue
            e = enqueue[key]
            if key == "floor":
                rows.append(["floor: raw INSERT / COPY", _num(e["single"]), _num(e["bulk"])])
                rows.append(["floor: executemany", "", _num(e["bulk_executemany"])])
            else:
                bulk = _num(e["bulk"]) if e["bulk"] else "no bulk API"
                rows.append([LABELS[key], _num(e["single"]), bulk])
        out += _table(["system", "single enqueues/s", "bulk rows/s"], rows)
        out.append("")

    latency = results.get("latency")
    if latency:
        out += [
            "### Latency: enqueue commit to job start, idle worker",
            "",
        ]
        out += _table(
            ["worker wakes up by", "samples", "p50", "p99", "mean"],
            [
                [
                    row["label"],
                    str(row["samples"]),
                    f"{1000 * row['p50_s']:.0f} ms",
                    f"{1000 * row['p99_s']:.0f} ms",
                    f"{1000 * row['mean_s']:.0f} ms",
                ]
                for row in latency
            ],
        )
        out.append("")

    scale = results.get("scale")
    if scale:
        out += [
            "### Scale: the claim and the reaper as the table grows",
            "",
            "Claim: medians of the round trip (client), of `EXPLAIN ANALYZE`'s execution time "
            "(server) and of the buffers it touched (which no load on the machine changes). "
            "Reaper: one pass over 20 running jobs of a live worker.",
            "",
        ]
        out += _table(
            [
                "rows",
                "claim (client)",
                "claim (server)",
                "buffers touched",
                "index used",
                "reaper pass",
                "reaper buffers",
            ],
            [
                [
                    f"{row['rows']:,}",
                    f"{1000 * row['claim_s']:.2f} ms",
                    f"{1000 * row['claim_server_s']:.3f} ms",
                    f"{row['claim_buffers']:.0f}",
                    "yes" if row["claim_uses_index"] else "**no**",
                    f"{1000 * row['reaper_s']:.1f} ms",
                    f"{row.get('reaper_buffers', 0):.0f}",
                ]
                for row in scale["sizes"]
            ],
        )
        out.append("")
        controls = scale.get("controls")
        if controls:
            out += [
                f"The claim function under queue controls and concurrency limits, at"
                f" {controls['rows']:,} rows: the round trip (client) and the buffers"
                " `EXPLAIN (ANALYZE, BUFFERS)` counts for the function and its inner statements.",
                "",
            ]
            sizes = scale["sizes"]
            earlier = sizes[-2].get("controls", {}) if len(sizes) > 1 else {}
            out += _table(
                [
                    "case",
                    "claim (client)",
                    "p90",
                    "buffers touched",
                    f"buffers at {sizes[-2]['rows']:,} rows" if earlier else "",
                ],
                [
                    [
                        name,
                        f"{1000 * case['claim_s']:.2f} ms",
                        f"{1000 * case['claim_p90_s']:.2f} ms",
                        f"{case['claim_buffers']:.0f}",
                        f"{earlier[name]['claim_buffers']:.0f}" if name in earlier else "",
                    ]
                    for name, case in controls["cases"].items()
                ],
            )
            out.append("")

    cost = results.get("cost")
    if cost:
        out += [
            "### Cost per job (no-op jobs)",
            "",
            "Statements and round trips on the worker's queue connection (libpq trace), per job; "
            "CPU per 1,000 jobs with start-up taken off: the worker (supervisor + executors) and "
            "the PostgreSQL backend serving it.",
            "",
        ]
        out += _table(
            [
                "worker",
                "statements/job",
                "round trips/job",
                "supervisor CPU",
                "executors CPU",
                "database CPU",
            ],
            [
                [
                    row["label"],
                    f"{row['statements_per_job']:.2f}",
                    f"{row['round_trips_per_job']:.2f}",
                    f"{row['supervisor_cpu_ms_per_1000']:.0f} ms",
                    f"{row['executors_cpu_ms_per_1000']:.0f} ms",
                    f"{row['db_cpu_ms_per_1000']:.0f} ms",
                ]
                for row in cost["workers"]
            ],
        )
        out += [
            "",
            "The two statements alone, claimed and finished back to back on one connection: "
            "round trip, and the database backend's CPU, per statement.",
            "",
        ]
        out += _table(
            ["statements", "claim", "claim, database CPU", "finish", "finish, database CPU"],
            [
                [
                    row["label"],
                    f"{row['claim_rt_us']:.0f} µs",
                    f"{row['claim_db_cpu_us']:.0f} µs",
                    f"{row['finish_rt_us']:.0f} µs",
                    f"{row['finish_db_cpu_us']:.0f} µs",
                ]
                for row in cost["statements"]
            ],
        )
        if cost.get("steps"):
            out += [
                "",
                "A long job's checkpoint, per call on a worker's connection: a step recorded"
                " (100 bytes of result, a durable commit), a cursor saved as the worker writes"
                " it, and for comparison the progress write every running job makes anyway;"
                " the read a resumed run makes once, and `is_owner()`.",
                "",
            ]
            out += _table(
                ["call", "round trip", "database CPU"],
                [
                    [row["label"], f"{row['rt_us']:.0f} µs", f"{row['db_cpu_us']:.0f} µs"]
                    for row in cost["steps"]
                ],
            )
        out.append("")
    if results.get("api"):
        out += api.markdown(results["api"])
    return "\n".join(out)
