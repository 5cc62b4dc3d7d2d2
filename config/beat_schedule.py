"""
What beat sends and how often (``CELERY_BEAT_SCHEDULE``, read by ``config.settings``): the
reconcilers, sweeps and samplers of every app. Every task here is idempotent: beat with standbys
(``config.beat``) sends each due run at most once, and a run lost with a dying leader is made good
by the next.
"""

import environ

env = environ.Env()

CELERY_BEAT_SCHEDULE = {
    "tenants.invitation_expire": {"task": "tenants.invitation_expire", "schedule": 300.0},
    "provisioning.idempotency_key_prune": {"task": "provisioning.idempotency_key_prune", "schedule": 3600.0},
    # Start reservations whose window opened, release those whose window ended, resume or fail
    # operations stuck past their deadline.
    "provisioning.lifecycle_tick": {"task": "provisioning.lifecycle_tick", "schedule": 5.0},
    "provisioning.agent_nonce_prune": {"task": "provisioning.agent_nonce_prune", "schedule": 60.0},
    # Expire high-priority status that ran out; revoke it where the team's record fell below the thresholds.
    "tenants.hp_revoke_due": {"task": "tenants.hp_revoke_due", "schedule": 3600.0},
    # Chain the audit events in commit order and sign a checkpoint of the head.
    "security.audit_seal": {"task": "security.audit_seal", "schedule": 5.0},
    # Page the on-call address about new incidents, send staff their incident notices (security.incident_paging).
    "security.incidents_page": {"task": "security.incidents_page", "schedule": 10.0, "options": {"expire_seconds": 30}},
    # --- GPU telemetry (cloud.telemetry) ---
    # Roll raw samples into 1-minute buckets (and closed hours into 1-hour ones) every minute;
    # drop what is past MERIDIAN_TELEMETRY_RETENTION every hour; read the BMCs and fabric port
    # states of bare-metal nodes a tenant holds (no agent runs there) every MERIDIAN_BMC_POLL_SECONDS.
    "cloud.telemetry_rollup": {"task": "cloud.telemetry_rollup", "schedule": 60.0},
    # Storage: lost volume steps and checkpoint moves sent again, ended reservations' attachments
    # detached, orphans removed.
    "storage.reconcile": {"task": "storage.reconcile", "schedule": 60.0},
    # Storage's billed GiB per tenant, team and class (storage.usage).
    "storage.usage_sample": {"task": "storage.usage_sample",
                             "schedule": env.float("MERIDIAN_STORAGE_USAGE_SECONDS", default=300.0)},
    # Billing: the windows that closed since the last run into the usage ledger, then corrections.
    "billing.meter": {"task": "billing.meter", "schedule": env.float("MERIDIAN_METER_SECONDS", default=300.0)},
    # The spot market: every spot offering's price per region from how much of its GPUs are held.
    "billing.spot_update": {"task": "billing.spot_update", "schedule": env.float("MERIDIAN_SPOT_SECONDS",
                                                                                default=300.0)},
    # Webhooks: events fanned out to their endpoints' deliveries; due retries queued; old ones pruned.
    "webhooks.dispatch": {"task": "webhooks.dispatch", "schedule": env.float("MERIDIAN_WEBHOOK_DISPATCH_SECONDS",
                                                                          default=5.0)},
    "webhooks.sweep": {"task": "webhooks.sweep", "schedule": 30.0},
    "webhooks.prune": {"task": "webhooks.prune", "schedule": 86400.0},
    # Inference endpoints: the autoscaler's pass over every endpoint, and the balancer's configuration.
    "inference.autoscale": {"task": "inference.autoscale",
                            "schedule": env.float("MERIDIAN_AUTOSCALE_SECONDS", default=5.0)},
    "inference.balancer_sync": {"task": "inference.balancer_sync", "schedule": 30.0},
    # Last month's invoices, finalized once the meter has recorded all of it.
    "billing.invoices_close": {"task": "billing.invoices_close", "schedule": 3600.0},
    # Checkpoint tiers: scan each policy's file system, demote what it no longer keeps hot.
    "storage.checkpoints_tier": {"task": "storage.checkpoints_tier",
                                 "schedule": env.float("MERIDIAN_STORAGE_TIER_SECONDS", default=600.0)},
    # Sample each queued reservation's place and estimated start, and the fleet's occupancy, for
    # the console's charts (provisioning.history); prune what is past MERIDIAN_HISTORY_DAYS.
    "provisioning.history_sample": {"task": "provisioning.history_sample",
                                    "schedule": env.float("MERIDIAN_HISTORY_SAMPLE_SECONDS", default=300.0)},
    "cloud.telemetry_prune": {"task": "cloud.telemetry_prune", "schedule": 3600.0},
    "cloud.telemetry_bmc_collect": {"task": "cloud.telemetry_bmc_collect",
                                    "schedule": env.float("MERIDIAN_BMC_POLL_SECONDS", default=60.0)},
    # --- end of GPU telemetry ---
    # Compare every fabric's partitions with the database and repair drift (IB-VPCs), every
    # MERIDIAN_FABRIC_RECONCILE_SECONDS.
    "provisioning.fabrics_reconcile": {"task": "provisioning.fabrics_reconcile",
                                       "schedule": env.float("MERIDIAN_FABRIC_RECONCILE_SECONDS", default=60.0)},
    # Fleet alerts from the GPU telemetry rollups (operations.alerts): utilization fluctuation, idle
    # reserved GPUs (the tenant is told), repeated XIDs on a node.
    "cloud.alerts_evaluate": {"task": "cloud.alerts_evaluate", "schedule": 60.0},
    # Failure detection (operations.detection): silent agents make their nodes suspect, then failed;
    # reset GPUs that recovered come back. Every MERIDIAN_WATCHDOG_SECONDS (1 s: half a liveness
    # period); a round still queued after a few of them is dropped, the next one judges.
    "cloud.heartbeats_watch": {"task": "cloud.heartbeats_watch",
                               "schedule": env.float("MERIDIAN_WATCHDOG_SECONDS", default=1.0),
                               # (django_celery_beat's name for Celery's relative ``expires``, whole seconds)
                               "options": {"expire_seconds": max(5, round(5 * env.float("MERIDIAN_WATCHDOG_SECONDS",
                                                                                       default=1.0)))}},
    # Reserved GPUs never used are warned, then released as no-shows; GPUs held past a
    # reservation's end plus its offering's release grace are reclaimed (provisioning.lifecycle.no_shows).
    "provisioning.no_show_scan": {"task": "provisioning.no_show_scan", "schedule": 60.0},
}
