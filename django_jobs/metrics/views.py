"""The metrics page: Prometheus' text format (or OpenMetrics, when the scraper asks for it),
GET and HEAD only, behind :mod:`django_jobs.metrics.access`."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import choose_encoder

from django_jobs.exceptions import DatabaseUnreachable, JobTablesMissing
from django_jobs.metrics import access, collect

logger = logging.getLogger("django_jobs.metrics")


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    refused = access.refusal(request)
    if refused is not None:
        return refused
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    try:
        registry = collect.registry()
    except (DatabaseUnreachable, JobTablesMissing) as exc:
        # The server's trouble, not the scraper's: Prometheus records the scrape as failed.
        logger.warning("metrics: %s", exc)
        return JsonResponse({"error": str(exc)}, status=503)
    response = HttpResponse(encoder(registry), content_type=content_type)
    response["Cache-Control"] = "no-store"
    return response
