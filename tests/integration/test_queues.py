"""Queue controls and concurrency limits, driven through the claim: pause and resume, limits
per queue and per key, the claim's plans and cost, and the commands."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command, load_command_class
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from django_jobs import queues, store
from django_jobs.exceptions import InvalidOption
from django_jobs.models import Job, Queue
from django_jobs.store.sql import query
from testproject.testjobs.jobs import echo, import_customer, noop
from tests.factories import JobFactory, UserFactory
from tests.integration.helpers import WORKER, claim, finish

pytestmark = pytest.mark.django_db(transaction=True)


def running(key=None, queue=None):
    jobs = Job.objects.filter(state="running")
    if key is not None:
        jobs = jobs.filter(concurrency_key=key)
    if queue is not None:
        jobs = jobs.filter(queue=queue)
    return jobs.count()


# ---------------------------------------------------------------------------- pause and resume


def test_a_paused_queue_is_not_claimed_from_and_resume_brings_it_back() -> None:
    held = JobFactory(queue="imports")
    other = JobFactory(queue="default")
    queues.pause("imports", by="alice", reason="migrating the customers table")
    row = Queue.objects.get(name="imports")
    assert (row.paused, row.paused_by, row.pause_reason) == (
        True,
        "alice",
        "migrating the customers table",
    )
    assert claim(["imports"]) is None
    assert claim(None).id == other.pk  # a worker of every queue takes the open ones
    assert claim(None) is None
    # Enqueueing still works while paused.
    later = echo.using(queue="imports").enqueue(1)
    queues.resume("imports")
    assert {claim(["imports"]).id, claim(["imports"]).id} == {held.pk, later.pk}


def test_pausing_twice_keeps_the_first_pause_time_and_the_view_shows_it() -> None:
    JobFactory(queue="imports")
    queues.pause("imports", by="alice")
    first = Queue.objects.get(name="imports").paused_at
    queues.pause("imports", by="bob", reason="still")
    row = Queue.objects.get(name="imports")
    assert row.paused_at == first and row.paused_by == "bob"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, jobs, paused, paused_by, pause_reason FROM django_jobs_queue_summary"
            " WHERE queue = 'imports'"
        )
        assert cursor.fetchall() == [("pending", 1, True, "bob", "still")]


def test_a_paused_queue_without_jobs_still_has_its_row_in_the_view() -> None:
    queues.pause("reports")  # a registered task's queue
    with connection.cursor() as cursor:
        cursor.execute("SELECT state, jobs, paused FROM django_jobs_queue_summary")
        assert cursor.fetchall() == [("pending", 0, True)]


def test_a_paused_queue_does_not_make_the_claim_walk_its_jobs() -> None:
    # 20,000 ready jobs of a paused queue ahead of one ready job elsewhere, in claim order: a
    # claim that walked them would read some 400 buffers.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_jobs_job (task, queue, priority, state)"
            " SELECT 'tests.noop', 'imports', 5, 'pending' FROM generate_series(1, 20000)"
        )
        cursor.execute("ANALYZE django_jobs_job")
    other = JobFactory(queue="default")
    queues.pause("imports")
    assert _buffers("free_candidate", queues=None, closed=["imports"]) < 60
    assert claim(None).id == other.pk


# ---------------------------------------------------------------------------- limits per queue


def test_a_queue_limit_caps_running_jobs_and_other_queues_still_run() -> None:
    gpu = [JobFactory(queue="gpu") for _ in range(3)]
    cpu = JobFactory(queue="default")
    queues.set_limit("gpu", 2)
    first, second = claim(["gpu"]), claim(["gpu"])
    assert {first.id, second.id} <= {j.pk for j in gpu}
    assert claim(["gpu"]) is None
    assert claim(None).id == cpu.pk  # the full queue is passed over, not waited for
    finish(first)
    assert claim(None).queue == "gpu"
    assert running(queue="gpu") == 2


def test_settings_limits_are_synced_and_an_admin_limit_wins(settings) -> None:
    settings.JOBS_QUEUE_LIMITS = {"gpu": 4, "reports": 1}
    queues.sync_limits()
    limits = dict(Queue.objects.values_list("name", "concurrency_limit"))
    assert limits == {"gpu": 4, "reports": 1}
    queues.set_limit("gpu", 8)  # the admin or jobqueue
    settings.JOBS_QUEUE_LIMITS = {"gpu": 2}
    queues.sync_limits()
    rows = {q.name: (q.concurrency_limit, q.limit_source) for q in Queue.objects.all()}
    assert rows == {"gpu": (8, "admin"), "reports": (None, "")}
    queues.set_limit("gpu", None, source=Queue.LimitSource.SETTINGS)
    assert Queue.objects.get(name="gpu").concurrency_limit == 2


# ---------------------------------------------------------------------------- limits per key


def test_a_key_limit_holds_jobs_of_that_key_and_claims_other_work_instead() -> None:
    a1, a2, a3 = (import_customer.using(concurrency_key="c:1").enqueue(1) for _ in range(3))
    b1 = import_customer.using(concurrency_key="c:2").enqueue(2)
    free = noop.enqueue()
    claimed = [claim() for _ in range(4)]
    assert [c.id for c in claimed] == [a1.pk, a2.pk, b1.pk, free.pk]
    assert claim() is None and Job.objects.get(pk=a3.pk).state == "pending"
    finish(claimed[0])
    assert claim().id == a3.pk
    assert running(key="c:1") == 2


def test_the_key_defaults_to_the_task_name_and_the_limit_to_one() -> None:
    job = import_customer.enqueue(1)
    assert (job.concurrency_key, job.concurrency_limit) == ("tests.import_customer", 2)
    keyed = echo.using(concurrency_key="only-one").enqueue()
    assert (keyed.concurrency_key, keyed.concurrency_limit) == ("only-one", 1)
    plain = echo.enqueue()
    assert (plain.concurrency_key, plain.concurrency_limit) == (None, None)
    stored = Job.objects.get(pk=keyed.pk)
    assert (stored.concurrency_key, stored.concurrency_limit) == ("only-one", 1)


def test_enqueue_many_stores_the_key() -> None:
    jobs = import_customer.using(concurrency_key="c:9").enqueue_many([((1,), {}), ((2,), {})])
    stored = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert {(j.concurrency_key, j.concurrency_limit) for j in stored} == {("c:9", 2)}


def test_a_retry_and_a_reap_free_the_slot() -> None:
    first, second = (
        import_customer.using(concurrency_key="k", concurrency_limit=1).enqueue(1) for _ in range(2)
    )
    taken = claim()
    assert taken.id == first.pk and claim() is None
    # A failure with attempts left goes back to pending: the slot is free, and the other job may
    # take it (the retry waits its backoff).
    Job.objects.filter(pk=first.pk).update(max_attempts=3)
    with connection.cursor() as cursor:
        store.finish(cursor, taken.lease, "error", retryable=True, retry_delay=60)
    again = claim()
    assert again.id == second.pk and claim() is None
    # The worker running it vanishes: the reaper ends the run, and the slot is free again.
    Job.objects.filter(pk=first.pk).update(run_after=Job.objects.get(pk=first.pk).created_at)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_jobs_job SET state = 'error', finished_at = now() WHERE id = %s",
            [second.pk],
        )
    assert claim().id == first.pk


def test_a_held_key_is_not_scanned_on_every_claim() -> None:
    # 10,000 pending jobs behind one saturated key, enqueued before a job without a key.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO django_jobs_job (task, queue, state, concurrency_key, concurrency_limit)"
            " SELECT 'tests.noop', 'default', 'pending', 'busy', 1"
            " FROM generate_series(1, 10000)"
        )
        cursor.execute("ANALYZE django_jobs_job")
    first = claim()
    assert Job.objects.get(pk=first.id).concurrency_key == "busy"
    free = noop.enqueue()
    assert claim().id == free.pk
    assert claim() is None
    keyed = _buffers("keyed_candidate", queues=None, closed=[])
    assert keyed < 50, keyed
    # The whole claim too: its claim of the job without a key reads the index without the
    # held-back jobs (job_claim_free_queue_idx), never past them.
    noop.enqueue()
    whole = _claim_buffers()
    assert whole < 150, whole


def _claim_buffers() -> int:
    """Shared buffers one claim (the worker's call of the claim function, rolled back) touches,
    its inner statements included, once the function keeps its plans."""
    from django.db import transaction

    for _ in range(8):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("call_claim"),
                {"worker_id": WORKER, "queues": None, "skip_tasks": None},
            )
            plan = cursor.fetchone()[0][0]["Plan"]
            transaction.set_rollback(True)
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


def _buffers(statement: str, **params) -> int:
    """Shared buffers (hits and reads) one run of a named statement touches, once the function
    it calls has its plan (a worker's connection plans it once)."""
    with connection.cursor() as cursor:
        for _ in range(8):  # plpgsql plans a statement on its first runs, then keeps a plan
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query(statement),
                {"skip_tasks": None, **params},
            )
            plan = cursor.fetchone()[0][0]["Plan"]
    return plan.get("Shared Hit Blocks", 0) + plan.get("Shared Read Blocks", 0)


# ---------------------------------------------------------------------------- bad input


def test_bad_input_gets_a_clear_error_and_writes_nothing() -> None:
    with pytest.raises(queues.UnknownQueue, match="unknown queue 'nope'"):
        queues.pause("nope")
    with pytest.raises(InvalidOption, match="limit must be a whole number from 1"):
        queues.set_limit("default", -1)
    with pytest.raises(InvalidOption, match="limit must be a whole number from 1"):
        queues.set_limit("default", 0)
    assert not Queue.objects.exists()
    with pytest.raises(InvalidOption, match="concurrency_key must be a non-empty string"):
        echo.using(concurrency_key="").enqueue()
    with pytest.raises(InvalidOption, match="concurrency_key must be a non-empty string"):
        echo.using(concurrency_key="   ").enqueue()
    with pytest.raises(InvalidOption, match="concurrency_limit must be an integer from 1"):
        echo.using(concurrency_key="k", concurrency_limit=-2).enqueue()
    with pytest.raises(InvalidOption, match="concurrency_limit must be an integer from 1"):
        echo.using(concurrency_limit=True)
    assert not Job.objects.exists()


def test_the_database_refuses_a_key_without_a_positive_limit() -> None:
    from django.db import IntegrityError

    with pytest.raises(IntegrityError):
        JobFactory(concurrency_key="k", concurrency_limit=0)


@override_settings(JOBS_QUEUE_LIMITS={"gpu": -4})
def test_a_bad_queue_limit_setting_is_a_system_check_error() -> None:
    from django_jobs.checks import check_queue_limits

    (error,) = check_queue_limits()
    assert error.id == "django_jobs.E005" and "JOBS_QUEUE_LIMITS['gpu']" in error.msg


# ---------------------------------------------------------------------------- the command


def test_jobqueue_pause_list_limit_resume(capsys) -> None:
    JobFactory(queue="imports")
    call_command("jobqueue", "pause", "imports", "--reason", "incident 42")
    call_command("jobqueue", "limit", "imports", "3")
    call_command("jobqueue", "list")
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("imports"))
    assert "paused" in line and "3" in line and "incident 42" in line and "jobqueue (" in line
    call_command("jobqueue", "resume", "imports")
    call_command("jobqueue", "limit", "imports", "none")
    assert Queue.objects.filter(name="imports", paused=False, concurrency_limit=None).exists()
    with pytest.raises(CommandError, match="unknown queue 'typo'"):
        call_command("jobqueue", "pause", "typo")
    with pytest.raises(CommandError, match="whole number"):
        call_command("jobqueue", "limit", "imports", "-1")
    with pytest.raises(CommandError, match="whole number"):
        call_command("jobqueue", "limit", "imports", "many")


