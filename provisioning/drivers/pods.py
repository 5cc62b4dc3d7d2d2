"""
GPU containers: the pod manifest, built with the official ``kubernetes`` client's models so
the API's own schema checks it (types, required fields), then serialised as the API takes it.
"""

from __future__ import annotations

from kubernetes import client

API = client.ApiClient()


def pod_manifest(*, name: str, namespace: str, node_name: str, image: str, gpus: int, devices: list[dict],
                 memory_cap_mib: int | None, ssh_public_key: str, labels: dict[str, str]) -> dict:
    """
    A pod pinned to the shared host, asking for its whole GPUs (``nvidia.com/gpu``); a slot of a
    fractional offering asks for one GPU share (``nvidia.com/gpu.shared``) and carries its memory
    cap in an annotation, which the node's isolation enforces (DESIGN.md, GPU memory isolation).
    """
    if gpus < 1 and not memory_cap_mib:
        raise ValueError("A pod asks for at least one whole GPU or for a slot with its memory cap.")
    limits = {"nvidia.com/gpu": str(gpus)}
    annotations = {"meridian.cloud/gpus": ",".join(d["gpu_id"] for d in devices)}
    if memory_cap_mib:
        limits = {"nvidia.com/gpu.shared": "1"}
        annotations["meridian.cloud/gpu-memory-cap-mib"] = str(memory_cap_mib)
    container = client.V1Container(
        name="main", image=image,
        resources=client.V1ResourceRequirements(limits=limits, requests=dict(limits)),
        env=[client.V1EnvVar(name="SSH_PUBLIC_KEY", value=ssh_public_key)],
        ports=[client.V1ContainerPort(container_port=22, name="ssh")],
        security_context=client.V1SecurityContext(allow_privilege_escalation=False, privileged=False),
    )
    pod = client.V1Pod(
        api_version="v1", kind="Pod",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, labels=labels, annotations=annotations),
        spec=client.V1PodSpec(containers=[container], node_name=node_name, restart_policy="Always",
                              automount_service_account_token=False),
    )
    return API.sanitize_for_serialization(pod)
