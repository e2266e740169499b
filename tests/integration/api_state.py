"""What the HTTP API keeps in its process between requests, reset around the tests that serve
it: each test starts with no cached token, no counted authentication failure and no recent
worker registration, and the API's thread pool and long-poll dispatcher stop with the module.

A test module takes both by importing them (pytest finds fixtures in a module's namespace)::

    from tests.integration.api_state import api_pool, fresh_caches  # noqa: F401
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from django_jobs.api import authentication, thread_pool
from django_jobs.api.operations import registrations
from django_jobs.api.waiting import dispatcher
from django_jobs.tokens import auth


@pytest.fixture(autouse=True, scope="module")
def api_pool() -> Iterator[None]:
    yield
    dispatcher.stop()
    thread_pool.shutdown()


@pytest.fixture(autouse=True)
def fresh_caches() -> Iterator[None]:
    auth.cache.forget()
    authentication.failures.forget()
    registrations._at.clear()
    yield
