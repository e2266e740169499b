"""KubernetesLiveness (the official Kubernetes client) against a recorded pod-list response
served over local HTTP(S)."""

from __future__ import annotations

import base64
import json
import logging
import logging.handlers
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test.utils import override_settings

from django_jobs.liveness import KubernetesLiveness
from django_jobs.models import Job, Worker
from django_jobs.reaper import reap_pass
from tests.factories import AttemptFactory, JobFactory, WorkerFactory
from tests.integration.helpers import silent_server
from tests.timing import BUSY_MACHINE_MARGIN

pytestmark = pytest.mark.django_db

PODS = (Path(__file__).parent.parent / "data" / "pods.json").read_bytes()
ALIVE = "jobs-worker-6d9c7f8b5d-2xkqp"
RESTARTED = "jobs-worker-6d9c7f8b5d-r8vzt"
GONE = "jobs-worker-6d9c7f8b5d-dead1"
ALIVE_UID = "3f1c2a9e-7b8d-4c1e-9a60-2f0e8c1d7a11"


class FakeApi:
    """A Kubernetes API in a thread that serves ``pods`` (a copy of the recorded pod list, for a
    test to change) for namespace ``jobs``, over http, or https with ``tls``."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.pods: dict[str, Any] = json.loads(PODS)
        self.requests: list[tuple[str, str | None]] = []
        self.forbidden = ""  # if set, the message of a 403 answer to every pod list
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.requests.append((self.path, self.headers.get("Authorization")))
                if not self.path.startswith("/api/v1/namespaces/jobs/pods"):
                    self.send_response(404)
                    self.end_headers()
                    return
                if api.forbidden:
                    status = {"kind": "Status", "code": 403, "message": api.forbidden}
                    self.send_response(403)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(json.dumps(status).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(api.pods).encode())

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that refused our certificate, or had none to show

        self.server = Server(("127.0.0.1", 0), Handler)
        if tls is not None:
            # The handshake happens in the request's thread, not in the one that accepts.
            self.server.socket = tls.wrap_socket(
                self.server.socket, server_side=True, do_handshake_on_connect=False
            )
        scheme = "http" if tls is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def pod(self, name: str) -> dict[str, Any]:
        return next(p for p in self.pods["items"] if p["metadata"]["name"] == name)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def start_api() -> Iterator[Callable[..., FakeApi]]:
    started: list[FakeApi] = []

    def start(tls: ssl.SSLContext | None = None) -> FakeApi:
        started.append(FakeApi(tls))
        return started[-1]

    yield start
    for api in started:
        api.close()


@pytest.fixture
def api(start_api: Callable[..., FakeApi]) -> FakeApi:
    return start_api()


@pytest.fixture(autouse=True)
def outside_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    """No in-cluster service account, whatever machine the tests run on."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)


@pytest.fixture
def reaper_log() -> Iterator[list[logging.LogRecord]]:
    """The reaper's records of WARNING and up, whatever level and handlers a command set."""
    logger = logging.getLogger("django_jobs.reaper")
    handler = logging.handlers.BufferingHandler(capacity=1000)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    yield handler.buffer
    logger.removeHandler(handler)
    logger.setLevel(level)


def kubernetes(api: FakeApi, **options: Any) -> dict[str, Any]:
    """Settings for ``api``: a token sent over local plain http, which a test must allow."""
    return {
        "JOBS_KUBERNETES": {
            "api_url": api.url,
            "token": "sa-token",
            "namespace": "jobs",
            "allow_insecure_http": True,
            **options,
        },
        "JOBS_HEARTBEAT_INTERVAL": 10,
        "JOBS_WORKER_TIMEOUT": 60,
    }


def running_on(pod: str, silent_for: int = 30, name: str | None = None) -> Job:
    """A job running on a worker in ``pod`` (as recorded from ``POD_NAME``), whose last
    heartbeat was ``silent_for`` seconds ago. The worker's name is the pod's unless given."""
    worker = WorkerFactory(id=f"{name or pod}:1:abc123", name=name or pod, pod=pod)
    Worker.objects.filter(pk=worker.pk).update(
        last_seen_at=worker.started_at - timedelta(seconds=silent_for)
    )
    job = JobFactory(claimed=True, worker_id=worker.id)
    AttemptFactory(job=job, number=1, worker_id=worker.id)
    return job


def reaped(settings: dict[str, Any]) -> dict[int, str]:
    """One pass with KubernetesLiveness: the reason of each job it reaped, by id."""
    with override_settings(**settings):
        report = reap_pass(liveness=KubernetesLiveness())
    return {a.job.lease.job_id: a.reason for a in report.actions if a.new_state}


