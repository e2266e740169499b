"""Fixtures shared by the system tests (what they share that is not a fixture is in
``tests/system/helpers.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import CHROMIUM, ApiServer, connect, wait_for
from tests.crashable import CrashableCluster, running_cluster
from tests.factories import UserFactory
from tests.system.helpers import FAST_API_WORKER, PASSWORD

# ---------------------------------------------------------------------- a throwaway cluster


@pytest.fixture
def cluster_settings() -> dict[str, str]:
    """The server settings of the ``cluster`` fixture's cluster (``postgresql.conf``'s names and
    values); a module whose cluster needs others overrides this fixture."""
    return {}


@pytest.fixture
def cluster(cluster_settings: dict[str, str]) -> Iterator[CrashableCluster]:
    """A started throwaway PostgreSQL cluster for the test to crash, with ``cluster_settings``;
    destroyed at the end (the test is skipped where there are no PostgreSQL binaries)."""
    with running_cluster(cluster_settings or None) as cluster:
        yield cluster


# ---------------------------------------------------------------------- the HTTP API's server


@pytest.fixture
def api_server(start_api_server: Callable[..., ApiServer]) -> ApiServer:
    """The HTTP API served by uvicorn on the test database, its workers' timings
    :data:`~tests.system.helpers.FAST_API_WORKER`'s; stopped at the end."""
    return start_api_server(FAST_API_WORKER)


# ---------------------------------------------------------------------- the browser


@dataclass
class Chromium:
    browser: Any
    #: The event loop of Playwright's sync API, current in this thread only while a test uses
    #: the browser (see ``browser``).
    loop: asyncio.AbstractEventLoop


@pytest.fixture(scope="session")
def chromium() -> Iterator[Chromium]:
    """One headless Chromium (Debian's package, driven by Playwright) for the whole session;
    tests take it through ``browser``."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        loop = asyncio._get_running_loop()
        assert loop is not None, "Playwright's sync API runs its event loop in this thread"
        asyncio._set_running_loop(None)  # until a test takes the browser
        try:
            yield Chromium(browser, loop)
        finally:
            asyncio._set_running_loop(loop)
            browser.close()


@pytest.fixture
def browser(chromium: Chromium, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The session's Chromium for one test, which opens its own contexts
    (``browser.new_context(...)``): they are closed at the end of the test.

    Playwright's sync API runs an event loop in this thread. It is made current for the test
    only (it would otherwise stay current for every test after the first browser test, and
    Django would take their synchronous ORM calls for calls from async code), with
    ``DJANGO_ALLOW_ASYNC_UNSAFE`` set meanwhile: the ORM calls the tests make between browser
    steps are plain synchronous code. While the loop is current, Django keeps this thread's
    database connections apart from the others; they are closed at the end, before the test
    database is flushed (left open, the test database could not be dropped at the end of the
    run).
    """
    from django.db import connections

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    previous = asyncio._get_running_loop()
    asyncio._set_running_loop(chromium.loop)
    try:
        yield chromium.browser
    finally:
        try:
            for context in chromium.browser.contexts:
                context.close()
        finally:
            connections.close_all()
            asyncio._set_running_loop(previous)


@pytest.fixture(scope="session")
def live_server(
    request: pytest.FixtureRequest, django_db_setup: None, django_db_blocker: Any
) -> Iterator[Any]:
    """pytest-django's live server (its address from ``--liveserver`` or
    ``DJANGO_LIVE_TEST_SERVER_ADDRESS``, else ``localhost``), started once the test database is
    set up, and so stopped before it is dropped: stopping waits, ten seconds at most, until the
    threads that served its requests have closed their connections to the test database (they
    close them as the browser hangs up), for the database to be dropped."""
    from django.db import connections
    from pytest_django.live_server_helper import LiveServer

    address = (
        request.config.getvalue("liveserver")
        or os.environ.get("DJANGO_LIVE_TEST_SERVER_ADDRESS")
        or "localhost"
    )
    server = LiveServer(address)
    yield server
    server.stop()
    with django_db_blocker.unblock():
        connections.close_all()
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not _other_sessions(), timeout=10, interval=0.1)


def _other_sessions() -> int:
    """How many sessions other than this one are open on the test database."""
    with connect() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def operator() -> Any:
    """The console's user in the browser tests: a superuser, ``operator``, whose password is
    :data:`~tests.system.helpers.PASSWORD`."""
    return UserFactory(username="operator", superuser=True, password=PASSWORD)
