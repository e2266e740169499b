"""Deciding which workers are gone, for the reaper.

``JOBS_LIVENESS_CHECK`` names the class to use (a dotted path in settings, which is code the
operator chose, not data from a job row). Two ship with django-jobs:

- :class:`HeartbeatLiveness` (the default): a worker is gone when it has no registry row, or its
  last heartbeat is older than ``JOBS_WORKER_TIMEOUT`` (by the database's clock).
- :class:`KubernetesLiveness`: as above, and also when the pod the worker recorded as its own
  (``POD_NAME``) no longer exists or has ended, or the worker's container in it has restarted
  since the worker was first seen. It reads the pod list with the official Kubernetes client
  (the ``kubernetes`` extra), using the pod's service account, a URL and token from settings, or
  a kubeconfig. When the API cannot be reached, a pass judges by heartbeats alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import warnings
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


#: The annotation by which kubectl picks a pod's main container.
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"

#: The extra that installs the official Kubernetes client.
KUBERNETES_EXTRA = "pip install 'django-pgjobs[kubernetes]'"


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
    #: Seconds a pod list may take, so that a hung API server cannot stall the reaper.
    TIMEOUT = 10.0

    def __init__(self, worker_timeout: float | None = None) -> None:
        super().__init__(worker_timeout)
        options = conf.kubernetes_options()
        self.api = locate_api(options, self.SERVICE_ACCOUNT)
        self.label_selector = options.get("label_selector", "")
        self.container: str | None = options.get("container") or None
        self.silence = 2 * conf.heartbeat_interval()

    def list_pods(self) -> dict[str, dict[str, Any]]:
        """Pods of the namespace by name, as the API returns them."""
        body = self.api.list_pods(self.label_selector, self.TIMEOUT)
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
        except api_errors() as exc:
            logger.warning(
                "Kubernetes API at %s could not list pods (%s); judging workers by their "
                "heartbeats alone this pass",
                self.api.url,
                describe_error(exc),
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
    """Where the Kubernetes API is (``url``, for messages), the namespace to list, and how to
    reach it: a ``kubernetes.client.Configuration`` (server, credentials and TLS)."""

    url: str
    namespace: str
    configuration: Any

    def list_pods(self, label_selector: str, timeout: float) -> Any:
        """The JSON body of the namespace's pod list; raises one of :func:`api_errors`."""
        import urllib3
        from kubernetes import client

        with client.ApiClient(self.configuration) as api_client, warnings.catch_warnings():
            if not self.configuration.verify_ssl:  # the operator's choice: no warning per pass
                warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
            response: Any = client.CoreV1Api(api_client).list_namespaced_pod(
                self.namespace,
                label_selector=label_selector or None,
                _preload_content=False,  # the JSON as it came: no models to build
                # (connect, read): a lone number is ignored by clients before 30 unless an int.
                _request_timeout=(timeout, timeout),
            )
            return json.loads(response.data)


def api_errors() -> tuple[type[BaseException], ...]:
    """What a failed pod list can raise: an HTTP error status or a TLS error (``ApiException``),
    no connection or a timeout (urllib3's errors, ``OSError``), credentials that could not be
    refreshed (``ConfigException``), or a body that is not a pod list."""
    import urllib3
    from kubernetes.client.exceptions import OpenApiException
    from kubernetes.config import ConfigException

    return (
        OpenApiException,
        ConfigException,
        urllib3.exceptions.HTTPError,
        OSError,
        ValueError,
        KeyError,
        TypeError,
    )


def describe_error(exc: BaseException) -> str:
    """``exc`` on one line: for an HTTP error, its status and the API's own message."""
    from kubernetes.client.exceptions import ApiException

    text = str(exc)
    if isinstance(exc, ApiException) and exc.status:
        text = f"HTTP {exc.status} {exc.reason}"
        with contextlib.suppress(TypeError, ValueError, KeyError):  # a body that is no Status
            text += f": {json.loads(exc.body or '')['message']}"
    return " ".join(f"{type(exc).__name__}: {text}".split())


