"""
Building a simulated fleet: regions, one InfiniBand fat tree per fabric, nodes of 8 GPUs (HGX boards).

Used by the demo and by the benchmarks (1,280 nodes x 8 GPUs per fabric). Rows are written with
``bulk_create`` in one transaction per fabric, so 10,240 GPUs take seconds, not minutes.
"""

from __future__ import annotations

import math
import secrets
import uuid
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from cloud.choices import GPUState, Health, NodePool, NodeState, SwitchTier
from cloud.models import GPU, Fabric, GPUModel, HCAPort, Node, Region, Switch
from security.audit import audit_record

NODES_PER_LEAF = 32
LEAVES_PER_POD = 8
SPINES_PER_POD = 4
GPUS_PER_NODE = 8
# PCI bus ids of the eight SXM GPUs of an HGX baseboard, as nvidia-smi lists them.
HGX_PCI_BUS_IDS = [f"00000000:{bus}:00.0" for bus in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")]
# One ConnectX-7 beside each GPU, under the same PCIe switch.
HGX_HCA_PCI_BUS_IDS = [f"00000000:{bus}:00.0" for bus in ("1a", "2b", "3b", "5e", "9b", "ac", "bb", "dc")]
# Where each GPU of an HGX board sits, as its agent reports it (provisioning.agent.topology): all eight on the
# NVSwitches (one NVLink domain), a PCIe switch per pair, four on each CPU's NUMA node, its 112 cores split evenly.
HGX_PLACES = [{"nvlink_domain": 0, "pcie_switch": g // 2 * 2, "numa_node": g // 4} for g in range(GPUS_PER_NODE)]
HGX_NUMA_CPUS = {"0": "0-55", "1": "56-111"}
NVIDIA_OUI = "b83fd2"  # the IEEE OUI NVIDIA (Mellanox) port GUIDs begin with
REGION_NAMES = ["us-east-1", "eu-west-1", "us-west-2", "ap-northeast-1", "eu-north-1", "ap-south-1", "us-central-1",
                "eu-central-1"]
# What the console calls them, beside the slug (a title made of the slug read "Eu West 1").
REGION_TITLES = {"us-east-1": "US East", "eu-west-1": "EU West", "us-west-2": "US West",
                 "ap-northeast-1": "Asia Pacific Northeast", "eu-north-1": "EU North",
                 "ap-south-1": "Asia Pacific South", "us-central-1": "US Central", "eu-central-1": "EU Central"}
# The demo sells a different generation per region; the benchmark fleet uses the first.
REGION_GPU_MODELS = ["h100-80gb-sxm", "h200-141gb-sxm", "a100-80gb-sxm", "b200-180gb-sxm"]


@dataclass(frozen=True)
class FleetSpec:
    regions: int = 2
    nodes_per_fabric: int = 64
    fabrics_per_region: int = 1
    spare_ratio: float = 0.04
    shared_ratio: float = 0.25
    first_region: int = 0


@dataclass
class FleetReport:
    regions: int = 0
    fabrics: int = 0
    switches: int = 0
    nodes: int = 0
    gpus: int = 0


def build_fleet(spec: FleetSpec, *, progress=None) -> FleetReport:
    """Create ``spec``'s regions and fabrics (skipping fabrics that already exist)."""
    report = FleetReport()
    models = {m.slug: m for m in GPUModel.objects.all()}
    for r in range(spec.first_region, spec.first_region + spec.regions):
        slug = REGION_NAMES[r] if r < len(REGION_NAMES) else f"region-{r + 1}"
        region, created = Region.objects.get_or_create(slug=slug, defaults={"name": REGION_TITLES.get(slug, slug)})
        report.regions += created
        model = models[REGION_GPU_MODELS[r % len(REGION_GPU_MODELS)]]
        for f in range(spec.fabrics_per_region):
            fabric_slug = f"ib-{chr(ord('a') + f)}"
            if Fabric.objects.filter(region=region, slug=fabric_slug).exists():
                continue
            _build_fabric(region, fabric_slug, model, spec, report)
            if progress:
                progress(f"{region.slug}/{fabric_slug}: {spec.nodes_per_fabric} nodes of {model.name}")
    if report.nodes:
        _refresh_planner_statistics()
    return report


def _refresh_planner_statistics() -> None:
    """
    After a bulk load the planner has no statistics for the new rows and picks nested loops:
    the capacity aggregates took a second on 10,240 GPUs instead of 15 ms. ANALYZE fixes that
    now rather than whenever autovacuum gets to it.
    """
    with connection.cursor() as cursor:
        for model in (Switch, Node, GPU):
            cursor.execute(f"ANALYZE {connection.ops.quote_name(model._meta.db_table)}")


@transaction.atomic
def _build_fabric(region: Region, fabric_slug: str, model: GPUModel, spec: FleetSpec, report: FleetReport) -> None:
    fabric = Fabric.objects.create(region=region, name=f"{region.slug} fabric {fabric_slug}", slug=fabric_slug)
    report.fabrics += 1
    leaves_needed = math.ceil(spec.nodes_per_fabric / NODES_PER_LEAF)
    pods = math.ceil(leaves_needed / LEAVES_PER_POD)
    prefix = f"{region.slug}-{fabric_slug}"
    switches = [
        Switch(fabric=fabric, name=f"{prefix}-core{c:02d}", tier=SwitchTier.CORE) for c in range(SPINES_PER_POD)
    ]
    switches += [
        Switch(fabric=fabric, name=f"{prefix}-p{p:02d}-spine{s:02d}", tier=SwitchTier.SPINE, pod=p)
        for p in range(pods) for s in range(SPINES_PER_POD)
    ]
    leaves = [
        Switch(fabric=fabric, name=f"{prefix}-p{i // LEAVES_PER_POD:02d}-leaf{i:03d}", tier=SwitchTier.LEAF,
               pod=i // LEAVES_PER_POD)
        for i in range(leaves_needed)
    ]
    Switch.objects.bulk_create(switches + leaves)
    report.switches += len(switches) + len(leaves)

    now = timezone.now()
    spare_every = max(1, round(1 / spec.spare_ratio)) if spec.spare_ratio > 0 else 0
    shared_from = spec.nodes_per_fabric - int(spec.nodes_per_fabric * spec.shared_ratio)
    nodes, gpus, ports = [], [], []
    for i in range(spec.nodes_per_fabric):
        shared = i >= shared_from
        hostname = f"{prefix}-n{i:04d}"
        node = Node(
            id=uuid.uuid4(), hostname=hostname, region=region, fabric=fabric, leaf=leaves[i // NODES_PER_LEAF],
            pool=NodePool.SHARED if shared else NodePool.BARE_METAL,
            is_spare=bool(spare_every) and not shared and i % spare_every == spare_every - 1,
            bmc_address=f"https://{hostname}-bmc.oob.internal/redfish/v1", bmc_username="meridian",
            bmc_password=secrets.token_urlsafe(18), cpu_cores=112, numa_cpus=dict(HGX_NUMA_CPUS), ram_gib=2048,
            nvme_tb="30.72",
            state=NodeState.IN_SERVICE if shared else NodeState.AVAILABLE, state_changed_at=now,
            health=Health.HEALTHY, gpus_installed=GPUS_PER_NODE,
        )
        nodes.append(node)
        for g in range(GPUS_PER_NODE):
            gpus.append(GPU(
                node=node, index=g, uuid=f"GPU-{uuid.uuid4()}", serial=f"{secrets.randbelow(10**13):013d}",
                pci_bus_id=HGX_PCI_BUS_IDS[g], model=model, memory_mib=model.memory_gib * 1024,
                state=GPUState.AVAILABLE, health=Health.HEALTHY, **HGX_PLACES[g],
            ))
            # One ConnectX port per GPU (rail-optimised), with NVIDIA's OUI as real GUIDs carry.
            ports.append(HCAPort(node=node, index=g, guid=f"{NVIDIA_OUI}{secrets.token_hex(5)}",
                                 pci_bus_id=HGX_HCA_PCI_BUS_IDS[g]))
    Node.objects.bulk_create(nodes, batch_size=500)
    GPU.objects.bulk_create(gpus, batch_size=2000)
    HCAPort.objects.bulk_create(ports, batch_size=2000)
    report.nodes += len(nodes)
    report.gpus += len(gpus)
    audit_record(actor=None, action="fabric.enroll", target=fabric,
                 after={"nodes": len(nodes), "gpus": len(gpus), "gpu_model": model.slug})
