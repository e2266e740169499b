"""The job list's filters. Each offers choices known in advance (states, configured queues,
registered tasks, time ranges), never a ``SELECT DISTINCT`` over the table.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from django_jobs.admin.listing import job_id
from django_jobs.models.job import Job
from django_jobs.registry import registry
from django_jobs.states import State


class FixedChoicesFilter(admin.SimpleListFilter):
    """Filter on one column with choices known in advance: never ``SELECT DISTINCT``."""

    field = ""

    def options(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return self.options()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class StateFilter(FixedChoicesFilter):
    title = parameter_name = field = "state"

    def options(self) -> list[tuple[str, str]]:
        return list(State.choices)


class QueueFilter(FixedChoicesFilter):
    title = parameter_name = field = "queue"

    def options(self) -> list[tuple[str, str]]:
        return [(q, q) for q in registry.queues()]


class TaskFilter(FixedChoicesFilter):
    title = parameter_name = field = "task"

    def options(self) -> list[tuple[str, str]]:
        return [(name, name) for name in registry.names()]


class RecentFilter(admin.SimpleListFilter):
    """Time ranges counted back from the database's clock."""

    field = "created_at"
    RANGES = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
    LABELS = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days"}

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return list(self.LABELS.items())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        if value not in self.RANGES:
            return queryset
        return queryset.filter(**{f"{self.field}__gte": Now() - self.RANGES[value]})


class CreatedFilter(RecentFilter):
    title = "created"
    parameter_name = "created"
    field = "created_at"


class FinishedFilter(RecentFilter):
    title = "finished"
    parameter_name = "finished"
    field = "finished_at"


class ParentFilter(admin.SimpleListFilter):
    """``?parent=<id>``: the children of a job (linked from its page; no choices shown)."""

    title = "parent"
    parameter_name = "parent"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return []

    def has_output(self) -> bool:
        # Django drops a filter without choices, unapplied: this one applies when it is in the
        # query string, and is shown then, to be cleared.
        return self.value() is not None

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        parent = job_id(self.value() or "")
        return queryset if parent is None else queryset.filter(parent_id=parent)
