"""
Simulated hardware: the embedded default and most tests. State lives in the database
(SimulatedDevice), so it outlives a killed worker like real hardware does, and every call is
counted so tests can prove a retried step did not repeat a side effect.

Faults are injected from ``settings.MERIDIAN_SIMULATION``, deterministic under its seed:
``latency_s`` and ``failure_rate`` (transient, retried) and ``broken_rate`` (for good), each a
mapping from an action name (``set_power``, ``write_image``, ``scrub``...) or ``"default"``.
"""

from __future__ import annotations

import random
import time
import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction

from cloud.guids import normal_guid
from cloud.models import GPU, Node
from provisioning.agent.topology import simulated_places
from provisioning.drivers.base import (
    ContainerDriver,
    DriverError,
    HostDriver,
    ImageDriver,
    PowerDriver,
    Target,
    VMDriver,
)
from provisioning.drivers.fabric import (
    DEFAULT_PKEY,
    FULL,
    FabricDriver,
    Partition,
    PartitionSpec,
    check_members,
)
from provisioning.drivers.simulated_console import boot_log
from provisioning.drivers.simulated_devices import SIMULATED_DRIVER, SIMULATED_VBIOS, misbehaviour, simulated_evidence
from provisioning.models import SimulatedDevice
from security import acceptance


def _knob(name: str, action: str) -> float:
    table = settings.MERIDIAN_SIMULATION.get(name, {})
    return float(table.get(action, table.get("default", 0.0)))


class Simulated:
    """One simulated device per (kind, node): read its state, change it, count the calls."""
    kind = ""

    def _key(self, target: Target) -> str:
        return f"{self.kind}:{target.hostname}"

    def _state(self, target: Target) -> dict:
        row = SimulatedDevice.objects.filter(key=self._key(target)).values_list("state", flat=True).first()
        return row or {}

    def _act(self, target: Target, action: str, change) -> None:
        """
        Count the call, maybe fail it as configured, then apply ``change(state)`` and store it.
        With a latency the count is stored first, as real hardware has begun when a worker dies
        mid-call; without one, count and change are one write.
        """
        key = self._key(target)
        seed = settings.MERIDIAN_SIMULATION.get("seed", 0)
        latency = _knob("latency_s", action)
        with transaction.atomic():
            row = SimulatedDevice.objects.select_for_update().filter(key=key).first()
            if row is None:  # a new device: get_or_create is safe when two workers touch it at once
                SimulatedDevice.objects.get_or_create(key=key)
                row = SimulatedDevice.objects.select_for_update().get(key=key)
            calls = {**row.calls, action: row.calls.get(action, 0) + 1}
            roll = random.Random(f"{seed}|{key}|{action}|{calls[action]}").random()  # noqa: S311 -- fault injection
            fails = roll < max(_knob("broken_rate", action), _knob("failure_rate", action))
            if latency or fails:
                SimulatedDevice.objects.filter(key=key).update(calls=calls)
            else:
                state = dict(row.state)
                change(state)
                SimulatedDevice.objects.filter(key=key).update(calls=calls, state=state)
                return
        if roll < _knob("broken_rate", action):
            raise DriverError(f"Simulated hardware fault on {target.hostname}: {action} failed.", transient=False)
        if fails:
            raise DriverError(f"Simulated transient error on {target.hostname}: {action} timed out.")
        time.sleep(latency)
        with transaction.atomic():
            row = SimulatedDevice.objects.select_for_update().get(key=key)
            state = dict(row.state)
            change(state)
            SimulatedDevice.objects.filter(key=key).update(state=state)

    @staticmethod
    def calls(kind: str, hostname: str) -> dict:
        """Every call made to one simulated device, by action (for tests and the bench)."""
        row = SimulatedDevice.objects.filter(key=f"{kind}:{hostname}").values_list("calls", flat=True).first()
        return row or {}


