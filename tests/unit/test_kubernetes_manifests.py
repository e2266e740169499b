"""deploy/kubernetes/: every manifest is valid against the Kubernetes schemas (the
kubernetes-validate package) or, for KEDA's kinds, against the fields KEDA's documentation
defines; and the files agree with each other and with the worker's options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
#: The oldest Kubernetes release the manifests are meant for, and the newest the validator has.
VERSIONS = ["1.29.0", kubernetes_validate.utils.latest_version()]

#: KEDA's ScaledObject and TriggerAuthentication (keda.sh/v1alpha1), as far as the manifests use
#: them: the fields and types of KEDA's documentation (keda.sh/docs/2.x/reference/scaledobject-spec
#: and .../authentication-providers), strict about unknown fields.
_NAME_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": {"type": "string"}, "kind": {"type": "string"}},
    "additionalProperties": False,
}
KEDA = {
    "ScaledObject": {
        "type": "object",
        "required": ["scaleTargetRef", "triggers"],
        "additionalProperties": False,
        "properties": {
            "scaleTargetRef": {
                "type": "object",
                "required": ["name"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "kind": {"type": "string"},
                    "apiVersion": {"type": "string"},
                    "envSourceContainerName": {"type": "string"},
                },
            },
            **{
                key: {"type": "integer", "minimum": 0}
                for key in (
                    "pollingInterval",
                    "cooldownPeriod",
                    "initialCooldownPeriod",
                    "minReplicaCount",
                    "maxReplicaCount",
                    "idleReplicaCount",
                )
            },
            "triggers": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "required": ["type", "metadata"],
                    "additionalProperties": False,
                    "properties": {
                        "type": {"type": "string"},
                        "name": {"type": "string"},
                        "metadata": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                        "authenticationRef": _NAME_REF,
                        "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                    },
                },
            },
        },
    },
    "TriggerAuthentication": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "secretTargetRef": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["parameter", "name", "key"],
                    "additionalProperties": False,
                    "properties": {
                        "parameter": {"type": "string"},
                        "name": {"type": "string"},
                        "key": {"type": "string"},
                    },
                },
            },
        },
    },
}


def documents() -> list[tuple[str, dict[str, Any]]]:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    found = []
    for name in kustomization["resources"]:
        for document in yaml.safe_load_all((DEPLOY / name).read_text()):
            if document:
                found.append((name, document))
    return found


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in documents() if d["kind"] == kind}


def test_every_file_is_in_the_kustomization() -> None:
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


@pytest.mark.parametrize("version", VERSIONS)
def test_the_manifests_are_valid_kubernetes(version: str) -> None:
    checked = 0
    for name, document in documents():
        if document["apiVersion"].startswith("keda.sh/"):
            continue
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(f"{name}: {document['kind']}: {error.message}") from None
        checked += 1
    assert checked >= 10


def test_the_keda_objects_have_only_the_fields_keda_defines() -> None:
    kinds = set()
    for _, document in documents():
        if document["apiVersion"] != "keda.sh/v1alpha1":
            continue
        kinds.add(document["kind"])
        jsonschema.validate(document["spec"], KEDA[document["kind"]])
    assert kinds == {"ScaledObject", "TriggerAuthentication"}
    # A schema that accepts anything would prove nothing.
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"scaleTargetRef": {"name": "x"}, "triggers": []}, KEDA["ScaledObject"])


def test_the_scaled_object_scales_the_worker_deployment_on_the_demand_view() -> None:
    (scaled,) = by_kind("ScaledObject").values()
    target = scaled["spec"]["scaleTargetRef"]["name"]
    assert target in by_kind("Deployment")
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    assert "django_jobs_queue_demand" in trigger["metadata"]["query"]
    assert trigger["authenticationRef"]["name"] in by_kind("TriggerAuthentication")
    assert scaled["spec"]["minReplicaCount"] == 0  # scales to zero


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _option(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{name}="))


def test_the_worker_drains_within_its_termination_grace_period() -> None:
    worker = by_kind("Deployment")["jobs-worker"]
    args = _container(worker)["args"]
    assert args[:3] == ["python", "manage.py", "runjobworker"]
    grace = float(_option(args, "--grace"))
    kill_grace = 5  # JOBS_KILL_GRACE's default
    period = worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert period >= grace + kill_grace + 10
    # SIGTERM drains: no preStop hook, which would only delay the drain.
    assert "lifecycle" not in _container(worker)
    # The probe reads the file the worker touches.
    alive = _option(args, "--alive-file")
    assert alive in " ".join(_container(worker)["livenessProbe"]["exec"]["command"])


def test_the_worker_options_exist() -> None:
    from django.core.management import load_command_class

    parser = load_command_class("django_jobs", "runjobworker").create_parser(
        "manage.py", "runjobworker"
    )
    args = _container(by_kind("Deployment")["jobs-worker"])["args"][3:]
    parser.parse_args(args)  # exits on an unknown option


def test_only_the_reaper_may_list_pods() -> None:
    (binding,) = by_kind("RoleBinding").values()
    assert [s["name"] for s in binding["subjects"]] == ["reapjobs"]
    (role,) = by_kind("Role").values()
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    reaper = by_kind("Deployment")["jobs-reaper"]["spec"]["template"]["spec"]
    assert reaper["serviceAccountName"] == "reapjobs"
    assert _container(by_kind("Deployment")["jobs-reaper"])["args"][2] == "reapjobs"


def test_the_api_service_selects_the_api_pods() -> None:
    (service,) = by_kind("Service").values()
    api = by_kind("Deployment")["jobs-api"]
    assert service["spec"]["selector"] == api["spec"]["template"]["metadata"]["labels"]
