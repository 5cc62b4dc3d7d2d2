"""
The fleet's settings, read from the environment (docs/configuration.md): drivers and fabrics,
IB-VPC addressing, attestation, images, how provisioning steps retry and wait, failure
detection and replacement, the SLA, metrics, alerts and no-shows. ``config.settings`` holds
them with the rest; they live here because there are many.
"""

from datetime import timedelta

import environ

env = environ.Env()
# The embedded default (SQLite): its simulated node agents answer for the GPU hosts.
EMBEDDED = env("DATABASE_URL", default="sqlite:").startswith("sqlite:")

# Provisioning (DESIGN.md, Workers, the node agent and drivers). Drivers per region: "default"
# and region slugs, each {kind: implementation}; kinds power (simulated|redfish), image, vm
# (simulated|libvirt), container, host.
# The embedded default runs simulated node agents (manage.py run_agents), so GPU hosts answer
# through them, as real hosts would.
MERIDIAN_DRIVERS = env.json("MERIDIAN_DRIVERS", default={"default": {"host": "agent"} if EMBEDDED else {}})
# InfiniBand fabric drivers (partitions for IB-VPCs), per "<region>/<fabric>" or "default":
# {"driver": "simulated"} | {"driver": "opensm", "path": ".../partitions.conf", "reread_command": [...]}
# | {"driver": "ufm", "url": "https://ufm...", "username": ..., "password": ..., "verify_tls": true}.
MERIDIAN_FABRICS = env.json("MERIDIAN_FABRICS", default={"default": {"driver": "simulated"}})
# IPoIB subnets chosen for VPCs that do not name one: the first free /24 (per tenant) of this range.
MERIDIAN_VPC_SUPERNET = env("MERIDIAN_VPC_SUPERNET", default="10.128.0.0/9")
MERIDIAN_VPC_PREFIX = env.int("MERIDIAN_VPC_PREFIX", default=24)
# A tenant's default VPC takes every instance that names no VPC: room for 65,534 ports.
MERIDIAN_DEFAULT_VPC_PREFIX = env.int("MERIDIAN_DEFAULT_VPC_PREFIX", default=16)
# SR-IOV virtual functions a shared host's HCA port may hand out (one per VM or container).
MERIDIAN_VFS_PER_PORT = env.int("MERIDIAN_VFS_PER_PORT", default=16)
# Device attestation: how long a challenge (nonce) may be answered, and how often idle nodes are
# attested again.
MERIDIAN_ATTESTATION_NONCE_TTL = timedelta(seconds=env.int("MERIDIAN_ATTESTATION_NONCE_TTL_SECONDS", default=120))
MERIDIAN_ATTESTATION_IDLE_INTERVAL = timedelta(
    hours=env.float("MERIDIAN_ATTESTATION_IDLE_INTERVAL_HOURS", default=24.0))
# An imported OCSP "good" status without a nextUpdate counts as fresh this long after its thisUpdate.
MERIDIAN_OCSP_MAX_AGE = timedelta(hours=env.float("MERIDIAN_OCSP_MAX_AGE_HOURS", default=168.0))
# Receipt signing keys stay in the published JWKS this long after they stop signing.
MERIDIAN_RECEIPT_KEY_PUBLISHED_DAYS = env.int("MERIDIAN_RECEIPT_KEY_PUBLISHED_DAYS", default=400)
# Simulated hardware: seed, and per action (or "default") latency_s, failure_rate (transient)
# and broken_rate (for good); e.g. {"seed": 7, "failure_rate": {"write_image": 0.2}}.
MERIDIAN_SIMULATION = {"seed": 0, "latency_s": {}, "failure_rate": {}, "broken_rate": {},
                       **env.json("MERIDIAN_SIMULATION", default={})}
