"""
The named steps of provisioning, release (cleaning) and node validation, per offering kind (in
the spirit of Ironic's deploy and clean steps). Each step is idempotent: it reads what the
hardware already has and acts only where that differs, so a retried step -- after a worker
died between the driver call and the commit -- finds the work done and goes on.

A step gets a Context and touches hardware only through ``ctx.drivers``; a driver error is
raised as NodeFault naming the node, so the pipeline knows which node to retry or fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from cloud.choices import IsolationMode, NodePool, OfferingKind
from core.errors import DomainError
from provisioning import cloud_init, host_keys
from provisioning.choices import OperationKind
from provisioning.drivers import DriverError, Drivers, NotYet, Target, drivers_for
from provisioning.drivers.libvirt_vm import disk_volume, domain_xml, mac_address, vf_pci_address, volume_names
from provisioning.drivers.pods import Limits, namespace_of, pod_phase, pod_spec
from provisioning.images import boot_of
from provisioning.models import Allocation, Instance
from provisioning.networks.ports import (
    VPCRefused,
    instance_ports,
    instance_virtual_function,
    ports_join,
    ports_join_many,
    ports_leave,
)
from provisioning.networks.vpcs import default_vpc
from security.models import AttestationNonce, AttestationReport
from security.services import attestation_challenge, attestation_outcome, attestation_submit

log = logging.getLogger(__name__)


class NodeFault(Exception):
    """
    A driver call for one node failed; ``cause`` says how, ``transient`` whether to retry.
    ``held``: the node (or its GPUs) is held already -- attestation quarantined it -- so the
    failure handlers must not mark it faulty on top. ``blame``: whether the node is at fault.
    """
    def __init__(self, node, cause: DriverError | str, *, transient: bool | None = None, held: bool = False,
                 blame: bool = True):
        self.node = node
        self.cause = str(cause)
        self.held = held
        # False: the node is fine, the request is not (the tenant's network cannot be made, say):
        # its instances are cleaned like the others and the node goes back to the pool.
        self.blame = blame and not held
        self.transient = getattr(cause, "transient", False) if transient is None else transient
        self.wait_s = getattr(cause, "wait_s", None)  # NotYet: not a failure, ask again then
        super().__init__(f"{node.hostname}: {self.cause}")


@dataclass
class Context:
    operation: object
    drivers: Drivers
    reservation: object | None = None
    instances: list = field(default_factory=list)  # the instances this operation works on
    node: object | None = None  # a validation's node

    def each(self, act: Callable) -> None:
        """Run ``act(instance, target)`` for every instance; a driver error names its node."""
        for instance in self.instances:
            self.on(instance.node, lambda target, instance=instance: act(instance, target))

    def on(self, node, act: Callable):
        try:
            return act(target_of(node))
        except DriverError as exc:
            raise NodeFault(node, exc) from exc


def target_of(node) -> Target:
    return Target(node_id=str(node.pk), hostname=node.hostname, bmc_address=node.bmc_address,
                  bmc_username=node.bmc_username, bmc_password=node.bmc_password)


@dataclass(frozen=True)
class Step:
    """
    ``run`` acts for one operation. ``run_many``, where a step has one, acts for a batch of
    operations at once (one fabric call for them all); anything it raises sends the batch back
    to ``run``, one operation at a time, to find whose fault it is (steps are idempotent).
    """
    name: str
    run: Callable[[Context], None]
    run_many: Callable[[list[Context]], None] | None = None


#
# Bare metal
#


def power_on_deploy(ctx: Context) -> None:
    """Boot the deploy image from the BMC's virtual CD (the agent ramdisk writes the OS image)."""
    url = settings.MERIDIAN_DEPLOY_IMAGE_URL
    power = ctx.drivers.power

    def boot(instance, target):
        if power.media(target) != url:
            power.insert_media(target, url)
        if power.boot_device(target) != "cd":
            power.set_boot_device(target, "cd")
        if power.power_state(target) != "on":
            power.set_power(target, True)
    ctx.each(boot)


