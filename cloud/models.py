"""
The infrastructure inventory: regions, InfiniBand fabrics and switches, nodes, GPUs, the GPU
model catalogue and the offerings sold on them. Platform-owned: tenants see offerings and
aggregate availability, never a node or GPU identity.
"""

import uuid

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from cloud.choices import (
    MAX_TASKS_PER_GPU,
    GPUState,
    Health,
    IsolationMode,
    NodePool,
    NodeState,
    OfferingKind,
    SwitchTier,
    TimeSliceClass,
)
from security.crypto import EncryptedTextField
from tenants.scoping import PlatformQuerySet

PKEY_MIN = 0x0001
PKEY_MAX = 0x7FFE  # 0x7FFF is the default (management) partition and is never handed out.


class CatalogueQuerySet(PlatformQuerySet):
    """The public catalogue (regions, GPU models, offerings): every signed-in principal reads what
    is on sale; staff also see what was taken off sale."""

    tenant_readable = True

    def visible_to(self, principal, action="view"):
        qs = super().visible_to(principal, action)
        if principal is not None and not principal.is_platform and hasattr(self.model, "is_active"):
            qs = qs.filter(is_active=True)
        return qs


class Region(models.Model):
    """A location with its own fabrics and nodes; a reservation names one or more regions."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CatalogueQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]

    def __str__(self):
        return self.slug


class GPUModel(models.Model):
    """A catalogue row with the published figures a logical GPU spec is matched against."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    vendor = models.CharField(max_length=50, default="NVIDIA")
    memory_gib = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(4096)])
    memory_bandwidth_tbs = models.DecimalField(
        max_digits=6, decimal_places=2, validators=[MinValueValidator(0), MaxValueValidator(1000)]
    )
    fp16_tflops = models.DecimalField(
        "dense FP16/BF16 TFLOPS", max_digits=8, decimal_places=1,
        validators=[MinValueValidator(0), MaxValueValidator(1_000_000)],
    )
    fp8_tflops = models.DecimalField(
        "dense FP8 TFLOPS", max_digits=8, decimal_places=1, null=True, blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(1_000_000)],
    )
    mig_max_instances = models.PositiveSmallIntegerField(
        default=0, validators=[MaxValueValidator(64)], help_text="0 when the GPU has no MIG support."
    )
    tdp_watts = models.PositiveIntegerField(validators=[MaxValueValidator(100_000)])
    max_cuda_version = models.CharField(max_length=16, blank=True, default="",
                                        help_text="The newest CUDA the fleet's driver for it runs (e.g. 12.8); "
                                                  "empty: no limit is known.")

    objects = CatalogueQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        verbose_name = "GPU model"

    def __str__(self):
        return self.name

    @property
    def supports_mig(self) -> bool:
        return self.mig_max_instances > 0


class Fabric(models.Model):
    """An InfiniBand fabric of one region: a fat tree of switches and a pool of partition keys."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="fabrics")
    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=50)
    pkey_min = models.PositiveIntegerField(default=PKEY_MIN)
    pkey_max = models.PositiveIntegerField(default=PKEY_MAX)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["region__slug", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["region", "slug"], name="fabric_slug_unique_per_region"),
            models.CheckConstraint(
                condition=Q(pkey_min__gte=PKEY_MIN, pkey_max__lte=PKEY_MAX, pkey_min__lte=models.F("pkey_max")),
                name="fabric_pkey_pool_in_range",
                violation_error_message="The P_Key pool must lie within 0x0001-0x7FFE.",
            ),
        ]

    def __str__(self):
        return f"{self.region.slug}/{self.slug}"


class Switch(models.Model):
    """One switch of a fabric; ``pod`` groups leaves under the same spine block."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    fabric = models.ForeignKey(Fabric, on_delete=models.CASCADE, related_name="switches")
    name = models.CharField(max_length=100)
    tier = models.CharField(max_length=8, choices=SwitchTier.choices)
    pod = models.PositiveIntegerField(default=0)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["fabric", "tier", "name"]
        verbose_name_plural = "switches"
        constraints = [models.UniqueConstraint(fields=["fabric", "name"], name="switch_name_unique_per_fabric")]

    def __str__(self):
        return self.name


