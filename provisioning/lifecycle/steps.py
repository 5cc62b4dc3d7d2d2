"""
The named steps of provisioning, release (cleaning) and node validation, per offering kind (in
the spirit of Ironic's deploy and clean steps). Each step is idempotent: it reads what the
hardware already has and acts only where that differs, so a retried step -- after a worker
died between the driver call and the commit -- finds the work done and goes on.

A step gets a Context and touches hardware only through ``ctx.drivers``; a driver error is
raised as NodeFault naming the node, so the pipeline knows which node to retry or fail.
"""

from __future__ import annotations

from django.conf import settings
from django.utils import timezone

from cloud.choices import NodePool, OfferingKind
from cloud.services import node_cc_observed, node_topology_observed
from core.errors import DomainError
from provisioning import cloud_init, host_keys
from provisioning.choices import OperationKind
from provisioning.drivers import DriverError, Drivers, NotYet, Target, drivers_for
from provisioning.images import boot_of
from provisioning.lifecycle.guest_steps import (
    apply_pod,
    configure_mig,
    define_domain,
    delete_pod,
    instances_abandon,
    mig_layout_for,
    start_domain,
    stop_domain,
    undefine_domain,
)
from provisioning.lifecycle.step_context import Context, NodeFault, Step, authorized_keys, keys_of, target_of
from provisioning.models import Allocation, NodeValidation
from provisioning.mounts import handover_waits, mounts_for
from provisioning.networks.ports import VPCRefused, ports_join, ports_join_many, ports_leave
from provisioning.networks.vpcs import default_vpc
from security import acceptance
from security.models import AttestationNonce, AttestationReport, ReferenceManifest, ReferenceMeasurement
from security.services import attestation_challenge, attestation_outcome, attestation_submit, evidence_cc_mode

# What other modules take from here beside the steps: the context a step gets, and the guest
# steps' helpers (kept importable from the module that lists the pipelines).
__all__ = ["PIPELINES", "Context", "NodeFault", "Step", "authorized_keys", "console_output", "instances_abandon",
           "mig_layout_for", "step_title", "target_of"]

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
    keys, mounts = keys_of(ctx.reservation), mounts_for(ctx.reservation)

    def switch(instance, target):
        url = cloud_init.drive_url(cloud_init.drive_for(instance, keys=keys, mounts=mounts))
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
        gpus = _inventory_matches(ctx, node)
        on_node = [i for i in ctx.instances if i.node_id == node.pk]
        if ctx.node is not None or node.pool != NodePool.SHARED:
            _attest(ctx, node, gpus, instances=on_node)
            continue
        for instance in on_node:
            gpu_ids = {d["gpu_id"] for d in instance.devices}
            _attest(ctx, node, [g for g in gpus if str(g.pk) in gpu_ids], instances=[instance], shared=True)


def _inventory_matches(ctx: Context, node) -> list:
    """
    Every GPU the catalogue lists is there and healthy, as the host sees it; where each sits in
    the node (NVLink, PCIe switch, NUMA node) is recorded as the host reports it (written only
    when it changed: at a node's validation, or after its hardware changed). Its GPU rows, by index.
    """
    host = ctx.drivers.host
    seen = ctx.on(node, host.inventory)
    gpus = list(node.gpus.select_related("model").order_by("index"))
    expected = {gpu.uuid for gpu in gpus}
    found = {gpu["uuid"] for gpu in seen}
    if found != expected:
        raise NodeFault(node, f"the host sees {len(found)} of its {len(expected)} GPUs "
                              f"(missing: {', '.join(sorted(expected - found)) or 'none'})", transient=False)
    sick = [gpu["uuid"] for gpu in seen if not gpu["healthy"]]
    if sick:
        raise NodeFault(node, f"GPUs report unhealthy: {', '.join(sick)}", transient=False)
    node_topology_observed(node=node, gpus=gpus, seen=seen)
    return gpus


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
    if not shared:  # the whole node's evidence: its GPUs' CC mode decides whether it is confidential capacity
        node_cc_observed(node=node, cc_mode=evidence_cc_mode(report.gpus))
    _confidential_check(ctx, node, report)
    if ctx.operation.kind == OperationKind.PROVISION:
        from provisioning.receipts import receipt_store

        receipt_store(reservation=ctx.reservation, node=node, report=report, instances=instances)