MERIDIAN_REDFISH_VERIFY_TLS = env.bool("MERIDIAN_REDFISH_VERIFY_TLS", default=True)
MERIDIAN_LIBVIRT_URI = env("MERIDIAN_LIBVIRT_URI", default="qemu+ssh://root@{host}/system")
MERIDIAN_DEPLOY_IMAGE_URL = env("MERIDIAN_DEPLOY_IMAGE_URL", default="http://images.meridian.internal/deploy.iso")
MERIDIAN_OS_IMAGE = env("MERIDIAN_OS_IMAGE", default="ubuntu-24.04-cuda-12.8")
# A VM's disk: a copy-on-write volume in this libvirt storage pool over the image's base volume there.
MERIDIAN_LIBVIRT_POOL = env("MERIDIAN_LIBVIRT_POOL", default="meridian")
MERIDIAN_VM_DISK_GIB = env.int("MERIDIAN_VM_DISK_GIB", default=200)
# Where a port's SR-IOV virtual functions sit on the PCI bus (the adapter's First VF Offset and VF
# Stride, as lspci -vvv shows them): a VM's virtual function is passed through by that address.
MERIDIAN_SRIOV_VF_OFFSET = env.int("MERIDIAN_SRIOV_VF_OFFSET", default=1)
MERIDIAN_SRIOV_VF_STRIDE = env.int("MERIDIAN_SRIOV_VF_STRIDE", default=1)
# The libvirt network a VM's NIC joins (its private address is set by its cloud-init network config).
MERIDIAN_LIBVIRT_NETWORK = env("MERIDIAN_LIBVIRT_NETWORK", default="meridian-instances")
# cloud-init (provisioning.cloud_init): the most user-data a reservation may carry, and how much of an
# instance's console output the API returns (the last bytes of it).
MERIDIAN_USER_DATA_MAX_BYTES = env.int("MERIDIAN_USER_DATA_MAX_BYTES", default=16_384)
MERIDIAN_CONSOLE_OUTPUT_BYTES = env.int("MERIDIAN_CONSOLE_OUTPUT_BYTES", default=65_536)
MERIDIAN_CONTAINER_IMAGE = env("MERIDIAN_CONTAINER_IMAGE", default="nvcr.io/nvidia/pytorch:25.01-py3")
# Each region's Kubernetes cluster for the "kubernetes" container driver ("default" and region slugs):
# {"url", "token", "ca_file", "verify_tls"} or {"kubeconfig", "context"}.
MERIDIAN_KUBERNETES = env.json("MERIDIAN_KUBERNETES", default={})
# The Multus network a container joins for its IB-VPC (its virtual function's GUID in cni-args); "" for none.
MERIDIAN_KUBERNETES_IB_NETWORK = env("MERIDIAN_KUBERNETES_IB_NETWORK", default="ib-vpc")
# A worker goes on to an operation's next step in the same task for this long (steps that only
# ask a driver or an agent take milliseconds; a task per step cost more than the steps did).
# 0: one step per task.
MERIDIAN_STEP_CHAIN_SECONDS = env.float("MERIDIAN_STEP_CHAIN_SECONDS", default=5.0)
# A transient driver error retries the step up to this many attempts, backing off 2^n seconds
# (capped); cleaning gets its own, smaller limit, and a reservation whose provisioning failed
# for good on this many nodes fails instead of being placed again.
MERIDIAN_STEP_ATTEMPTS = env.int("MERIDIAN_STEP_ATTEMPTS", default=5)
MERIDIAN_STEP_BACKOFF_MAX_S = env.float("MERIDIAN_STEP_BACKOFF_MAX_SECONDS", default=60.0)
MERIDIAN_CLEANING_ATTEMPTS = env.int("MERIDIAN_CLEANING_ATTEMPTS", default=3)
MERIDIAN_PROVISION_FAILURES = env.int("MERIDIAN_PROVISION_FAILURES", default=3)
# An operation untouched for MERIDIAN_STUCK_AFTER (config.settings: longer than a task may run)
# lost its worker without a redelivery: the reaper resumes it up to this many times, then fails it.
MERIDIAN_RESUME_LIMIT = env.int("MERIDIAN_RESUME_LIMIT", default=3)
# Node agents: seconds between their turns (heartbeat, then commands); an agent silent for three
# turns cannot answer a step that needs it.
MERIDIAN_AGENT_INTERVAL = env.float("MERIDIAN_AGENT_INTERVAL_SECONDS", default=10.0)
# Seconds between an agent's liveness pings (one statement each, apart from its turns: heartbeats
# keep their period); the heartbeat's answer tells agents, and a node whose agent pings is judged
# by them (operations.heartbeats). 0: no pings, nodes are judged by their heartbeats.
MERIDIAN_LIVENESS_SECONDS = env.float("MERIDIAN_LIVENESS_SECONDS", default=2.0)
# How often the heartbeat watchdog runs (the beat task cloud.heartbeats_watch). A round later than
# this by more than the failure policy's stall_slack_s counts as the control plane's own stall.
MERIDIAN_WATCHDOG_SECONDS = env.float("MERIDIAN_WATCHDOG_SECONDS", default=1.0)
# GPU telemetry (cloud.telemetry): how long raw samples, 1-minute and 1-hour rollups are kept.
MERIDIAN_TELEMETRY_RETENTION = {
    "raw": timedelta(minutes=env.int("MERIDIAN_TELEMETRY_RAW_MINUTES", default=60)),
    "1m": timedelta(hours=env.int("MERIDIAN_TELEMETRY_1M_HOURS", default=48)),
    "1h": timedelta(days=env.int("MERIDIAN_TELEMETRY_1H_DAYS", default=90)),
}
# Storage (storage.steps): how often a volume's step meets a transient backend error before the
# volume fails, and how long a step may stay in flight before the reconcile sends it again.
MERIDIAN_STORAGE_ATTEMPTS = env.int("MERIDIAN_STORAGE_ATTEMPTS", default=5)
MERIDIAN_STORAGE_STALE_SECONDS = env.int("MERIDIAN_STORAGE_STALE_SECONDS", default=120)
MERIDIAN_STORAGE_SNAPSHOTS_PER_VOLUME = env.int("MERIDIAN_STORAGE_SNAPSHOTS_PER_VOLUME", default=32)
# How often storage's billed GiB are sampled (each sample covers the interval before it).
MERIDIAN_STORAGE_USAGE_SECONDS = env.float("MERIDIAN_STORAGE_USAGE_SECONDS", default=300.0)
# Block volumes of classes whose backend is "libvirt": the storage host's libvirt and its pool.
MERIDIAN_STORAGE_LIBVIRT_URI = env("MERIDIAN_STORAGE_LIBVIRT_URI", default="qemu:///system")
MERIDIAN_STORAGE_LIBVIRT_POOL = env("MERIDIAN_STORAGE_LIBVIRT_POOL", default="meridian-volumes")
# Shared file systems of classes whose backend is "scale": IBM Storage Scale's management API,
# the file system the filesets are made in, where it is linked (PATH), where it is mounted on the
# workers that move checkpoints (MOUNT), and the CES NFS address instances mount exports from.
MERIDIAN_STORAGE_SCALE_URL = env("MERIDIAN_STORAGE_SCALE_URL", default="https://scale-gui.internal:443")
MERIDIAN_STORAGE_SCALE_USER = env("MERIDIAN_STORAGE_SCALE_USER", default="meridian")
MERIDIAN_STORAGE_SCALE_PASSWORD = env("MERIDIAN_STORAGE_SCALE_PASSWORD", default="")
MERIDIAN_STORAGE_SCALE_VERIFY = env("MERIDIAN_STORAGE_SCALE_CA_BUNDLE", default="") or True
MERIDIAN_STORAGE_SCALE_FILESYSTEM = env("MERIDIAN_STORAGE_SCALE_FILESYSTEM", default="fs1")
MERIDIAN_STORAGE_SCALE_PATH = env("MERIDIAN_STORAGE_SCALE_PATH", default="/gpfs/fs1")
MERIDIAN_STORAGE_SCALE_MOUNT = env("MERIDIAN_STORAGE_SCALE_MOUNT", default="/gpfs/fs1")
MERIDIAN_STORAGE_SCALE_NFS_SERVER = env("MERIDIAN_STORAGE_SCALE_NFS_SERVER", default="ces.scale.internal")
MERIDIAN_STORAGE_SCALE_JOB_SECONDS = env.float("MERIDIAN_STORAGE_SCALE_JOB_SECONDS", default=60.0)
# Object storage of classes whose backend is "s3": the S3 service (empty endpoint: AWS), the
# platform's keys there, the buckets' name prefix, and when objects move to the archive class.
MERIDIAN_STORAGE_S3_ENDPOINT = env("MERIDIAN_STORAGE_S3_ENDPOINT", default="")
MERIDIAN_STORAGE_S3_REGION = env("MERIDIAN_STORAGE_S3_REGION", default="us-east-1")
MERIDIAN_STORAGE_S3_ACCESS_KEY = env("MERIDIAN_STORAGE_S3_ACCESS_KEY", default="")
MERIDIAN_STORAGE_S3_SECRET_KEY = env("MERIDIAN_STORAGE_S3_SECRET_KEY", default="")
MERIDIAN_STORAGE_S3_PREFIX = env("MERIDIAN_STORAGE_S3_PREFIX", default="meridian-")
MERIDIAN_STORAGE_S3_PLATFORM_CIDRS = env("MERIDIAN_STORAGE_S3_PLATFORM_CIDRS", default="")
MERIDIAN_STORAGE_S3_ARCHIVE_DAYS = env.int("MERIDIAN_STORAGE_S3_ARCHIVE_DAYS", default=30)
MERIDIAN_STORAGE_S3_ARCHIVE_CLASS = env("MERIDIAN_STORAGE_S3_ARCHIVE_CLASS", default="GLACIER")
# Checkpoint moves between tiers (storage.checkpoints): bytes per chunk, each chunk a step's unit.
MERIDIAN_STORAGE_CHUNK_BYTES = env.int("MERIDIAN_STORAGE_CHUNK_MIB", default=64) * 1024 * 1024
# How long one run of a move works before it sends the rest to the queue (its progress stays visible).
MERIDIAN_STORAGE_MOVE_SLICE_SECONDS = env.float("MERIDIAN_STORAGE_MOVE_SLICE_SECONDS", default=20.0)
# The console's history (provisioning.history): queue places, estimated starts and occupancy over time.
MERIDIAN_HISTORY_RETENTION = timedelta(days=env.int("MERIDIAN_HISTORY_DAYS", default=14))
# An HCA port's up/down changes are counted within this window (cloud.health's port_flaps).
MERIDIAN_PORT_FLAP_WINDOW_S = env.float("MERIDIAN_PORT_FLAP_WINDOW_S", default=300.0)
# Failure detection (cloud.health.FailurePolicy, applied by operations.detection): a JSON object over
# the defaults, e.g. {"suspect_after_misses": 3, "faulty_after_misses": 6, "xid_actions": {"94": "drain_node"},
# "max_temperature_c": 88}. Heartbeat periods are MERIDIAN_AGENT_INTERVAL_SECONDS, the flap window
# MERIDIAN_PORT_FLAP_WINDOW_S; an unknown key or action is refused when the policy is read.
MERIDIAN_FAILURE_POLICY = env.json("MERIDIAN_FAILURE_POLICY", default={})
# How many times a step asks again for an answer it is waiting on (an agent's scrub) before that
# counts as a failed attempt.
MERIDIAN_STEP_WAITS = env.int("MERIDIAN_STEP_WAITS", default=30)
# How often a hand-over looks again while it waits (a checkpoint restored for the reservation);
# with MERIDIAN_STEP_WAITS, how long it waits before the step counts as failed (30 x 60 s).
MERIDIAN_HANDOVER_WAIT_SECONDS = env.float("MERIDIAN_HANDOVER_WAIT_SECONDS", default=60.0)
# Replacement of failed hardware (provisioning.lifecycle.replacement): spares of the failed node's fabric
# first; with FROM_POOL on, ordinary free capacity of that fabric when no spare fits. A
# reservation with nothing to replace it waits (its healthy units keep running) this long, then fails.
MERIDIAN_REPLACEMENT_FROM_POOL = env.bool("MERIDIAN_REPLACEMENT_FROM_POOL", default=True)
MERIDIAN_REPLACEMENT_WAIT = timedelta(seconds=env.int("MERIDIAN_REPLACEMENT_WAIT_SECONDS", default=900))

