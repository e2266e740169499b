"""Deciding which workers are gone, for the reaper.

``JOBS_LIVENESS_CHECK`` names the class to use (a dotted path in settings, which is code the
operator chose, not data from a job row). Two ship with django-jobs:

- :class:`HeartbeatLiveness` (the default): a worker is gone when it has no registry row, or its
  last heartbeat is older than ``JOBS_WORKER_TIMEOUT`` (by the database's clock).
- :class:`KubernetesLiveness`: as above, and also when the pod the worker recorded as its own
  (``POD_NAME``) no longer exists or has ended, or the worker's container in it has restarted
  since the worker was first seen. It needs no client library: it reads the pod list from the
  Kubernetes API with the pod's service account, a URL and token from settings, or a kubeconfig
  (JSON, or YAML with the ``kubernetes`` extra). When the API cannot be reached, a pass judges
  by heartbeats alone.
"""

from __future__ import annotations

import base64
import dataclasses
import http.client
import json
import logging
import os
import ssl
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_jobs import conf, store
from django_jobs.cursor import Cursor
from django_jobs.store import RunningJob

logger = logging.getLogger("django_jobs.reaper")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why a worker counts as gone, and how long it must have been silent for the reaper's
    in-statement re-check (a worker that sent a heartbeat since is alive whatever was said)."""

    reason: str
    silence: float


class LivenessCheck(Protocol):
    def dead_workers(self, jobs: Sequence[RunningJob], cursor: Cursor) -> dict[str, Verdict]:
        """Map the worker ids (of these running jobs) that are gone to a verdict."""
        ...


class HeartbeatLiveness:
    """A worker is gone when its heartbeat is older than ``JOBS_WORKER_TIMEOUT``."""

    def __init__(self, worker_timeout: float | None = None) -> None:
        self.worker_timeout = conf.worker_timeout() if worker_timeout is None else worker_timeout

    def dead_workers(self, jobs: Sequence[RunningJob], cursor: Cursor) -> dict[str, Verdict]:
        dead = {}
        for job in jobs:
            worker_id = job.lease.worker_id
            if job.unregistered:
                dead[worker_id] = Verdict("worker is not registered (gone)", self.worker_timeout)
            elif job.silent_for is not None and job.silent_for > self.worker_timeout:
                dead[worker_id] = Verdict(
                    f"no heartbeat for {job.silent_for:.0f}s (limit {self.worker_timeout:.0f}s)",
                    self.worker_timeout,
                )
        return dead


# What a failed pod list can raise: no connection, TLS, a timeout or an HTTP error status (all
# OSError), a broken response, or a body that is not a pod list.
API_ERRORS = (OSError, http.client.HTTPException, ValueError, KeyError, TypeError)

#: The annotation by which kubectl picks a pod's main container.
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"


class KubernetesLiveness(HeartbeatLiveness):
    """Also treat a worker as gone when its pod is gone or has ended, or its container has
    restarted.

    A worker's pod is the one it recorded when it registered: the ``POD_NAME`` environment
    variable, set from the Downward API. A worker that recorded none (``POD_NAME`` unset, or
    it runs outside the cluster) is judged by its heartbeat alone. A restart counts only for
    the worker's own container (``container``; default: the pod's
    ``kubectl.kubernetes.io/default-container`` annotation, else its first container), so a
    sidecar's restart does not. A worker that still sends heartbeats is never judged by the pod
    list alone: the reaper re-checks that it has been silent for two heartbeat intervals.

    If the pod list cannot be read, the pass judges by heartbeats alone and logs a warning.

    Settings, all optional, in ``JOBS_KUBERNETES``: see
    :func:`django_jobs.conf.kubernetes_options`.
    """

    SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

    def __init__(self, worker_timeout: float | None = None) -> None:
        super().__init__(worker_timeout)
        options = conf.kubernetes_options()
        self.api = locate_api(options, self.SERVICE_ACCOUNT)
        self.label_selector = options.get("label_selector", "")
        self.container: str | None = options.get("container") or None
        self.silence = 2 * conf.heartbeat_interval()

    def list_pods(self) -> dict[str, dict[str, Any]]:
        """Pods of the namespace by name, as the API returns them."""
        path = f"/api/v1/namespaces/{urllib.parse.quote(self.api.namespace)}/pods"
        if self.label_selector:
            path += "?labelSelector=" + urllib.parse.quote(self.label_selector)
        body = self.api.get(path)
        return {pod["metadata"]["name"]: pod for pod in body.get("items", [])}

    def worker_container(self, pod: dict[str, Any]) -> str | None:
        """The name of the pod's worker container (see the class's docstring)."""
        if self.container:
            return self.container
        annotations = pod.get("metadata", {}).get("annotations") or {}
        if annotations.get(DEFAULT_CONTAINER_ANNOTATION):
            return str(annotations[DEFAULT_CONTAINER_ANNOTATION])
        containers = pod.get("spec", {}).get("containers") or [{}]
        return containers[0].get("name")

    def boot_id(self, pod: dict[str, Any]) -> str | None:
        """The pod's uid and its worker container's id. It changes when that container restarts
        or the pod is replaced by one of the same name, and not when a sidecar restarts. ``None``
        while the container has no id (it has not started yet, or the pod has no such one)."""
        name = self.worker_container(pod)
        statuses = pod.get("status", {}).get("containerStatuses") or []
        container_id = next((s.get("containerID") for s in statuses if s.get("name") == name), "")
        if not container_id:
            return None
        return f"{pod['metadata'].get('uid', '')},{container_id}"[:255]

    def dead_workers(self, jobs: Sequence[RunningJob], cursor: Cursor) -> dict[str, Verdict]:
        dead = super().dead_workers(jobs, cursor)
        candidates = {job.lease.worker_id for job in jobs} - set(dead)
        if not candidates:
            return dead
        try:
            pods = self.list_pods()
        except API_ERRORS as exc:
            logger.warning(
                "Kubernetes API at %s could not list pods (%s: %s); judging workers by their "
                "heartbeats alone this pass",
                self.api.url,
                type(exc).__name__,
                exc,
            )
            return dead
        misnamed = []
        for seen in store.worker_pods(cursor, candidates):
            pod = pods.get(seen.pod)
            if pod is None:
                dead[seen.worker_id] = Verdict(f"pod {seen.pod} no longer exists", self.silence)
                continue
            phase = pod.get("status", {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                dead[seen.worker_id] = Verdict(f"pod {seen.pod} has ended ({phase})", self.silence)
                continue
            boot = self.boot_id(pod)
            if boot is None:
                container = self.worker_container(pod)
                containers = pod.get("spec", {}).get("containers") or []
                if container not in {c.get("name") for c in containers}:
                    misnamed.append(f"{seen.pod} has no container {container!r}")
            elif not seen.boot_id:
                store.record_worker_boot(cursor, seen.worker_id, boot)
            elif seen.boot_id != boot:
                dead[seen.worker_id] = Verdict(f"pod {seen.pod} has restarted", self.silence)
        if misnamed:
            logger.warning(
                "restarts of these pods' workers go unnoticed: %s (set the worker's container "
                "in JOBS_KUBERNETES['container'])",
                "; ".join(sorted(misnamed)),
            )
        return dead


@dataclasses.dataclass(frozen=True)
class KubernetesApi:
    """Where the Kubernetes API is, and how to reach it: a bearer token, and for https, the
    TLS context (which checks the server's certificate and may present a client certificate)."""

    url: str
    namespace: str
    token: str | None = None
    tls: ssl.SSLContext | None = None

    def get(self, path: str) -> Any:
        """The JSON body of a GET of ``path``; raises one of :data:`API_ERRORS`."""
        request = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=10, context=self.tls) as response:
            return json.load(response)


