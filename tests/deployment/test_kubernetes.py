"""
deploy/kubernetes/: every document read strictly into the pinned kubernetes client's models
(tests/deployment/kube_models.py), then checked where the models cannot tell: selectors, probes,
one image, non-root pods, secrets and config that exist, leader-and-standby replicas.
No API server runs here: nothing is applied.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.deployment.kube_models import read

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
ROLES = {"web", "worker", "beat", "scheduler", "migrate"}


def documents() -> list[tuple[str, dict]]:
    found = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            found += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    return found


def by_kind(kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == kind}


def workloads() -> dict[str, dict]:
    """Deployments and Jobs by name."""
    return {**by_kind("Deployment"), **by_kind("Job")}


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def web_deployment() -> dict:
    return by_kind("Deployment")["meridian-web"]


DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: sample}
spec:
  replicas: 2
  selector: {matchLabels: {app: sample}}
  template:
    metadata: {labels: {app: sample}}
    spec:
      containers:
        - name: sample
          image: sample:1
          ports: [{containerPort: 8000}]
"""


# --- the checker itself: it must find real mistakes ---

def test_a_sound_manifest_reads_without_error():
    reading = read(yaml.safe_load(DEPLOYMENT))
    assert reading.errors == []
    assert reading.model.spec.template.spec.containers[0].ports[0].container_port == 8000


@pytest.mark.parametrize("breakage, expected", [
    (lambda d: d["spec"].update(replica=3), "$.spec.replica: unknown field of V1DeploymentSpec"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(imagePullPolicy=None, imagePulPolicy="Always"),
     "$.spec.template.spec.containers[0].imagePulPolicy: unknown field of V1Container"),
    (lambda d: d["spec"].update(replicas="2"), "$.spec.replicas: expected int, got str ('2')"),
    (lambda d: d["spec"].update(paused="yes"), "$.spec.paused: expected bool, got str"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports={"containerPort": 80}),
     "$.spec.template.spec.containers[0].ports: expected a list"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0]["ports"][0].update(containerPort=True),
     "containerPort: expected int, got bool"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].pop("name"),
     "V1Container: Invalid value for `name`, must not be `None`"),
    (lambda d: d["spec"].pop("selector"), "V1DeploymentSpec: Invalid value for `selector`, must not be `None`"),
    (lambda d: d["spec"]["template"]["spec"].update(containers=None),
     "V1PodSpec: Invalid value for `containers`, must not be `None`"),
    (lambda d: d.update(apiVersion="apps/v9"), "no model V9Deployment"),
])
def test_the_checker_refuses_a_broken_manifest(breakage, expected):
    document = yaml.safe_load(DEPLOYMENT)
    breakage(document)
    errors = read(document).errors
    assert any(expected in error for error in errors), errors


def test_the_checker_reports_every_mistake_of_a_document():
    document = yaml.safe_load(DEPLOYMENT)
    document["spec"]["replica"] = 3
    document["metadata"]["labels"] = {"app": 7}
    errors = read(document).errors
    assert len(errors) == 2, errors


# --- the manifests ---

def test_every_manifest_reads_strictly_into_the_clients_models():
    found = documents()
    assert {doc["kind"] for _, doc in found} >= {"Namespace", "ConfigMap", "Secret", "Job", "Deployment", "Service",
                                                "PodDisruptionBudget", "HorizontalPodAutoscaler", "Ingress"}
    for name, doc in found:
        assert read(doc).errors == [], f"{name}: {doc['kind']} {doc['metadata']['name']}"


def test_the_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in KUBE.glob("*.yaml") if p.name != "kustomization.yaml")
    assert listed.index("namespace.yaml") == 0
    assert [image["name"] for image in kustomization["images"]] == ["meridian"]


def test_one_namespace():
    namespaces = set(by_kind("Namespace"))
    assert namespaces == {"meridian"}
    for name, doc in documents():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "meridian", name


def test_selectors_match_their_pods():
    deployments = workloads()
    for name, workload in deployments.items():
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if workload["kind"] == "Deployment":
            selector = workload["spec"]["selector"]["matchLabels"]
            assert selector.items() <= labels.items(), name
    pod_labels = [w["spec"]["template"]["metadata"]["labels"] for w in deployments.values()]

    def selects(selector: dict) -> int:
        return sum(selector.items() <= labels.items() for labels in pod_labels)

    for name, service in by_kind("Service").items():
        assert selects(service["spec"]["selector"]) == 1, f"Service {name} selects one workload's pods"
    for name, budget in by_kind("PodDisruptionBudget").items():
        assert selects(budget["spec"]["selector"]["matchLabels"]) == 1, f"PodDisruptionBudget {name}"
    for name, hpa in by_kind("HorizontalPodAutoscaler").items():
        target = hpa["spec"]["scaleTargetRef"]
        assert target["kind"] == "Deployment" and target["name"] in deployments, name
        assert hpa["spec"]["minReplicas"] >= 2


def test_the_service_and_ingress_reach_the_web_port():
    web = web_deployment()
    ports = {port["name"]: port["containerPort"] for port in pod_spec(web)["containers"][0]["ports"]}
    service = by_kind("Service")["meridian-web"]
    assert all(port["targetPort"] in ports for port in service["spec"]["ports"])
    service_ports = {port["name"] for port in service["spec"]["ports"]}
    for ingress in by_kind("Ingress").values():
        for rule in ingress["spec"]["rules"]:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                assert backend["name"] in by_kind("Service")
                assert backend["port"]["name"] in service_ports