def test_pods_that_are_gone_or_restarted_mean_dead_workers(api) -> None:
    settings = kubernetes(api, label_selector="app=jobs-worker")
    # None of these workers is stale by heartbeat alone (60 s).
    alive, restarted, gone = running_on(ALIVE), running_on(RESTARTED), running_on(GONE)
    # The restarted pod's worker was first seen before its container was OOM-killed.
    Worker.objects.filter(pod=RESTARTED).update(
        boot_id="a7e4b1c2-0d3f-4e5a-8b6c-9d0e1f2a3b4c,containerd://0ld0ld"
    )
    reasons = reaped(settings)

    assert set(reasons) == {restarted.pk, gone.pk}
    assert f"pod {GONE} no longer exists" in reasons[gone.pk]
    assert f"pod {RESTARTED} has restarted" in reasons[restarted.pk]
    assert Job.objects.get(pk=alive.pk).state == "running"
    # The live pod's boot identity was recorded on first sight, to notice a later restart.
    assert Worker.objects.get(pod=ALIVE).boot_id == (
        f"{ALIVE_UID},containerd://9b2f6c0e4d5a8b1c7e3f2a6d9c0b4e8f1a2d3c4b5e6f7a8b9c0d1e2f3a4b5c6d"
    )
    path, auth = api.requests[0]
    assert path == "/api/v1/namespaces/jobs/pods?labelSelector=app%3Djobs-worker"
    assert auth == "Bearer sa-token"


def test_a_worker_whose_pod_is_missing_but_still_beats_is_left_alone(api) -> None:
    job = running_on(GONE, silent_for=1)  # heartbeat one second ago: it is alive somewhere
    with override_settings(**kubernetes(api)):
        report = reap_pass(liveness=KubernetesLiveness())
    assert [a.new_state for a in report.actions] == [None]  # judged, but the re-check refused
    assert Job.objects.get(pk=job.pk).state == "running"


def test_a_worker_is_found_by_the_pod_it_recorded_not_by_its_name(api) -> None:
    # Two worker containers in one pod, with distinct JOBS_WORKER_IDs as the README advises:
    # neither name is a pod's, and both are alive in a live pod.
    reports = running_on(ALIVE, name="reports-worker")
    imports = running_on(ALIVE, name="imports-worker")
    # Without a pod recorded (POD_NAME unset), only the heartbeat can say it is gone, even if
    # its name happens to be a pod's that no longer exists.
    elsewhere = running_on("", name=GONE)
    gone_pod = running_on(GONE, name="exports-worker")

    reasons = reaped(kubernetes(api))

    assert set(reasons) == {gone_pod.pk}
    assert f"pod {GONE} no longer exists" in reasons[gone_pod.pk]
    running = Job.objects.filter(state="running").values_list("pk", flat=True)
    assert set(running) == {reports.pk, imports.pk, elsewhere.pk}


def test_a_sidecar_restart_is_not_a_worker_restart(api) -> None:
    pod = api.pod(ALIVE)
    pod["spec"]["containers"].append({"name": "istio-proxy", "image": "istio/proxyv2:1.22"})
    statuses = pod["status"]["containerStatuses"]
    statuses.insert(0, {"name": "istio-proxy", "containerID": "containerd://proxy-1"})
    job = running_on(ALIVE)
    assert reaped(kubernetes(api)) == {}  # first sight: the worker container's id is recorded

    statuses[0]["containerID"] = "containerd://proxy-2"  # the sidecar restarted
    assert reaped(kubernetes(api)) == {}

    statuses[1]["containerID"] = "containerd://worker-2"  # now the worker's own container
    reasons = reaped(kubernetes(api))
    assert set(reasons) == {job.pk} and f"pod {ALIVE} has restarted" in reasons[job.pk]


def test_the_worker_container_is_the_setting_else_the_annotated_default_else_the_first(
    api,
) -> None:
    pod = {
        "metadata": {"name": ALIVE, "uid": ALIVE_UID, "annotations": {}},
        "spec": {"containers": [{"name": "istio-proxy"}, {"name": "worker"}]},
        "status": {
            "containerStatuses": [
                {"name": "worker", "containerID": "containerd://w"},
                {"name": "istio-proxy", "containerID": "containerd://p"},
            ]
        },
    }
    with override_settings(**kubernetes(api)):
        assert KubernetesLiveness().worker_container(pod) == "istio-proxy"
        assert KubernetesLiveness().boot_id(pod) == f"{ALIVE_UID},containerd://p"
        pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] = "worker"
        assert KubernetesLiveness().boot_id(pod) == f"{ALIVE_UID},containerd://w"
    pod["metadata"]["annotations"].clear()
    with override_settings(**kubernetes(api, container="worker")):
        assert KubernetesLiveness().boot_id(pod) == f"{ALIVE_UID},containerd://w"


