"""Fixtures shared by the system tests (what they share that is not a fixture is in
``tests/system/helpers.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.conftest import ApiServer
from tests.crashable import CrashableCluster, running_cluster
from tests.system.helpers import FAST_API_WORKER

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
