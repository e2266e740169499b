"""The ASGI application, for the HTTP API's long polling:
``uvicorn testproject.asgi:application``. Requests under /jobs/api/ go straight to the API's
views (django_jobs.api.asgi); the rest through Django's handler."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
django_application = get_asgi_application()

from django_jobs.api.asgi import with_api  # noqa: E402 - needs the apps loaded

application = with_api(django_application, prefix="/jobs/api/")