class Node(models.Model):
    """
    A GPU server. Bare-metal nodes are sold whole; shared hosts run tenants' VMs and containers.
    Its BMC password is encrypted at rest and never leaves the control plane through the API.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.CharField(max_length=253, unique=True)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="nodes")
    fabric = models.ForeignKey(Fabric, on_delete=models.PROTECT, related_name="nodes")
    leaf = models.ForeignKey(
        Switch, on_delete=models.PROTECT, related_name="nodes", limit_choices_to={"tier": SwitchTier.LEAF}
    )
    pool = models.CharField(max_length=16, choices=NodePool.choices, default=NodePool.BARE_METAL)
    is_spare = models.BooleanField(default=False, help_text="Held back for fast replacement of failed nodes.")
    # The node's shape: GPUs it was enrolled with (1 to 16: 4-GPU trays, 8-GPU HGX boards, 16-GPU servers), an
    # inventory fact like its cores (a GPU out for repair does not change it). No default: whoever makes a node
    # says it. A bare-metal offering of N GPUs sells only nodes of N, whole.
    gpus_installed = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(16)])
    # Confidential computing: the host's CPUs run confidential VMs (inventory), its GPUs' CC mode as the
    # last passing attestation's evidence showed it, and what follows (cloud.services.node_cc_observed):
    # a confidential node sells only confidential offerings, a GPU in CC mode serving a TEE alone.
    cvm_host = models.BooleanField(default=False, help_text="The CPUs run confidential VMs (AMD SEV-SNP or "
                                                            "Intel TDX).")
    gpu_cc_mode = models.CharField(max_length=8, blank=True, help_text="on, devtools or off, from verified "
                                                                       "attestation evidence; empty: unknown.")
    confidential = models.BooleanField(default=False, db_index=True)
    bmc_address = models.CharField(max_length=255, help_text="Redfish endpoint of the node's BMC.")
    bmc_username = models.CharField(max_length=64, blank=True)
    bmc_password = EncryptedTextField(blank=True)
    cpu_cores = models.PositiveIntegerField()
    # The CPUs of each NUMA node the GPUs sit on ({"0": "0-55,112-167"}, from the agent): a VM's vCPUs are pinned there.
    numa_cpus = models.JSONField(default=dict, blank=True)
    ram_gib = models.PositiveIntegerField()
    nvme_tb = models.DecimalField(max_digits=6, decimal_places=2)
    state = models.CharField(max_length=24, choices=NodeState.choices, default=NodeState.ENROLLED)
    state_reason = models.CharField(max_length=500, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    # Where the last move came from, so a hold or a suspicion returns the node where it was --
    # or through validation when that was not a sellable state.
    previous_state = models.CharField(max_length=24, choices=NodeState.choices, blank=True)
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["hostname"]
        indexes = [models.Index(fields=["region", "pool", "state"], name="node_capacity_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=NodeState.values), name="node_state_valid"),
            models.CheckConstraint(condition=Q(cpu_cores__gt=0, ram_gib__gt=0), name="node_sizes_positive"),
        ]

    def __str__(self):
        return self.hostname

    def clean(self):
        super().clean()
        if self.fabric_id and self.region_id and self.fabric.region_id != self.region_id:
            raise ValidationError({"fabric": f"Fabric {self.fabric} is not in region {self.region}."})
        if self.leaf_id and self.fabric_id and self.leaf.fabric_id != self.fabric_id:
            raise ValidationError({"leaf": f"Switch {self.leaf} is not on fabric {self.fabric}."})


class GPU(models.Model):
    """One GPU of a node. On shared hosts it is the unit that is allocated, scrubbed and re-verified."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField("GPU UUID", max_length=64, unique=True)
    serial = models.CharField(max_length=64, unique=True)
    # The device ID the GPU's certificate gave at its first passing attestation; later evidence must match.
    attested_identity = models.CharField(max_length=64, blank=True)
    pci_bus_id = models.CharField(max_length=32)
    model = models.ForeignKey(GPUModel, on_delete=models.PROTECT, related_name="gpus")
    memory_mib = models.PositiveIntegerField()
    state = models.CharField(max_length=16, choices=GPUState.choices, default=GPUState.AVAILABLE)
    health = models.CharField(max_length=16, choices=Health.choices, default=Health.UNKNOWN)
    mig_enabled = models.BooleanField(default=False)
    # Its place in the node, as the agent read it from NVML (provisioning.agent.topology): GPUs with the same
    # number share an NVLink domain, a PCIe switch (each named by its lowest GPU index), a NUMA node; None: unknown.
    nvlink_domain = models.PositiveSmallIntegerField(null=True, blank=True)
    pcie_switch = models.PositiveSmallIntegerField(null=True, blank=True)
    numa_node = models.PositiveSmallIntegerField(null=True, blank=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["node__hostname", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_index_unique_per_node"),
            models.UniqueConstraint(fields=["node", "pci_bus_id"], name="gpu_pci_unique_per_node"),
            models.CheckConstraint(condition=Q(state__in=GPUState.values), name="gpu_state_valid"),
        ]
        indexes = [
            models.Index(fields=["model", "state"], name="gpu_capacity_idx"),
            # The few GPUs that bar their whole node from sale: counting sellable bare-metal nodes
            # reads this small index instead of every GPU of the fleet.
            models.Index(fields=["node"], condition=Q(health__in=[Health.FAILED, Health.UNKNOWN]),
                         name="gpu_unsellable_idx"),
        ]

    def __str__(self):
        return f"{self.node.hostname}/gpu{self.index}"


class HCAPort(models.Model):
    """
    One InfiniBand port of a node's host channel adapters, by its port GUID (a GPU server has one
    per GPU, rail-optimised). A bare-metal tenant's VPC membership is these ports; a shared host
    hands out SR-IOV virtual functions of them instead (provisioning.VirtualFunction).
    """

    id = models.BigAutoField(primary_key=True)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="ib_ports")
    index = models.PositiveSmallIntegerField()
    guid = models.CharField("port GUID", max_length=16, unique=True, help_text="16 lower-case hex digits, no 0x.")
    pci_bus_id = models.CharField("PCI address", max_length=32, blank=True,
                                  help_text="Its physical function's, e.g. 00000000:1a:00.0: a shared host passes "
                                            "its SR-IOV virtual functions through to VMs by theirs.")

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["node__hostname", "index"]
        verbose_name = "HCA port"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="hca_port_index_unique_per_node"),
            models.CheckConstraint(condition=Q(guid__regex=r"^[0-9a-f]{16}$"), name="hca_port_guid_normal"),
        ]

    def __str__(self):
        return f"{self.node.hostname}/ib{self.index}"


