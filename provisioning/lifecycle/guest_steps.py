"""
The steps of VMs and containers on shared hosts: a VM's domain (disk volume, GPUs and
InfiniBand virtual function passed through, config drive) and a container's pod (through the
region's Kubernetes API), their MIG layout, and what is left of them on a host held for repair.
"""

from __future__ import annotations

import logging

from django.conf import settings

from cloud.choices import IsolationMode, OfferingKind
from provisioning import cloud_init
from provisioning.drivers import DriverError, NotYet, drivers_for
from provisioning.drivers.libvirt_vm import disk_volume, domain_xml, mac_address, vf_pci_address, volume_names
from provisioning.drivers.pods import Limits, namespace_of, pod_phase, pod_spec
from provisioning.images import boot_of
from provisioning.lifecycle.step_context import Context, NodeFault, authorized_keys, keys_of, target_of
from provisioning.models import Instance
from provisioning.mounts import mounts_for
from provisioning.networks.ports import instance_ports, instance_virtual_function

log = logging.getLogger(__name__)


#
# VMs
#


def define_domain(ctx: Context) -> None:
    """
    A domain with the instance's GPUs and its InfiniBand virtual function passed through, its
    share of the host's CPUs and memory (from its GPUs' NUMA node when they share one), a NIC, and
    its cloud-init config drive (keys, hostname, network, the tenant's user-data).
    """
    vms = ctx.drivers.vm
    keys = keys_of(ctx.reservation)
    offering = ctx.reservation.offering
    source = boot_of(ctx.reservation).source
    pool = settings.MERIDIAN_LIBVIRT_POOL
    # Block volumes are disks of the domain from the hosts' shared storage pool (file systems are
    # mounted by cloud-init over the network).
    mounts = mounts_for(ctx.reservation)  # once for all its instances: each asks the storage backend
    block_volumes = tuple((settings.MERIDIAN_STORAGE_LIBVIRT_POOL, m.ref, m.read_only)
                          for m in mounts if m.kind == "block" and m.ref)

    def define(instance, target):
        if vms.domain_state(target, instance.name) != "absent":
            return
        disk, base = volume_names(instance.name, source)
        path = vms.volume(target, pool, disk) or vms.create_volume(target, pool, disk, base=base,
                                                                  size_gib=settings.MERIDIAN_VM_DISK_GIB)
        mac = mac_address(str(instance.pk))
        drive = cloud_init.drive_for(instance, keys=keys, mounts=mounts, mac=mac)
        node, share = instance.node, host_share(instance, offering)
        numa = (instance.topology or {}).get("numa_node")  # its GPUs' NUMA node: its vCPUs and memory from there
        xml = domain_xml(name=instance.name, vcpus=max(2, int(node.cpu_cores * share)),
                         memory_mib=max(8192, int(node.ram_gib * 1024 * share * 0.9)), devices=instance.devices,
                         image=path, network=settings.MERIDIAN_LIBVIRT_NETWORK, mac=mac,
                         config_drive=cloud_init.drive_url(drive), ib_functions=(ib_function(instance),),
                         volumes=block_volumes, numa_node=numa,
                         cpuset=node.numa_cpus.get(str(numa), "") if numa is not None else "")
        vms.define(target, instance.name, xml)
    ctx.each(define)


def ib_function(instance) -> str:
    """The PCI address of the instance's InfiniBand virtual function (handed out here; join_network joins it)."""
    vf = instance_virtual_function(instance)
    if not vf.port.pci_bus_id:
        raise DriverError(f"{vf.port} has no PCI address recorded, so its virtual functions cannot be passed "
                          "through: enrol the host's ports with ib_port_pci_bus_ids.", transient=False)
    return vf_pci_address(vf.port.pci_bus_id, vf.index, offset=settings.MERIDIAN_SRIOV_VF_OFFSET,
                          stride=settings.MERIDIAN_SRIOV_VF_STRIDE)


def start_domain(ctx: Context) -> None:
    vms = ctx.drivers.vm
    ctx.each(lambda instance, target: vms.start(target, instance.name)
             if vms.domain_state(target, instance.name) != "running" else None)


def stop_domain(ctx: Context) -> None:
    vms = ctx.drivers.vm
    ctx.each(lambda instance, target: vms.stop(target, instance.name)
             if vms.domain_state(target, instance.name) == "running" else None)


def undefine_domain(ctx: Context) -> None:
    """Remove the domain and its disk volume (nothing of the tenant's stays in the host's pool)."""
    ctx.each(lambda instance, target: _remove_domain(ctx.drivers.vm, instance, target))


def _remove_domain(vms, instance, target) -> None:
    """Undefine the instance's domain and delete its disk volume, each if it is still there."""
    if vms.domain_state(target, instance.name) != "absent":
        vms.undefine(target, instance.name)
    pool, disk = settings.MERIDIAN_LIBVIRT_POOL, disk_volume(instance.name)
    if vms.volume(target, pool, disk) is not None:
        vms.delete_volume(target, pool, disk)


#
# Containers
#


def mig_layout_for(offering) -> str:
    """The MIG layout a fractional MIG offering's GPUs are cut into: one slice per slot."""
    return f"{offering.slots_per_gpu}-way"


