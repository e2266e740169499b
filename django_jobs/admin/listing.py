"""The job list's rows: which columns it fetches, how it searches and counts, and which lookups
its query string may hold. None of it reads the whole table: the count is estimated past
:attr:`EstimatedCountPaginator.EXACT_LIMIT` rows (and then labelled "about"), and a search is an
exact id, a prefix or an exact key, each served by an index, or an argument value
(``key=value``), looked for among the newest :data:`ARGUMENT_SEARCH_DEPTH` jobs only: no index
covers the payloads, and one would be written by every claim.
"""

from __future__ import annotations

import json
import math
import re
from typing import cast

from django.contrib import admin, messages
from django.core.paginator import Paginator
from django.db.models import BooleanField, ExpressionWrapper, Max, Q, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.functional import cached_property

from django_jobs.admin.masking import MASKED_FIELDS
from django_jobs.models.job import Job
from django_jobs.sanitize import is_sensitive, mask_text
from django_jobs.states import State

#: Up to this many rows a count is exact (a ``LIMIT`` count); past it, the planner's estimate.
EXACT_LIMIT = 10_000


def estimated_count(queryset: QuerySet[Job]) -> tuple[int, bool]:
    """How many rows ``queryset`` has, and whether that is exact: exact up to
    :data:`EXACT_LIMIT` (a count that stops there), else the planner's estimate, so that no
    count reads a huge table through."""
    exact = queryset.order_by()[: EXACT_LIMIT + 1].count()
    if exact <= EXACT_LIMIT:
        return exact, True
    plan = json.loads(queryset.order_by().explain(format="json"))
    return max(int(plan[0]["Plan"]["Plan Rows"]), exact), False


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to ``EXACT_LIMIT`` rows (a cheap ``LIMIT`` count), and beyond that
    uses the planner's estimate, so no page of a huge list runs a full ``COUNT(*)``. An
    estimate is shown as one ("about 940,000 jobs", see ``pagination.html``)."""

    EXACT_LIMIT = EXACT_LIMIT

    @cached_property
    def estimated(self) -> bool:
        return not self._counted[1]

    @cached_property
    def _counted(self) -> tuple[int, bool]:
        return estimated_count(cast("QuerySet[Job]", self.object_list))  # the admin pages one

    @cached_property
    def count(self) -> int:
        return self._counted[0]

    @property
    def shown_count(self) -> str:
        """The count as the list shows it: ``"about 940,000"`` when estimated."""
        return f"about {self.count:,}" if self.estimated else f"{self.count:,}"


def scheduled() -> Q:
    """Pending jobs whose ``run_after`` is still ahead, by the database's clock: not ready yet."""
    return Q(state=State.PENDING, run_after__gt=Now())


def ready() -> Q:
    """Pending jobs that may be claimed now."""
    return Q(state=State.PENDING, run_after__lte=Now())


#: An argument search (``key=value``) looks at the newest this many jobs only, by id.
ARGUMENT_SEARCH_DEPTH = 100_000

#: The longest search term taken; a longer one finds nothing.
MAX_TERM = 500


class ArgumentTerm:
    """A search term ``key=value``: jobs whose keyword argument ``key`` is ``value`` (a JSON
    number, ``true``/``false``/``null`` or a string, quoted or not), or whose positional
    arguments hold it. ``refused`` says why a term cannot be searched, if it cannot."""

    def __init__(self, term: str) -> None:
        key, _, text = term.partition("=")
        self.key = key.strip()
        self.values: list[object] = [text.strip()]
        self.refused = ""
        if is_sensitive(self.key) or self.key in MASKED_FIELDS:
            self.refused = f"The argument {self.key!r} is masked: it cannot be searched."
            return
        if mask_text(text) != text:
            self.refused = "That value would be masked: it cannot be searched."
            return
        try:
            parsed = json.loads(text)
        except ValueError:
            return
        if isinstance(parsed, float) and not math.isfinite(parsed):
            return  # JSON has no NaN or Infinity: searched as the text it is
        if isinstance(parsed, str) and not storable(parsed):
            self.values = []  # "\ud800" or "\u0000": no stored payload holds one
        elif isinstance(parsed, (str, int, float, bool)) or parsed is None:
            self.values = [parsed] if isinstance(parsed, str) else [parsed, text.strip()]

    @staticmethod
    def matches(term: str) -> bool:
        """Whether ``term`` reads as ``key=value``, with a key such as ``report_id``."""
        key, equals, _ = term.partition("=")
        key = key.strip()
        return bool(equals) and bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}", key))

    def condition(self) -> Q:
        condition = Q(pk__in=[])  # matches nothing, for a term without a value to look for
        for value in self.values:
            condition |= Q(kwargs__contains={self.key: value}) | Q(args__contains=[value])
        return condition