class PortLink(models.TextChoices):
    UP = "up", "Up (active)"
    DOWN = "down", "Down"
    UNKNOWN = "unknown", "Unknown"


class HCAPortStatus(models.Model):
    """
    The last known link state of one HCA port (from the node's agent, or the fabric out of band
    while a tenant holds the server) and how often it changed lately: a flapping port is a fault.
    """

    port = models.OneToOneField(HCAPort, on_delete=models.CASCADE, primary_key=True, related_name="status")
    link = models.CharField(max_length=8, choices=PortLink.choices, default=PortLink.UNKNOWN)
    changed_at = models.DateTimeField(null=True, blank=True)
    # Up/down changes since ``window_started_at``; a window older than MERIDIAN_PORT_FLAP_WINDOW_S
    # starts again at the next change (cloud.telemetry.changes_in_window reads it that way).
    changes = models.PositiveIntegerField(default=0)
    window_started_at = models.DateTimeField(null=True, blank=True)
    seen_at = models.DateTimeField()
    # Who said so: the node's agent, or the fabric driver while a tenant holds the server.
    source = models.CharField(max_length=8, default="agent")

    class Meta:
        verbose_name = "HCA port status"
        verbose_name_plural = "HCA port statuses"
        constraints = [models.CheckConstraint(condition=Q(link__in=PortLink.values), name="hca_port_link_valid")]

    def __str__(self):
        return f"{self.port} {self.link}"


class TelemetrySource(models.TextChoices):
    AGENT = "agent", "Node agent (NVML)"
    BMC = "bmc", "BMC (Redfish), out of band"
    GUEST = "guest", "In-guest agent (the instance's own NVML)"


