"""Deciding which workers are gone, for the reaper.

``JOBS_LIVENESS_CHECK`` names the class to use (a dotted path in settings, which is code the
operator chose, not data from a job row). Two ship with django-jobs:

- :class:`HeartbeatLiveness` (the default): a worker is gone when it has no registry row, or its
  last heartbeat is older than ``JOBS_WORKER_TIMEOUT`` (by the database's clock).
- :class:`KubernetesLiveness`: as above, and also when the pod named by the worker no longer
  exists, or has restarted since the worker was first seen. It needs no client library: it reads
  the pod list from the Kubernetes API with the pod's service account (or a kubeconfig, with the
  ``kubernetes`` extra for YAML).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from django.utils.module_loading import import_string

from django_jobs import conf
from django_jobs.transitions import RunningJob

logger = logging.getLogger("django_jobs.reaper")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Why a worker counts as gone, and how long it must have been silent for the reaper's
    in-statement re-check (a worker that sent a heartbeat since is alive whatever was said)."""

    reason: str
    silence: float


class LivenessCheck(Protocol):
    def dead_workers(self, jobs: Sequence[RunningJob], cursor: Any) -> dict[str, Verdict]:
        """Map the worker ids (of these running jobs) that are gone to a verdict."""
        ...


class HeartbeatLiveness:
    """A worker is gone when its heartbeat is older than ``JOBS_WORKER_TIMEOUT``."""

    def __init__(self, worker_timeout: float | None = None) -> None:
        self.worker_timeout = conf.worker_timeout() if worker_timeout is None else worker_timeout

    def dead_workers(self, jobs: Sequence[RunningJob], cursor: Any) -> dict[str, Verdict]:
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


class KubernetesLiveness(HeartbeatLiveness):
    """Also treat a worker as gone when its pod is gone or has restarted.

    A worker's pod is found by the worker's base name (``POD_NAME``). A worker that still sends
    heartbeats is never judged by the pod list alone: the reaper re-checks that it has been
    silent for two heartbeat intervals, so a worker running outside the cluster under a
    non-pod name is not reaped while it is alive.

    Settings, all optional, in ``JOBS_KUBERNETES``: ``api_url``, ``token``, ``namespace``,
    ``label_selector``, ``ca_file``, ``verify`` (default True), ``kubeconfig``.
    """

    SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")

    def __init__(self, worker_timeout: float | None = None) -> None:
        super().__init__(worker_timeout)
        options = conf.kubernetes_options()
        self.api_url, self.token, self.ca_file, self.namespace = self._locate(options)
        self.label_selector = options.get("label_selector", "")
        self.verify = options.get("verify", True)
        self.silence = 2 * conf.heartbeat_interval()

    def _locate(self, options: dict[str, Any]) -> tuple[str, str | None, str | None, str]:
        namespace = options.get("namespace")
        if options.get("api_url"):
            return (
                options["api_url"].rstrip("/"),
                options.get("token"),
                options.get("ca_file"),
                namespace or "default",
            )
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        if host and (self.SERVICE_ACCOUNT / "token").exists():
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            return (
                f"https://{host}:{port}",
                (self.SERVICE_ACCOUNT / "token").read_text().strip(),
                str(self.SERVICE_ACCOUNT / "ca.crt"),
                namespace or (self.SERVICE_ACCOUNT / "namespace").read_text().strip(),
            )
        return self._from_kubeconfig(options.get("kubeconfig"), namespace)

    def _from_kubeconfig(
        self, path: str | None, namespace: str | None
    ) -> tuple[str, str | None, str | None, str]:
        try:
            import yaml
        except ImportError:
            raise RuntimeError(
                "KubernetesLiveness found no in-cluster service account; reading a kubeconfig "
                "needs PyYAML: pip install 'django-jobs[kubernetes]'"
            ) from None
        config_path = Path(path or os.environ.get("KUBECONFIG") or Path.home() / ".kube/config")
        config = yaml.safe_load(config_path.read_text())
        context_name = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(
            (u["user"] for u in config.get("users", []) if u["name"] == context.get("user")), {}
        )
        return (
            cluster["server"].rstrip("/"),
            user.get("token"),
            cluster.get("certificate-authority"),
            namespace or context.get("namespace", "default"),
        )

    def list_pods(self) -> dict[str, dict[str, Any]]:
        """Pods of the namespace by name, as the API returns them."""
        url = f"{self.api_url}/api/v1/namespaces/{self.namespace}/pods"
        if self.label_selector:
            url += "?labelSelector=" + urllib.parse.quote(self.label_selector)
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        context = None
        if url.startswith("https"):
            context = ssl.create_default_context(cafile=self.ca_file)
            if not self.verify:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            body = json.load(response)
        return {pod["metadata"]["name"]: pod for pod in body.get("items", [])}

    @staticmethod
    def boot_id(pod: dict[str, Any]) -> str:
        """The pod's uid and its containers' ids: it changes when any container restarts."""
        statuses = pod.get("status", {}).get("containerStatuses", [])
        containers = sorted(s.get("containerID", "") for s in statuses)
        return ",".join([pod["metadata"].get("uid", ""), *containers])[:255]

    def dead_workers(self, jobs: Sequence[RunningJob], cursor: Any) -> dict[str, Verdict]:
        dead = super().dead_workers(jobs, cursor)
        candidates = {job.lease.worker_id for job in jobs} - set(dead)
        if not candidates:
            return dead
        pods = self.list_pods()
        cursor.execute(
            "SELECT id, name, boot_id FROM django_jobs_worker WHERE id = ANY(%s)",
            [list(candidates)],
        )
        for worker_id, name, seen_boot in cursor.fetchall():
            pod = pods.get(name)
            if pod is None:
                dead[worker_id] = Verdict(f"pod {name} no longer exists", self.silence)
                continue
            phase = pod.get("status", {}).get("phase")
            if phase in ("Succeeded", "Failed"):
                dead[worker_id] = Verdict(f"pod {name} has ended ({phase})", self.silence)
                continue
            boot = self.boot_id(pod)
            if not seen_boot:
                cursor.execute(
                    "UPDATE django_jobs_worker SET boot_id = %s WHERE id = %s", [boot, worker_id]
                )
            elif seen_boot != boot:
                dead[worker_id] = Verdict(f"pod {name} has restarted", self.silence)
        return dead


def liveness_check() -> LivenessCheck:
    """An instance of the class named by ``JOBS_LIVENESS_CHECK``."""
    return import_string(conf.liveness_check_path())()
