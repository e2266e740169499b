"""The job list's filters. Each offers choices known in advance (states, configured queues,
registered tasks, time ranges), never a ``SELECT DISTINCT`` over the table.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest

from django_jobs.admin.listing import estimated_count, job_id, ready, scheduled
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


def state_choices() -> list[tuple[str, str]]:
    """The states, with ``scheduled`` after ``pending``."""
    choices = list(State.choices)
    at = choices.index((State.PENDING.value, State.PENDING.label))
    choices.insert(at + 1, (StateFilter.SCHEDULED, "Scheduled"))
    return choices


class StateFilter(FixedChoicesFilter):
    """The job's state, with pending split in two: ``pending`` is ready to run now, and
    ``scheduled`` waits for its ``run_after`` (by the database's clock)."""

    title = parameter_name = field = "state"
    SCHEDULED = "scheduled"

    def options(self) -> list[tuple[str, str]]:
        return state_choices()

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        value = self.value()
        return self.filtered(queryset, value) if value else queryset

    @classmethod
    def filtered(cls, queryset: QuerySet[Job], value: str) -> QuerySet[Job]:
        if value == cls.SCHEDULED:
            return queryset.filter(scheduled())
        if value == State.PENDING:
            return queryset.filter(ready())
        return queryset.filter(state=value)


@dataclasses.dataclass(frozen=True)
class StateTab:
    """One tab above the list: a state, how many jobs are in it, and the list filtered on it."""

    state: str
    label: str
    count: int
    exact: bool
    url: str
    selected: bool

    @property
    def shown_count(self) -> str:
        return f"{self.count:,}" if self.exact else f"about {self.count:,}"


def state_tabs(request: HttpRequest, changelist: Any) -> list[StateTab]:
    """A tab for every state (scheduled apart from pending), with the jobs in it among those the
    list's other filters and its search let through: the selected state narrows the list, never
    its tabs. Each count is exact up to :data:`~django_jobs.admin.listing.EXACT_LIMIT` (a count
    that stops there), else the planner's estimate, labelled "about". job_admin_state_idx serves
    every state but done, whose rows are most of the table, so its count stops early.

    ``changelist`` is the list's ``ChangeList``, whose rows are already counted: with no state
    selected, the "All" tab takes that count rather than taking it again."""
    current = request.GET.get(StateFilter.parameter_name, "")
    others = request.GET.copy()
    for name in (StateFilter.parameter_name, "p"):
        others.pop(name, None)
    if current:
        scope = changelist.get_queryset(request, exclude_parameters=[StateFilter.parameter_name])
        everything = estimated_count(scope)
    else:
        scope = changelist.queryset
        everything = (changelist.result_count, not changelist.paginator.estimated)
    tabs = [StateTab("", "All", *everything, _url(others, ""), not current)]
    for value, label in state_choices():
        queryset = StateFilter.filtered(scope, value)
        tabs.append(
            StateTab(
                value, label, *estimated_count(queryset), _url(others, value), current == value
            )
        )
    return tabs


def _url(query: Any, state: str) -> str:
    query = query.copy()
    if state:
        query[StateFilter.parameter_name] = state
    return "?" + query.urlencode() if query else "?"


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