def test_a_misnamed_worker_container_is_reported(api, reaper_log) -> None:
    running_on(ALIVE)
    assert reaped(kubernetes(api, container="wrker")) == {}
    (record,) = reaper_log
    assert f"{ALIVE} has no container 'wrker'" in record.getMessage()


def test_an_unreachable_api_leaves_the_pass_to_heartbeats(reaper_log) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"  # nothing listens there any more
    silent_for_an_hour = running_on(ALIVE, silent_for=3600)
    silent_for_a_while = running_on(GONE, silent_for=30)
    settings = {"JOBS_KUBERNETES": {"api_url": url, "namespace": "jobs"}}

    reasons = reaped(settings)

    assert set(reasons) == {silent_for_an_hour.pk}
    assert "no heartbeat for 3600s" in reasons[silent_for_an_hour.pk]
    assert Job.objects.get(pk=silent_for_a_while.pk).state == "running"
    messages = [r.getMessage() for r in reaper_log if "Kubernetes API" in r.getMessage()]
    assert len(messages) == 1 and "judging workers by their heartbeats alone" in messages[0]
    assert url in messages[0]


def test_a_token_is_not_sent_over_plain_http_unless_allowed(api, tmp_path) -> None:
    options = {"api_url": api.url, "token": "sa-token", "namespace": "jobs"}
    with (
        override_settings(JOBS_KUBERNETES=options),
        pytest.raises(ImproperlyConfigured, match=r"clear text.*'allow_insecure_http'\] = True"),
    ):
        KubernetesLiveness()
    config = kubeconfig(tmp_path, api.url, user={"token": "sa-token"})
    with (
        override_settings(JOBS_KUBERNETES={"kubeconfig": config}),
        pytest.raises(ImproperlyConfigured, match="plain http://"),
    ):
        KubernetesLiveness()
    assert api.requests == []

    with override_settings(JOBS_KUBERNETES={**options, "token": None}):
        assert set(KubernetesLiveness().list_pods()) == {ALIVE, RESTARTED}  # kubectl proxy
    with override_settings(JOBS_KUBERNETES={**options, "allow_insecure_http": True}):
        assert set(KubernetesLiveness().list_pods()) == {ALIVE, RESTARTED}
    assert [auth for _, auth in api.requests] == [None, "Bearer sa-token"]


def test_unknown_kubernetes_options_are_refused() -> None:
    with (
        override_settings(JOBS_KUBERNETES={"api_url": "https://k8s", "allow_insecure_https": True}),
        pytest.raises(ImproperlyConfigured, match=r"unknown keys.*allow_insecure_https"),
    ):
        KubernetesLiveness()


