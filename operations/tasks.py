"""Periodic work of the fleet; thin wrappers around services."""


from celery import shared_task

from operations import metrics  # noqa: F401 -- connects the Celery task metrics in every worker that loads the tasks


@shared_task(name="cloud.alerts_evaluate")
def alerts_evaluate() -> dict:
    """Fleet alerts from the last minutes' telemetry: fluctuating utilization, XID bursts, idle reserved GPUs."""
    from operations.alerts import alerts_evaluate as evaluate

    return evaluate()


#
# GPU telemetry (cloud.telemetry): rollups, retention, out-of-band readings of held bare-metal nodes
#


@shared_task(name="cloud.telemetry_rollup")
def telemetry_rollup() -> dict:
    """Raw samples of closed minutes into 1-minute buckets, closed hours into 1-hour ones (idempotent)."""
    from cloud.telemetry import rollup

    return rollup()


@shared_task(name="cloud.telemetry_prune")
def telemetry_prune() -> dict:
    """Drop samples and rollups past MERIDIAN_TELEMETRY_RETENTION (never what is not rolled up yet)."""
    from cloud.telemetry import prune

    return prune()


@shared_task(name="cloud.telemetry_bmc_collect")
def telemetry_bmc_collect() -> dict:
    """
    BMC readings and fabric port states of the bare-metal nodes a tenant holds (no agent runs there),
    and the BMC's GPU sensors for VMs' passed-through GPUs nothing else reported lately.
    """
    from operations.bmc import bmc_collect, vm_gpu_collect

    return {**bmc_collect(), "vm_gpus": vm_gpu_collect()}


#
# Failure detection (operations.detection)
#


@shared_task(name="cloud.heartbeats_watch")
def heartbeats_watch() -> dict:
    """Silent agents' nodes suspect, then failed (and replaced); suspect nodes heard again back; reset GPUs back."""
    from operations.heartbeats import watch_heartbeats

    return watch_heartbeats()


@shared_task(name="provisioning.agent_nonce_prune")
def agent_nonce_prune() -> int:
    """Forget the agents' nonces once their requests would be stale anyway (the table stays small)."""
    from operations.node_api.agents import prune_nonces

    return prune_nonces()