def authorized_keys(reservation) -> str:
    """
    The authorized_keys an instance of ``reservation`` gets: the key pasted into it, then its saved
    keys as they are now (a key removed since is no longer there), each once, one per line.
    """
    lines = [reservation.ssh_public_key.strip()] if reservation.ssh_public_key.strip() else []
    lines += [key.authorized_keys_line for key in reservation.ssh_keys.order_by("name", "created_at")]
    return "\n".join(dict.fromkeys(lines))


def write_image(ctx: Context) -> None:
    """The OS image with the tenant's keys, marked with this instance: a disk written for anyone else is rewritten."""
    image, key = boot_of(ctx.reservation).source, authorized_keys(ctx.reservation)
    disks = ctx.drivers.image

    def write(instance, target):
        if disks.deployed_for(target) != str(instance.pk):
            disks.write_image(target, image, key, str(instance.pk))
    ctx.each(write)


def boot_from_disk(ctx: Context) -> None:
    """
    Power the server off (the deploy image is done), swap the deploy image for the instance's
    cloud-init config drive in the virtual CD, boot from the written disk and power on: cloud-init
    finds the drive by its label and sets the host up. The drive stays in until release: on a
    reboot without it cloud-init would take the host for a new instance and make new host keys.
    """
    power = ctx.drivers.power
    keys = _keys_of(ctx.reservation)

    def switch(instance, target):
        url = cloud_init.drive_url(cloud_init.drive_for(instance, keys=keys))
        # Boot device last: a retry that finds it on the disk knows the power cycle is under way.
        if power.boot_device(target) != "hdd" and power.power_state(target) == "on":
            power.set_power(target, False)
        if power.media(target) != url:
            if power.media(target) is not None:
                power.eject_media(target)
            power.insert_media(target, url)
        if power.boot_device(target) != "hdd":
            power.set_boot_device(target, "hdd")
        if power.power_state(target) != "on":
            power.set_power(target, True)
    ctx.each(switch)


def _keys_of(reservation) -> list[str]:
    return [line for line in authorized_keys(reservation).splitlines() if line]


def join_network(ctx: Context) -> None:
    """
    Join each instance's ports (a server's HCA ports, a VM's or container's virtual function) to
    the reservation's IB-VPC partition as full members -- the tenant's default VPC on the node's
    fabric when the reservation names none -- and read the fabric back.
    """
    for instance in ctx.instances:
        vpc = _vpc_of(ctx, instance)
        try:
            ctx.on(instance.node, lambda target, instance=instance, vpc=vpc: ports_join(instance, vpc))
        except NodeFault as fault:
            if isinstance(fault.__cause__, VPCRefused):
                fault.blame = False  # the VPC is full or going away: the node is fine
            raise


def join_network_many(contexts: list[Context]) -> None:
    """``join_network`` for a batch: one fabric call per partition for all their ports, one read-back per fabric."""
    defaults: dict = {}  # the tenant's default VPC on a fabric, looked up once for the batch
    ports_join_many([(instance, _vpc_of(ctx, instance, defaults)) for ctx in contexts for instance in ctx.instances])


def _vpc_of(ctx: Context, instance, defaults: dict | None = None):
    reservation = ctx.reservation
    if reservation.vpc is not None:
        return reservation.vpc
    defaults = {} if defaults is None else defaults
    key = (reservation.tenant_id, instance.node.fabric_id)
    try:
        if key not in defaults:
            defaults[key] = default_vpc(tenant_id=reservation.tenant_id, fabric=instance.node.fabric)
        return defaults[key]
    except DomainError as exc:  # no P_Key or subnet left for the tenant: not the node's fault
        raise NodeFault(instance.node, f"the tenant's default VPC cannot be made: {exc.detail}", transient=False,
                        blame=False) from exc