class SimulatedPower(Simulated, PowerDriver):
    kind = "bmc"

    def power_state(self, target):
        return self._state(target).get("power", "off")

    def set_power(self, target, on):
        self._act(target, "set_power", lambda s: s.update(power="on" if on else "off"))

    def boot_device(self, target):
        return self._state(target).get("boot", "hdd")

    def set_boot_device(self, target, device):
        self._act(target, "set_boot_device", lambda s: s.update(boot=device))

    def media(self, target):
        return self._state(target).get("media")

    def insert_media(self, target, url):
        self._act(target, "insert_media", lambda s: s.update(media=url))

    def eject_media(self, target):
        self._act(target, "eject_media", lambda s: s.update(media=None))

    def readings(self, target):
        """
        A BMC's sensors, deterministic: an idle CPU, the intake air and one sensor per GPU (as HGX
        boards list them), and the draw of a node on or off; ``set_readings`` overrides any of it.
        """
        state = self._state(target)
        on = state.get("power", "off") == "on"
        try:
            gpus = GPU.objects.filter(node_id=target.node_id).count() if target.node_id else 0
        except ValidationError:  # a target that names no enrolled node (a bare test target)
            gpus = 0
        given = state.get("readings", {})
        gpu_c = given.get("gpu_celsius", 38 if on else 24)
        temperatures = [{"name": "CPU Temp", "context": "CPU", "celsius": 45 if on else 24},
                        {"name": "Chassis Intake Temp", "context": "Intake", "celsius": 24},
                        *({"name": f"GPU {i} Temp", "context": "GPU",
                           "celsius": gpu_c[i] if isinstance(gpu_c, list) else gpu_c} for i in range(gpus))]
        return {"power_w": given.get("power_w", (900.0 + 90.0 * gpus) if on else 12.0),
                "temperatures": temperatures, "health": given.get("health", "ok")}

    def console(self, target):
        """A server booted from its disk has printed its boot (keys from its deployment: the media it booted with)."""
        state = self._state(target)
        if state.get("power") != "on" or state.get("boot", "hdd") != "hdd":
            return ""
        return boot_log(target.hostname, f"{target.hostname}|{state.get('media') or ''}")

    def set_readings(self, target, **readings) -> None:
        """Tests and the demo: fix what the BMC reports (power_w, gpu_celsius: one value or per GPU, health)."""
        self._act(target, "set_readings", lambda s: s.setdefault("readings", {}).update(readings))


class SimulatedImage(Simulated, ImageDriver):
    kind = "disk"

    def image(self, target):
        return self._state(target).get("image")

    def deployed_for(self, target):
        return self._state(target).get("marker")

    def write_image(self, target, image, ssh_public_key, marker):
        self._act(target, "write_image", lambda s: s.update(image=image, ssh_key=ssh_public_key, marker=marker))

    def wipe(self, target):
        self._act(target, "wipe", lambda s: s.update(image=None, ssh_key=None, marker=None))


class SimulatedVM(Simulated, VMDriver):
    kind = "hypervisor"

    def domain_state(self, target, name):
        return self._state(target).get("domains", {}).get(name, {}).get("state", "absent")

    def _domain(self, target, action, name, update):
        def change(state):
            domains = state.setdefault("domains", {})
            update(domains, name)
        self._act(target, action, change)

    def define(self, target, name, xml):
        self._domain(target, "define", name, lambda d, n: d.setdefault(n, {"state": "defined", "xml": xml}))

    def start(self, target, name):
        def run(domains, n):
            if n not in domains:  # as libvirt answers: nothing was started, the call undone
                raise DriverError(f"No domain {name} on {target.hostname}.", transient=False)
            domains[n]["state"] = "running"
        self._domain(target, "start", name, run)

    def stop(self, target, name):
        def shut_off(domains, n):
            if n in domains:
                domains[n]["state"] = "defined"
        self._domain(target, "stop", name, shut_off)

    def undefine(self, target, name):
        self._domain(target, "undefine", name, lambda d, n: d.pop(n, None))

    def volume(self, target, pool, name):
        return self._state(target).get("volumes", {}).get(f"{pool}/{name}", {}).get("path")

    def create_volume(self, target, pool, name, *, base, size_gib):
        path = f"/var/lib/libvirt/{pool}/{name}"
        self._act(target, "create_volume", lambda s: s.setdefault("volumes", {}).setdefault(
            f"{pool}/{name}", {"path": path, "base": base, "size_gib": size_gib}))
        return path

    def delete_volume(self, target, pool, name):
        self._act(target, "delete_volume", lambda s: s.setdefault("volumes", {}).pop(f"{pool}/{name}", None))

    def console(self, target, name):
        domain = self._state(target).get("domains", {}).get(name, {})
        return boot_log(name, f"{name}|{domain.get('xml', '')}") if domain.get("state") == "running" else ""


