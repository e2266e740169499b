"""The API's token cache: grants and refusals kept apart, the least recently used out, so that
a flood of made-up tokens never pushes out the fleet's grants."""

from __future__ import annotations

import secrets

import pytest

from django_jobs.tokens import auth
from django_jobs.tokens.auth import Fresh, TokenCache

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