def leave_network(ctx: Context) -> None:
    """Take each instance's ports out of its partitions and prove from the fabric that they left."""
    for instance in ctx.instances:
        ctx.on(instance.node, lambda target, instance=instance: ports_leave(instance))


def verify(ctx: Context) -> None:
    """
    The node is what the catalogue says -- every GPU present and healthy as the host sees it --
    and proves it: its GPUs answer a fresh challenge with evidence signed by their device keys,
    checked against the trusted roots and the reference values (security.attestation). On a
    shared host only the instance's GPUs are attested (a failure holds those GPUs, not the other
    tenants' work); a bare-metal node or a node in validation is attested whole.
    """
    nodes = {instance.node_id: instance.node for instance in ctx.instances}
    if ctx.node is not None:
        nodes = {ctx.node.pk: ctx.node}
    for node in nodes.values():
        _inventory_matches(ctx, node)
        gpus = list(node.gpus.select_related("model").order_by("index"))
        on_node = [i for i in ctx.instances if i.node_id == node.pk]
        if ctx.node is not None or node.pool != NodePool.SHARED:
            _attest(ctx, node, gpus, instances=on_node)
            continue
        for instance in on_node:
            gpu_ids = {d["gpu_id"] for d in instance.devices}
            _attest(ctx, node, [g for g in gpus if str(g.pk) in gpu_ids], instances=[instance], shared=True)


def _inventory_matches(ctx: Context, node) -> None:
    """Every GPU the catalogue lists is there and healthy, as the host sees it."""
    host = ctx.drivers.host
    seen = ctx.on(node, host.inventory)
    expected = set(node.gpus.values_list("uuid", flat=True))
    found = {gpu["uuid"] for gpu in seen}
    if found != expected:
        raise NodeFault(node, f"the host sees {len(found)} of its {len(expected)} GPUs "
                              f"(missing: {', '.join(sorted(expected - found)) or 'none'})", transient=False)
    sick = [gpu["uuid"] for gpu in seen if not gpu["healthy"]]
    if sick:
        raise NodeFault(node, f"GPUs report unhealthy: {', '.join(sick)}", transient=False)


def _attest(ctx: Context, node, gpus: list, *, instances: list, shared: bool = False) -> None:
    """
    Challenge, evidence, verdict. A failed verdict holds the node (or, shared, the GPUs) and
    fails the step for good; a pass before a hand-over signs a receipt onto the allocations.
    """
    indexes = ",".join(str(g.index) for g in gpus)
    reference = f"{ctx.operation.pk}:{node.pk}:{indexes}"
    report = _passed_before(node, reference)
    if report is not None:
        # This step attested the node on an earlier look and then waited for another node's agent:
        # challenged again, every node before the one waited for would wait for its agent once more
        # (a step over many nodes would advance one node per two agent turns and run out of waits).
        if ctx.operation.kind == OperationKind.PROVISION and not _receipts_kept(ctx, node, instances):
            from provisioning.receipts import receipt_store

            receipt_store(reservation=ctx.reservation, node=node, report=report, instances=instances)
        return
    nonce = attestation_challenge(node_id=node.pk, reference=reference)
    evidence = ctx.on(node, lambda target: ctx.drivers.host.attest(target, nonce.value, [g.index for g in gpus],
                                                                   reference=f"attest:{nonce.value}"))
    report = attestation_submit(node=node, evidence=evidence, nonce=nonce.value,
                                gpu_uuids=[g.uuid for g in gpus] if shared else None)
    if report.status != AttestationReport.Status.PASS:
        attestation_outcome(node=node, report=report, gpus=gpus if shared else None)
        why = "; ".join(dict.fromkeys(f"{r['check']}: {r['detail']}" for r in report.reasons))[:900]
        raise NodeFault(node, f"attestation {report.status}: {why}", transient=False, held=True)
    if ctx.operation.kind == OperationKind.PROVISION:
        from provisioning.receipts import receipt_store

        receipt_store(reservation=ctx.reservation, node=node, report=report, instances=instances)