# SLA (provisioning.sla.accounting): the monthly availability target in percent, and the service credit
# table: [threshold %, credit %] rows; the largest credit whose threshold the month's
# availability is below is owed, as a share of the month's spend. Default: below 99 % 10 %,
# below 95 % 25 %, below 90 % 50 %.
MERIDIAN_SLA_TARGET = env.float("MERIDIAN_SLA_TARGET", default=99.0)
MERIDIAN_SLA_CREDITS = env.json("MERIDIAN_SLA_CREDITS", default=[[99.0, 10], [95.0, 25], [90.0, 50]])
# /metrics (operations.metrics_views): a platform token always works; set both of these to let a
# scraper use HTTP basic auth instead. Under gunicorn (several processes) and for the Celery
# workers' task metrics, set PROMETHEUS_MULTIPROC_DIR (the environment variable) to one empty
# folder shared by the web and worker processes of a machine (see the README).
MERIDIAN_METRICS_USER = env("MERIDIAN_METRICS_USER", default="")
MERIDIAN_METRICS_PASSWORD = env("MERIDIAN_METRICS_PASSWORD", default="")
# Fleet alerts (operations.alerts) over the 1-minute telemetry rollups of the last window: a node's
# utilization fluctuation (std / mean) above the threshold, at a mean utilization of at least
# MERIDIAN_ALERT_MIN_UTILIZATION %, opens an incident; so do this many XIDs on one node. A
# reservation's GPUs idle (0 % and no process in every sample) for MERIDIAN_IDLE_GPU_MINUTES
# tell its tenant, at most once per reservation in that many minutes.
MERIDIAN_ALERT_WINDOW_MIN = env.int("MERIDIAN_ALERT_WINDOW_MIN", default=10)
MERIDIAN_ALERT_FLUCTUATION = env.float("MERIDIAN_ALERT_FLUCTUATION", default=0.15)
MERIDIAN_ALERT_MIN_UTILIZATION = env.float("MERIDIAN_ALERT_MIN_UTILIZATION", default=5.0)
MERIDIAN_ALERT_XIDS = env.int("MERIDIAN_ALERT_XIDS", default=3)
MERIDIAN_IDLE_GPU_MINUTES = env.int("MERIDIAN_IDLE_GPU_MINUTES", default=30)
# No-shows (provisioning.lifecycle.no_shows): where telemetry has power but no utilization (the BMC of bare
# metal a tenant holds), a GPU is idle at or below MERIDIAN_IDLE_POWER_W -- a JSON object of watts
# per GPU model slug, or one number for every model -- else at or below
# MERIDIAN_IDLE_POWER_FRACTION of its model's TDP; a chassis at or below MERIDIAN_IDLE_NODE_BASE_W
# plus its GPUs' idle power. The grace periods themselves are each offering's policy.
MERIDIAN_IDLE_POWER_W = env.json("MERIDIAN_IDLE_POWER_W", default={})
MERIDIAN_IDLE_POWER_FRACTION = env.float("MERIDIAN_IDLE_POWER_FRACTION", default=0.2)
MERIDIAN_IDLE_NODE_BASE_W = env.float("MERIDIAN_IDLE_NODE_BASE_W", default=1500.0)
# Instance addresses (provisioning.addresses): each region's private and public pools, as CIDRs, by
# region slug or "default"; DNS names are <instance>.<tenant>.<region>.MERIDIAN_DNS_ZONE.
MERIDIAN_ADDRESS_POOLS = env.json("MERIDIAN_ADDRESS_POOLS", default={
    "default": {"private": "10.64.0.0/14", "public": "198.18.0.0/20"}})