@pytest.mark.parametrize(
    "options",
    [
        ["-v", "2"],
        ["--verbosity", "0"],
        ["--settings", "testproject.settings"],
        ["--traceback", "--no-color"],
        ["--pythonpath", "."],
    ],
)
def test_jobqueue_takes_djangos_options_after_the_subcommand(options, capsys) -> None:
    JobFactory(queue="imports")
    call_command("jobqueue", "list", *options)
    call_command("jobqueue", "pause", "imports", *options)
    call_command("jobqueue", "resume", "imports", *options)
    call_command("jobqueue", "limit", "imports", "2", *options)
    out = capsys.readouterr().out
    assert "imports" in out and "queue imports limit: 2" in out


def test_an_option_before_the_subcommand_still_counts(capsys) -> None:
    command = load_command_class("django_jobs", "jobqueue")
    parsed = command.create_parser("manage.py", "jobqueue").parse_args(["-v", "3", "list"])
    assert parsed.verbosity == 3
    parsed = command.create_parser("manage.py", "jobqueue").parse_args(["list", "-v", "0"])
    assert parsed.verbosity == 0


def test_a_future_job_of_a_key_does_not_hold_its_slot() -> None:
    later = import_customer.using(
        concurrency_key="k", concurrency_limit=1, run_after=timedelta(hours=1)
    ).enqueue(1)
    now = import_customer.using(concurrency_key="k", concurrency_limit=1).enqueue(2)
    assert claim().id == now.pk
    assert Job.objects.get(pk=later.pk).state == "pending"