class GPUTelemetry(models.Model):
    """
    The latest sample of one GPU: always one query away (cloud.telemetry keeps it). Counters
    (ECC) are cumulative as NVML reports them; ``xids`` are the XID errors since the sample before.
    From the BMC (a tenant holds the server) only what a BMC can tell is set; the rest is None.
    """

    gpu = models.OneToOneField(GPU, on_delete=models.CASCADE, primary_key=True, related_name="telemetry")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+", db_index=False)
    sampled_at = models.DateTimeField()
    utilization_pct = models.PositiveSmallIntegerField(null=True)
    memory_used_mib = models.PositiveIntegerField(null=True)
    memory_total_mib = models.PositiveIntegerField(null=True)
    temperature_c = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    ecc_corrected = models.BigIntegerField(null=True)
    ecc_uncorrected = models.BigIntegerField(null=True)
    processes = models.PositiveSmallIntegerField(null=True)
    # NVLink links active and present (None: no NVLink, or not offered by the driver).
    nvlink_up = models.PositiveSmallIntegerField(null=True)
    nvlink_total = models.PositiveSmallIntegerField(null=True)
    # The compute time slice in force on the GPU (None: the driver's default, or not readable).
    time_slice_ms = models.PositiveSmallIntegerField(null=True)
    xids = models.JSONField(default=list)
    source = models.CharField(max_length=8, choices=TelemetrySource.choices, default=TelemetrySource.AGENT)

    class Meta:
        verbose_name = "GPU telemetry"
        verbose_name_plural = "GPU telemetry"
        indexes = [models.Index(fields=["node"], name="gpu_telemetry_node_idx")]

    def __str__(self):
        return f"{self.gpu_id} at {self.sampled_at:%H:%M:%S}"


class GPUSample(models.Model):
    """
    A raw sample, kept for a short window (``MERIDIAN_TELEMETRY_RETENTION["raw"]``) and rolled
    up into minutes. Written only by cloud.telemetry.ingest, by COPY on PostgreSQL.
    """

    id = models.BigAutoField(primary_key=True)
    # No foreign key in the database: a row per GPU every 10 s would pay a referential check each,
    # and ingest writes only GPUs it just read as the node's. A GPU's samples go with it (Django's
    # cascade) and within the raw retention anyway.
    gpu = models.ForeignKey(GPU, on_delete=models.CASCADE, related_name="+", db_index=False, db_constraint=False)
    sampled_at = models.DateTimeField()
    utilization_pct = models.PositiveSmallIntegerField(null=True)
    memory_used_mib = models.PositiveIntegerField(null=True)
    temperature_c = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    ecc_corrected = models.BigIntegerField(null=True)
    ecc_uncorrected = models.BigIntegerField(null=True)
    processes = models.PositiveSmallIntegerField(null=True)
    xid_count = models.PositiveSmallIntegerField(default=0)
    # The XID codes themselves: failure detection counts the serious ones inside its window.
    xids = models.JSONField(default=list)

    class Meta:
        # Rollups and retention read by time alone: migration 0006 adds that index, a BRIN index on
        # PostgreSQL (rows arrive in time order; almost free to maintain), a B-tree on SQLite.
        indexes = [models.Index(fields=["gpu", "sampled_at"], name="gpu_sample_gpu_time_idx")]

    def __str__(self):
        return f"{self.gpu_id} at {self.sampled_at:%H:%M:%S}"


class RollupPeriod(models.TextChoices):
    MINUTE = "1m", "1 minute"
    HOUR = "1h", "1 hour"


