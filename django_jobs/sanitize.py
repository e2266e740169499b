"""Masking secrets in what django-jobs stores and shows: tracebacks, error messages, arguments."""

from __future__ import annotations

import functools
import heapq
import re
import traceback as tb
from collections.abc import Generator
from typing import Any

from django_jobs.conf import sensitive_keys

MASK = "********"


def is_sensitive(key: str) -> bool:
    lowered = key.lower()
    return any(k in lowered for k in sensitive_keys())


def mask_value(value: Any) -> Any:
    """Return a copy of a JSON value with the values of sensitive keys masked, and the secrets
    :func:`mask_text` finds masked in its strings (``"--password=..."``, a database URL)."""
    if isinstance(value, dict):
        return {k: MASK if is_sensitive(str(k)) else mask_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(v) for v in value]
    if isinstance(value, str):
        return mask_text(value)
    return value


# Masking reads text that jobs write, so it must take time linear in the text whatever the text
# is: a job's 64 KiB log tail of hex digits must not freeze the process that masks it. A single
# regex such as ``[\w-]*(?:password)[\w-]*\s*=`` tries a match from every start in a long run
# of word characters and scans the run from each, which is quadratic. So the key names and the
# ``://`` of URLs are found first, by ``str.find`` or one regex pass, and only the text after
# each is matched, anchored there; each run of name characters is looked at once. The results
# are those of the plain patterns (tests/unit/test_masking.py checks them against each other).

# A quoted value: up to the closing quote of the same kind, past escaped quotes.
QUOTED = r""""(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'"""
# The scheme of an Authorization header, masked with its credentials: "Authorization: Basic
# dXNlcjpwdw==" must not keep the credentials because the scheme was taken for the value.
AUTH_SCHEME = r"(?:bearer|basic|digest|token|negotiate)\s+"

# After a key: the rest of its run of name characters, taken whole (possessive: a run is never
# scanned twice), an optional closing quote and bracket, ``=``, ``:`` or ``==``, then the value,
# masked: quoted, or up to white space or punctuation.
_KEY_TAIL = re.compile(
    rf"""(?i)[\w-]*+["']?\]?\s*[:=]=?\s*({QUOTED}|(?:{AUTH_SCHEME})?[^\s,;)}}\]]+)"""
)
# A run of key-name characters, and the characters of a URL scheme.
_NAME_RUN = re.compile(r"[\w-]+")
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789+.-")
# ``://``, the user, a colon, the password (masked) and ``@``: a URL with a password, if a
# scheme stands before it.
_USERINFO = re.compile(r"://([^/\s:@]*:)([^@\s/]+)@")
_BEARER = re.compile(r"(?i)(bearer\s+)([a-z0-9._~+/=-]+)")


@functools.lru_cache(maxsize=8)
def _key_finder(keys: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("(?i)" + "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True)))


def _key_hits(text: str, keys: tuple[str, ...]) -> Generator[tuple[int, int], int | None, None]:
    """Where a sensitive key occurs in ``text``, in order, as ``(start, end)``; the caller sends
    back the position before which it wants no more hits (the end of what it has looked at),
    so that a run of keys costs one ``str.find`` per key, not one step per occurrence.

    ``str.find`` on the lowered text runs at memory speed, unlike a case-blind regex alternation
    that tries every key at every position. Text whose lowering changes its length (a few
    Unicode letters) takes the regex."""
    lowered = text.lower()
    if len(lowered) != len(text):
        floor = 0
        for match in _key_finder(keys).finditer(text):
            if match.start() >= floor:
                floor = (yield match.start(), match.end()) or 0
        return
    heap = [(at, len(key), key) for key in keys if (at := lowered.find(key)) != -1]
    heapq.heapify(heap)
    while heap:
        at, length, key = heap[0]
        wanted = yield at, at + length
        floor = max(wanted or 0, at + 1)
        while heap and heap[0][0] < floor:
            _, length, key = heapq.heappop(heap)
            if (at := lowered.find(key, floor)) != -1:
                heapq.heappush(heap, (at, length, key))


def _end_of_name(text: str, index: int) -> int:
    """The end of the run of key-name characters at ``index``."""
    match = _NAME_RUN.match(text, index)
    return match.end() if match else index


def _mask_key_values(text: str, keys: tuple[str, ...]) -> str:
    """``key=value``, ``key: value``, ``"key": "value"``, ``key='value'``,
    ``headers["key"] = "value"``: the value masked, for every key name holding a sensitive key."""
    if not keys:
        return text
    out: list[str] = []
    done = 0  # text before this is copied or masked
    hits = _key_hits(text, keys)
    hit = next(hits, None)
    while hit is not None:
        tail = _KEY_TAIL.match(text, hit[1])
        if tail is not None:
            out.append(text[done : tail.start(1)])
            out.append(MASK)
            done = examined = tail.end()
        else:
            # Every key in this run of name characters gives the same answer: look at it once.
            examined = _end_of_name(text, hit[1])
        hit = _send(hits, examined)
    out.append(text[done:])
    return "".join(out)


def _send(hits: Generator[tuple[int, int], int | None, None], floor: int) -> tuple[int, int] | None:
    try:
        return hits.send(floor)
    except StopIteration:
        return None


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _mask_urls(text: str) -> str:
    """``scheme://user:password@host``: the password masked."""
    out: list[str] = []
    done = 0
    floor = 0  # no scheme starts before this: it is part of an earlier candidate
    for candidate in _USERINFO.finditer(text):
        at = candidate.start()
        # The scheme: the run of scheme characters before "://", back to the floor; it starts
        # at its first lowercase letter that begins a word.
        start = at
        while start > floor and text[start - 1] in _SCHEME_CHARS:
            start -= 1
        floor = candidate.end()
        if not any(
            "a" <= text[i] <= "z" and (i == 0 or not _is_word(text[i - 1]))
            for i in range(start, at)
        ):
            continue
        out.append(text[done : candidate.start(2)])
        out.append(MASK)
        done = candidate.end(2)
    out.append(text[done:])
    return "".join(out)


def _nothing_to_mask(text: str, keys: tuple[str, ...]) -> bool:
    """Whether ASCII ``text`` holds none of what each masking step starts from: a key, ``://``
    or ``bearer`` (a few scans at memory speed). A job's output is masked a line at a time, and
    most lines hold nothing to mask. Other text takes the steps: case-blind matching and
    ``str.lower`` agree on ASCII only."""
    if not text.isascii() or "://" in text:
        return False
    lowered = text.lower()
    return "bearer" not in lowered and not any(key in lowered for key in keys)


def mask_text(text: str, keys: tuple[str, ...] | None = None) -> str:
    """Mask obvious secrets in free text such as a traceback, in time linear in its length.
    ``keys``: :func:`~django_jobs.conf.sensitive_keys`, for a caller that masks many texts."""
    if keys is None:
        keys = sensitive_keys()
    if _nothing_to_mask(text, keys):
        return text
    text = _mask_key_values(text, keys)
    text = _mask_urls(text)
    return _BEARER.sub(lambda m: m.group(1) + MASK, text)


def format_exception(exc: BaseException) -> str:
    return mask_text("".join(tb.format_exception(exc)))[-20000:]
