"""An attempt's log as it is stored: its last ``JOBS_ATTEMPT_LOG_BYTES``, from a line start,
after a marker where the rest was cut, secrets masked, in text PostgreSQL can store.

Masking runs once, where the text is produced, and the stored log is shown as it is stored (the
admin does not mask it again):

- a worker's executor masks what its job prints and logs, a line at a time, before it goes down
  the output pipe (worker/capture.py); the supervisor only keeps the tail of those bytes and
  cuts it here (:func:`kept_text`), so no masking runs on its loop;
- the HTTP API masks a log sent by a remote worker on the server, before storing it
  (:func:`stored_log`), whatever the client did.

A line the cut went through is left out whole, however long: its kept end could be a secret whose
key was cut off (``password=`` cut, ``hunter2`` kept), which masking could not know.
"""

from __future__ import annotations

import re

from django_jobs.sanitize import mask_text
from django_jobs.storable import storable_text


def marker(cut: int, limit: int) -> str:
    """The line that stands for the ``cut`` bytes left out before the kept ones."""
    return f"[… {cut:,} earlier bytes cut: the last {limit:,} are kept …]\n"


# A marker at the start of a log that was cut before it was sent (by a worker of the API, which
# cuts its tail as a worker does): its count carries on, and the marker is not kept as text.
_SENT_MARKER = re.compile(
    r"\[… ([\d,]{1,30}) earlier bytes cut: the last [\d,]{1,30} are kept …\]\n"
)


def kept_text(data: bytes, cut: int, at_line_start: bool, limit: int) -> str:
    """The stored text of a log's last bytes ``data``, ``cut`` bytes having been left out before
    them (``at_line_start``: the last byte cut was a newline). Linear in ``data``; masks
    nothing (``data`` was masked where it was produced)."""
    if cut and not at_line_start:
        newline = data.find(b"\n")
        partial = len(data) if newline < 0 else newline + 1
        data, cut = data[partial:], cut + partial
    text = data.decode("utf-8", "replace")
    if cut:
        text = marker(cut, limit) + text
    return storable_text(text)


def stored_log(text: str, limit: int) -> str:
    """A whole log sent as text (by a worker of the HTTP API), as it is stored: made storable,
    cut to its last ``limit`` bytes as a worker's tail is, then masked. Masking reads at most
    ``limit`` bytes (and the marker), however much was sent."""
    if limit <= 0:
        return ""
    earlier = 0
    sent = _SENT_MARKER.match(text)
    if sent is not None:
        earlier, text = int(sent.group(1).replace(",", "")), text[sent.end() :]
    data = storable_text(text).encode("utf-8")
    excess = len(data) - limit
    if excess <= 0:
        return mask_text(kept_text(data, earlier, True, limit))
    at_line_start = data[excess - 1] == ord("\n")
    return mask_text(kept_text(data[excess:], earlier + excess, at_line_start, limit))
