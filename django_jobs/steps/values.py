"""The checks a step or cursor passes before anything is written: a name, and a JSON value
within ``JOBS_MAX_PAYLOAD_BYTES``. A bad one raises :class:`~django_jobs.exceptions.StepError`
(a name) or :class:`~django_jobs.exceptions.InvalidStepResult` (a value), and nothing is
written. Text in a value that PostgreSQL cannot store follows the rule of a job's result
(storable.py): a NUL is written as ``\x00`` and invalid Unicode as U+FFFD; the value recorded
is the one every attempt gets back, the first included."""

from __future__ import annotations

from typing import Any

from django_jobs import conf
from django_jobs.enqueue import checked_json, encode_json
from django_jobs.exceptions import InvalidPayload, InvalidStepResult, StepError
from django_jobs.models.step import NAME_CHARS
from django_jobs.storable import storable_value, unstorable


def checked_name(name: Any, what: str) -> str:
    """``name`` if it can name a step or a cursor (``what``): a non-empty string of at most
    :data:`NAME_CHARS` characters that PostgreSQL can store."""
    if not isinstance(name, str) or not name:
        raise StepError(f"a {what}'s name must be a non-empty string, not {name!r}")
    if len(name) > NAME_CHARS:
        raise StepError(
            f"a {what}'s name is at most {NAME_CHARS} characters; {name[:40]!r}... has {len(name)}"
        )
    why = unstorable(name)
    if why is not None:
        raise StepError(f"the {what} name {name!r} {why}")
    return name


def value_json(value: Any, what: str) -> str:
    """``value`` as the JSON text a step's result or a cursor's value (``what``, e.g. ``"step
    'fetch'"``) is stored as: plain JSON (tuples become lists), nested at most 100 levels,
    strings PostgreSQL can store, at most ``JOBS_MAX_PAYLOAD_BYTES``."""
    try:
        fixed, _ = storable_value(value)
        text = encode_json(checked_json(fixed, "the value"))
    except RecursionError:
        raise InvalidStepResult(f"{what} cannot be recorded: it is nested too deeply") from None
    except InvalidPayload as exc:
        raise InvalidStepResult(f"{what} cannot be recorded: {exc}") from None
    limit = conf.max_payload_bytes()
    if len(text) > limit:
        raise InvalidStepResult(
            f"{what} cannot be recorded: its value is {len(text)} bytes of JSON, over"
            f" JOBS_MAX_PAYLOAD_BYTES ({limit}). Store large data elsewhere (an object store,"
            " a table of your own) and record a reference."
        )
    return text
