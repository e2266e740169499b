from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs/api/", include("django_jobs.api.urls")),
    path("metrics/", include("django_jobs.metrics.urls")),
]