# ---------------------------------------------------------------- kubeconfig and TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, and a server certificate for 127.0.0.1 and a client certificate that it signed."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make certificates with")
    directory = tmp_path_factory.mktemp("certs")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl(
        "req", "-x509", *key, "-days", "2", "-subj", "/CN=django-jobs test CA",
        "-keyout", "ca.key", "-out", "ca.crt",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    extensions = {
        "server": "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for name, extension in extensions.items():
        (directory / f"{name}.ext").write_text(
            extension + "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        openssl(
            "req", *key, "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr"
        )
        openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext",
        )  # fmt: skip
    return directory


def server_tls(certs: Path, *, client_certificate: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs / "server.crt", certs / "server.key")
    if client_certificate:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(certs / "ca.crt")
    return context


def kubeconfig(
    tmp_path: Path, server: str, *, cluster: dict | None = None, user: dict | None = None
) -> str:
    """A kubeconfig (JSON, which is YAML too) whose current context is namespace ``jobs``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "test",
        "contexts": [
            {"name": "test", "context": {"cluster": "c", "user": "u", "namespace": "jobs"}}
        ],
        "clusters": [{"name": "c", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user or {}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return str(path)


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def pods_through(config: str) -> set[str]:
    with override_settings(JOBS_KUBERNETES={"kubeconfig": config}):
        return set(KubernetesLiveness().list_pods())


def test_kubeconfig_certificate_authority_data_is_trusted(start_api, certs, tmp_path) -> None:
    api = start_api(server_tls(certs))
    cluster = {"certificate-authority-data": b64(certs / "ca.crt")}
    config = kubeconfig(tmp_path, api.url, cluster=cluster, user={"token": "sa-token"})
    assert pods_through(config) == {ALIVE, RESTARTED}
    assert api.requests == [("/api/v1/namespaces/jobs/pods", "Bearer sa-token")]


def test_kubeconfig_insecure_skip_tls_verify_is_honoured(start_api, certs, tmp_path) -> None:
    api = start_api(server_tls(certs))
    cluster = {"insecure-skip-tls-verify": True}
    assert pods_through(kubeconfig(tmp_path, api.url, cluster=cluster)) == {ALIVE, RESTARTED}


@pytest.mark.parametrize("form", ["data", "files"])
def test_kubeconfig_client_certificate_is_presented(start_api, certs, tmp_path, form) -> None:
    api = start_api(server_tls(certs, client_certificate=True))
    if form == "data":
        user = {
            "client-certificate-data": b64(certs / "client.crt"),
            "client-key-data": b64(certs / "client.key"),
        }
    else:  # paths relative to the kubeconfig, as kubectl reads them
        shutil.copy(certs / "client.crt", tmp_path / "client.crt")
        shutil.copy(certs / "client.key", tmp_path / "client.key")
        user = {"client-certificate": "client.crt", "client-key": "client.key"}
    cluster = {"certificate-authority": str(certs / "ca.crt")}
    config = kubeconfig(tmp_path, api.url, cluster=cluster, user=user)
    assert pods_through(config) == {ALIVE, RESTARTED}


def test_kubeconfig_exec_plugin_token_is_sent(start_api, certs, tmp_path) -> None:
    plugin = tmp_path / "get-token.py"  # stands for kubelogin, `aws eks get-token`, ...
    plugin.write_text(
        "import json, os\n"
        "info = json.loads(os.environ['KUBERNETES_EXEC_INFO'])\n"
        "print(json.dumps({'apiVersion': info['apiVersion'], 'kind': 'ExecCredential',\n"
        "                  'status': {'token': 'exec-token'}}))\n"
    )
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin)],
        }
    }
    api = start_api(server_tls(certs))
    cluster = {"certificate-authority-data": b64(certs / "ca.crt")}
    assert pods_through(kubeconfig(tmp_path, api.url, cluster=cluster, user=user)) == {
        ALIVE,
        RESTARTED,
    }
    assert api.requests == [("/api/v1/namespaces/jobs/pods", "Bearer exec-token")]


def test_a_failing_exec_plugin_leaves_the_pass_to_heartbeats(api, tmp_path, reaper_log) -> None:
    plugin = tmp_path / "get-token.py"
    plugin.write_text("import sys\nsys.exit('token expired: run `aws sso login`')\n")
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": sys.executable,
            "args": [str(plugin)],
        }
    }
    api.forbidden = "Unauthorized"  # an API server refuses a request without credentials
    job = running_on(GONE)
    settings = {
        **kubernetes(api),
        "JOBS_KUBERNETES": {"kubeconfig": kubeconfig(tmp_path, api.url, user=user)},
    }
    assert reaped(settings) == {}
    assert Job.objects.get(pk=job.pk).state == "running"
    assert [auth for _, auth in api.requests] == [None]
    (message,) = [r.getMessage() for r in reaper_log if "Kubernetes API" in r.getMessage()]
    assert "judging workers by their heartbeats alone" in message


def test_kubeconfig_impersonation_is_refused_by_name(api, tmp_path) -> None:
    # The client does not impersonate: it would act with the user's own credentials.
    config = kubeconfig(tmp_path, api.url, user={"token": "t", "as": "system:admin"})
    with pytest.raises(ImproperlyConfigured, match=r"impersonation \(as\): not supported"):
        pods_through(config)
    assert api.requests == []


def test_a_missing_kubeconfig_says_what_to_set(tmp_path) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"no in-cluster service account.*'api_url'"):
        pods_through(str(tmp_path / "nowhere"))


# ---------------------------------------------------------------- in a pod


@pytest.fixture
def in_a_pod(monkeypatch, certs, tmp_path) -> Callable[[FakeApi], Path]:
    """Make the process look like it runs in a pod whose API server is ``api``: the service
    account's token, CA and namespace in a directory, and the service host and port."""

    def enter(api: FakeApi) -> Path:
        account = tmp_path / "serviceaccount"
        account.mkdir()
        (account / "token").write_text("sa-token")  # as the kubelet writes it: no newline
        (account / "namespace").write_text("jobs")
        shutil.copy(certs / "ca.crt", account / "ca.crt")
        monkeypatch.setattr(KubernetesLiveness, "SERVICE_ACCOUNT", account)
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.server.server_address[1]))
        return account

    return enter


