"""
Out of band: the bare-metal nodes a tenant holds run no Meridian agent, so they are watched from
outside -- the BMC through the power driver's ``readings`` (Redfish on real hardware) and the HCA
ports through each fabric's driver. A shared host's GPUs passed through to VMs are invisible to its
agent's NVML: ``vm_gpu_collect`` fills their temperature from the host's BMC where neither the
agent nor the in-guest agent has reported lately.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from cloud.choices import NodePool, NodeState, OfferingKind
from cloud.models import GPU, GPUSample, GPUTelemetry, Node, NodeBMCReading, PortLink, TelemetrySource
from cloud.telemetry.ingestion import LATEST_FIELDS, known_ports, port_updates, upsert_ports
from operations.detection import judge_bmc
from provisioning.choices import InstanceState
from provisioning.drivers import DriverError, Target, drivers_for, fabric_driver_for
from provisioning.models import Instance

log = logging.getLogger(__name__)


def bmc_collect(*, now: datetime | None = None) -> dict:
    """
    Read, out of band, the bare-metal nodes a tenant holds (no Meridian agent runs on them then):
    power, temperatures and health from each BMC through the power driver's ``readings``, and
    the nodes' HCA port states from each fabric's driver. GPU-level readings a BMC cannot give
    stay None (a GPU temperature sensor it lists is used). A node whose BMC does not answer keeps
    its last reading and is counted in ``failed``.
    """
    now = now or timezone.now()
    held = list(
        Node.objects.filter(pool=NodePool.BARE_METAL, state=NodeState.ALLOCATED)
        .select_related("region", "fabric__region")
        .order_by("hostname")
    )
    result = {"nodes": 0, "failed": 0, "ports": 0}
    if not held:
        return result
    gpus: dict = {}
    for gpu_id, node_id, index in GPU.objects.filter(node__in=held).values_list("id", "node_id", "index"):
        gpus.setdefault(node_id, []).append((index, gpu_id))
    readings, latest, samples = [], [], []
    judged = []  # (node, BMC reading, power state): failure detection judges them once stored
    for node in held:
        target = _target(node)
        try:
            power = drivers_for(node.region.slug).power
            reading = power.readings(target)
            judged.append((node, reading, power.power_state(target)))
        except DriverError as exc:
            log.warning("BMC readings of %s: %s", node.hostname, exc)
            result["failed"] += 1
            continue
        readings.append(
            NodeBMCReading(
                node=node,
                read_at=now,
                power_w=reading.get("power_w"),
                temperatures=reading.get("temperatures") or [],
                health=reading.get("health") or "unknown",
            )
        )
        ordered = [gpu_id for _, gpu_id in sorted(gpus.get(node.pk, []), key=lambda g: g[0])]
        _gpu_rows(node.pk, reading, list(enumerate(ordered)), now, latest, samples)
        result["nodes"] += 1
    port_readings: dict = {}
    port_rows = _fabric_port_rows(held, now, fabric_driver_for, port_readings)
    with transaction.atomic():
        NodeBMCReading.objects.bulk_create(
            readings,
            update_conflicts=True,
            unique_fields=["node"],
            update_fields=["read_at", "power_w", "temperatures", "health"],
        )
        GPUSample.objects.bulk_create(samples)
        GPUTelemetry.objects.bulk_create(
            latest, update_conflicts=True, unique_fields=["gpu"], update_fields=["node", *LATEST_FIELDS]
        )
        if port_rows:
            upsert_ports(port_rows)
    result["ports"] = len(port_rows)

    for node, reading, power in judged:
        try:  # one node's detection must not stop the others'
            judge_bmc(node=node, reading=reading, power=power, ports=port_readings.get(node.pk, []), now=now)
        except Exception:
            log.exception("failure detection on the BMC readings of %s", node.hostname)
    return result


def _fabric_port_rows(held: list[Node], now: datetime, fabric_driver_for, readings: dict | None = None) -> list[tuple]:
    """
    The held nodes' port states as each fabric reports them (one driver call per fabric); each
    node's ``PortReading``s go into ``readings`` by node id, for failure detection.
    """
    known = known_ports(held)
    by_fabric: dict = {}
    for node in held:
        by_fabric.setdefault(node.fabric_id, (node.fabric, []))[1].append(node)
    rows = []
    for fabric, nodes in by_fabric.values():
        try:
            states = fabric_driver_for(fabric).port_states([guid for node in nodes for guid in known[node.pk]])
        except DriverError as exc:
            log.warning("port states of fabric %s: %s", fabric, exc)
            continue
        for node in nodes:
            links = [
                (guid, states[guid]) for guid in known[node.pk] if states.get(guid) in (PortLink.UP, PortLink.DOWN)
            ]
            if links:
                updates = port_updates(node, links, now, "fabric", known[node.pk])
                rows += [row for row, _ in updates if row]
                if readings is not None:
                    readings[node.pk] = [reading for _, reading in updates]
    return rows


def vm_gpu_collect(*, now: datetime | None = None) -> dict:
    """
    The GPU sensors of shared hosts' BMCs for GPUs held by active VMs, written only for a GPU whose
    latest sample is older than three agent intervals (a GPU passed through to a VM: its host's NVML
    cannot see it; an in-guest agent's samples, when the tenant runs one, are fresher and kept).
    Node-level judgement stays with the host's agent (its heartbeat is the host's liveness).
    """
    now = now or timezone.now()
    fresh = now - timedelta(seconds=3 * settings.MERIDIAN_AGENT_INTERVAL)
    in_vms = {str(d["gpu_id"]) for devices in Instance.objects.filter(
        state=InstanceState.ACTIVE, reservation__offering__kind=OfferingKind.VM, node__pool=NodePool.SHARED
    ).values_list("devices", flat=True) for d in devices}
    stale = set(map(str, GPU.objects.filter(pk__in=in_vms).exclude(telemetry__sampled_at__gte=fresh)
                    .values_list("pk", flat=True)))
    result = {"gpus": 0, "failed": 0}
    if not stale:
        return result
    nodes = list(Node.objects.filter(gpus__pk__in=stale).distinct().select_related("region"))
    in_order: dict = {}  # node -> its GPUs by index: a BMC lists the GPU sensors in that order
    for gpu_id, node_id in GPU.objects.filter(node__in=nodes).order_by("node_id", "index").values_list("pk", "node_id"):
        in_order.setdefault(node_id, []).append(gpu_id)
    latest, samples = [], []
    for node in nodes:
        try:
            reading = drivers_for(node.region.slug).power.readings(_target(node))
        except DriverError as exc:
            log.warning("BMC GPU sensors of %s: %s", node.hostname, exc)
            result["failed"] += 1
            continue
        stale_here = [(position, gpu) for position, gpu in enumerate(in_order[node.pk]) if str(gpu) in stale]
        _gpu_rows(node.pk, reading, stale_here, now, latest, samples)
    with transaction.atomic():
        GPUSample.objects.bulk_create(samples)
        GPUTelemetry.objects.bulk_create(latest, update_conflicts=True, unique_fields=["gpu"],
                                         update_fields=["node", *LATEST_FIELDS])
    result["gpus"] = len(latest)
    return result


def _target(node: Node) -> Target:
    return Target(node_id=str(node.pk), hostname=node.hostname, bmc_address=node.bmc_address,
                  bmc_username=node.bmc_username, bmc_password=node.bmc_password)


def _gpu_rows(node_id, reading: dict, positions: list[tuple[int, object]], now: datetime, latest: list,
              samples: list) -> None:
    """
    The GPUs' latest and raw samples from a BMC reading: each GPU's temperature from the GPU sensor at
    its position (BMCs list them in index order); a reading out of range or missing stays None.
    """
    sensors = [t.get("celsius") for t in reading.get("temperatures") or []
               if str(t.get("context", "")).lower() == "gpu"]
    for position, gpu_id in positions:
        celsius = sensors[position] if position < len(sensors) else None
        celsius = int(round(celsius)) if isinstance(celsius, int | float) and 0 <= celsius <= 200 else None
        latest.append(GPUTelemetry(gpu_id=gpu_id, node_id=node_id, sampled_at=now, temperature_c=celsius, xids=[],
                                   source=TelemetrySource.BMC))
        samples.append(GPUSample(gpu_id=gpu_id, sampled_at=now, temperature_c=celsius))