def _confidential_check(ctx: Context, node, report) -> None:
    """
    A confidential reservation is handed over only when the evidence just verified shows every one
    of its GPUs in CC mode (and, for a VM, a host that runs confidential VMs); otherwise the node
    leaves the confidential pool and the reservation is placed again elsewhere.
    """
    if ctx.reservation is None or not ctx.reservation.offering.confidential:
        return
    off = [gpu["uuid"] for gpu in report.gpus if gpu.get("cc_mode") != "on"]
    if not off and (node.pool == NodePool.BARE_METAL or node.cvm_host):
        return
    node_cc_observed(node=node, cc_mode="off" if off else node.gpu_cc_mode)
    cause = (f"the evidence shows confidential computing off on {', '.join(off)}" if off
             else "the host does not run confidential VMs")
    raise NodeFault(node, f"{cause}: the confidential reservation is placed on another node", transient=False,
                    blame=False)


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
    Access goes to the tenant (recorded when the operation finishes), once what it waits for is
    there (a checkpoint restored with the reservation). From here the tenant's data is on these
    GPUs: a simulated host marks their memory used, so release must scrub it.
    """
    if ctx.reservation is not None and ctx.instances and (waiting := handover_waits(ctx.reservation)):
        raise NodeFault(ctx.instances[0].node, NotYet(f"The hand-over waits for {'; '.join(waiting)}.",
                                                      wait_s=settings.MERIDIAN_HANDOVER_WAIT_SECONDS), blame=False)
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
    devices = scrub_devices(ctx.instances)

    def clean(instance, target):
        asked = reference.format(instance.pk)
        if not host.scrubbed(target, instance.devices, asked):
            host.scrub(target, devices[instance.pk], asked)
        if not host.scrubbed(target, instance.devices, asked):
            raise DriverError("GPU memory still holds the previous tenant's data after the scrub.", transient=False)
    ctx.each(clean)


def scrub_devices(instances) -> dict:
    """
    Each instance's devices (by instance id) with what a shared GPU's scrub needs: whose slot it
    is (the instance, and the runtime's id for it) and how many other reservations still hold the
    GPU -- with any, the agent clears only the slot and never resets the GPU under them. One query.
    """
    now = timezone.now()
    holders: dict[str, set] = {}
    for gpu_id, reservation_id in Allocation.objects.filter(
            gpu_id__in=[d["gpu_id"] for instance in instances for d in instance.devices], starts_at__lte=now,
            ends_at__gt=now).values_list("gpu_id", "reservation_id"):
        holders.setdefault(str(gpu_id), set()).add(reservation_id)
    found = {}
    for instance in instances:
        aliases = {instance.runtime_uid: instance.name} if instance.runtime_uid else {}
        found[instance.pk] = [
            {**d, "owner": instance.name, "aliases": aliases,
             "neighbours": len(holders.get(str(d["gpu_id"]), set()) - {instance.reservation_id})}
            for d in instance.devices]
    return found


def reset_power(ctx: Context) -> None:
    """Leave the node off, booting from the network next time (ready for the next deploy)."""
    power = ctx.drivers.power
    ctx.each(lambda instance, target: power.set_boot_device(target, "pxe")
             if power.boot_device(target) != "pxe" else None)



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
    """
    Exercise every GPU's memory and clear it (real: the agent's burn-in and reset), check it is
    clear, then run the acceptance checks (security.acceptance): one failed check keeps the node out.
    """
    host = ctx.drivers.host
    devices = [{"index": index, "mem_lo": 0, "mem_hi": memory}
               for index, memory in ctx.node.gpus.values_list("index", "memory_mib")]
    reference = str(ctx.operation.pk)

    def run(target):
        if not host.scrubbed(target, devices, reference):
            host.scrub(target, devices, reference)
        if not host.scrubbed(target, devices, reference):
            raise DriverError("GPU memory is not clear after the burn-in.", transient=False)
        measured = host.acceptance(target, reference)
        failed = record_validation(ctx.node, ctx.operation, measured)
        if failed:
            shown = "; ".join(str(result) for result in failed[:3])
            more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
            raise DriverError(f"The acceptance checks failed: {shown}{more}.", transient=False)
    ctx.on(ctx.node, run)


def record_validation(node, operation, measured: dict) -> list:
    """Judge what the host measured against its GPU model's profile, record every check, return the failures."""
    model = node.gpus.values_list("model__slug", flat=True).first() or ""
    known = {(vbios.lower(), driver) for vbios, driver in
             ReferenceMeasurement.objects.filter(gpu_model=model).values_list("vbios_version", "driver_version")}
    rims = set(ReferenceManifest.objects.values_list("kind", "version"))
    known |= {(vbios.lower(), driver) for kind, vbios in rims if kind == "vbios"
              for other, driver in rims if other == "driver"}
    gpus = [{**gpu, "vbios": str(gpu.get("vbios") or "").lower()} for gpu in measured.get("gpus", [])]
    # With no reference values at all, attestation holds every node already: not reported twice.
    results = acceptance.evaluate(model, gpus, measured.get("node", {}), known_versions=known or None)
    failed = acceptance.failures(results)
    NodeValidation.objects.create(node=node, operation=operation, passed=not failed,
                                  results=[r.to_dict() for r in failed + [r for r in results if r.passed]])
    return failed


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
    "burn_in": "Burn-in and acceptance checks",
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