def configure_mig(ctx: Context) -> None:
    """
    A MIG offering's GPUs are cut into its layout before the hand-over (the watchdog then checks
    they stay so). A GPU already in that layout is left alone: other tenants' slices may be on it,
    and the planner only packs slots of one layout onto a GPU.
    """
    offering = ctx.reservation.offering
    if offering.isolation_mode != IsolationMode.MIG:
        return
    layout, host = mig_layout_for(offering), ctx.drivers.host

    def configure(instance, target):
        for device in instance.devices:
            if host.mig_layout(target, device["index"]) != layout:
                host.set_mig_layout(target, device["index"], layout,
                                    reference=f"{ctx.operation.pk}:{device['index']}:{layout}")
    ctx.each(configure)


def apply_pod(ctx: Context) -> None:
    """
    The instance's namespace, network policy, secret (keys, environment) and pod, then wait for
    the pod to run: pulling an image takes minutes, a bad image or a crash loop fails the step.
    """
    pods, reservation = ctx.drivers.container, ctx.reservation
    image = boot_of(reservation).source
    mounts = mounts_for(reservation)  # once for all its instances: each asks the storage backend

    def apply(instance, target):
        namespace = namespace_of(reservation.tenant_id)
        pod = pods.pod(target, namespace, instance.name)
        if pod is None:
            pods.apply(target, spec_of(instance))
            pod = pods.pod(target, namespace, instance.name) or {}
        # The host's cgroups name the pod's processes by its UID: the watchdog knows them by it.
        uid = (pod.get("metadata") or {}).get("uid") or ""
        if uid != instance.runtime_uid:
            Instance.objects.filter(pk=instance.pk).update(runtime_uid=uid)
            instance.runtime_uid = uid
        phase, why = pod_phase(pod)
        if phase == "failed":  # the image or its command, not the host: cleaned, and placed again
            raise NodeFault(instance.node, f"the container cannot start: {why}", transient=False, blame=False)
        if phase == "starting":
            raise NotYet(f"the container is starting ({why})", wait_s=10.0)

    def spec_of(instance):
        network = settings.MERIDIAN_KUBERNETES_IB_NETWORK
        # The virtual function is handed out here (join_network then finds it) so the pod is made with its GUID.
        vf_guid = next(iter(instance_ports(instance)), "") if network else ""
        return pod_spec(
            name=instance.name, tenant_id=reservation.tenant_id, node_name=instance.node.hostname, image=image,
            devices=instance.devices, limits=pod_limits(instance, reservation.offering),
            authorized_keys=authorized_keys(reservation), environment=dict(reservation.environment or {}),
            labels={"meridian.cloud/reservation": str(reservation.pk), "meridian.cloud/instance": instance.name},
            network=network, vf_guid=vf_guid, mounts=mounts,
        )
    ctx.each(apply)


def instances_abandon(instances, *, tenant_id) -> None:
    """
    Best effort for instances (of one tenant) on a host held for repair, which will never be
    cleaned: their VM (domain and disk volume) or pod is removed now if the host still answers, so
    nothing of the tenant's waits on it; what cannot be removed now is logged for the repair.
    """
    for instance in instances:
        if instance.kind == OfferingKind.BARE_METAL:
            continue  # the whole server is wiped when it is cleared after repair (clear_node)
        drivers, target = drivers_for(instance.node.region.slug), target_of(instance.node)
        try:
            if instance.kind == OfferingKind.VM:
                _remove_domain(drivers.vm, instance, target)
            else:
                _remove_pod(drivers.container, namespace_of(tenant_id), instance, target)
        except DriverError as exc:
            log.warning("Could not remove %s from %s, held for repair (remove it there): %s", instance.name,
                        instance.node.hostname, exc)


def host_share(instance, offering) -> float:
    """The instance's share of its host: its GPUs of the host's, a slot counted as its part of a GPU."""
    gpus = max(1, instance.node.gpus.count())
    if offering.slots_per_gpu > 1:
        return len(instance.devices) / (gpus * offering.slots_per_gpu)
    return len(instance.devices) / gpus


def pod_limits(instance, offering) -> Limits:
    """Whole GPUs or a slot with its memory cap; the host's CPUs and memory in proportion (at least 1 CPU, 4 GiB)."""
    node, share = instance.node, host_share(instance, offering)
    slot = offering.slots_per_gpu > 1
    return Limits(gpus=0 if slot else len(instance.devices),
                  gpu_memory_cap_mib=(instance.devices[0]["mem_hi"] - instance.devices[0]["mem_lo"]) if slot else None,
                  cpu_millicores=max(1000, int(node.cpu_cores * 1000 * share)),
                  memory_mib=max(4096, int(node.ram_gib * 1024 * share * 0.9)))


def delete_pod(ctx: Context) -> None:
    namespace = namespace_of(ctx.reservation.tenant_id)
    ctx.each(lambda instance, target: _remove_pod(ctx.drivers.container, namespace, instance, target))


def _remove_pod(pods, namespace: str, instance, target) -> None:
    """
    Delete the instance's pod and its secret. Asked even when the pod is gone: a worker that died
    between deleting the pod and its secret leaves the secret, and deleting what is gone is a no-op.
    """
    pods.delete(target, namespace, instance.name)
