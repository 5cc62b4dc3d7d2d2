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
        target = Target(
            node_id=str(node.pk),
            hostname=node.hostname,
            bmc_address=node.bmc_address,
            bmc_username=node.bmc_username,
            bmc_password=node.bmc_password,
        )
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
        gpu_temperatures = [
            t.get("celsius") for t in reading.get("temperatures") or [] if str(t.get("context", "")).lower() == "gpu"
        ]
        for position, (_, gpu_id) in enumerate(sorted(gpus.get(node.pk, []), key=lambda g: g[0])):
            celsius = gpu_temperatures[position] if position < len(gpu_temperatures) else None
            celsius = int(round(celsius)) if isinstance(celsius, int | float) and 0 <= celsius <= 200 else None
            latest.append(
                GPUTelemetry(
                    gpu_id=gpu_id,
                    node_id=node.pk,
                    sampled_at=now,
                    temperature_c=celsius,
                    xids=[],
                    source=TelemetrySource.BMC,
                )
            )
            samples.append(GPUSample(gpu_id=gpu_id, sampled_at=now, temperature_c=celsius))
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
    held = list(Instance.objects.filter(state=InstanceState.ACTIVE, reservation__offering__kind=OfferingKind.VM,
                                        node__pool=NodePool.SHARED).values_list("node_id", "devices"))
    wanted: dict = {}
    for node_id, devices in held:
        wanted.setdefault(node_id, set()).update(str(d["gpu_id"]) for d in devices)
    stale = set(map(str, GPU.objects.filter(pk__in=[g for gpus in wanted.values() for g in gpus]).exclude(
        telemetry__sampled_at__gte=fresh).values_list("pk", flat=True)))
    result = {"gpus": 0, "failed": 0}
    latest, samples = [], []
    for node in Node.objects.filter(pk__in=[n for n, gpus in wanted.items() if gpus & stale]).select_related("region"):
        target = Target(node_id=str(node.pk), hostname=node.hostname, bmc_address=node.bmc_address,
                        bmc_username=node.bmc_username, bmc_password=node.bmc_password)
        try:
            reading = drivers_for(node.region.slug).power.readings(target)
        except DriverError as exc:
            log.warning("BMC GPU sensors of %s: %s", node.hostname, exc)
            result["failed"] += 1
            continue
        sensors = [t.get("celsius") for t in reading.get("temperatures") or []
                   if str(t.get("context", "")).lower() == "gpu"]
        for gpu_id, index in node.gpus.order_by("index").values_list("pk", "index"):
            if str(gpu_id) not in stale or str(gpu_id) not in wanted[node.pk] or index >= len(sensors):
                continue
            celsius = sensors[index]
            celsius = int(round(celsius)) if isinstance(celsius, int | float) and 0 <= celsius <= 200 else None
            latest.append(GPUTelemetry(gpu_id=gpu_id, node_id=node.pk, sampled_at=now, temperature_c=celsius,
                                       xids=[], source=TelemetrySource.BMC))
            samples.append(GPUSample(gpu_id=gpu_id, sampled_at=now, temperature_c=celsius))
    with transaction.atomic():
        GPUSample.objects.bulk_create(samples)
        GPUTelemetry.objects.bulk_create(latest, update_conflicts=True, unique_fields=["gpu"],
                                         update_fields=["node", *LATEST_FIELDS])
    result["gpus"] = len(latest)
    return result