def locate_api(options: dict[str, Any], service_account: Path) -> KubernetesApi:
    """The API named by ``options`` (``api_url``), else the pod's service account, else the
    kubeconfig. Raises ``ImproperlyConfigured`` if it would send a token in clear text."""
    namespace = options.get("namespace")
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if options.get("api_url"):
        url = str(options["api_url"]).rstrip("/")
        api = KubernetesApi(
            url,
            namespace or "default",
            options.get("token"),
            _tls_context(url, cafile=options.get("ca_file"), verify=options.get("verify", True)),
        )
    elif host and (service_account / "token").exists():
        host = f"[{host}]" if ":" in host else host  # an IPv6 address
        url = f"https://{host}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
        api = KubernetesApi(
            url,
            namespace or (service_account / "namespace").read_text().strip(),
            (service_account / "token").read_text().strip(),
            _tls_context(url, cafile=str(service_account / "ca.crt")),
        )
    else:
        api = _from_kubeconfig(options.get("kubeconfig"), namespace)
    if api.url.startswith("http://") and api.token and not options.get("allow_insecure_http"):
        raise ImproperlyConfigured(
            f"KubernetesLiveness: the Kubernetes API at {api.url} is plain http://, which would "
            "send the bearer token in clear text. Use an https:// URL; or, for an API that needs "
            "no token (a local `kubectl proxy`), give none; or, to send it anyway, set "
            "JOBS_KUBERNETES['allow_insecure_http'] = True."
        )
    return api


def _tls_context(
    url: str,
    *,
    cafile: str | None = None,
    cadata: str | None = None,
    verify: bool = True,
    client_cert: tuple[bytes, bytes] | None = None,
) -> ssl.SSLContext | None:
    """The TLS context for ``url`` (``None`` for http): it trusts ``cafile`` or ``cadata`` (PEM)
    if given, else the system's CAs; checks nothing unless ``verify``; and presents
    ``client_cert``, a PEM ``(certificate, key)`` pair, if given."""
    if not url.startswith("https://"):
        return None
    context = ssl.create_default_context(cafile=cafile, cadata=cadata)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if client_cert is not None:
        # The ssl module loads a certificate and key only from files: keep them for the moment
        # it takes, in a directory only this user can read.
        with tempfile.TemporaryDirectory(prefix="django-jobs-kube-") as directory:
            cert_file, key_file = Path(directory, "client.crt"), Path(directory, "client.key")
            cert_file.write_bytes(client_cert[0])
            key_file.write_bytes(client_cert[1])
            context.load_cert_chain(cert_file, key_file)
    return context