def locate_api(options: dict[str, Any], service_account: Path) -> KubernetesApi:
    """The API named by ``options`` (``api_url``), else the pod's service account, else the
    kubeconfig. Raises ``ImproperlyConfigured`` if the ``kubernetes`` extra is missing, or if it
    would send a token in clear text."""
    try:
        from kubernetes import client
        from kubernetes.config import ConfigException
        from kubernetes.config.incluster_config import InClusterConfigLoader
    except ImportError:
        raise ImproperlyConfigured(
            "KubernetesLiveness needs the official Kubernetes client, the `kubernetes` extra: "
            f"{KUBERNETES_EXTRA}"
        ) from None
    namespace = options.get("namespace")
    configuration = client.Configuration()
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    if options.get("api_url"):
        configuration.host = str(options["api_url"]).rstrip("/")
        if options.get("token"):
            configuration.api_key["authorization"] = f"Bearer {options['token']}"
        configuration.ssl_ca_cert = options.get("ca_file")
        configuration.verify_ssl = bool(options.get("verify", True))
        namespace = namespace or "default"
    elif host and (service_account / "token").exists():
        environ = {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": os.environ.get("KUBERNETES_SERVICE_PORT") or "443",
        }
        try:
            # The client re-reads the token file once a minute: projected tokens rotate.
            InClusterConfigLoader(
                token_filename=str(service_account / "token"),
                cert_filename=str(service_account / "ca.crt"),
                environ=environ,
            ).load_and_set(configuration)
        except ConfigException as exc:
            raise ImproperlyConfigured(
                f"KubernetesLiveness: the pod's service account in {service_account}: {exc}"
            ) from None
        namespace = namespace or (service_account / "namespace").read_text().strip()
    else:
        namespace = _from_kubeconfig(options.get("kubeconfig"), namespace, configuration)
    # One attempt per pass, within the request's timeout: the next pass is the retry.
    configuration.retries = False
    url = str(configuration.host)
    # The key of the Authorization header's value: "authorization" before client 30.
    credential = any(configuration.api_key.get(key) for key in ("BearerToken", "authorization"))
    if url.startswith("http://") and credential and not options.get("allow_insecure_http"):
        raise ImproperlyConfigured(
            f"KubernetesLiveness: the Kubernetes API at {url} is plain http://, which would "
            "send the bearer token in clear text. Use an https:// URL; or, for an API that needs "
            "no token (a local `kubectl proxy`), give none; or, to send it anyway, set "
            "JOBS_KUBERNETES['allow_insecure_http'] = True."
        )
    return KubernetesApi(url, namespace, configuration)


# What a kubeconfig user can say that the client would ignore, by key: each one is refused
# rather than ignored, so that the check never acts with other credentials than configured.
_IGNORED_USER = {
    "as": "impersonation (as)",
    "as-uid": "impersonation (as-uid)",
    "as-groups": "impersonation (as-groups)",
    "as-user-extra": "impersonation (as-user-extra)",
}
#: The auth-provider plugins the client implements.
_AUTH_PROVIDERS = {"gcp", "oidc"}


def _from_kubeconfig(path: str | None, namespace: str | None, configuration: Any) -> str:
    """Load the kubeconfig's current context into ``configuration``, as the official client
    does (``$KUBECONFIG`` may list several files); return the namespace to list."""
    import yaml
    from kubernetes.config import ConfigException, load_kube_config
    from kubernetes.config.kube_config import KubeConfigMerger

    config_file = str(path or os.environ.get("KUBECONFIG") or "~/.kube/config")
    where = f"kubeconfig {config_file}"
    if not any(Path(f).expanduser().exists() for f in config_file.split(os.pathsep) if f):
        raise ImproperlyConfigured(
            f"KubernetesLiveness found no in-cluster service account and no {where}; set "
            "JOBS_KUBERNETES['api_url'] (and 'token'), or 'kubeconfig'"
        )
    try:
        config = KubeConfigMerger(config_file).config
        context_name = config["current-context"]
        context = config["contexts"].get_with_name(context_name)["context"]
        user_name = context.safe_get("user")
        users = config.safe_get("users")
        entry = users and user_name and config["users"].get_with_name(user_name, safe=True)
        user = dict(entry.value.get("user") or {}) if entry else {}
        ignored = sorted({feature for key, feature in _IGNORED_USER.items() if key in user})
        provider = (user.get("auth-provider") or {}).get("name")
        if "auth-provider" in user and provider not in _AUTH_PROVIDERS:
            ignored.append(f"the auth-provider {provider!r}")
        if ignored:
            raise ImproperlyConfigured(
                f"{where}, context {context_name!r}: {'; '.join(ignored)}: not supported by "
                "KubernetesLiveness. Give the context a user with a token (a service account's: "
                "`kubectl create token NAME`), a client certificate or an exec plugin, or set "
                "JOBS_KUBERNETES['api_url'] and 'token' instead."
            )
        load_kube_config(
            config_file=config_file, client_configuration=configuration, persist_config=False
        )
    except (ConfigException, yaml.YAMLError, OSError) as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from None
    return str(namespace or context.safe_get("namespace") or "default")


def liveness_check() -> LivenessCheck:
    """An instance of the class named by ``JOBS_LIVENESS_CHECK``."""
    return import_string(conf.liveness_check_path())()
