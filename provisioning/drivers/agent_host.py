"""
A GPU host as its node agent reports it: inventory from the last heartbeat, scrubs as commands
the agent pulls and answers (DESIGN.md: the agent pulls, the control plane never calls in).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from cloud.models import GPU
from provisioning.drivers.base import PLACE_KEYS, DriverError, HostDriver, NotYet, Target


class AgentHost(HostDriver):
    def _state(self, target: Target):
        from provisioning.models import AgentState

        state = AgentState.objects.filter(node_id=target.node_id).first()
        silent_for = timedelta(seconds=3 * settings.MERIDIAN_AGENT_INTERVAL)
        if state is None or state.last_seen_at < timezone.now() - silent_for:
            # Late is not failed: a loaded control plane hears its agents late, and an agent only
            # starts once its host is up. The step waits for it (MERIDIAN_STEP_WAITS looks, per node);
            # whether the node failed is the heartbeat watchdog's call (operations.detection).
            seen = f"since {state.last_seen_at:%H:%M:%S} UTC" if state else "yet"
            raise NotYet(f"The node agent of {target.hostname} has not been heard {seen}; waiting for it (check it "
                         "runs and reaches the control plane).", wait_s=max(1.0, settings.MERIDIAN_AGENT_INTERVAL / 2))
        return state

    def inventory(self, target):
        # Where each GPU sits in the node, when the agent read it (provisioning.agent.topology).
        return [{"index": g.get("index"), "uuid": g["uuid"], "healthy": bool(g.get("healthy", True)),
                 **{key: g[key] for key in PLACE_KEYS if key in g}} for g in self._state(target).gpus]

    def scrub(self, target, devices, reference=""):
        from provisioning.agents.commands import command_enqueue
        from provisioning.models import AgentCommand

        self._state(target)
        command_enqueue(node_id=target.node_id, kind=AgentCommand.Kind.SCRUB, reference=reference,
                        payload={"devices": [{k: d[k] for k in ("index", "mem_lo", "mem_hi", "owner", "aliases",
                                                                "neighbours") if k in d} for d in devices]})

    def mig_layout(self, target, index):
        return next((g.get("mig_layout") for g in self._state(target).gpus if g.get("index") == index), None)

    def set_mig_layout(self, target, index, layout, reference=""):
        """The agent cuts the GPU (its host's MIG command) and reports the layout in its next heartbeat."""
        from provisioning.agents.commands import command_enqueue
        from provisioning.models import AgentCommand

        command = command_enqueue(node_id=target.node_id, kind=AgentCommand.Kind.MIG, reference=reference,
                                  payload={"index": index, "layout": layout})
        if command.state == AgentCommand.State.FAILED:
            detail = (command.result or {}).get("detail", "no detail")
            raise DriverError(f"The agent of {target.hostname} could not set MIG on GPU {index}: {detail}.",
                              transient=False)
        if command.state != AgentCommand.State.DONE:
            raise NotYet(f"Waiting for the agent of {target.hostname} to cut GPU {index} into {layout}.",
                         wait_s=max(1.0, settings.MERIDIAN_AGENT_INTERVAL / 2))

    def attest(self, target, nonce, gpus, reference=""):
        """The agent is asked to sign evidence for the nonce; its answer is read back on a later call."""
        from provisioning.agents.commands import command_enqueue
        from provisioning.models import AgentCommand

        self._state(target)
        command = command_enqueue(node_id=target.node_id, kind=AgentCommand.Kind.ATTEST, reference=reference,
                                  payload={"nonce": nonce, "gpus": sorted(gpus)})
        if command.state == AgentCommand.State.DONE:
            return (command.result or {}).get("evidence") or {}
        if command.state == AgentCommand.State.FAILED:
            detail = (command.result or {}).get("detail", "no detail")
            raise DriverError(f"The agent of {target.hostname} could not attest: {detail}.", transient=False)
        raise NotYet(f"Waiting for the agent of {target.hostname} to answer the attestation challenge.",
                     wait_s=max(1.0, settings.MERIDIAN_AGENT_INTERVAL / 2))

    def acceptance(self, target, reference=""):
        """The agent measures (NVML readings and its stress steps); its answer is read back on a later call."""
        from provisioning.agents.commands import command_enqueue
        from provisioning.models import AgentCommand

        self._state(target)
        model = GPU.objects.filter(node_id=target.node_id).values_list("model__slug", flat=True).first() or ""
        command = command_enqueue(node_id=target.node_id, kind=AgentCommand.Kind.ACCEPTANCE, reference=reference,
                                  payload={"model": model})
        if command.state == AgentCommand.State.DONE:
            return {"gpus": (command.result or {}).get("gpus") or [], "node": (command.result or {}).get("node") or {}}
        if command.state == AgentCommand.State.FAILED:
            detail = (command.result or {}).get("detail", "no detail")
            raise DriverError(f"The agent of {target.hostname} could not run the acceptance checks: {detail}.",
                              transient=False)
        raise NotYet(f"Waiting for the agent of {target.hostname} to run the acceptance checks.",
                     wait_s=max(1.0, settings.MERIDIAN_AGENT_INTERVAL / 2))

    def scrubbed(self, target, devices, reference=""):
        from provisioning.models import AgentCommand

        command = AgentCommand.objects.filter(node_id=target.node_id, kind=AgentCommand.Kind.SCRUB,
                                              reference=reference).first()
        if command is None:
            return False
        if command.state == AgentCommand.State.DONE:
            return True
        if command.state == AgentCommand.State.FAILED:
            detail = (command.result or {}).get("detail", "no detail")
            raise DriverError(f"The agent of {target.hostname} could not scrub: {detail}.", transient=False)
        raise NotYet(f"Waiting for the agent of {target.hostname} to scrub.",
                     wait_s=max(1.0, settings.MERIDIAN_AGENT_INTERVAL / 2))