def _passed_before(node, reference: str):
    """The passing report of this very challenge (this operation, node and GPUs) if one was made, else None."""
    spent = AttestationNonce.objects.filter(node_id=node.pk, reference=reference, used_at__isnull=False)
    return (AttestationReport.objects.filter(node_id=node.pk, nonce__in=spent.values("value"),
                                             status=AttestationReport.Status.PASS).order_by("-verified_at").first())


def _receipts_kept(ctx: Context, node, instances: list) -> bool:
    """Whether every allocation under ``instances`` on ``node`` carries its receipt already."""
    gpu_ids = {d["gpu_id"] for instance in instances for d in instance.devices}
    return not Allocation.objects.filter(reservation=ctx.reservation, node=node, gpu_id__in=gpu_ids,
                                         attestation_receipt="", ends_at__gt=timezone.now()).exists()


def hand_over(ctx: Context) -> None:
    """
    Access goes to the tenant (recorded when the operation finishes). From here the tenant's
    data is on these GPUs: a simulated host marks their memory used, so release must scrub it.
    """
    host = ctx.drivers.host
    tenant_writes = getattr(host, "use", None)
    if tenant_writes is not None:
        ctx.each(lambda instance, target: tenant_writes(target, instance.devices)
                 if host.scrubbed(target, instance.devices) else None)
    ctx.each(lambda instance, target: _host_keys_from_console(ctx.drivers, instance, target))


def _host_keys_from_console(drivers: Drivers, instance, target) -> None:
    """
    The host keys cloud-init printed on the console, unless the instance reported them already.
    Best effort: a console the driver cannot read leaves them to the instance's own report.
    """
    if instance.reported_at is not None or instance.kind == OfferingKind.CONTAINER:
        return
    try:
        text = console_output(instance, drivers=drivers, target=target)
    except DriverError:
        return
    host_keys.record(instance, host_keys.from_console(text))


def console_output(instance, *, drivers: Drivers | None = None, target: Target | None = None) -> str:
    """What the instance printed on its serial console, as its driver keeps it ('' for containers)."""
    drivers = drivers or drivers_for(instance.node.region.slug)  # the host's region holds its drivers
    target = target or target_of(instance.node)
    if instance.kind == OfferingKind.VM:
        return drivers.vm.console(target, instance.name)
    if instance.kind == OfferingKind.BARE_METAL:
        return drivers.power.console(target)
    return ""


def power_off(ctx: Context) -> None:
    """Power the server off and take its config drive out of the virtual CD."""
    power = ctx.drivers.power

    def off(instance, target):
        if power.power_state(target) == "on":
            power.set_power(target, False)
        if power.media(target) is not None:
            power.eject_media(target)
    ctx.each(off)


def wipe(ctx: Context) -> None:
    disks = ctx.drivers.image
    ctx.each(lambda instance, target: disks.wipe(target) if disks.image(target) is not None else None)


def scrub(ctx: Context) -> None:
    """Clear the tenant's GPU memory and check it is clear (real: the reset command through the agent)."""
    host = ctx.drivers.host

    reference = f"{ctx.operation.pk}:{{}}"

    def clean(instance, target):
        asked = reference.format(instance.pk)
        if not host.scrubbed(target, instance.devices, asked):
            host.scrub(target, instance.devices, asked)
        if not host.scrubbed(target, instance.devices, asked):
            raise DriverError("GPU memory still holds the previous tenant's data after the scrub.", transient=False)
    ctx.each(clean)


def reset_power(ctx: Context) -> None:
    """Leave the node off, booting from the network next time (ready for the next deploy)."""
    power = ctx.drivers.power
    ctx.each(lambda instance, target: power.set_boot_device(target, "pxe")
             if power.boot_device(target) != "pxe" else None)


