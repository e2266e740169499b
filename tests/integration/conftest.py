"""Fixtures shared by the integration tests (what they share that is not a fixture is in
``tests/integration/helpers.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from tests.factories import UserFactory
from tests.integration.helpers import logged_in

# ---------------------------------------------------------------------- the HTTP API's state


@pytest.fixture(scope="module")
def api_pool() -> Iterator[None]:
    """The API's thread pool and long-poll dispatcher, stopped with the module."""
    yield
    from django_jobs.api import thread_pool
    from django_jobs.api.waiting import dispatcher

    dispatcher.stop()
    thread_pool.shutdown()


@pytest.fixture
def api_state(api_pool: None) -> None:
    """What the HTTP API keeps in its process between requests, reset: each test starts with no
    cached token, no counted authentication failure and no recent worker registration; and the
    API's pool stops with the module. A module that serves the API takes it for each test::

        pytestmark = [..., pytest.mark.usefixtures("api_state")]
    """
    from django_jobs.api import authentication
    from django_jobs.api.operations import registrations
    from django_jobs.tokens import auth

    auth.cache.forget()
    authentication.failures.forget()
    registrations._at.clear()


# ---------------------------------------------------------------------- users of the admin


@pytest.fixture
def client_options() -> dict[str, Any]:
    """The options of the test clients that ``superuser`` and ``staff`` log in
    (``Client(**client_options)``). A module overrides it where its clients differ, as the
    hostile ones do to get a server error as a 500 answer (``raise_request_exception=False``)."""
    return {}


@pytest.fixture
def superuser(client_options: dict[str, Any]) -> Client:
    """A test client logged in as a superuser, ``root``."""
    return logged_in(UserFactory(username="root", superuser=True), **client_options)


@pytest.fixture
def staff(client_options: dict[str, Any]) -> Callable[..., Client]:
    """``staff(*codenames)``: a test client logged in as a new staff user who has exactly the
    permissions named."""

    def staff(*codenames: str) -> Client:
        return logged_in(UserFactory(permissions=codenames), **client_options)

    return staff
