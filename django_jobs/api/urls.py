"""The HTTP API's URLs, version 1. Mount them in the project's urls.py::

path("jobs/api/", include("django_jobs.api.urls")),
"""

from django.urls import path, re_path

from django_jobs.api import views

app_name = "django_jobs_api"

urlpatterns = [
    path("v1/claim", views.claim, name="claim"),
    path("v1/heartbeat", views.heartbeat, name="heartbeat"),
    path("v1/enqueue", views.enqueue, name="enqueue"),
    path("v1/jobs/<int:job_id>", views.job, name="job"),
    path("v1/jobs/<int:job_id>/heartbeat", views.job_heartbeat, name="job-heartbeat"),
    path("v1/jobs/<int:job_id>/finish", views.finish, name="finish"),
    path("v1/jobs/<int:job_id>/release", views.release, name="release"),
    path("v1/jobs/<int:job_id>/progress", views.progress, name="progress"),
    path("v1/jobs/<int:job_id>/outcome", views.outcome, name="outcome"),
    path("v1/jobs/<int:job_id>/spawn", views.spawn, name="spawn"),
    path("v1/jobs/<int:job_id>/steps", views.job_step, name="step"),
    path("v1/jobs/<int:job_id>/cursor", views.job_cursor, name="cursor"),
    # Any other path under the mount point: a JSON 404, not the project's page.
    re_path(r"^(?P<rest>.*)$", views.not_found, name="not-found"),
]