def test_web_probes_ask_the_health_endpoints_as_an_allowed_host():
    container = pod_spec(web_deployment())["containers"][0]
    port_names = {port["name"] for port in container["ports"]} | {port["containerPort"] for port in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/health/live"
    allowed = by_kind("ConfigMap")["meridian-config"]["data"]["DJANGO_ALLOWED_HOSTS"].split(",")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        action = container[probe]["httpGet"]
        assert action["port"] in port_names, probe
        headers = {header["name"]: header["value"] for header in action["httpHeaders"]}
        # ALLOWED_HOSTS would answer 400 and the HTTPS redirect 301 to a probe without these.
        assert headers["Host"] in allowed, probe
        assert headers["X-Forwarded-Proto"] == "https", probe
    assert by_kind("ConfigMap")["meridian-config"]["data"]["MERIDIAN_BEHIND_TLS_PROXY"] == "1"


def test_one_image_and_the_entrypoints_roles():
    images = set()
    roles = set()
    for name, workload in workloads().items():
        for container in pod_spec(workload)["containers"]:
            images.add(container["image"])
            assert "command" not in container, f"{name}: the image's entrypoint picks the role"
            roles.add(container["args"][0])
    assert images == {"meridian:latest"}, "every workload runs the one image (kustomization.yaml sets the release)"
    assert roles == ROLES


def test_pods_run_as_non_root_on_a_read_only_root():
    for name, workload in workloads().items():
        spec = pod_spec(workload)
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10001, name
        assert spec["automountServiceAccountToken"] is False, name
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["capabilities"]["drop"] == ["ALL"], name
            mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
            assert "/tmp" in mounts, f"{name}: a writable /tmp"  # noqa: S108
            resources = container["resources"]
            assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}, name


def test_volumes_exist_and_the_metrics_folder_is_per_pod():
    claims = set(by_kind("PersistentVolumeClaim"))
    metrics_dir = by_kind("ConfigMap")["meridian-config"]["data"]["PROMETHEUS_MULTIPROC_DIR"]
    for name, workload in workloads().items():
        spec = pod_spec(workload)
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        for container in spec["containers"]:
            for mount in container["volumeMounts"]:
                assert mount["name"] in volumes, f"{name} mounts {mount['name']}, which is not a volume"
                if mount["mountPath"] == metrics_dir:
                    assert "emptyDir" in volumes[mount["name"]], f"{name}: the metrics folder is the pod's own"
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims
    for role in ("web", "worker"):
        mounts = {m["mountPath"] for m in pod_spec(workloads()[f"meridian-{role}"])["containers"][0]["volumeMounts"]}
        assert metrics_dir in mounts, role


def test_every_secret_and_config_reference_exists():
    secrets = {name: set(doc.get("stringData", {})) | set(doc.get("data", {}))
               for name, doc in by_kind("Secret").items()}
    config_maps = set(by_kind("ConfigMap"))
    referenced = set()
    for name, workload in workloads().items():
        for container in pod_spec(workload)["containers"]:
            for source in container.get("envFrom", []):
                assert source["configMapRef"]["name"] in config_maps, name
            for variable in container.get("env", []):
                ref = variable.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["key"] in secrets.get(ref["name"], set()), f"{name}: {ref}"
                    assert variable["name"] == ref["key"], name
                    referenced.add(ref["key"])
    assert {"DJANGO_SECRET_KEY", "MERIDIAN_ENCRYPTION_KEYS", "DATABASE_URL", "CELERY_BROKER_URL",
            "REDIS_URL"} <= referenced


def test_the_secret_is_a_template():
    secret = by_kind("Secret")["meridian-secrets"]
    for key, value in secret["stringData"].items():
        assert value == "" or "REPLACE_ME" in value, f"{key} must stay a placeholder"
    assert "data" not in secret


def test_replicas_leaders_and_standbys():
    deployments = by_kind("Deployment")
    assert deployments["meridian-web"]["spec"]["replicas"] >= 2
    assert deployments["meridian-worker"]["spec"]["replicas"] >= 2
    for name in ("meridian-beat", "meridian-scheduler"):
        assert deployments[name]["spec"]["replicas"] == 2, f"{name}: one leads, one stands by"
    job = by_kind("Job")["meridian-migrate"]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_a_broken_copy_of_the_manifests_is_refused():
    """The whole web Deployment, misspelt in one place deep inside: the strict reading names it."""
    document = copy.deepcopy(web_deployment())
    container = document["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"]["httpGet"]["paht"] = container["readinessProbe"]["httpGet"].pop("path")
    container["resources"]["limits"]["cpu"] = 2  # a number is a fine quantity
    document["spec"]["template"]["metadata"]["labels"]["tier"] = 1  # a label is not
    errors = read(document).errors
    assert errors == [
        "$.spec.template.metadata.labels.tier: expected str, got int (1)",
        "$.spec.template.spec.containers[0].readinessProbe.httpGet.paht: unknown field of V1HTTPGetAction",
    ]
