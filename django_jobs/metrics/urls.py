"""``path("metrics/", include("django_jobs.metrics.urls"))``: the Prometheus endpoint."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.urls import path

try:
    from django_jobs.metrics import views
except ImportError as exc:  # pragma: no cover - depends on what is installed
    if exc.name != "prometheus_client":
        raise
    raise ImproperlyConfigured(
        "django_jobs.metrics needs the Prometheus client: pip install 'django-pgjobs[prometheus]'"
    ) from exc

app_name = "django_jobs_metrics"
urlpatterns = [path("", views.metrics, name="metrics")]