#: The largest id a job can have (``id`` is a bigint).
MAX_JOB_ID = 2**63 - 1

#: The job's columns the list's query string may filter on, beside the list's own filters: none
#: that is masked on the job page (see :meth:`JobList.lookup_allowed`).
FILTERABLE = frozenset(
    {"id", "pk", "task", "queue", "priority", "state", "attempt", "max_attempts", "worker_id",
     "unique_key", "run_after", "created_at", "started_at", "finished_at", "expires_at",
     "parent", "parent_id", "cancel_requested", "concurrency_key", "rate_key"}
)  # fmt: skip
#: The lookups the list's query string may use on them.
FILTER_LOOKUPS = frozenset(
    {"exact", "iexact", "in", "isnull", "gt", "gte", "lt", "lte", "startswith", "istartswith"}
)


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
        "error",
        "run_after",
        "created_at",
        "started_at",
        "finished_at",
        "cancel_requested",
        "progress_done",
        "progress_total",
        "progress_attempt",
    ]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # ``is_scheduled``: pending with ``run_after`` ahead, by the database's clock.
        queryset = (
            super()
            .get_queryset(request)
            .annotate(is_scheduled=ExpressionWrapper(scheduled(), output_field=BooleanField()))
        )
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
        if not storable(term) or len(term) > MAX_TERM:
            return queryset.none(), False
        if ArgumentTerm.matches(term):
            return self.argument_search(request, queryset, ArgumentTerm(term)), False
        condition = Q(task__startswith=term) | Q(worker_id__startswith=term) | Q(unique_key=term)
        if (pk := job_id(term)) is not None:
            condition |= Q(pk=pk)
        return queryset.filter(condition), False

    def argument_search(
        self, request: HttpRequest, queryset: QuerySet[Job], term: ArgumentTerm
    ) -> QuerySet[Job]:
        """Jobs among the newest :data:`ARGUMENT_SEARCH_DEPTH` whose arguments hold the term's
        value: a backward walk of the primary key, bounded by id, testing each row's payload
        (no index covers it)."""
        if term.refused:
            # The state tabs search again (state_tabs): the operator is told once.
            if not getattr(request, "_dj_search_refused", False):
                messages.warning(request, term.refused, fail_silently=True)
                request._dj_search_refused = True  # type: ignore[attr-defined]
            return queryset.none()
        newest = Job.objects.aggregate(newest=Max("id"))["newest"] or 0
        return queryset.filter(term.condition(), id__gt=newest - ARGUMENT_SEARCH_DEPTH)

    #: Fields the job page shows masked, or not at all: never filtered on.
    MASKED_FIELDS = MASKED_FIELDS

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest) -> bool:
        """Every parameter of the list's query string, the filters' own included, comes here;
        what it refuses is answered with a 400.

        Beside its own filters, the list takes a lookup of :data:`FILTER_LOOKUPS` on a column
        of :data:`FILTERABLE` (``?priority__gte=1``, ``?worker_id__startswith=pod-7``) and
        nothing else. Django would take any column and any lookup: a filter on a masked value
        (``?kwargs__password__startswith=h``, ``?cursors__token__value__startswith=s``) would
        reveal it a letter at a time, and a lookup such as ``__regex`` or ``__range`` fails in
        the database on a value typed in. A value PostgreSQL cannot hold would fail in the
        driver."""
        if not storable(value):
            return False
        filters = {getattr(f, "parameter_name", f) for f in self.get_list_filter(request)}
        if lookup not in filters:
            column, _, rest = lookup.partition(LOOKUP_SEP)
            if column not in FILTERABLE or (rest and rest not in FILTER_LOOKUPS):
                return False
        return super().lookup_allowed(lookup, value, request)