# ---------------------------------------------------------------------------- admin and jobstats


def _staff(client, *codenames: str):
    client.force_login(UserFactory(username="ops", permissions=codenames))
    return client


def test_the_queue_admin_edits_a_limit_and_pauses_with_the_permission(client) -> None:
    JobFactory(queue="gpu")
    _staff(client, "view_queue", "add_queue", "change_queue", "view_job")
    response = client.post(
        "/admin/django_jobs/queue/add/", {"name": "gpu", "concurrency_limit": "0"}
    )
    assert response.status_code == 200 and "from 1" in response.content.decode()
    assert not Queue.objects.exists()
    response = client.post(
        "/admin/django_jobs/queue/add/", {"name": "typo", "concurrency_limit": "2"}
    )
    assert "No job, task, worker" in response.content.decode()
    client.post("/admin/django_jobs/queue/add/", {"name": "gpu", "concurrency_limit": "4"})
    row = Queue.objects.get(name="gpu")
    assert (row.concurrency_limit, row.limit_source) == (4, "admin")
    # Without django_jobs.pause_queue, the pause action is not offered, and not carried out.
    page = client.get("/admin/django_jobs/queue/").content.decode()
    assert "pause_queues" not in page
    client.post(
        "/admin/django_jobs/queue/", {"action": "pause_queues", "_selected_action": ["gpu"]}
    )
    assert not Queue.objects.get(name="gpu").paused