#
# VMs
#


def define_domain(ctx: Context) -> None:
    """
    A domain with the instance's GPUs and its InfiniBand virtual function passed through, its
    share of the host's CPUs and memory, a NIC, and its cloud-init config drive (keys, hostname,
    network, the tenant's user-data).
    """
    vms = ctx.drivers.vm
    keys = _keys_of(ctx.reservation)
    offering = ctx.reservation.offering
    source = boot_of(ctx.reservation).source
    pool = settings.MERIDIAN_LIBVIRT_POOL

    def define(instance, target):
        if vms.domain_state(target, instance.name) != "absent":
            return
        disk, base = volume_names(instance.name, source)
        path = vms.volume(target, pool, disk) or vms.create_volume(target, pool, disk, base=base,
                                                                  size_gib=settings.MERIDIAN_VM_DISK_GIB)
        mac = mac_address(str(instance.pk))
        drive = cloud_init.drive_for(instance, keys=keys, mac=mac)
        node, share = instance.node, host_share(instance, offering)
        xml = domain_xml(name=instance.name, vcpus=max(2, int(node.cpu_cores * share)),
                         memory_mib=max(8192, int(node.ram_gib * 1024 * share * 0.9)), devices=instance.devices,
                         image=path, network=settings.MERIDIAN_LIBVIRT_NETWORK, mac=mac,
                         config_drive=cloud_init.drive_url(drive), ib_functions=(ib_function(instance),))
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
    vms, pool = ctx.drivers.vm, settings.MERIDIAN_LIBVIRT_POOL

    def remove(instance, target):
        if vms.domain_state(target, instance.name) != "absent":
            vms.undefine(target, instance.name)
        disk = disk_volume(instance.name)
        if vms.volume(target, pool, disk) is not None:
            vms.delete_volume(target, pool, disk)
    ctx.each(remove)


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
            network=network, vf_guid=vf_guid,
        )
    ctx.each(apply)


def instances_abandon(instances) -> None:
    """
    Best effort for instances on a host held for repair, which will never be cleaned: their VM
    (domain and disk volume) or pod is removed now if the host still answers, so nothing of the
    tenant's waits on it; what cannot be removed now is logged for the repair.
    """
    for instance in instances:
        if instance.kind == OfferingKind.BARE_METAL:
            continue  # the whole server is wiped when it is cleared after repair (clear_node)
        drivers, target = drivers_for(instance.node.region.slug), target_of(instance.node)
        try:
            if instance.kind == OfferingKind.VM:
                vms, pool = drivers.vm, settings.MERIDIAN_LIBVIRT_POOL
                if vms.domain_state(target, instance.name) != "absent":
                    vms.undefine(target, instance.name)
                if vms.volume(target, pool, disk_volume(instance.name)) is not None:
                    vms.delete_volume(target, pool, disk_volume(instance.name))
            else:
                namespace = namespace_of(instance.reservation.tenant_id)
                if drivers.container.pod(target, namespace, instance.name) is not None:
                    drivers.container.delete(target, namespace, instance.name)
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
    pods, namespace = ctx.drivers.container, namespace_of(ctx.reservation.tenant_id)
    ctx.each(lambda instance, target: pods.delete(target, namespace, instance.name)
             if pods.pod(target, namespace, instance.name) is not None else None)


#
# Node validation (burn-in)
#


def check_bmc(ctx: Context) -> None:
    """The BMC answers (power state read) -- out-of-band control works before the node is sold."""
    ctx.on(ctx.node, ctx.drivers.power.power_state)


