"""
GPU containers: what a container instance is in Kubernetes terms, built with the official
``kubernetes`` client's models so the API's own schema checks it (types, required fields), then
serialised as the API takes it.

An instance is four objects in its tenant's namespace: the namespace itself (one per tenant,
labelled with it), a NetworkPolicy that admits other namespaces' traffic only to SSH, a Secret
with the instance's authorized_keys and environment, and the pod pinned to its host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from kubernetes import client

API = client.ApiClient()
TENANT_LABEL = "meridian.cloud/tenant"
# Multus reads the pod's extra networks from this annotation; the IB SR-IOV CNI takes the virtual
# function's GUID from cni-args (as Mellanox ib-kubernetes sets it).
NETWORKS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
KEYS_PATH = "/etc/meridian/ssh"


@dataclass(frozen=True)
class PodSpec:
    """The objects one container instance is made of, each a manifest as the API takes it."""

    namespace: dict
    network_policy: dict
    secret: dict
    pod: dict

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def namespace_name(self) -> str:
        return self.namespace["metadata"]["name"]


@dataclass(frozen=True)
class Limits:
    """What the pod may use: whole GPUs or one slot (with its memory cap), and its CPU and memory."""

    gpus: int
    cpu_millicores: int
    memory_mib: int
    gpu_memory_cap_mib: int | None = None


def namespace_of(tenant_id) -> str:
    return f"tenant-{tenant_id}"


def pod_spec(*, name: str, tenant_id, node_name: str, image: str, devices: list[dict], limits: Limits,
             authorized_keys: str, environment: dict[str, str], labels: dict[str, str],
             network: str = "", vf_guid: str = "", mounts=()) -> PodSpec:
    namespace = namespace_of(tenant_id)
    labels = {**labels, TENANT_LABEL: str(tenant_id)}
    return PodSpec(
        namespace=_serialise(client.V1Namespace(
            api_version="v1", kind="Namespace",
            metadata=client.V1ObjectMeta(name=namespace, labels={
                TENANT_LABEL: str(tenant_id),
                # Baseline: no privileged pods, host namespaces or host paths in a tenant's namespace.
                "pod-security.kubernetes.io/enforce": "baseline"}))),
        network_policy=network_policy_manifest(namespace, tenant_id),
        secret=secret_manifest(name=f"{name}-access", namespace=namespace, labels=labels,
                               authorized_keys=authorized_keys, environment=environment),
        pod=pod_manifest(name=name, namespace=namespace, node_name=node_name, image=image, devices=devices,
                         limits=limits, secret=f"{name}-access", environment=sorted(environment), labels=labels,
                         network=network, vf_guid=vf_guid, mounts=mounts),
    )


def network_policy_manifest(namespace: str, tenant_id) -> dict:
    """Pods of other namespaces (other tenants) reach this tenant's pods on SSH only; its own reach everything."""
    return _serialise(client.V1NetworkPolicy(
        api_version="networking.k8s.io/v1", kind="NetworkPolicy",
        metadata=client.V1ObjectMeta(name="tenant-isolation", namespace=namespace,
                                     labels={TENANT_LABEL: str(tenant_id)}),
        spec=client.V1NetworkPolicySpec(
            pod_selector=client.V1LabelSelector(), policy_types=["Ingress"],
            ingress=[
                client.V1NetworkPolicyIngressRule(_from=[client.V1NetworkPolicyPeer(
                    pod_selector=client.V1LabelSelector())]),
                client.V1NetworkPolicyIngressRule(ports=[client.V1NetworkPolicyPort(port=22, protocol="TCP")]),
            ]),
    ))


def secret_manifest(*, name: str, namespace: str, labels: dict, authorized_keys: str,
                    environment: dict[str, str]) -> dict:
    """The keys and the tenant's environment, kept out of the pod spec (which any reader of pods sees)."""
    return _serialise(client.V1Secret(
        api_version="v1", kind="Secret", type="Opaque",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        string_data={"authorized_keys": authorized_keys + "\n", **{f"env.{key}": value
                                                                   for key, value in environment.items()}},
    ))


