"""Fixtures shared by the system tests (what they share that is not a fixture is in
``tests/system/helpers.py``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import ApiServer
from tests.system.helpers import FAST_API_WORKER

# ---------------------------------------------------------------------- the HTTP API's server


@pytest.fixture
def api_server(start_api_server: Callable[..., ApiServer]) -> ApiServer:
    """The HTTP API served by uvicorn on the test database, its workers' timings
    :data:`~tests.system.helpers.FAST_API_WORKER`'s; stopped at the end."""
    return start_api_server(FAST_API_WORKER)