MERIDIAN_DNS_ZONE = env("MERIDIAN_DNS_ZONE", default="gpu.meridian.example")
# Billing (billing.meter): how far back each meter run looks again for what changed after it was
# recorded (an allocation found to have ended earlier), and how often the beat runs the meter.
MERIDIAN_METER_RECHECK_HOURS = env.int("MERIDIAN_METER_RECHECK_HOURS", default=48)
# What a public IPv4 address costs per hour it is held (the meter's "address" records), in USD.
MERIDIAN_PUBLIC_ADDRESS_HOUR_PRICE = env("MERIDIAN_PUBLIC_ADDRESS_HOUR_PRICE", default="0.005")
# Invoice numbers: <prefix>-<year>-<sequence>, one gap-free sequence for invoices and credit notes.
MERIDIAN_INVOICE_PREFIX = env("MERIDIAN_INVOICE_PREFIX", default="MER")
# The spot market (billing.spot): the share of a region's GPUs of a model held above which the
# spot price rises from the floor toward the on-demand price, and how long its history is kept.
MERIDIAN_SPOT_KNEE = env.float("MERIDIAN_SPOT_KNEE", default=0.5)
MERIDIAN_SPOT_HISTORY_DAYS = env.int("MERIDIAN_SPOT_HISTORY_DAYS", default=400)
# Webhooks (webhooks.delivery): the first retry's delay (doubling after, 6 h at most), attempts before a
# delivery fails, failed deliveries in a row before an endpoint is disabled, how long a rotated secret
# still signs, how long events and finished deliveries are kept, and (development) http to loopback.
MERIDIAN_WEBHOOK_RETRY_SECONDS = env.float("MERIDIAN_WEBHOOK_RETRY_SECONDS", default=30.0)
MERIDIAN_WEBHOOK_MAX_ATTEMPTS = env.int("MERIDIAN_WEBHOOK_MAX_ATTEMPTS", default=10)
MERIDIAN_WEBHOOK_DISABLE_AFTER = env.int("MERIDIAN_WEBHOOK_DISABLE_AFTER", default=5)
MERIDIAN_WEBHOOK_SECRET_OVERLAP_HOURS = env.int("MERIDIAN_WEBHOOK_SECRET_OVERLAP_HOURS", default=24)
MERIDIAN_WEBHOOK_KEEP_DAYS = env.int("MERIDIAN_WEBHOOK_KEEP_DAYS", default=30)
MERIDIAN_WEBHOOK_ALLOW_LOOPBACK = env.bool("MERIDIAN_WEBHOOK_ALLOW_LOOPBACK", default=False)
# Inference endpoints (inference): the stable URL of each, how the balancer (HAProxy) listens and where
# its configuration is written and how it is reloaded (empty: written only), how replicas are health
# checked ("http", or "simulated" where replicas run no process), how long a replica drains before its
# reservation is released, how long each replica's reservation lasts, and how often the autoscaler runs.
MERIDIAN_ENDPOINT_URL = env("MERIDIAN_ENDPOINT_URL", default="https://{endpoint}--{tenant}.endpoints.meridian.example")
MERIDIAN_BALANCER_BIND = env("MERIDIAN_BALANCER_BIND", default=":8443")
MERIDIAN_BALANCER_RELOAD = env("MERIDIAN_BALANCER_RELOAD", default="")
_REAL_WORKLOADS = any(kinds.get(kind, "simulated") != "simulated" for kinds in MERIDIAN_DRIVERS.values()
                      for kind in ("vm", "container"))
MERIDIAN_ENDPOINT_PROBE = env("MERIDIAN_ENDPOINT_PROBE", default="http" if _REAL_WORKLOADS else "simulated")
MERIDIAN_ENDPOINT_DRAIN_SECONDS = env.float("MERIDIAN_ENDPOINT_DRAIN_SECONDS", default=10.0)
MERIDIAN_ENDPOINT_REPLICA_HOURS = env.int("MERIDIAN_ENDPOINT_REPLICA_HOURS", default=168)
