"""What an executor copies of a job's output to its supervisor: text printed, and bytes written
to the streams' buffers."""

from __future__ import annotations

import io
import logging
import os
import threading
import time

from django_jobs.worker.capture import MaskedLines, Sink, Tee
from tests.timing import CPU_BOUND


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


def _masked_copy(writes: list[str | bytes], hold: int = 64 * 1024) -> str:
    """What reaches the pipe of ``writes`` made through a tee of masked lines, and the end of
    the attempt."""
    read_end, write_end = os.pipe()
    copied: list[bytes] = []
    reader = threading.Thread(target=lambda: copied.append(os.fdopen(read_end, "rb").read()))
    reader.start()  # a pipe holds 64 KiB: read as it is written
    masked = MaskedLines(Sink(write_end), hold)
    tee = Tee(io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True), masked)
    for piece in writes:
        if isinstance(piece, bytes):
            tee.buffer.write(piece)
        else:
            tee.write(piece)
    masked.flush()
    os.close(write_end)
    reader.join(timeout=10)
    return copied[0].decode()


def test_the_executor_masks_a_secret_written_in_pieces_before_it_goes_down_the_pipe() -> None:
    copied = _masked_copy(
        [
            "login with ",
            "password=",
            "hunter2",
            "\n",
            b"token: tok-",
            b"zzz\nAuthorization: Bearer ",
            "abc.def\n",
            "connect to postgres://app:pw-secret@db/app\n",
        ]
    )
    assert copied == (
        "login with password=********\n"
        "token: ********\n"
        "Authorization: ********\n"
        "connect to postgres://app:********@db/app\n"
    )


def test_a_line_that_ends_open_waits_for_the_value_on_the_next() -> None:
    assert _masked_copy(["password:\n", "  hunter2\n", "done\n"]) == (
        "password:\n  ********\ndone\n"
    )


def test_a_line_not_ended_is_sent_masked_at_the_end_of_the_attempt() -> None:
    assert _masked_copy(["first\n", "api_key=sk-live-123"]) == "first\napi_key=********"


def test_invalid_bytes_and_a_character_split_between_writes_are_decoded_once() -> None:
    euro = "€".encode()
    assert _masked_copy([b"raw \xff ", euro[:1], euro[1:], b"\n", b"cut ", euro[:2], "text\n"]) == (
        "raw \ufffd €\ncut \ufffdtext\n"
    )


def test_a_line_longer_than_the_hold_is_sent_in_pieces_each_masked() -> None:
    copied = _masked_copy(["x" * 150 + " password=hunter2 ", "y" * 100, "\n"], hold=100)
    assert "hunter2" not in copied and copied.count("\n") == 1 and len(copied) > 250


def test_masking_64_kib_of_adversarial_output_in_the_executor_takes_linear_time() -> None:
    # A 24 KiB hex line froze the old supervisor for 31 s; here it is masked once, where it is
    # written, in milliseconds: counted in this thread's CPU time (where the masking runs; the
    # pipe's reader is another thread), which other processes on the cores do not add to.
    hex_line = "0123456789abcdef" * 4096
    started = time.thread_time()
    copied = _masked_copy([hex_line[i : i + 100] for i in range(0, len(hex_line), 100)] + ["\n"])
    assert time.thread_time() - started < CPU_BOUND and copied == hex_line + "\n"


def test_a_progress_bar_redrawn_with_carriage_returns_goes_as_it_is_drawn() -> None:
    read_end, write_end = os.pipe()
    masked = MaskedLines(Sink(write_end), 64 * 1024)
    masked.write("\r 10% |#")
    masked.write("\r 20% |##")
    os.set_blocking(read_end, False)
    assert os.read(read_end, 1024) == b"\r 10% |#\r"  # the second redraw ended the first
    masked.write("\r\nsecret:\r\n")
    masked.write("  hunter2\r\n")
    masked.flush()
    os.close(write_end)
    assert os.read(read_end, 1024) == b" 20% |##\r\nsecret:\r\n  ********\r\n"
    os.close(read_end)


def test_the_workers_output_has_the_job_id_at_each_line_start_and_the_copy_has_none(
    capfdbinary,
) -> None:
    import sys as _sys

    from django_jobs.worker.capture import captured

    read, write = os.pipe()
    with captured(Sink(write), logging.WARNING, prefix="[job 7] "):
        print("first line")
        print("a line in ", end="")
        print("two writes")
        _sys.stdout.buffer.write(b"bytes one\nbytes ")
        _sys.stdout.buffer.write(b"two\n")
        _sys.stdout.flush()
    os.close(write)
    copy = b""
    while chunk := os.read(read, 65536):
        copy += chunk
    os.close(read)
    shown = capfdbinary.readouterr().out
    assert shown == (
        b"[job 7] first line\n[job 7] a line in two writes\n[job 7] bytes one\n[job 7] bytes two\n"
    )
    assert copy == b"first line\na line in two writes\nbytes one\nbytes two\n"
