"""The HTTP API against hostile and broken clients, on a real uvicorn: slow clients, a lock held
on the token table, a flood of made-up tokens, long polls whose clients hang up, and what idle
long polls cost. A valid worker's heartbeat is timed through each."""

from __future__ import annotations

import asyncio
import json
import secrets
import selectors
import socket
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from django.db import connection

from django_jobs.api import authentication
from django_jobs.models import Attempt, Job, Worker
from django_jobs.registry import registry
from django_jobs.tokens import auth
from tests.conftest import ApiServer, connect, wait_for
from tests.timing import BUSY_MACHINE_MARGIN


class Heartbeats:
    """A valid worker's heartbeat, sent every ``interval`` seconds in a thread; each one's
    latency, and its status."""

    def __init__(self, url: str, secret: str, interval: float = 0.2) -> None:
        self.client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {secret}"}, timeout=30
        )
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        #: When each sample's answer came (time.monotonic()).
        self.answered: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def beat(self) -> tuple[float, int]:
        started = time.monotonic()
        answer = self.client.post("v1/heartbeat", json={"worker": "timed"})
        return time.monotonic() - started, answer.status_code

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(self.beat())
            self.answered.append(time.monotonic())

    def answered_between(self, start: float, end: float) -> int:
        """How many heartbeats were answered between ``start`` and ``end``."""
        return sum(start <= moment <= end for moment in self.answered)

    def __enter__(self) -> Heartbeats:
        assert self.beat()[1] == 200  # the token is known to the server before the test
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.client.close()

    def report(self, what: str) -> dict[str, float]:
        latencies = [latency for latency, _ in self.samples]
        figures = {
            "n": len(latencies),
            "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "max_ms": round(max(latencies) * 1000, 1),
        }
        print(f"valid heartbeat during {what}: {figures}")
        return figures


def raw(server: ApiServer) -> socket.socket:
    parts = urlsplit(server.url)
    sock = socket.create_connection((parts.hostname, parts.port))
    sock.settimeout(30)
    return sock


