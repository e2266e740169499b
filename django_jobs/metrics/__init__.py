"""The Prometheus endpoint: ``path("metrics/", include("django_jobs.metrics.urls"))``.

Every number comes from PostgreSQL (:mod:`django_jobs.metrics.collect`), none from the memory of
the process that answers, so any web process answers the same and a restart resets nothing; the
page is rendered with the official ``prometheus_client`` (the ``prometheus`` extra: ``pip install
'django-pgjobs[prometheus]'``). Who may read it: :mod:`django_jobs.metrics.access`.
"""
