"""What an executor copies of a job's output to its supervisor: text printed, and bytes written
to the streams' buffers."""

from __future__ import annotations

import io
import os

from django_jobs.worker.capture import Sink, Tee


def _copied(write_end: int, read_end: int) -> bytes:
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        return pipe.read()


def test_bytes_written_to_stdout_buffer_are_copied_as_well_as_text() -> None:
    read_end, write_end = os.pipe()
    underlying = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    tee = Tee(underlying, Sink(write_end))
    tee.write("printed\n")
    tee.buffer.write(b"raw \xff bytes\n")
    tee.buffer.flush()
    assert _copied(write_end, read_end) == b"printed\nraw \xff bytes\n"
    assert underlying.buffer.getvalue() == b"printed\nraw \xff bytes\n"  # type: ignore[attr-defined]


def test_a_stream_without_a_buffer_still_has_none() -> None:
    read_end, write_end = os.pipe()
    tee = Tee(io.StringIO(), Sink(write_end))
    try:
        tee.buffer  # noqa: B018
    except AttributeError:
        pass
    else:
        raise AssertionError("a StringIO has no buffer, and neither has its tee")
    finally:
        _copied(write_end, read_end)