class GPUSampleRollup(models.Model):
    """
    Aggregates of a GPU's samples over one period (1 minute, 1 hour), kept longer than the raw
    samples. Sums, sums of squares and counts of the samples that had the reading, so means and
    standard deviations combine exactly across buckets (an hour is the sum of its minutes).
    """

    id = models.BigAutoField(primary_key=True)
    gpu = models.ForeignKey(GPU, on_delete=models.CASCADE, related_name="+", db_index=False)
    period = models.CharField(max_length=2, choices=RollupPeriod.choices)
    bucket = models.DateTimeField()
    samples = models.PositiveIntegerField()
    utilization_samples = models.PositiveIntegerField(default=0)
    utilization_sum = models.FloatField(default=0)
    utilization_sumsq = models.FloatField(default=0)
    utilization_max = models.PositiveSmallIntegerField(null=True)
    memory_used_max = models.PositiveIntegerField(null=True)
    temperature_samples = models.PositiveIntegerField(default=0)
    temperature_sum = models.FloatField(default=0)
    temperature_max = models.SmallIntegerField(null=True)
    power_samples = models.PositiveIntegerField(default=0)
    power_sum = models.FloatField(default=0)
    power_max = models.FloatField(null=True)
    ecc_uncorrected_max = models.BigIntegerField(null=True)
    xid_count = models.PositiveIntegerField(default=0)
    # Samples with 0 % utilization and no process: evidence of an idle (or never used) GPU.
    idle_samples = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "period", "bucket"], name="gpu_rollup_unique")]
        indexes = [models.Index(fields=["period", "bucket"], name="gpu_rollup_period_idx")]

    def __str__(self):
        return f"{self.gpu_id} {self.period} {self.bucket:%Y-%m-%d %H:%M}"


class NodeBMCReading(models.Model):
    """
    The latest out-of-band readings of a bare-metal node a tenant holds (no Meridian agent runs
    on it then): power, temperatures and health as its BMC reports them through Redfish.
    """

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="bmc_reading")
    read_at = models.DateTimeField()
    power_w = models.FloatField(null=True)
    # [{"name", "context", "celsius"}] as the BMC lists its sensors (Redfish Thermal.Temperatures).
    temperatures = models.JSONField(default=list)
    health = models.CharField(max_length=16, default="unknown")

    class Meta:
        verbose_name = "node BMC reading"

    def __str__(self):
        return f"{self.node_id} at {self.read_at:%H:%M:%S}"