def pod_manifest(*, name: str, namespace: str, node_name: str, image: str, devices: list[dict], limits: Limits,
                 secret: str, environment: list[str], labels: dict[str, str], network: str = "",
                 vf_guid: str = "", mounts=()) -> dict:
    """
    A pod pinned to the shared host, asking for its whole GPUs (``nvidia.com/gpu``); a slot of a
    fractional offering asks for one GPU share (``nvidia.com/gpu.shared``) and carries its memory
    cap in an annotation, which the node's isolation enforces (DESIGN.md, GPU memory isolation).
    Requests equal limits: the pod is in the Guaranteed QoS class and is never squeezed by a neighbour.
    The reservation's shared file systems (``mounts``) are NFS volumes at their paths.
    """
    if limits.gpus < 1 and not limits.gpu_memory_cap_mib:
        raise ValueError("A pod asks for at least one whole GPU or for a slot with its memory cap.")
    shared = [m for m in mounts if m.kind == "shared_fs"]  # a container mounts file systems, not block devices
    resources = {"cpu": f"{limits.cpu_millicores}m", "memory": f"{limits.memory_mib}Mi"}
    annotations = {"meridian.cloud/gpus": ",".join(d["gpu_id"] for d in devices)}
    if limits.gpu_memory_cap_mib:
        resources["nvidia.com/gpu.shared"] = "1"
        annotations["meridian.cloud/gpu-memory-cap-mib"] = str(limits.gpu_memory_cap_mib)
    else:
        resources["nvidia.com/gpu"] = str(limits.gpus)
    if network:
        attachment = {"name": network, "interface": "ib0"}
        if vf_guid:
            attachment["cni-args"] = {"guid": ":".join(vf_guid[i:i + 2] for i in range(0, 16, 2))}
        annotations[NETWORKS_ANNOTATION] = json.dumps([attachment])
    from_secret = [client.V1EnvVar(name=key, value_from=client.V1EnvVarSource(
        secret_key_ref=client.V1SecretKeySelector(name=secret, key=f"env.{key}"))) for key in environment]
    container = client.V1Container(
        name="main", image=image,
        resources=client.V1ResourceRequirements(limits=resources, requests=dict(resources)),
        env=[client.V1EnvVar(name="SSH_PUBLIC_KEY", value_from=client.V1EnvVarSource(
            secret_key_ref=client.V1SecretKeySelector(name=secret, key="authorized_keys"))), *from_secret],
        ports=[client.V1ContainerPort(container_port=22, name="ssh")],
        volume_mounts=[client.V1VolumeMount(name="access", mount_path=KEYS_PATH, read_only=True),
                       *(client.V1VolumeMount(name=f"vol-{n}", mount_path=m.path, read_only=m.read_only)
                         for n, m in enumerate(shared))],
        security_context=client.V1SecurityContext(allow_privilege_escalation=False, privileged=False),
    )
    pod = client.V1Pod(
        api_version="v1", kind="Pod",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels, annotations=annotations),
        spec=client.V1PodSpec(
            containers=[container], node_name=node_name, restart_policy="Always",
            automount_service_account_token=False, enable_service_links=False,
            volumes=[client.V1Volume(name="access", secret=client.V1SecretVolumeSource(
                secret_name=secret, default_mode=0o400,
                items=[client.V1KeyToPath(key="authorized_keys", path="authorized_keys")])),
                *(client.V1Volume(name=f"vol-{n}", nfs=client.V1NFSVolumeSource(
                    server=m.server, path=m.export_path, read_only=m.read_only)) for n, m in enumerate(shared))]),
    )
    return _serialise(pod)


def pod_phase(pod: dict) -> tuple[str, str]:
    """
    ``(phase, why)`` of an applied pod: ``running``, ``starting`` (scheduled, pulling, creating)
    or ``failed`` (it cannot start without a change: a bad image, a missing secret key, a crash loop).
    """
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITS:
            return "failed", f"{waiting['reason']}: {waiting.get('message') or 'see the pod events'}"
    if phase == "Running":
        return "running", ""
    if phase in ("Failed", "Succeeded"):
        return "failed", f"the pod {phase.lower()}: {status.get('reason') or ''} {status.get('message') or ''}".strip()
    return "starting", status.get("reason") or status.get("message") or "scheduled, starting its container"


# Waits a pod does not come out of by itself.
FATAL_WAITS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
               "CrashLoopBackOff", "CreateContainerError"}


def _serialise(obj) -> dict:
    return API.sanitize_for_serialization(obj)