# What a kubeconfig can say that this reader does not do, by key; each one is refused rather
# than ignored, so that the check never talks to a server other than the one configured, or
# with other credentials.
_UNSUPPORTED_USER = {
    "exec": "exec authentication (a credential plugin such as kubelogin, "
    "gke-gcloud-auth-plugin or `aws eks get-token`)",
    "auth-provider": "auth-provider authentication",
    "username": "basic authentication (username and password)",
    "password": "basic authentication (username and password)",
    "as": "impersonation (as)",
    "as-uid": "impersonation (as-uid)",
    "as-groups": "impersonation (as-groups)",
    "as-user-extra": "impersonation (as-user-extra)",
}
_UNSUPPORTED_CLUSTER = {
    "proxy-url": "a proxy (proxy-url)",
    "tls-server-name": "tls-server-name",
}


def _from_kubeconfig(path: str | None, namespace: str | None) -> KubernetesApi:
    """The API of the kubeconfig's current context: its server, CA (``certificate-authority``
    or ``-data``, or ``insecure-skip-tls-verify``), and its user's ``token`` (or ``tokenFile``)
    or client certificate (``client-certificate`` and ``client-key``, or their ``-data``)."""
    config_path = Path(path or os.environ.get("KUBECONFIG") or Path.home() / ".kube/config")
    where = f"kubeconfig {config_path}"
    if not config_path.exists():
        raise ImproperlyConfigured(
            f"KubernetesLiveness found no in-cluster service account and no {where}; set "
            "JOBS_KUBERNETES['api_url'] (and 'token'), or 'kubeconfig'"
        )
    config = _read_kubeconfig(config_path)
    context_name = config.get("current-context")
    context = _named(config.get("contexts"), context_name, "context", where)
    cluster = _named(config.get("clusters"), context.get("cluster"), "cluster", where)
    user = (
        _named(config.get("users"), context["user"], "user", where) if context.get("user") else {}
    )
    unsupported = sorted(
        {
            feature
            for item, features in ((cluster, _UNSUPPORTED_CLUSTER), (user, _UNSUPPORTED_USER))
            for key, feature in features.items()
            if key in item
        }
    )
    if unsupported:
        raise ImproperlyConfigured(
            f"{where}, context {context_name!r}: {'; '.join(unsupported)}: not supported by "
            "KubernetesLiveness. Give the context a user with a token (a service account's: "
            "`kubectl create token NAME`) or a client certificate, or set "
            "JOBS_KUBERNETES['api_url'] and 'token' instead."
        )

    def data(item: dict[str, Any], key: str) -> bytes | None:
        """The PEM of ``key``, from its ``-data`` (base64) or from its file."""
        if item.get(f"{key}-data"):
            return base64.b64decode(item[f"{key}-data"])
        if item.get(key):
            return (config_path.parent / item[key]).read_bytes()  # relative to the kubeconfig
        return None

    server = str(cluster["server"]).rstrip("/")
    cert, key = data(user, "client-certificate"), data(user, "client-key")
    if (cert is None) != (key is None):
        raise ImproperlyConfigured(
            f"{where}, user {context.get('user')!r}: a client certificate needs both "
            "client-certificate and client-key (or their -data)"
        )
    token = user.get("token")
    if not token and user.get("tokenFile"):
        token = (config_path.parent / user["tokenFile"]).read_text().strip()
    ca = data(cluster, "certificate-authority")
    return KubernetesApi(
        server,
        namespace or context.get("namespace") or "default",
        token,
        _tls_context(
            server,
            cadata=None if ca is None else ca.decode(),
            verify=not cluster.get("insecure-skip-tls-verify", False),
            client_cert=None if cert is None or key is None else (cert, key),
        ),
    )


def _read_kubeconfig(path: Path) -> dict[str, Any]:
    text = path.read_text()
    try:
        import yaml
    except ImportError:
        try:
            return dict(json.loads(text))
        except ValueError:
            raise ImproperlyConfigured(
                f"reading the YAML kubeconfig {path} needs PyYAML: pip install "
                "'django-pgjobs[kubernetes]' (or write the kubeconfig as JSON)"
            ) from None
    return dict(yaml.safe_load(text))


def _named(entries: Any, name: Any, kind: str, where: str) -> dict[str, Any]:
    """The ``kind`` part of the entry called ``name`` in a kubeconfig list."""
    for entry in entries or []:
        if entry.get("name") == name:
            return dict(entry.get(kind) or {})
    raise ImproperlyConfigured(f"{where} has no {kind} named {name!r}")


def liveness_check() -> LivenessCheck:
    """An instance of the class named by ``JOBS_LIVENESS_CHECK``."""
    return import_string(conf.liveness_check_path())()
