"""
``manage.py run_agents``: simulated node agents for every node of the fleet (the demo's and the
embedded default's), each with its own key, speaking to the control plane over HTTP like a real
one. The agents themselves are Django-free (provisioning.agent); this runner only hands them
their keys and GPUs.
"""

import logging
import signal
import threading
import time
import urllib.request

from django.conf import settings
from django.core.management.base import BaseCommand

from cloud.models import Node
from inference.load import gpu_targets
from operations.node_api.agents import credential_issue
from provisioning.agent.agent import Agent, ControlPlane, ControlPlaneError, simulated_host
from provisioning.agent.attester import SimulatedAttester
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.agent.ports import SimulatedPorts
from provisioning.agent.topology import simulated_layout
from provisioning.drivers.simulated_devices import attester_identities
from provisioning.models import NodeCredential

log = logging.getLogger("meridian.agent")


class Command(BaseCommand):
    help = "Run a simulated node agent for every node (heartbeats, commands) against the control plane."

    def add_arguments(self, parser):
        parser.add_argument("--url", default=None, help="The control plane (default: MERIDIAN_PUBLIC_URL).")
        parser.add_argument("--interval", type=float, default=None, help="Seconds between turns.")

    def handle(self, *args, url, interval, **options):
        url = url or settings.MERIDIAN_PUBLIC_URL
        interval = interval or settings.MERIDIAN_AGENT_INTERVAL
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        agents = [Agent(ControlPlane(url, key_id, secret), nvml, attester=attester, hostname=hostname, ports=ports,
                        **dict(zip(("process_owner", "kill"), simulated_host(nvml), strict=True)))
                  for key_id, secret, nvml, hostname, attester, ports in self._fleet()]
        self.stdout.write(f"{len(agents)} simulated node agents, a turn every {interval:g} s, against {url}")
        self._wait_for(url, stopping)
        loaded: set = set()  # the GPUs the synthetic load set last turn
        while not stopping.is_set():
            started = time.monotonic()
            loaded = self._apply_load(agents, loaded)
            for agent in agents:
                if stopping.is_set():
                    break
                try:
                    agent.run_once()
                except ControlPlaneError as exc:
                    log.warning("agent: %s", exc)
                except Exception:  # one agent's surprise must not stop the fleet's (and make run with it)
                    log.exception("agent of %s failed this turn", agent.hostname)
            stopping.wait(max(0.0, interval - (time.monotonic() - started)))

    @staticmethod
    def _apply_load(agents, loaded: set) -> set:
        """The demo endpoints' synthetic load on their replicas' GPUs (inference.load); others back to idle."""
        try:
            targets = gpu_targets()
        except Exception:  # a read that fails must not stop the fleet's turn
            log.exception("could not read the synthetic load")
            return loaded
        by_host = {agent.hostname: agent for agent in agents}
        for hostname, index in loaded - set(targets):
            if hostname in by_host and index in by_host[hostname].nvml.gpus:
                by_host[hostname].nvml.gpus[index].utilization_pct = 0
        for (hostname, index), percent in targets.items():
            if hostname in by_host and index in by_host[hostname].nvml.gpus:
                by_host[hostname].nvml.gpus[index].utilization_pct = percent
        return set(targets)

    def _fleet(self):
        """Each node's key (issued on first run) and its GPUs as a simulated NVML sees them."""
        for node in Node.objects.prefetch_related("gpus", "ib_ports").order_by("hostname"):
            credential = NodeCredential.objects.filter(node=node, revoked_at=None).first()
            secret = credential.secret if credential else None
            if credential is None:
                credential, secret = credential_issue(actor=None, node=node)
            rows = list(node.gpus.all())
            layout = simulated_layout(max((g.index for g in rows), default=-1) + 1, cores=node.cpu_cores)
            gpus = [SimulatedGPU(index=g.index, uuid=g.uuid, memory_mib=g.memory_mib, topology=layout[g.index])
                    for g in rows]
            yield (credential.key_id, secret, SimulatedNVML(gpus), node.hostname,
                   SimulatedAttester(attester_identities(node)), SimulatedPorts([p.guid for p in node.ib_ports.all()]))

    @staticmethod
    def _wait_for(url: str, stopping: threading.Event, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not stopping.is_set() and time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{url}/health/", timeout=2)  # noqa: S310 -- our own URL
                return
            except OSError:
                stopping.wait(0.5)
