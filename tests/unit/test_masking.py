"""Masking secrets in text a job controls: the same results as the reference patterns, in time
linear in the text, whatever the text."""

from __future__ import annotations

import random
import re
import time

import pytest

from django_jobs.conf import DEFAULT_SENSITIVE_KEYS
from django_jobs.sanitize import AUTH_SCHEME, MASK, QUOTED, mask_text
from tests.timing import CPU_BOUND
from tests.unit.helpers import ADVERSARIAL

KEYS = tuple(k.lower() for k in DEFAULT_SENSITIVE_KEYS)


def reference_mask(text: str) -> str:
    """The masking rules as three plain regexes: what mask_text must do, in quadratic time on
    some inputs (only for short texts here)."""
    keys = "|".join(re.escape(k) for k in KEYS)
    key_value = re.compile(
        rf"""(?i)(["']?[\w-]*(?:{keys})[\w-]*["']?\]?\s*[:=]=?\s*)"""
        rf"""({QUOTED}|(?:{AUTH_SCHEME})?[^\s,;)}}\]]+)"""
    )
    url = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^/\s:@]*:)([^@\s/]+)(@)")
    bearer = re.compile(r"(?i)(bearer\s+)([a-z0-9._~+/=-]+)")
    text = key_value.sub(lambda m: m.group(1) + MASK, text)
    text = url.sub(lambda m: m.group(1) + MASK + m.group(3), text)
    return bearer.sub(lambda m: m.group(1) + MASK, text)


PIECES = [
    "password", "PassWord", "api_key", "token", "secret", "x", "ab", "-", "_", "9", "é",
    "=", "==", ":", " ", "  ", "\n", "\t", '"', "'", "\\", "]", "[", ",", ";", ")", "}", "@",
    "/", "://", "http", "postgres", "a+b.c-d", "Bearer ", "basic ", "user", "pw", ".", "+",
]  # fmt: skip


def random_text(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14)))


@pytest.mark.parametrize(
    "text",
    [
        "password=hunter2",
        "--password=hunter2 --user=bob",
        '{"api_key": "abc\\"def", "name": "x"}',
        "headers['Authorization'] = 'Bearer abc.def'",
        "Authorization: Basic dXNlcjpwdw==",
        "postgres://bob:s3cret@db:5432/app and http://x:y@h",
        "a://b://user:pw@h",
        "my_secret_value: 42, other: 1",
        "tokens = [1, 2]",
        "nothing to see here",
    ],
)
def test_masks_like_the_reference_on_known_secrets(text: str) -> None:
    assert mask_text(text) == reference_mask(text)


def test_masks_like_the_reference_on_random_text() -> None:
    rng = random.Random(20261202)
    for _ in range(20_000):
        text = random_text(rng)
        assert mask_text(text) == reference_mask(text), text


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_masking_64_kib_of_adversarial_text_takes_linear_time(name: str) -> None:
    # The old single-regex masking took minutes on some of these (quadratic backtracking); a
    # linear scan takes milliseconds (bench/masking.py measures the real figure). Counted in this
    # thread's CPU time, which other processes competing for the cores do not add to.
    text = ADVERSARIAL[name]
    started = time.thread_time()
    mask_text(text)
    assert time.thread_time() - started < CPU_BOUND