class SimulatedContainers(Simulated, ContainerDriver):
    kind = "containers"

    def pod(self, target, namespace, name):
        return self._state(target).get("pods", {}).get(f"{namespace}/{name}")

    def apply(self, target, spec):
        # The API server gives every pod a UID; the simulated kubelet starts it at once.
        applied = {**spec.pod, "metadata": {**spec.pod["metadata"], "uid": str(uuid.uuid4())},
                   "status": {"phase": "Running"}}

        def change(state):
            state.setdefault("secrets", {}).setdefault(f"{spec.namespace_name}/{spec.secret['metadata']['name']}",
                                                       spec.secret)
            state.setdefault("pods", {}).setdefault(f"{spec.namespace_name}/{spec.name}", applied)
        self._act(target, "apply", change)

    def delete(self, target, namespace, name):
        def change(state):
            state.setdefault("pods", {}).pop(f"{namespace}/{name}", None)
            state.setdefault("secrets", {}).pop(f"{namespace}/{name}-access", None)
        self._act(target, "delete", change)

    def secret(self, target, namespace, name) -> dict | None:
        """The instance's secret as applied (tests read the keys and environment it carries)."""
        return self._state(target).get("secrets", {}).get(f"{namespace}/{name}-access")


class SimulatedHost(Simulated, HostDriver):
    """The node agent's answers, with GPUs as the catalogue has them unless a test breaks one."""
    kind = "host"

    def inventory(self, target):
        """
        The catalogue's GPUs, each where the catalogue places it in the node or else where a
        realistic server of that many GPUs has it (agent.topology.simulated_layout: an HGX board,
        PCIe cards in bridged pairs), or where a test put it (state "topology": by GPU index).
        """
        state = self._state(target)
        missing, unhealthy = set(state.get("missing", [])), set(state.get("unhealthy", []))
        rows = list(GPU.objects.filter(node_id=target.node_id).order_by("index").values_list(
            "index", "uuid", "nvlink_domain", "pcie_switch", "numa_node", "node__numa_cpus", "node__gpus_installed",
            "node__cpu_cores"))
        layout = simulated_places(rows[0][6], rows[0][7]) if rows else {}
        places = {index: {"nvlink_domain": domain, "pcie_switch": switch, "numa_node": numa,
                          "cpus": cpus.get(str(numa))} if numa is not None else layout.get(index, {})
                  for index, _, domain, switch, numa, cpus, *_ in rows}
        return [{"index": index, "uuid": uuid, "healthy": index not in unhealthy, **places[index],
                 **state.get("topology", {}).get(str(index), {})}
                for index, uuid, *_ in rows if index not in missing]

    def scrub(self, target, devices, reference=""):
        marks = [_slot(d) for d in devices]
        self._act(target, "scrub", lambda s: s.update(dirty=[m for m in s.get("dirty", []) if m not in marks]))

    def scrubbed(self, target, devices, reference=""):
        dirty = self._state(target).get("dirty", [])
        return not any(_slot(d) in dirty for d in devices)

    def mig_layout(self, target, index):
        return self._state(target).get("mig", {}).get(str(index))

    def set_mig_layout(self, target, index, layout, reference=""):
        self._act(target, "set_mig_layout", lambda s: s.setdefault("mig", {}).update({str(index): layout}))

    def attest(self, target, nonce, gpus, reference=""):
        """Evidence signed by each simulated GPU's own device key (provisioning.drivers.simulated_devices)."""
        self._act(target, "attest", lambda state: None)
        node = Node.objects.get(pk=target.node_id)
        rows = GPU.objects.filter(node=node, index__in=list(gpus)).select_related("model").order_by("index")
        return simulated_evidence(node, nonce, list(rows), mode=misbehaviour(target.hostname),
                                  cc_mode=self._state(target).get("cc_mode"))

    def acceptance(self, target, reference=""):
        """A healthy node's readings, with what a test broke (state "acceptance": by GPU index, and "node")."""
        self._act(target, "acceptance", lambda state: None)
        broken = self._state(target).get("acceptance", {})
        rows = GPU.objects.filter(node_id=target.node_id).select_related("model").order_by("index")
        gpus = [{**acceptance.nominal(gpu.model.slug, gpu.index, driver=SIMULATED_DRIVER, vbios=SIMULATED_VBIOS),
                 **broken.get(str(gpu.index), {})} for gpu in rows]
        model = rows[0].model.slug if rows else ""
        return {"gpus": gpus, "node": {**acceptance.nominal_node(model), **broken.get("node", {})}}

    def set_topology(self, target, places: dict[int, dict]) -> None:
        """Report these GPUs elsewhere in the node (as their agent would after the hardware changed), by index."""
        self._act(target, "set_topology", lambda state: state.update(topology={str(i): p for i, p in places.items()}))

    def set_cc_mode(self, target, mode: str | None) -> None:
        """Set the simulated GPUs' confidential-computing mode (as an operator's nvidia-smi conf-compute would)."""
        self._act(target, "set_cc_mode", lambda state: state.update(cc_mode=mode))

    def use(self, target, devices) -> None:
        """A tenant wrote to this memory (the handover does it): it needs a scrub before reuse."""
        marks = [_slot(d) for d in devices]
        self._act(target, "use", lambda s: s.update(dirty=sorted(set(s.get("dirty", [])) | set(marks))))