def head(server: ApiServer, endpoint: str, token: str, length: int) -> bytes:
    path = urlsplit(server.url).path + endpoint
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def answer_of(sock: socket.socket) -> tuple[int, bytes, bool]:
    """The status and body of the answer on ``sock``, and whether the server then closed it."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"closed without an answer: {data!r}")
        data += chunk
    header, _, rest = data.partition(b"\r\n\r\n")
    length = int(header.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    closed = False
    try:
        closed = sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        closed = True
    return int(header.split(b" ")[1]), rest[:length], closed


@pytest.fixture
def valid(start_api_server: Callable[..., ApiServer]) -> Iterator[tuple[ApiServer, str]]:
    server = start_api_server({"JOBS_API_BODY_TIMEOUT": "2", "JOBS_POLL_INTERVAL": "1"})
    _, secret = auth.create(f"t-{secrets.token_hex(4)}", ["*"], can_enqueue=True)
    yield server, secret


def test_the_token_is_checked_before_the_body_and_slow_bodies_are_cut_off(
    start_api_server: Callable[..., ApiServer],
) -> None:
    # The default body timeout, 10 s: a 413 that waited for its body, or a heartbeat held up
    # behind the slow bodies, would come at that deadline, twice a busy machine's margin away.
    body_timeout = 10
    server = start_api_server(
        {"JOBS_API_BODY_TIMEOUT": str(body_timeout), "JOBS_POLL_INTERVAL": "1"}
    )
    _, secret = auth.create(f"t-{secrets.token_hex(4)}", ["*"], can_enqueue=True)
    never_headers = [raw(server) for _ in range(100)]
    for sock in never_headers:
        sock.sendall(b"POST /jobs/api/v1/claim HTTP/1.1\r\nHost: x\r\nAuthor")
    with Heartbeats(server.url, secret) as beats:
        # A made-up token with most of a body: refused from its headers, the body unread, and
        # the connection closed.
        strangers = [raw(server) for _ in range(50)]
        for sock in strangers:
            sock.sendall(head(server, "v1/claim", "djt_" + secrets.token_urlsafe(32), 700_000))
            sock.sendall(b"{" + b" " * 100_000)
        # A good token whose body never comes, and one that says it is huge.
        slow = [raw(server) for _ in range(20)]
        for sock in slow:
            sock.sendall(head(server, "v1/claim", secret, 1000) + b'{"worker": ')
        huge = raw(server)
        huge.sendall(head(server, "v1/claim", secret, 99_999_999_999))
        started = time.monotonic()

        status, body, closed = answer_of(huge)
        assert (status, closed) == (413, True), body
        assert time.monotonic() - started < BUSY_MACHINE_MARGIN  # at once, from its headers
        assert "over" in json.loads(body)["error"]
        for sock in strangers:
            status, body, closed = answer_of(sock)
            assert status in (401, 429) and closed, body
        for sock in slow:
            status, body, closed = answer_of(sock)
            assert (status, closed) == (408, True), body
            assert f"did not arrive within {body_timeout} s" in json.loads(body)["error"]
        assert time.monotonic() - started < body_timeout + BUSY_MACHINE_MARGIN  # the deadline
    figures = beats.report("slow clients")
    assert all(status == 200 for _, status in beats.samples)
    assert figures["max_ms"] < BUSY_MACHINE_MARGIN * 1000  # milliseconds on an idle machine
    for sock in [*never_headers, *strangers, *slow, huge]:
        sock.close()


@pytest.mark.slow
def test_a_lock_on_the_token_table_and_unknown_tokens_do_not_wedge_the_pool(
    start_api_server: Callable[..., ApiServer],
) -> None:
    # A lock timeout of 15 s, within the lock's 20 s: the made-up tokens' lookups still fail
    # while it is held, and a heartbeat that waited for its token's read would take 15 s.
    server = start_api_server({"JOBS_LOCK_TIMEOUT_MS": "15000", "JOBS_POLL_INTERVAL": "1"})
    _, secret = auth.create(f"t-{secrets.token_hex(4)}", ["*"], can_enqueue=True)
    with Heartbeats(server.url, secret) as beats, connect() as locker:
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE django_jobs_api_token IN ACCESS EXCLUSIVE MODE")
        locked = time.monotonic()
        statuses: list[int] = []

        def stranger() -> None:
            answer = httpx.post(
                server.url + "v1/heartbeat",
                json={"worker": "x"},
                headers={"Authorization": f"Bearer djt_{secrets.token_urlsafe(32)}"},
                timeout=60,
            )
            statuses.append(answer.status_code)

        threads = [threading.Thread(target=stranger) for _ in range(5)]
        for thread in threads:
            thread.start()
        time.sleep(20)  # the scenario: a migration holds the lock for 20 s
        locker.execute("COMMIT")
        unlocked = time.monotonic()
        for thread in threads:
            thread.join()
    figures = beats.report("a 20 s ACCESS EXCLUSIVE lock on the token table")
    assert all(status == 200 for _, status in beats.samples)
    # A beat every 0.2 s and its answer: about 100 in the 20 s on an idle machine, at least one
    # every 2 s on a busy one; beats that waited for the lock would be one or two.
    assert beats.answered_between(locked, unlocked) >= 10, figures
    # Milliseconds, or STALE_WAIT for the one that finds its grant old; 15 s for one that waited
    # for its token's read.
    assert figures["max_ms"] < (authentication.STALE_WAIT + BUSY_MACHINE_MARGIN) * 1000
    # The made-up tokens: 503 while the table could not be read (or 429, or 401 after it).
    assert len(statuses) == 5 and set(statuses) <= {401, 429, 503}


def test_a_flood_of_made_up_tokens_is_rate_limited_and_the_fleet_goes_on(
    valid: tuple[ApiServer, str],
) -> None:
    server, secret = valid
    statuses: dict[int, int] = {}
    retry_after: set[str] = set()

    async def flood(seconds: float, per_second: int) -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:

            async def one() -> None:
                token = f"djt_{secrets.token_urlsafe(32)}"
                answer = await client.post(
                    "v1/heartbeat", json={}, headers={"Authorization": f"Bearer {token}"}
                )
                statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                if answer.status_code == 429:
                    retry_after.add(answer.headers["Retry-After"])
                    assert answer.json()["error"].startswith("too many requests")

            started = time.monotonic()
            tasks = []
            for n in range(int(seconds * per_second)):
                await asyncio.sleep(max(0.0, started + n / per_second - time.monotonic()))
                tasks.append(asyncio.ensure_future(one()))
            await asyncio.gather(*tasks)

    with Heartbeats(server.url, secret, interval=0.1) as beats:
        flooded = time.monotonic()
        asyncio.run(flood(6, 160))
        ended = time.monotonic()
    figures = beats.report("160 made-up tokens a second")
    assert all(status == 200 for _, status in beats.samples)
    # A beat every 0.1 s and its answer: about 50 in the flood's 6 s on an idle machine, at least
    # one a second on a busy one; none would be answered while the flood held the pool up.
    assert beats.answered_between(flooded, ended) >= 6, figures
    assert figures["max_ms"] < BUSY_MACHINE_MARGIN * 1000  # milliseconds on an idle machine
    assert statuses.get(429, 0) > 0.8 * sum(statuses.values()), statuses
    assert set(statuses) <= {401, 429}, statuses
    assert all(1 <= int(seconds) <= 60 for seconds in retry_after)


#: /proc/net/tcp's states in which a socket is still open in its process: ESTABLISHED, and
#: CLOSE_WAIT (its peer has closed the connection, this end not yet).
OPEN = {"01", "08"}


def server_connections(server: ApiServer) -> set[int]:
    """The client ports of the connections that the server still holds open. One whose client
    hung up stays here (in CLOSE_WAIT) until the server has seen it go: uvicorn closes its end
    as it tells the request that its client has gone (``http.disconnect``)."""
    port = urlsplit(server.url).port
    held = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, remote, state = line.split()[1:4]
        if int(local.rsplit(":", 1)[1], 16) == port and state in OPEN:
            held.add(int(remote.rsplit(":", 1)[1], 16))
    return held


def long_poll(server: ApiServer, secret: str, **body: object) -> socket.socket:
    """A claim that waits for work, sent on a connection of its own: read its answer with
    :func:`answer_of`."""
    sock = raw(server)
    data = json.dumps(body).encode()
    sock.sendall(head(server, "v1/claim", secret, len(data)) + data)
    return sock


def registered(worker: str) -> bool:
    """Whether the first claim of ``worker`` (its name in a claim) has been made: a long poll
    joins the server's waiters before that claim, and waits after it."""
    return Worker.objects.filter(id__endswith=f":{worker}").exists()


