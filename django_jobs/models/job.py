"""The job table: one row per job, with its state, options, lease and progress.

The partial indexes here serve the hot statements in :mod:`django_jobs.store`; each
statement there names the index it relies on.
"""

from __future__ import annotations

from typing import Any

from django.db import connections, models
from django.db.models import Q
from django.db.models.functions import Now

from django_jobs.progress import Shown
from django_jobs.states import ACTIVE_STATES, TERMINAL_STATES, State


class TransactionNow(models.Func):
    """``now()``: the transaction's start time, the clock that claims compare ``run_after`` with.

    (Django's ``Now()`` is ``statement_timestamp()``, which is later inside a transaction.)
    """

    template = "now()"
    output_field = models.DateTimeField()


class Job(models.Model):
    State = State

    id = models.BigAutoField(primary_key=True)
    task = models.CharField(max_length=255, help_text="Registered name of the @job function.")
    queue = models.CharField(max_length=100, db_default="default")
    priority = models.SmallIntegerField(db_default=0, help_text="Higher runs first, -100..100.")
    state = models.CharField(max_length=16, choices=State.choices, db_default=State.PENDING)
    args = models.JSONField(db_default=models.Value([], models.JSONField()))
    kwargs = models.JSONField(db_default=models.Value({}, models.JSONField()))
    attempt = models.IntegerField(db_default=0, help_text="Claims so far, counted at the claim.")
    max_attempts = models.IntegerField(db_default=3)
    timeout = models.IntegerField(null=True, blank=True, help_text="Seconds; empty = no limit.")
    run_after = models.DateTimeField(db_default=TransactionNow())
    worker_id = models.CharField(max_length=200, null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(db_default="", blank=True, help_text="Summary of the last error.")
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="children",
        db_index=False,  # job_parent_idx, below: only children are indexed
    )
    unique_key = models.CharField(max_length=255, null=True, blank=True)
    cancel_requested = models.BooleanField(db_default=False)
    lease = models.UUIDField(
        null=True,
        blank=True,
        editable=False,
        help_text="Random token of the latest claim; every later write of that run is fenced on "
        "it. A server crash cannot roll it back into a value that is handed out again.",
    )
    parent_attempt = models.IntegerField(
        null=True,
        blank=True,
        help_text="The parent's attempt that spawned this job: a parent's outcome is decided by "
        "the children of its final attempt.",
    )
    task_missing_since = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When a worker first handed the job back because it has not registered the "
        "task (a rolling deploy, say). JOBS_UNKNOWN_TASK_TIMEOUT counts from here.",
    )

    # The progress a run reports (context.progress): written by its worker at most once per
    # JOBS_PROGRESS_INTERVAL, in place (no index covers these columns, so the update is HOT).
    # It belongs to the attempt numbered progress_attempt: a retry starts again from nothing.
    progress_done = models.FloatField(null=True, blank=True, editable=False)
    progress_total = models.FloatField(null=True, blank=True, editable=False)
    progress_message = models.TextField(db_default="", blank=True, editable=False)
    progress_updated_at = models.DateTimeField(null=True, blank=True, editable=False)
    progress_attempt = models.IntegerField(null=True, blank=True, editable=False)
    concurrency_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        editable=False,
        help_text="At most concurrency_limit running jobs share this key, across all workers.",
    )
    concurrency_limit = models.IntegerField(null=True, blank=True, editable=False)
    # A rate limit (rates.py): at most rate_limit starts of rate_key's jobs in any window of
    # rate_period seconds, counted in django_jobs_rate. All three NULL: no rate limit.
    rate_key = models.CharField(
        max_length=255,
        null=True,
        blank=True,
        editable=False,
        help_text="At most rate_limit attempts of jobs with this key start in any window of "
        "rate_period seconds, across all workers.",
    )
    rate_limit = models.IntegerField(null=True, blank=True, editable=False)
    rate_period = models.IntegerField(null=True, blank=True, editable=False)
    expires_at = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="A job that has not started by then is never claimed: it ends cancelled, as "
        "expired. Empty: no deadline.",
    )
    #: The job's cursors (``context.save_cursor``), by name: ``{"name": {"value": ..., "attempt":
    #: 2, "saved_at": "..."}}``, kept across attempts. Written in place with the run's progress
    #: (no index covers it, so the update stays HOT); NULL for a job that saved none.
    cursors = models.JSONField(null=True, blank=True, editable=False)
    trace_context = models.JSONField(
        null=True,
        blank=True,
        editable=False,
        help_text="The W3C trace context (traceparent, tracestate) of the span that enqueued the "
        "job, with OpenTelemetry installed; each run's span links to it. Empty: no span was "
        "active.",
    )

    class Meta:
        db_table = "django_jobs_job"
        ordering = ["-id"]
        permissions = [
            ("retry_job", "Can retry jobs"),
            ("cancel_job", "Can cancel jobs"),
            ("run_job_now", "Can run pending jobs now"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=[s.value for s in State]), name="job_state_valid"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=-100, priority__lte=100), name="job_priority_range"
            ),
            models.CheckConstraint(
                condition=Q(attempt__gte=0, max_attempts__gte=1), name="job_attempt_counts"
            ),
            models.CheckConstraint(
                condition=Q(attempt__lte=models.F("max_attempts")), name="job_attempt_le_max"
            ),
            models.CheckConstraint(
                condition=Q(timeout__isnull=True) | Q(timeout__gt=0), name="job_timeout_positive"
            ),
            models.CheckConstraint(
                condition=~Q(state=State.RUNNING)
                | Q(worker_id__isnull=False, started_at__isnull=False),
                name="job_running_has_worker",
            ),
            models.CheckConstraint(
                condition=~Q(state__in=sorted(TERMINAL_STATES)) | Q(finished_at__isnull=False),
                name="job_terminal_has_finished_at",
            ),
            models.CheckConstraint(
                condition=Q(concurrency_key__isnull=True, concurrency_limit__isnull=True)
                | Q(concurrency_key__isnull=False, concurrency_limit__gte=1),
                name="job_concurrency_limit_positive",
            ),
            models.CheckConstraint(
                condition=Q(
                    rate_key__isnull=True, rate_limit__isnull=True, rate_period__isnull=True
                )
                | Q(rate_key__isnull=False, rate_limit__gte=1, rate_period__gte=1),
                name="job_rate_limit_positive",
            ),
            # At most one active job per unique_key; see enqueue.py for how duplicates resolve.
            models.UniqueConstraint(
                fields=["unique_key"],
                condition=Q(unique_key__isnull=False, state__in=sorted(ACTIVE_STATES)),
                name="job_unique_key_active",
            ),
        ]
        indexes = [
            # A job's children: the finish's check for unfinished ones, fan-in, cascades. Only
            # children are in it, so a claim or finish of any other job costs it nothing.
            models.Index(
                "task",
                "task_missing_since",
                condition=Q(task_missing_since__isnull=False, state=State.PENDING),
                name="job_task_missing_idx",
            ),
            models.Index(
                fields=["parent"], condition=models.Q(parent__isnull=False), name="job_parent_idx"
            ),
            # Claim: an ordered scan that stops at the first unlocked ready row, of jobs without
            # a concurrency key only, so that no claim walks past the jobs that wait for a key's
            # slot (queues/controls.py). Any queue, then one named queue.
            models.Index(
                models.F("priority").desc(),
                "run_after",
                "id",
                name="job_claim_free_idx",
                condition=Q(state=State.PENDING, concurrency_key__isnull=True),
            ),
            models.Index(
                "queue",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="job_claim_free_queue_idx",
                condition=Q(state=State.PENDING, concurrency_key__isnull=True),
            ),
            # Jobs with a concurrency key, by (key, queue) and then in claim order: the claim
            # reads the first job of each (key, queue) that has a free slot.
            models.Index(
                "concurrency_key",
                "queue",
                models.F("priority").desc(),
                "run_after",
                "id",
                name="job_claim_key_idx",
                condition=Q(state=State.PENDING, concurrency_key__isnull=False),
            ),
            # The running jobs of a key, counted before a claim takes one of its slots.
            models.Index(
                "concurrency_key",
                name="job_running_key_idx",
                condition=Q(state=State.RUNNING, concurrency_key__isnull=False),
            ),
            # The expiry pass (store.expire_due): pending jobs with a deadline, soonest first.
            # Only those are in it, so jobs without a deadline cost it nothing.
            models.Index(
                "expires_at",
                name="job_expiry_idx",
                condition=Q(state=State.PENDING, expires_at__isnull=False),
            ),
            # Reaper, heartbeat checks and startup recovery: running jobs by worker.
            models.Index(
                "worker_id", name="job_running_worker_idx", condition=Q(state=State.RUNNING)
            ),
            # The reaper's repair (workflows.repair): waiting parents (attempt > 0), as few as
            # the workflows in flight, and waiting dependents (attempt 0) a page at a time in id
            # order, so that a pass reads a bounded slice of them, not every waiting job. Each
            # predicate is the statement's own, so that the planner knows how few rows match.
            models.Index(
                "id",
                name="job_waiting_parent_idx",
                condition=Q(state=State.WAITING, attempt__gt=0),
            ),
            models.Index(
                "id",
                name="job_waiting_dependent_idx",
                condition=Q(state=State.WAITING, attempt=0),
            ),
            # The reaper's stray_children: active children of a recorded attempt, by parent. Only
            # those are in it, so a pass does not walk the finished children of every workflow.
            models.Index(
                "parent",
                name="job_active_child_idx",
                condition=Q(
                    parent__isnull=False,
                    parent_attempt__isnull=False,
                    state__in=[State.WAITING, State.PENDING],
                ),
            ),
            # The django_jobs_queue_summary view: waiting jobs per queue, oldest first.
            models.Index(
                "queue", "created_at", name="job_waiting_idx", condition=Q(state=State.WAITING)
            ),
            # prunejobs: finished jobs in (finished_at, id) order, for keyset batches.
            models.Index(
                "finished_at",
                "id",
                name="job_finished_idx",
                condition=Q(state__in=sorted(TERMINAL_STATES)),
            ),
            # The admin's list: filters and searches that must stay fast at millions of rows
            # (bench/admin_pages.py). Jobs in a state other than done, newest first.
            models.Index(
                "state",
                models.F("id").desc(),
                name="job_admin_state_idx",
                condition=~Q(state=State.DONE),
            ),
            # Task filter (equality) and task-prefix search, newest first.
            models.Index(
                fields=["task", "id"],
                opclasses=["varchar_pattern_ops", "int8_ops"],
                name="job_admin_task_idx",
            ),
            # Worker-id prefix search.
            models.Index(
                fields=["worker_id"],
                opclasses=["varchar_pattern_ops"],
                name="job_admin_worker_idx",
                condition=Q(worker_id__isnull=False),
            ),
            # Unique-key search, finished jobs included.
            models.Index(
                "unique_key", name="job_admin_unique_key_idx", condition=Q(unique_key__isnull=False)
            ),
            # (Also job_created_brin, a BRIN index on created_at for "created in the last
            # hour/day/week", made by migration 0004 in SQL: Django's BrinIndex would require
            # django.contrib.postgres in INSTALLED_APPS.)
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.task} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def duration(self) -> Any:
        if self.started_at and self.finished_at:
            return self.finished_at - self.started_at
        return None

    def refresh(self) -> Job:
        self.refresh_from_db()
        return self

    # The operators' actions on one job, through the connection the row came from. They call
    # the store and workflows, a layer above the models (which import nothing of django_jobs but
    # the states and progress), imported when called; neither imports the models, so no import
    # circle closes.

    def cancel(self, reason: str = "cancelled") -> str | None:
        """Cancel this job and what hangs off it: a pending or waiting job ends at once, a
        running one is asked to stop (its worker stops it within a heartbeat interval); its
        descendants likewise, and its dependents once it has ended. Returns the job's state
        after the call, or ``None`` if it had already finished."""
        from django_jobs import workflows

        with connections[self._state.db or "default"].cursor() as cursor:
            changed = workflows.cancel_with_cascade(cursor, [self.pk], reason)
        self.refresh_from_db()
        return changed[0].state if changed else None

    def retry(self, *, from_start: bool = False) -> bool:
        """Requeue this job if it ended in error or was cancelled, with a fresh budget of
        attempts (its task's ``max_attempts``). It resumes from its recorded steps and cursors;
        ``from_start``: they are forgotten, and it runs again from the beginning. Returns False
        if its state does not allow it, a dependency is not done, or another active job holds
        its unique key."""
        from django_jobs import store
        from django_jobs.registry import registry

        budget = registry.max_attempts_for(self.task, self.max_attempts)
        with connections[self._state.db or "default"].cursor() as cursor:
            done = store.retry(cursor, self.pk, budget, from_start=from_start)
        self.refresh_from_db()
        return done

    def run_now(self) -> bool:
        """Make this pending job ready at once. Returns False if it is not pending."""
        from django_jobs import store

        with connections[self._state.db or "default"].cursor() as cursor:
            done = store.run_now(cursor, self.pk)
        self.refresh_from_db()
        return done

    @property
    def progress(self) -> Shown | None:
        """The progress its current attempt reported, if it reported any."""
        if self.progress_done is None or self.progress_attempt != self.attempt:
            return None
        return Shown(
            self.progress_done,
            self.progress_total,
            self.progress_message,
            self.progress_updated_at,
            self.started_at,
        )

    @property
    def dependencies(self) -> models.QuerySet[Job]:
        """The jobs this job waits for."""
        return Job.objects.filter(dependent_links__job=self).order_by("id")

    @property
    def dependents(self) -> models.QuerySet[Job]:
        """The jobs that wait for this job."""
        return Job.objects.filter(dependency_links__depends_on=self).order_by("id")

    @property
    def root(self) -> Job:
        """The topmost ancestor through ``parent`` (the job itself if it has no parent)."""
        job = self
        while job.parent_id is not None:
            job = Job.objects.get(pk=job.parent_id)
        return job


class Dashboard(Job):
    """The admin's dashboard page (no table of its own: it reads the operations views)."""

    class Meta:
        proxy = True
        verbose_name = verbose_name_plural = "dashboard"
        default_permissions = ()
