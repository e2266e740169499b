"""The API's token cache: grants and refusals kept apart, the least recently used out, so that
a flood of made-up tokens never pushes out the fleet's grants."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import pytest
from django.db import DatabaseError, connection
from django.http import HttpRequest

from django_jobs.api import authentication, thread_pool
from django_jobs.api.protocol import ApiError
from django_jobs.store import claiming
from django_jobs.store.sql import query
from django_jobs.tokens import auth
from django_jobs.tokens.auth import Fresh, TokenCache
from tests.conftest import connect
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db


def test_made_up_tokens_push_out_made_up_tokens_never_the_grants_in_use() -> None:
    cache = TokenCache(entries=5)
    _, used = auth.create("used", ["*"])
    _, idle = auth.create("idle", ["*"])
    assert cache.lookup(used) is not None and cache.lookup(idle) is not None
    made_up = [f"djt_{secrets.token_urlsafe(32)}" for _ in range(50)]
    for n, token in enumerate(made_up):
        assert cache.lookup(token) is None
        assert cache.size()[1] <= 5
        if n % 10 == 0:
            assert isinstance(cache.peek(used), Fresh)  # in use: the last to go
    assert isinstance(cache.peek(used), Fresh) and isinstance(cache.peek(idle), Fresh)
    assert cache.peek(made_up[-1]) is None  # refused lately: no lookup
    assert cache.peek(made_up[0]) is TokenCache.MISS  # pushed out by the later ones
    # More grants than it keeps: the least recently used goes, not all of them at once.
    others = [auth.create(f"other-{n}", ["*"])[1] for n in range(4)]
    for token in others:
        cache.peek(used)
        assert cache.lookup(token) is not None
    assert cache.size()[0] == 5
    assert isinstance(cache.peek(used), Fresh)
    assert cache.peek(idle) is TokenCache.MISS
    assert all(isinstance(cache.peek(token), Fresh) for token in others)


@pytest.mark.django_db(transaction=True)
def test_a_known_token_is_used_while_its_table_is_locked_and_refused_once_revoked(
    monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # Short clocks: a grant is old after 0.3 s, and a lock is waited on for 0.3 s.
    monkeypatch.setattr(auth, "CACHE_SECONDS", 0.3)
    monkeypatch.setattr(authentication, "CACHE_SECONDS", 0.3)
    settings.JOBS_LOCK_TIMEOUT_MS = 300
    auth.cache.forget()
    authentication.failures.forget()
    row, secret = auth.create("locked-out", ["*"])

    def request(token: str) -> HttpRequest:
        made = HttpRequest()
        made.META = {"HTTP_AUTHORIZATION": f"Bearer {token}", "REMOTE_ADDR": "10.1.1.1"}
        return made

    async def scenario() -> None:
        assert (await authentication.authenticate(request(secret), "10.1.1.1")).id == row.id
        with connect() as locker:
            locker.execute("BEGIN")
            locker.execute("LOCK TABLE django_jobs_api_token IN ACCESS EXCLUSIVE MODE")
            await asyncio.sleep(0.4)  # the grant is old now
            # It waits for the token's read at most STALE_WAIT (here the read's 0.3 s lock
            # timeout ends it first); one that waited for the lock to go would wait for the
            # COMMIT below, that is forever: the bound turns that into a failure.
            grant = await asyncio.wait_for(
                authentication.authenticate(request(secret), "10.1.1.1"),
                authentication.STALE_WAIT + BUSY_MACHINE_MARGIN,
            )
            assert grant.id == row.id
            with pytest.raises(DatabaseError):  # an unknown token cannot be read: 503
                await authentication.authenticate(request("djt_" + "x" * 43), "10.1.1.1")
            locker.execute("COMMIT")
        await thread_pool.run(auth.revoke, [row.id])
        await asyncio.sleep(0.4)
        with pytest.raises(ApiError) as refused:
            await authentication.authenticate(request(secret), "10.1.1.1")
        assert refused.value.status == 401

    try:
        asyncio.run(scenario())
    finally:
        thread_pool.shutdown()
        auth.cache.forget()


@pytest.mark.django_db
def test_the_ticks_ready_check_reads_a_few_pages_a_queue_not_every_job() -> None:
    # 20,000 finished jobs and 5,000 delayed ones on the queues asked about, and two ready.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_jobs_job (task, queue, state, finished_at)"
            " SELECT 'tests.noop', 'q' || (n % 300), 'done', now()"
            " FROM generate_series(1, 20000) AS n"
        )
        cursor.execute(
            "INSERT INTO django_jobs_job (task, queue, state, run_after)"
            " SELECT 'tests.noop', 'q' || (n % 300), 'pending', now() + interval '1 hour'"
            " FROM generate_series(1, 5000) AS n"
        )
        cursor.execute(
            "INSERT INTO django_jobs_job (task, queue, state) VALUES"
            " ('tests.noop', 'q7', 'pending'), ('tests.noop', 'q300', 'pending')"
        )
        cursor.execute("ANALYZE django_jobs_job")
        queues = [f"q{n}" for n in range(300)]
        assert claiming.ready_queues(cursor, queues, False) == {"q7"}
        assert claiming.ready_queues(cursor, queues, True) == {"q7", ""}
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("ready_queues"),
            {"queues": queues, "any": True},
        )
        plan = cursor.fetchone()[0][0]["Plan"]
    buffers = plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)
    assert buffers < 2500, buffers  # index probes, not the 25,000 rows
