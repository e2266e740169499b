"""The job list's rows: which columns it fetches, how it searches and counts, and which lookups
its query string may hold. None of it reads the whole table: the count is estimated past
:attr:`EstimatedCountPaginator.EXACT_LIMIT` rows, and a search is an exact id, a prefix or an
exact key, each served by an index.
"""

from __future__ import annotations

import json
import re
from typing import cast

from django.contrib import admin
from django.core.paginator import Paginator
from django.db.models import Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest
from django.utils.functional import cached_property

from django_jobs.admin.masking import MASKED_FIELDS
from django_jobs.models.job import Job


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to ``EXACT_LIMIT`` rows (a cheap ``LIMIT`` count), and beyond that
    uses the planner's estimate, so no page of a huge list runs a full ``COUNT(*)``."""

    EXACT_LIMIT = 10_000

    @cached_property
    def count(self) -> int:
        queryset = cast("QuerySet[Job]", self.object_list)  # the admin pages a queryset
        exact = queryset.order_by()[: self.EXACT_LIMIT + 1].count()
        if exact <= self.EXACT_LIMIT:
            return exact
        plan = json.loads(queryset.order_by().explain(format="json"))
        return max(int(plan[0]["Plan"]["Plan Rows"]), exact)


#: The largest id a job can have (``id`` is a bigint).
MAX_JOB_ID = 2**63 - 1


def job_id(text: str) -> int | None:
    """``text`` read as a job id (``"42"`` or ``"#42"``), or None. Only ASCII digits count:
    ``str.isdigit`` also accepts ``"²"``, which ``int()`` refuses, and ``int()`` accepts ``"٣"``."""
    digits = text.removeprefix("#")
    if not re.fullmatch(r"[0-9]{1,19}", digits) or int(digits) > MAX_JOB_ID:
        return None
    return int(digits)


def storable(text: str) -> bool:
    """Whether a PostgreSQL text column could hold ``text``: none holds a NUL character or a lone
    surrogate, so a term with one matches nothing (and the driver would refuse to send it)."""
    return "\x00" not in text and not re.search("[\ud800-\udfff]", text)


class JobList(admin.ModelAdmin):
    """The part of :class:`~django_jobs.admin.JobAdmin` that picks the list's rows."""

    LIST_FIELDS = [
        "id",
        "task",
        "state",
        "queue",
        "priority",
        "attempt",
        "max_attempts",
        "worker_id",
        "created_at",
        "started_at",
        "finished_at",
        "progress_done",
        "progress_total",
        "progress_attempt",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        queryset = super().get_queryset(request)
        match = request.resolver_match
        if match is not None and match.url_name and match.url_name.endswith("changelist"):
            # The list never shows the JSON payloads: don't fetch them.
            queryset = queryset.only(*self.LIST_FIELDS)
        return queryset

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Job], search_term: str
    ) -> tuple[QuerySet[Job], bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        if not storable(term):
            return queryset.none(), False
        condition = Q(task__startswith=term) | Q(worker_id__startswith=term) | Q(unique_key=term)
        if (pk := job_id(term)) is not None:
            condition |= Q(pk=pk)
        return queryset.filter(condition), False

    #: Fields the job page shows masked, or not at all: never filtered on.
    MASKED_FIELDS = MASKED_FIELDS

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """Every parameter of the list's query string, the filters' own included, comes here;
        what it refuses is answered with a 400."""
        # Django lets the list be filtered on any column, but a filter on a masked value would
        # reveal it a letter at a time (?kwargs__password__startswith=h). (Lookups through a
        # relation it refuses itself.) A value PostgreSQL cannot hold would fail in the driver.
        if lookup.split(LOOKUP_SEP)[0] in self.MASKED_FIELDS or not storable(value):
            return False
        return super().lookup_allowed(lookup, value, request)