def test_a_long_poll_whose_client_hung_up_claims_nothing(
    start_api_server: Callable[..., ApiServer],
) -> None:
    # One database connection: the server's statements run one at a time, in the order its
    # requests ask for them.
    server = start_api_server({"JOBS_POLL_INTERVAL": "1", "JOBS_API_CONNECTIONS": "1"})
    _, secret = auth.create(f"t-{secrets.token_hex(4)}", ["*"])
    gone = long_poll(server, secret, worker="gone", queues=["remote"], wait=20)
    wait_for(lambda: registered("gone"))  # the scenario: into its wait
    port = gone.getsockname()[1]
    assert port in server_connections(server)
    gone.close()
    wait_for(lambda: port not in server_connections(server))  # the server has seen it go
    # Another long poll on the queue, which joined after it and runs remote.count only: had
    # the first one stayed, a wake for the queue would go to it first, and its claim would be
    # made (on the one connection) before any claim of this one.
    probe = long_poll(
        server, secret, worker="probe", queues=["remote"], tasks=["remote.count"], wait=20
    )
    wait_for(lambda: registered("probe"))
    job = registry.get("remote.upper").enqueue("late")
    after = registry.get("remote.count").enqueue()
    # The probe gets the job enqueued after: the server has handed out the first job's wake.
    status, body, _ = answer_of(probe)
    assert status == 200, body
    assert json.loads(body)["job"]["id"] == after.pk
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("pending", 0)
    assert not Attempt.objects.filter(job=job).exists()


def commits() -> int:
    with connect() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = %s",
            [connection.settings_dict["NAME"]],
        ).fetchone()
        return int(row[0])


@pytest.mark.slow
def test_idle_long_polls_on_many_queue_sets_cost_little_and_end_on_time(
    valid: tuple[ApiServer, str],
) -> None:
    server, secret = valid
    waiters, wait = 300, 20.0
    polls = selectors.DefaultSelector()
    sent: dict[socket.socket, float] = {}
    for n in range(waiters):
        sock = raw(server)
        body = json.dumps({"worker": f"w{n}", "queues": [f"made-up-{n}"], "wait": wait})
        sock.sendall(head(server, "v1/claim", secret, len(body)) + body.encode())
        sent[sock] = time.monotonic()
        polls.register(sock, selectors.EVENT_READ)
    # Once every poll has made its first claim (and registered its worker), they only wait.
    time.sleep(10)
    before, started = commits(), time.monotonic()
    time.sleep(6)
    per_second = (commits() - before) / (time.monotonic() - started)
    ended: list[float] = []
    while len(ended) < waiters:
        ready = polls.select(timeout=wait)
        assert ready, f"{waiters - len(ended)} polls were not answered"
        for key, _ in ready:
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            ended.append(time.monotonic() - sent[sock])
            assert sock.recv(65536).startswith(b"HTTP/1.1 204 ")
            polls.unregister(sock)
            sock.close()
    print(f"{waiters} idle long polls on {waiters} queue sets: {per_second:.1f} commits/s")
    print(f"their waits of {wait:g} s ended after {min(ended):.2f} to {max(ended):.2f} s")
    # Ended at their deadline (counted from their arrival, just after they were sent), within
    # what a busy machine adds; a wait that ran on to JOBS_API_MAX_WAIT would end at 30 s, and
    # one that did not end at all fails the select above.
    assert max(ended) < wait + BUSY_MACHINE_MARGIN
    assert per_second < 20  # one statement a tick, and the odd registration
    assert not Job.objects.exists()
