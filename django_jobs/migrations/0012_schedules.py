"""Periodic jobs: the schedules, their ticks, and the ``django_jobs_schedules`` view.

The view is part of the operations contract (docs/operations.md): one row per schedule, with
how late its next tick is by the database's clock (0 unless it is active and overdue).
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models

VIEW = """
CREATE VIEW django_jobs_schedules AS
SELECT s.name, s.task, s.cron AS expression, s.timezone, s.queue, s.paused,
       s.missing_from_code_since IS NOT NULL AS removed_from_code,
       s.next_run_at, s.last_run_at, s.last_job_id, s.last_outcome,
       CASE WHEN NOT s.paused AND s.missing_from_code_since IS NULL AND s.next_run_at < now()
            THEN EXTRACT(EPOCH FROM now() - s.next_run_at)
            ELSE 0 END::float8 AS late_seconds
FROM django_jobs_schedule s
"""


class Migration(migrations.Migration):
    dependencies = [
        ("django_jobs", "0011_task_missing_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=200, unique=True)),
                (
                    "task",
                    models.CharField(
                        help_text="Registered name of the @job function.", max_length=200
                    ),
                ),
                (
                    "cron",
                    models.CharField(
                        help_text="5-field cron expression, or @daily, @hourly, ...", max_length=200
                    ),
                ),
                ("timezone", models.CharField(default="UTC", max_length=64)),
                ("args", models.JSONField(blank=True, default=list)),
                ("kwargs", models.JSONField(blank=True, default=dict)),
                (
                    "queue",
                    models.CharField(
                        blank=True, default="", help_text="Empty: the task's queue.", max_length=100
                    ),
                ),
                (
                    "priority",
                    models.IntegerField(blank=True, help_text="Empty: the task's.", null=True),
                ),
                (
                    "catch_up",
                    models.CharField(
                        choices=[
                            ("skip", "skip missed ticks"),
                            ("latest", "run the latest missed tick"),
                        ],
                        default="skip",
                        max_length=10,
                    ),
                ),
                (
                    "overlap",
                    models.CharField(
                        choices=[
                            ("allow", "allow"),
                            ("skip", "skip while the previous run is active"),
                        ],
                        default="allow",
                        max_length=10,
                    ),
                ),
                ("paused", models.BooleanField(default=False)),
                ("paused_at", models.DateTimeField(blank=True, null=True)),
                ("paused_by", models.CharField(blank=True, default="", max_length=150)),
                (
                    "source",
                    models.CharField(
                        choices=[("code", "code"), ("admin", "admin")],
                        default="admin",
                        max_length=10,
                    ),
                ),
                ("missing_from_code_since", models.DateTimeField(blank=True, null=True)),
                ("next_run_at", models.DateTimeField(blank=True, null=True)),
                ("last_run_at", models.DateTimeField(blank=True, null=True)),
                ("last_job_id", models.BigIntegerField(blank=True, null=True)),
                ("last_outcome", models.CharField(blank=True, default="", max_length=200)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "db_table": "django_jobs_schedule",
                "ordering": ["name"],
                "permissions": [
                    ("pause_schedule", "Can pause and resume schedules"),
                    ("run_schedule", "Can run a schedule now"),
                ],
                "indexes": [
                    models.Index(
                        condition=models.Q(
                            ("missing_from_code_since__isnull", True), ("paused", False)
                        ),
                        fields=["next_run_at"],
                        name="schedule_due_idx",
                    )
                ],
            },
        ),
        migrations.CreateModel(
            name="ScheduleTick",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("fire_at", models.DateTimeField()),
                ("job_id", models.BigIntegerField(blank=True, null=True)),
                ("outcome", models.CharField(max_length=100)),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "schedule",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="ticks",
                        to="django_jobs.schedule",
                    ),
                ),
            ],
            options={
                "db_table": "django_jobs_schedule_tick",
                "ordering": ["-fire_at"],
                "indexes": [models.Index(fields=["created_at"], name="schedule_tick_created_idx")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("schedule", "fire_at"), name="schedule_tick_once"
                    )
                ],
            },
        ),
        migrations.RunSQL(VIEW, "DROP VIEW IF EXISTS django_jobs_schedules"),
    ]