def clear_node(ctx: Context) -> None:
    """A bare-metal node comes back from repair with whatever was on its disk: power it off and wipe it."""
    node = ctx.node
    if node.pool != NodePool.BARE_METAL:
        return  # a shared host's own disk is the host's system, not a tenant's
    power, disks = ctx.drivers.power, ctx.drivers.image

    def clear(target):
        if power.power_state(target) == "on":
            power.set_power(target, False)
        if disks.image(target) is not None:
            disks.wipe(target)
    ctx.on(node, clear)


def burn_in(ctx: Context) -> None:
    """Exercise every GPU's memory and clear it (real: the agent's burn-in and reset), and check it is clear."""
    host = ctx.drivers.host
    devices = [{"index": index, "mem_lo": 0, "mem_hi": memory}
               for index, memory in ctx.node.gpus.values_list("index", "memory_mib")]
    reference = str(ctx.operation.pk)

    def run(target):
        if not host.scrubbed(target, devices, reference):
            host.scrub(target, devices, reference)
        if not host.scrubbed(target, devices, reference):
            raise DriverError("GPU memory is not clear after the burn-in.", transient=False)
    ctx.on(ctx.node, run)


# Each step in a person's words (the console's step list; the names are the API's).
STEP_TITLES = {
    "place": "Find capacity",
    "power_on_deploy": "Power on with the deploy image",
    "write_image": "Write the OS image",
    "boot_from_disk": "Power-cycle into the OS",
    "join_network": "Join the VPC network",
    "verify": "Check and attest the hardware",
    "hand_over": "Hand over access",
    "define_domain": "Define the VM",
    "start_domain": "Start the VM",
    "configure_mig": "Partition the GPU (MIG)",
    "apply_pod": "Start the container",
    "power_off": "Power off",
    "wipe": "Wipe the disks",
    "leave_network": "Leave the VPC network",
    "scrub": "Scrub the GPU memory",
    "reset_power": "Ready the node for its next deploy",
    "stop_domain": "Stop the VM",
    "undefine_domain": "Remove the VM",
    "delete_pod": "Remove the container",
    "check_bmc": "Reach the BMC",
    "clear_node": "Clear the node",
    "burn_in": "Burn-in test",
}


def step_title(name: str) -> str:
    return STEP_TITLES.get(name) or name.replace("_", " ").capitalize()


JOIN_NETWORK = Step("join_network", join_network, join_network_many)
B, V, C = OfferingKind.BARE_METAL, OfferingKind.VM, OfferingKind.CONTAINER
P, R = OperationKind.PROVISION, OperationKind.RELEASE
PIPELINES: dict[tuple[str, str | None], list[Step]] = {
    (P, B): [Step("power_on_deploy", power_on_deploy), Step("write_image", write_image),
             Step("boot_from_disk", boot_from_disk), JOIN_NETWORK, Step("verify", verify),
             Step("hand_over", hand_over)],
    (P, V): [Step("define_domain", define_domain), Step("start_domain", start_domain),
             JOIN_NETWORK, Step("verify", verify), Step("hand_over", hand_over)],
    (P, C): [Step("configure_mig", configure_mig), Step("apply_pod", apply_pod), JOIN_NETWORK,
             Step("verify", verify), Step("hand_over", hand_over)],
    (R, B): [Step("power_off", power_off), Step("wipe", wipe), Step("leave_network", leave_network),
             Step("scrub", scrub), Step("verify", verify), Step("reset_power", reset_power)],
    (R, V): [Step("stop_domain", stop_domain), Step("undefine_domain", undefine_domain),
             Step("leave_network", leave_network), Step("scrub", scrub), Step("verify", verify)],
    (R, C): [Step("delete_pod", delete_pod), Step("leave_network", leave_network), Step("scrub", scrub),
             Step("verify", verify)],
    (OperationKind.VALIDATE, None): [Step("check_bmc", check_bmc), Step("clear_node", clear_node),
                                     Step("verify", verify), Step("burn_in", burn_in)],
    # An idle node proves itself again now and then without leaving the pool.
    (OperationKind.ATTEST, None): [Step("verify", verify)],
}