class Offering(models.Model):
    """
    What is sold: a kind of instance on a GPU model, with list prices per GPU-hour.

    Fractional container offerings cut each GPU into ``slots_per_gpu`` memory slots; everything
    else sells whole GPUs (``slots_per_gpu`` 1).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    slug = models.SlugField(max_length=50, unique=True)
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=OfferingKind.choices)
    gpu_model = models.ForeignKey(GPUModel, on_delete=models.PROTECT, related_name="offerings")
    gpus_per_unit = models.PositiveSmallIntegerField(validators=[MinValueValidator(1), MaxValueValidator(16)])
    slots_per_gpu = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    isolation_mode = models.CharField(max_length=16, choices=IsolationMode.choices, default=IsolationMode.EXCLUSIVE)
    time_slice_class = models.CharField(
        max_length=16, choices=TimeSliceClass.choices, blank=True, default="", db_default="",
        help_text="Time-sliced offerings: the slice length of the GPUs its tasks share (one class a GPU).",
    )
    price_per_gpu_hour = models.DecimalField(
        max_digits=8, decimal_places=4, validators=[MinValueValidator(0), MaxValueValidator(10_000)]
    )
    reserved_discount_pct = models.DecimalField(
        max_digits=5, decimal_places=2, default=0, validators=[MinValueValidator(0), MaxValueValidator(100)]
    )
    spot_available = models.BooleanField(default=False)
    spot_floor_price = models.DecimalField(
        max_digits=8, decimal_places=4, null=True, blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(10_000)],
    )
    confidential = models.BooleanField(
        default=False, help_text="Placed only on GPUs whose verified evidence shows confidential computing on "
                                 "(and, for VMs, on hosts that run confidential VMs).")
    is_active = models.BooleanField(default=True)
    # Usage policy (provisioning.lifecycle.no_shows): reserved GPUs nobody uses, or holds past the end, go back.
    no_show_grace_minutes = models.PositiveSmallIntegerField(
        default=15, validators=[MaxValueValidator(240)],
        help_text="An active reservation whose GPUs stay idle this long after its start is warned, then "
                  "released as a no-show; 0: never.",
    )
    no_show_warning_minutes = models.PositiveSmallIntegerField(
        default=10, validators=[MinValueValidator(1), MaxValueValidator(240)],
        help_text="How long the tenant is warned before an idle reservation is released as a no-show.",
    )
    release_grace_minutes = models.PositiveSmallIntegerField(
        default=10, validators=[MaxValueValidator(1440)],
        help_text="GPUs still held this long past the reservation's end are reclaimed.",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = CatalogueQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(kind=OfferingKind.BARE_METAL) | Q(slots_per_gpu=1),
                name="offering_bare_metal_whole_node",
                violation_error_message="A bare-metal offering sells whole nodes (of its GPUs per unit), not slots.",
            ),
            models.CheckConstraint(
                condition=Q(confidential=False) | ~Q(kind=OfferingKind.CONTAINER),
                name="offering_confidential_not_container",
                violation_error_message="Confidential offerings are bare-metal servers or VMs (a container has no "
                                        "TEE of its own).",
            ),
            models.CheckConstraint(
                condition=Q(slots_per_gpu=1) | Q(kind=OfferingKind.CONTAINER, gpus_per_unit=1),
                name="offering_fractions_only_for_single_gpu_containers",
                violation_error_message="Only single-GPU container offerings may be fractional.",
            ),
            models.CheckConstraint(
                condition=(Q(isolation_mode=IsolationMode.TIME_SLICED, kind=OfferingKind.CONTAINER, gpus_per_unit=1,
                             slots_per_gpu__gte=2, slots_per_gpu__lte=MAX_TASKS_PER_GPU)
                           & ~Q(time_slice_class=""))
                | (~Q(isolation_mode=IsolationMode.TIME_SLICED) & Q(time_slice_class="")),
                name="offering_time_slices_shape",
                violation_error_message=f"A time-sliced offering is a single-GPU container shared by 2 to "
                                        f"{MAX_TASKS_PER_GPU} tasks of one slice class; only it has a class.",
            ),
            models.CheckConstraint(
                condition=Q(spot_available=False) | Q(spot_floor_price__isnull=False),
                name="offering_spot_needs_floor",
                violation_error_message="A spot variant needs a floor price.",
            ),
        ]

    def __str__(self):
        return self.name

    @property
    def pool(self) -> str:
        return NodePool.BARE_METAL if self.kind == OfferingKind.BARE_METAL else NodePool.SHARED

    @property
    def reserved_price_per_gpu_hour(self):
        return (self.price_per_gpu_hour * (100 - self.reserved_discount_pct) / 100).quantize(self.price_per_gpu_hour)

    def clean(self):
        super().clean()
        if self.isolation_mode == IsolationMode.MIG and self.gpu_model_id and not self.gpu_model.supports_mig:
            raise ValidationError({"isolation_mode": f"{self.gpu_model} does not support MIG."})
        self._clean_time_slices()
        if self.spot_available and self.spot_floor_price is None:
            raise ValidationError({"spot_floor_price": "A spot variant needs a floor price."})
        floor, price = self.spot_floor_price, self.price_per_gpu_hour
        if floor is not None and price is not None and floor > price:
            raise ValidationError({"spot_floor_price": "The spot floor cannot exceed the on-demand price."})


    def _clean_time_slices(self) -> None:
        if self.isolation_mode != IsolationMode.TIME_SLICED:
            if self.time_slice_class:
                raise ValidationError({"time_slice_class": "Only a time-sliced offering has a slice class."})
            return
        if not self.time_slice_class:
            raise ValidationError({"time_slice_class": "A time-sliced offering needs a slice class."})
        if self.kind != OfferingKind.CONTAINER or self.gpus_per_unit != 1:
            raise ValidationError({"isolation_mode": "Only single-GPU container offerings may be time-sliced."})
        if not 2 <= (self.slots_per_gpu or 0) <= MAX_TASKS_PER_GPU:
            raise ValidationError({"slots_per_gpu": f"A time-sliced GPU is shared by 2 to {MAX_TASKS_PER_GPU} tasks."})


class LeaderLease(models.Model):
    """
    Who leads a singleton loop (the scheduler) on SQLite, where there are no advisory locks: a
    row per loop, held by one process until its lease runs out unrenewed.
    """

    name = models.CharField(max_length=64, primary_key=True)
    holder = models.CharField(max_length=128)
    expires_at = models.DateTimeField()

    def __str__(self):
        return f"{self.name} led by {self.holder} until {self.expires_at:%H:%M:%S}"


from cloud.image_models import Image, ImageQuerySet  # noqa: E402, F401 -- the app's models, one module each