def test_the_dashboard_buttons_need_the_permission_and_a_post(client) -> None:
    JobFactory(queue="imports")
    _staff(client, "view_job")
    url = "/admin/django_jobs/dashboard/queues/imports/pause/"
    assert client.post(url, {"reason": "x"}).status_code == 403
    assert "Pause</button>" not in client.get("/admin/django_jobs/dashboard/").content.decode()
    from django.contrib.auth.models import Permission, User

    User.objects.get(username="ops").user_permissions.add(
        Permission.objects.get(codename="pause_queue")
    )
    assert client.get(url).status_code == 405
    assert client.post(url, {"reason": "disk full"}).status_code == 302
    row = Queue.objects.get(name="imports")
    assert (row.paused, row.paused_by, row.pause_reason) == (True, "ops", "disk full")
    page = client.get("/admin/django_jobs/dashboard/").content.decode()
    assert "Resume</button>" in page and "disk full" in page
    response = client.post("/admin/django_jobs/dashboard/queues/nope/pause/", follow=True)
    assert "Unknown queue &#x27;nope&#x27;" in response.content.decode()
    client.post("/admin/django_jobs/dashboard/queues/imports/resume/")
    assert not Queue.objects.get(name="imports").paused


def test_jobstats_shows_a_paused_queue_and_a_limit(capsys) -> None:
    JobFactory(queue="imports")
    queues.pause("imports", by="alice", reason="incident 7")
    queues.set_limit("imports", 3)
    call_command("jobstats")
    out = capsys.readouterr().out
    assert "PAUSED by alice" in out and "incident 7" in out and "(limit 3)" in out
    call_command("jobstats", "--json")
    data = json.loads(capsys.readouterr().out)
    (imports,) = [q for q in data["queues"] if q["queue"] == "imports"]
    assert imports["paused"] is True and imports["concurrency_limit"] == 3


