"""The HTTP API: workers without a database connection, in any language.

Mounted by the project (``path("jobs/api/", include("django_jobs.api.urls"))``) and served by
its ASGI server, it lets a worker claim, heartbeat, finish, release and spawn jobs, and a token
allowed to enqueue jobs. The contract is docs/http-api.md; the modules:

- :mod:`~django_jobs.api.views`: the endpoints;
- :mod:`~django_jobs.api.protocol`: request bodies read and checked, answers written;
- :mod:`~django_jobs.api.operations`: what each endpoint does in the database;
- :mod:`~django_jobs.tokens.auth`: tokens, stored as hashes and cached briefly;
- :mod:`~django_jobs.api.thread_pool`: the few connections every statement runs on;
- :mod:`~django_jobs.api.waiting`: long polling, one LISTEN per process, no herd.
"""