def test_in_a_pod_the_service_account_is_used(start_api, certs, in_a_pod, tmp_path) -> None:
    api = start_api(server_tls(certs))
    in_a_pod(api)
    config = kubeconfig(tmp_path, "https://elsewhere.example:6443")  # not read in a pod
    beats = {"JOBS_HEARTBEAT_INTERVAL": 10, "JOBS_WORKER_TIMEOUT": 60}
    running_on(GONE)
    with override_settings(JOBS_KUBERNETES={"kubeconfig": config}, **beats):
        liveness = KubernetesLiveness()
        assert liveness.api.url == api.url
        report = reap_pass(liveness=liveness)
    (reason,) = [a.reason for a in report.actions if a.new_state]
    assert f"pod {GONE} no longer exists" in reason
    path, auth = api.requests[0]
    assert path == "/api/v1/namespaces/jobs/pods"  # the service account's namespace
    assert auth is not None and auth.lower() == "bearer sa-token"


def test_in_a_pod_the_settings_api_url_comes_first(api, start_api, certs, in_a_pod) -> None:
    in_a_pod(start_api(server_tls(certs)))
    with override_settings(**kubernetes(api)):
        assert KubernetesLiveness().api.url == api.url


def test_in_a_pod_an_untrusted_server_leaves_the_pass_to_heartbeats(
    start_api, certs, in_a_pod, reaper_log
) -> None:
    api = start_api(server_tls(certs))
    account = in_a_pod(api)
    (account / "ca.crt").write_text((certs / "client.crt").read_text())  # not the server's CA
    job = running_on(GONE)
    assert reaped({"JOBS_HEARTBEAT_INTERVAL": 10, "JOBS_WORKER_TIMEOUT": 60}) == {}
    assert Job.objects.get(pk=job.pk).state == "running"
    (message,) = [r.getMessage() for r in reaper_log if "Kubernetes API" in r.getMessage()]
    assert "CERTIFICATE_VERIFY_FAILED" in message and "\n" not in message


# ---------------------------------------------------------------- failures


def test_a_forbidden_pod_list_is_one_warning_with_the_api_message(api, reaper_log) -> None:
    api.forbidden = (
        'pods is forbidden: User "system:serviceaccount:jobs:reapjobs" cannot list resource '
        '"pods" in API group "" in the namespace "jobs"'
    )
    running_on(GONE)
    assert reaped(kubernetes(api)) == {}
    (message,) = [r.getMessage() for r in reaper_log]
    assert f"Exception: HTTP 403 Forbidden: {api.forbidden})" in message
    assert "judging workers by their heartbeats alone this pass" in message


def test_a_hung_api_server_cannot_stall_the_pass(monkeypatch, reaper_log) -> None:
    # A server that accepts connections, counts them, and never answers.
    with silent_server() as ((host, port), accepted):
        url = f"http://{host}:{port}"
        monkeypatch.setattr(KubernetesLiveness, "TIMEOUT", 1.0)
        silent_for_an_hour = running_on(ALIVE, silent_for=3600)
        silent_for_a_while = running_on(GONE, silent_for=30)  # a pod list would reap it
        started = time.monotonic()
        reasons = reaped({"JOBS_KUBERNETES": {"api_url": url, "namespace": "jobs"}})
        took = time.monotonic() - started
        tries = len(accepted)
    assert set(reasons) == {silent_for_an_hour.pk}
    assert tries == 1, tries  # one attempt, no retries
    # The 1 s timeout; without one the pass would wait as long as the server does, for ever.
    assert took < 1.0 + BUSY_MACHINE_MARGIN, f"the pass took {took:.1f}s for a 1s timeout"
    assert Job.objects.get(pk=silent_for_a_while.pk).state == "running"
    (message,) = [r.getMessage() for r in reaper_log if "Kubernetes API" in r.getMessage()]
    assert "timed out" in message and url.split("//")[1] in message


def test_without_the_kubernetes_extra_the_error_names_it(monkeypatch, api) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # as if it were not installed
    with (
        override_settings(**kubernetes(api)),
        pytest.raises(ImproperlyConfigured, match=r"pip install 'django-pgjobs\[kubernetes\]'"),
    ):
        KubernetesLiveness()


def test_the_recorded_response_is_a_real_pod_list() -> None:
    body = json.loads(PODS)
    assert body["kind"] == "PodList"
    assert {p["metadata"]["name"] for p in body["items"]} == {ALIVE, RESTARTED}