def test_a_limit_is_set_from_the_dashboard_with_the_permission_and_a_bad_one_changes_nothing(
    client,
) -> None:
    JobFactory(queue="imports")
    _staff(client, "view_job")
    url = "/admin/django_jobs/dashboard/queues/imports/limit/"
    assert client.post(url, {"limit": "3"}).status_code == 403
    from django.contrib.auth.models import Permission, User

    User.objects.get(username="ops").user_permissions.add(
        Permission.objects.get(codename="change_queue")
    )
    response = client.post(url, {"limit": "3", "next": "/admin/django_jobs/queue/"})
    assert response.status_code == 302 and response["Location"] == "/admin/django_jobs/queue/"
    assert Queue.objects.get(name="imports").concurrency_limit == 3
    for bad in ("0", "-2", "two", "1.5"):
        page = client.post(url, {"limit": bad}, follow=True).content.decode()
        assert 'class="error"' in page, bad
        assert Queue.objects.get(name="imports").concurrency_limit == 3
    away = client.post(url, {"limit": "", "next": "https://evil.example/"})
    assert away["Location"] == "/admin/django_jobs/dashboard/"
    assert Queue.objects.get(name="imports").concurrency_limit is None


def test_the_queues_page_lists_every_queue_with_its_counts(client) -> None:
    JobFactory.create_batch(2, queue="default")
    JobFactory(queue="imports", run_after=timezone.now() + timedelta(hours=1))
    _staff(client, "view_queue", "view_job")
    page = client.get("/admin/django_jobs/queue/").content.decode()
    table = page.split('id="dj-queues"', 1)[1].split("</table>", 1)[0]
    rows = {row.split("?queue=", 1)[1].split('"', 1)[0]: row for row in table.split("<tr>")[2:]}
    assert {"default", "imports"} <= set(rows)
    assert "<td>2</td>" in rows["default"]  # ready
    assert "/admin/django_jobs/queue/add/?name=default" in rows["default"]


def test_the_index_links_to_the_dashboard_without_a_model_row(client) -> None:
    _staff(client, "view_job")
    index = client.get("/admin/").content.decode()
    assert 'id="dj-dashboard-link"' in index and "model-dashboard" not in index
    from django.contrib.auth.models import Permission, User

    User.objects.get(username="ops").user_permissions.set(
        Permission.objects.filter(codename="view_apitoken")
    )
    index = client.get("/admin/").content.decode()
    assert "dj-dashboard-link" not in index and "model-dashboard" not in index


def test_the_queue_admin_sets_and_clears_a_rate_limit(client) -> None:
    JobFactory(queue="emails")
    _staff(client, "view_queue", "add_queue", "change_queue", "view_job")
    for bad in ("ten/s", "0/s", "5/0s"):
        response = client.post(
            "/admin/django_jobs/queue/add/",
            {"name": "emails", "concurrency_limit": "", "rate": bad},
        )
        assert response.status_code == 200 and "rate limit" in response.content.decode()
        assert not Queue.objects.exists()
    client.post(
        "/admin/django_jobs/queue/add/",
        {"name": "emails", "concurrency_limit": "", "rate": "100/m"},
    )
    row = Queue.objects.get(name="emails")
    assert (row.rate_limit, row.rate_period, row.rate_source) == (100, 60, "admin")
    page = client.get(f"/admin/django_jobs/queue/{row.pk}/change/").content.decode()
    assert 'value="100/m"' in page
    client.post(f"/admin/django_jobs/queue/{row.pk}/change/", {"concurrency_limit": "", "rate": ""})
    row.refresh_from_db()
    assert (row.rate_limit, row.rate_period) == (None, None)


def test_the_queue_controls_list_gives_the_pause_time_to_the_second(client) -> None:
    from django.utils import timezone

    JobFactory(queue="gpu")
    queues.pause("gpu", by="operator", reason="maintenance")
    _staff(client, "view_queue")
    paused_at = timezone.localtime(Queue.objects.get(name="gpu").paused_at)
    page = client.get("/admin/django_jobs/queue/").content.decode()
    assert f">{paused_at:%Y-%m-%d %H:%M:%S}</time>" in page
