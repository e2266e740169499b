"""The metrics page: Prometheus' text format (or OpenMetrics, when the scraper asks for it),
GET and HEAD only, behind :mod:`django_jobs.metrics.access`."""

from __future__ import annotations

import logging

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest

from django_jobs.exceptions import DatabaseUnreachable, JobTablesMissing
from django_jobs.metrics import access, collect

logger = logging.getLogger("django_jobs.metrics")

SAFE_METHODS = ("GET", "HEAD")


@csrf_exempt  # it changes nothing; any other method gets the JSON 405 below, not a CSRF page
def metrics(request: HttpRequest) -> HttpResponse:
    if request.method not in SAFE_METHODS:
        response = JsonResponse(
            {"error": f"{request.method} is not served here: GET the page", "field": "method"},
            status=405,
        )
        response["Allow"] = ", ".join(SAFE_METHODS)
        return response
    try:
        refused = access.refusal(request)
    except ImproperlyConfigured as exc:
        # The server's settings, not the scraper's request: `manage.py check` reports them.
        logger.error("metrics: %s", exc)
        return JsonResponse({"error": f"the metrics page is misconfigured: {exc}"}, status=500)
    if refused is not None:
        return refused
    try:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    except Exception:
        encoder, content_type = generate_latest, CONTENT_TYPE_LATEST
    try:
        registry = collect.registry()
    except (DatabaseUnreachable, JobTablesMissing) as exc:
        # The server's trouble, not the scraper's: Prometheus records the scrape as failed.
        logger.warning("metrics: %s", exc)
        return JsonResponse({"error": str(exc)}, status=503)
    page = HttpResponse(encoder(registry), content_type=content_type)
    page["Cache-Control"] = "no-store"
    return page