def _slot(device: dict) -> str:
    return f"{device['index']}:{device['mem_lo']}-{device['mem_hi']}"


class SimulatedFabric(Simulated, FabricDriver):
    """
    A simulated InfiniBand fabric: its partitions kept in the database, programmed like the real
    ones, and able to say which ports can reach each other (``reachable``) -- what the isolation
    tests and a tenant's isolation report ask of it.
    """
    kind = "fabric"

    def __init__(self, *, name: str = "default"):
        self.target = Target(node_id="", hostname=name)

    def read(self) -> dict[int, Partition]:
        stored = self._state(self.target).get("partitions", {})
        found = {DEFAULT_PKEY: Partition(PartitionSpec(pkey=DEFAULT_PKEY, name="Default"))}
        for key, p in stored.items():
            spec = PartitionSpec(pkey=int(key), name=p["name"], mtu=p["mtu"], rate_gbps=p["rate_gbps"],
                                 service_level=p["service_level"], ipoib=p["ipoib"])
            found[int(key)] = Partition(spec, dict(p["members"]))
        return found

    def ensure_partition(self, spec: PartitionSpec) -> None:
        def change(state):
            partitions = state.setdefault("partitions", {})
            members = partitions.get(str(spec.pkey), {}).get("members", {})
            partitions[str(spec.pkey)] = {"name": spec.name, "mtu": spec.mtu, "rate_gbps": spec.rate_gbps,
                                          "service_level": spec.service_level, "ipoib": spec.ipoib, "members": members}
        self._act(self.target, "ensure_partition", change)

    def delete_partition(self, pkey: int) -> None:
        if pkey == DEFAULT_PKEY:
            raise DriverError("The default partition 0x7fff cannot be deleted.", transient=False)
        self._act(self.target, "delete_partition",
                  lambda state: state.setdefault("partitions", {}).pop(str(pkey), None))

    def set_members(self, pkey: int, members) -> None:
        checked = check_members(members)
        if pkey == DEFAULT_PKEY and FULL in checked.values():
            raise DriverError("Ports are at most limited members of the default partition 0x7fff.", transient=False)

        def change(state):
            partitions = state.setdefault("partitions", {})
            if pkey == DEFAULT_PKEY and str(pkey) not in partitions:
                partitions[str(pkey)] = {"name": "Default", "mtu": 4096, "rate_gbps": None, "service_level": 0,
                                         "ipoib": True, "members": {}}
            if str(pkey) not in partitions:
                raise DriverError(f"Partition {pkey:#06x} does not exist on fabric {self.target.hostname}.",
                                  transient=False)
            partitions[str(pkey)]["members"].update(checked)
        self._act(self.target, "set_members", change)

    def remove_members(self, pkey: int, guids) -> None:
        gone = set(check_members({guid: FULL for guid in guids}))

        def change(state):
            partition = state.setdefault("partitions", {}).get(str(pkey))
            if partition is not None:
                partition["members"] = {g: m for g, m in partition["members"].items() if g not in gone}
        self._act(self.target, "remove_members", change)

    def port_states(self, guids) -> dict[str, str]:
        """Every port is up unless ``set_port_state`` took it down (the fabric's view, out of band)."""
        down = set(self._state(self.target).get("ports_down", []))
        states = {}
        for guid in guids:
            try:
                guid = normal_guid(guid)
            except ValueError:
                continue  # a bad stored GUID: nothing known of it, as a real fabric would say
            states[guid] = "down" if guid in down else "up"
        return states

    def set_port_state(self, guid: str, link: str) -> None:
        """Tests and the demo: a port's link goes down (a cable, a transceiver) or comes back up."""
        guid = normal_guid(guid)

        def change(state):
            down = set(state.get("ports_down", []))
            down = down | {guid} if link == "down" else down - {guid}
            state["ports_down"] = sorted(down)
        self._act(self.target, "set_port_state", change)

    def reachable(self, a: str, b: str) -> bool:
        """Whether ports ``a`` and ``b`` share a partition in which at least one is a full member."""
        a, b = normal_guid(a), normal_guid(b)
        return any(a in p.members and b in p.members and FULL in (p.members[a], p.members[b])
                   for p in self.read().values())
