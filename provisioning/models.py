"""
Reservations, the allocations that bind them to GPUs for a time range, the operations a client
polls, and idempotency keys of creates.

The one capacity rule -- no two allocations of the same GPU memory overlap in time -- is kept by
the database: an exclusion constraint on PostgreSQL (migration 0002), the same check inside the
IMMEDIATE write transaction on SQLite (``provisioning.allocations``).
"""

import uuid

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from provisioning.choices import (
    BillingTerm,
    EvictionPolicy,
    InstanceState,
    OperationKind,
    OperationState,
    ReservationState,
    StepState,
    VPCState,
)
from provisioning.transitions import HOLDING_STATES, QUOTA_STATES, TERMINAL_STATES, WAITING_STATES
from security.crypto import EncryptedTextField
from tenants.scoping import TeamOwnedModel, TenantOwnedModel, TenantScopedQuerySet


class Reservation(TeamOwnedModel):
    """
    A request for GPUs (or whole nodes) of an offering, in one of a list of regions, now or in a
    future window, for a duration. Owned by a tenant and optionally a team; its state moves only
    through services (provisioning.services), each move audited.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=100)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    offering = models.ForeignKey("cloud.Offering", on_delete=models.PROTECT, related_name="reservations")
    gpu_model = models.ForeignKey("cloud.GPUModel", on_delete=models.PROTECT, related_name="+")
    # What the tenant asked for when it gave a logical spec instead of an offering.
    spec = models.JSONField(null=True, blank=True)
    units = models.PositiveIntegerField(help_text="Instances: nodes for bare metal, slots for fractional offerings.")
    gpus = models.PositiveIntegerField(help_text="Whole GPUs held (0 for fractional slots).")
    regions = models.JSONField(help_text="Acceptable region slugs, preferred first.")
    region = models.ForeignKey("cloud.Region", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    requested_start = models.DateTimeField(null=True, blank=True, help_text="Empty: as soon as possible.")
    duration = models.DurationField()
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    billing_term = models.CharField(max_length=16, choices=BillingTerm.choices, default=BillingTerm.ON_DEMAND)
    spot_max_price = models.DecimalField(max_digits=8, decimal_places=4, null=True, blank=True)
    committed = models.BooleanField(default=False, help_text="Holds a commitment's capacity for its whole term: it "
                                                             "may outlast the usual cap and is not released early.")
    # The Meridian service that runs this work for the tenant ("endpoint:<id>": an inference endpoint's
    # replica). Idle is normal for it (a replica waits for requests): it is never released as a no-show.
    managed_by = models.CharField(max_length=64, blank=True, default="", db_default="")
    eviction_policy = models.CharField(max_length=8, choices=EvictionPolicy.choices, default=EvictionPolicy.SOFT)
    urgency = models.FloatField(default=0.5, validators=[MinValueValidator(0), MaxValueValidator(1)])
    ssh_public_key = models.TextField(blank=True)
    image = models.ForeignKey("cloud.Image", null=True, blank=True, on_delete=models.PROTECT,
                              related_name="reservations",
                              help_text="What its instances boot; empty: the default of its offering's kind.")
    public_ip = models.BooleanField(default=False, help_text="Whether its instances get a public address too.")
    user_data = models.TextField(blank=True, help_text="cloud-init user-data for its instances (#cloud-config or a "
                                                       "script), checked at create.")
    environment = models.JSONField(default=dict, blank=True,
                                   help_text="Environment variables of its containers (kept in a Kubernetes Secret).")
    ssh_keys = models.ManyToManyField("tenants.SSHKey", blank=True, related_name="reservations",
                                      help_text="Saved keys its instances get (with ssh_public_key, if pasted).")
    # Its IB-VPC; none: the tenant's default VPC on the fabric it lands on (created on first use).
    vpc = models.ForeignKey("VPC", null=True, blank=True, on_delete=models.PROTECT, related_name="reservations")
    state = models.CharField(max_length=16, choices=ReservationState.choices, default=ReservationState.PENDING)
    state_reason = models.CharField(max_length=500, blank=True)
    state_changed_at = models.DateTimeField(auto_now_add=True)
    score = models.FloatField(default=0.0)
    score_breakdown = models.JSONField(default=dict, blank=True)
    # Staff's hand on the queue (provisioning.staff_actions): a raise or cut of the score, and a hold
    # that keeps it queued but out of the scheduler's reach; the last note staff left on it.
    priority_adjustment = models.FloatField(default=0.0, db_default=0.0, help_text="Staff's raise (> 0) or cut (< 0) "
                                            "of the priority score, in [-1, 1].")
    held_at = models.DateTimeField(null=True, blank=True, help_text="When staff held it in the queue; empty: not held.")
    staff_note = models.CharField(max_length=500, blank=True, default="", db_default="",
                                  help_text="The last note staff left with an action on it.")
    preempted_by = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    # Provisioning attempts that failed for good on a node; past the limit the reservation fails.
    provision_failures = models.PositiveSmallIntegerField(default=0)
    # Times it was placed again on other hardware (back to the queue, or failed units replaced),
    # and why the last time: ``state_reason`` moves on with the state, this stays for the tenant.
    # (Defaults in the database too: a process still on the code before these columns can insert.)
    replacements = models.PositiveSmallIntegerField(default=0, db_default=0, help_text="Times it was placed again "
                                                    "on other hardware (back to the queue, or failed hardware "
                                                    "replaced).")
    replaced_at = models.DateTimeField(null=True, blank=True, help_text="When it was last placed again.")
    replacement_reason = models.CharField(max_length=500, blank=True, default="", db_default="",
                                          help_text="Why it was last placed again; empty if it never was.")

    class Meta:
        ordering = ["-submitted_at"]
        indexes = [
            models.Index(fields=["state", "submitted_at"], name="reservation_queue_idx"),
            # The queue in its order with the ids in the index: the scheduler reads it every cycle
            # from the index alone (no row of the table's history visited).
            # Held ones are out of it: staff keep them out of the scheduler's reach.
            models.Index(fields=["submitted_at", "id"], name="reservation_queued_idx",
                         condition=Q(state="queued", held_at__isnull=True)),
            # What counts against a tenant's quotas, on every create: its live work only, not its history.
            models.Index(fields=["tenant", "gpu_model"], name="reservation_live_owner_idx",
                         condition=Q(state__in=sorted(QUOTA_STATES | WAITING_STATES))),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=ReservationState.values), name="reservation_state_valid"),
            models.CheckConstraint(condition=Q(units__gte=1), name="reservation_units_positive"),
            models.CheckConstraint(condition=Q(urgency__gte=0, urgency__lte=1), name="reservation_urgency_range"),
            models.CheckConstraint(condition=Q(priority_adjustment__gte=-1, priority_adjustment__lte=1),
                                   name="reservation_adjustment_range"),
            models.CheckConstraint(
                condition=Q(billing_term=BillingTerm.SPOT) | Q(spot_max_price__isnull=True),
                name="reservation_max_price_only_for_spot",
            ),
            models.CheckConstraint(
                condition=Q(starts_at__isnull=True) | Q(ends_at__gt=F("starts_at")),
                name="reservation_window_ordered",
            ),
        ]

    def __str__(self):
        return f"{self.name} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def holds_capacity(self) -> bool:
        return self.state in HOLDING_STATES


class AllocationQuerySet(TenantScopedQuerySet):
    def holding(self, now):
        """
        The allocations holding capacity at ``now`` (the current time). Archived ones ended long
        before it; saying so lets PostgreSQL read the index of the live ones (allocation_live_end_idx)
        instead of every allocation ever made.
        """
        return self.filter(archived=False, starts_at__lte=now, ends_at__gt=now)


class Allocation(models.Model):
    """
    A reservation's hold on (part of) one GPU for ``[starts_at, ends_at)``. A whole GPU covers its
    memory ``[0, memory)``; a fractional slot covers its stretch of it. Ending an allocation early
    (release, eviction) shortens ``ends_at``; rows are kept as history. One that ended longer ago
    than MERIDIAN_ALLOCATION_ARCHIVE_AFTER is ``archived`` (provisioning.allocations): the
    no-overlap constraint covers only the others, so its index does not grow with the history.
    """

    id = models.BigAutoField(primary_key=True)
    # No foreign-key constraints in the database (db_constraint=False): PostgreSQL checks one per
    # row and key at commit, locking the referenced row, and for a scheduler batch of a thousand
    # rows that cost as much as the insert itself. Both writers insert rows only for what exists
    # in their transaction (the fast path's reservation, inserted first; the scheduler's, locked
    # first; GPUs and nodes read allocatable there), nothing deletes GPUs or nodes, and the ORM
    # still applies CASCADE and PROTECT on delete.
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="allocations",
                                    db_constraint=False)
    # No index of its own: allocation_gpu_end_idx (and the exclusion constraint's) lead with gpu.
    gpu = models.ForeignKey("cloud.GPU", on_delete=models.PROTECT, related_name="allocations", db_index=False,
                            db_constraint=False)
    node = models.ForeignKey("cloud.Node", on_delete=models.PROTECT, related_name="allocations", db_constraint=False)
    mem_lo = models.PositiveIntegerField()
    mem_hi = models.PositiveIntegerField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    # The signed attestation receipt (a JWT) of the node this GPU was handed over on.
    # Time-sliced slots: the slice class of the GPU they share. Two classes never overlap in time on
    # one GPU (the allocation_one_slice_class constraint), whatever memory each covers.
    share_class = models.CharField(max_length=16, blank=True, default="", db_default="")
    attestation_receipt = models.TextField(blank=True, db_default="")  # COPY (allocations.py) leaves it out
    archived = models.BooleanField(default=False, db_default=False)  # COPY leaves it out too

    objects = AllocationQuerySet.as_manager()
    tenant_path = "reservation__tenant"
    team_path = "reservation__team"

    class Meta:
        ordering = ["reservation", "gpu"]
        indexes = [
            models.Index(fields=["gpu", "ends_at"], name="allocation_gpu_end_idx"),
            # What holds capacity now or later (the scheduler's window) and what the archiver
            # looks for: the history (archived) stays out of it, as out of the constraint's.
            models.Index(fields=["ends_at"], name="allocation_live_end_idx", condition=Q(archived=False)),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(mem_hi__gt=F("mem_lo")), name="allocation_memory_range_ordered"),
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="allocation_time_range_ordered"),
        ]

    def __str__(self):
        return f"{self.gpu_id} [{self.mem_lo}, {self.mem_hi}) {self.starts_at:%Y-%m-%d %H:%M}-{self.ends_at:%H:%M}"


class Operation(TenantOwnedModel):
    """
    An asynchronous change a client can poll: what runs, which step, how far, and why it failed.
    A reservation's operations belong to its tenant; a node's validation belongs to the platform
    (no tenant, no reservation: only staff see it).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("tenants.Tenant", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="provisioning_operation_set")
    reservation = models.ForeignKey(Reservation, null=True, blank=True, on_delete=models.CASCADE,
                                    related_name="operations")
    node = models.ForeignKey("cloud.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="operations")
    kind = models.CharField(max_length=16, choices=OperationKind.choices)
    state = models.CharField(max_length=16, choices=OperationState.choices, default=OperationState.PENDING)
    step = models.CharField(max_length=64, blank=True)
    attempt = models.PositiveSmallIntegerField(default=0)
    progress = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    error = models.TextField(blank=True)
    # Times the reaper found it stuck (its worker died and no redelivery came) and resumed it.
    resumed = models.PositiveSmallIntegerField(default=0)
    # The token of the last message sent for it: only that message runs it (provisioning.lifecycle).
    dispatch = models.CharField(max_length=32, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    team_path = "reservation__team"

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["state", "updated_at"], name="operation_stuck_idx"),
            # Nodes being attested are not sold: every snapshot and fast-path read asks, and without
            # this the question scanned every operation ever recorded (one per reservation).
            models.Index(fields=["node"], name="operation_attesting_idx",
                         condition=Q(kind=OperationKind.ATTEST,
                                     state__in=[OperationState.PENDING, OperationState.RUNNING])),
        ]

    def __str__(self):
        return f"{self.kind} {self.state} ({self.reservation_id or self.node_id})"

    @property
    def is_finished(self) -> bool:
        return self.state in (OperationState.SUCCEEDED, OperationState.FAILED, OperationState.CANCELLED)


class StepRun(models.Model):
    """
    One attempt of one step of an operation (Ironic's deploy and clean steps): the node's step
    history and every cause of a failure, kept even when a retry succeeds.
    """

    id = models.BigAutoField(primary_key=True)
    operation = models.ForeignKey(Operation, on_delete=models.CASCADE, related_name="steps")
    node = models.ForeignKey("cloud.Node", null=True, blank=True, on_delete=models.CASCADE, related_name="step_runs")
    name = models.CharField(max_length=64)
    attempt = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=StepState.choices, default=StepState.RUNNING)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self):
        return f"{self.name} #{self.attempt} {self.state}"


class Instance(TeamOwnedModel):
    """
    What the tenant gets for one unit of a reservation: a bare-metal server, a VM or a container,
    on one node, with the GPUs (or slot) it was given and how to reach it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="instances")
    node = models.ForeignKey("cloud.Node", on_delete=models.PROTECT, related_name="instances")
    # The operations that provision and clean up this instance: each works on its own instances
    # only (a re-placed reservation can have one attempt cleaning while the next one runs).
    provisioned_by = models.ForeignKey(Operation, null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="provisioned_instances")
    released_by = models.ForeignKey(Operation, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="released_instances")
    index = models.PositiveSmallIntegerField(help_text="Which unit of the reservation.")
    kind = models.CharField(max_length=16)
    state = models.CharField(max_length=16, choices=InstanceState.choices, default=InstanceState.PROVISIONING)
    # [{"gpu_id", "index", "pci_bus_id", "mem_lo", "mem_hi"}]: what the drivers pass through.
    devices = models.JSONField(default=list)
    # {"gpus": [indexes], "link": "nvlink"|"pcie_switch"|"numa"|"system"|None, "numa_node": n|None}: how its GPUs
    # are linked (scheduling.planner.topology); a VM's vCPUs and memory come from that NUMA node.
    topology = models.JSONField(default=dict, blank=True)
    name = models.CharField(max_length=100, help_text="The domain or pod name on the host; the server's hostname.")
    address = models.CharField(max_length=255, blank=True, help_text="Its DNS name, once handed over.")
    private_ip = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    public_ip = models.GenericIPAddressField(protocol="IPv4", null=True, blank=True)
    ssh_user = models.CharField(max_length=32, blank=True)
    # [{"type", "key", "fingerprint"}]: the SSH host keys the instance reported (or printed on its console).
    host_keys = models.JSONField(default=list, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True, help_text="When it first reported in after booting.")
    # The runtime's id of a container (its pod's UID): how the host's cgroups name its processes.
    runtime_uid = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["reservation", "index"]
        constraints = [
            models.UniqueConstraint(fields=["reservation", "index"], name="instance_unit_unique"),
            models.CheckConstraint(condition=Q(state__in=InstanceState.values), name="instance_state_valid"),
        ]

    def __str__(self):
        return f"{self.name} ({self.state})"


class SimulatedDevice(models.Model):
    """
    The state of simulated hardware (a BMC, a disk, a hypervisor, a container host), kept in the
    database so it outlives the worker that changed it -- a retried step sees what the killed
    one did, as it would on real hardware -- with a count of every call for the tests.
    """

    key = models.CharField(max_length=200, primary_key=True)
    state = models.JSONField(default=dict)
    calls = models.JSONField(default=dict)

    def __str__(self):
        return self.key


class IdempotencyKey(models.Model):
    """
    The first response to a create sent with an ``Idempotency-Key``, per tenant and principal.
    Written in the same transaction as the object it created, so a retry after a crash replays
    instead of creating twice. Pruned after a day.
    """

    id = models.BigAutoField(primary_key=True)
    tenant_id = models.UUIDField(null=True)
    principal_id = models.UUIDField()
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=255)
    request_sha256 = models.CharField(max_length=64)
    response_code = models.PositiveSmallIntegerField()
    response_body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "principal_id", "key"], name="idempotency_key_unique"),
        ]

    def __str__(self):
        return f"{self.method} {self.path} [{self.key}] -> {self.response_code}"


__all__ = ["Allocation", "IdempotencyKey", "Operation", "Reservation", "BillingTerm", "EvictionPolicy",
           "OperationKind", "OperationState", "ReservationState"]


class NodeCredential(models.Model):
    """
    The key a node's agent signs its requests with (HMAC-SHA256, provisioning.agent.signing).
    The secret is kept encrypted (the server must know it to check signatures) and shown once.
    """

    node = models.OneToOneField("cloud.Node", on_delete=models.CASCADE, related_name="agent_credential")
    key_id = models.CharField(max_length=32, unique=True)
    secret = EncryptedTextField()
    created_at = models.DateTimeField(auto_now_add=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"{self.key_id} ({self.node_id})"


class AgentNonce(models.Model):
    """Nonces seen while their time is fresh: a replayed request meets its own nonce here."""

    id = models.BigAutoField(primary_key=True)
    node = models.ForeignKey("cloud.Node", on_delete=models.CASCADE, related_name="+")
    nonce = models.CharField(max_length=64)
    seen_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "nonce"], name="agent_nonce_once_per_node")]

    def __str__(self):
        return self.nonce


class AgentState(models.Model):
    """What a node's agent said last: when, which version, and its GPUs as NVML sees them."""

    node = models.OneToOneField("cloud.Node", on_delete=models.CASCADE, primary_key=True, related_name="agent_state")
    last_seen_at = models.DateTimeField()
    agent_version = models.CharField(max_length=32, blank=True)
    gpus = models.JSONField(default=list)
    # Liveness pings (operations.node_api.liveness): the agent run whose pings count ("": none, its
    # heartbeats are judged), the last ping's sequence, when it came (our clock) and was sent (the
    # node's), the previous ping's round trip and how many went unanswered since (as the agent saw
    # them). Database defaults too: the heartbeat's own INSERT names only its columns.
    ping_run = models.CharField(max_length=32, blank=True, default="", db_default="")
    ping_seq = models.BigIntegerField(default=0, db_default=0)
    alive_at = models.DateTimeField(null=True, blank=True)
    ping_sent_at = models.DateTimeField(null=True, blank=True)
    ping_rtt_ms = models.PositiveIntegerField(null=True, blank=True)
    ping_failed = models.PositiveIntegerField(default=0, db_default=0)

    def __str__(self):
        return f"{self.node_id} seen {self.last_seen_at:%Y-%m-%d %H:%M:%S}"


class AgentCommand(models.Model):
    """Work for one node's agent, pulled on its next turn: scrub these GPUs, report inventory."""

    class Kind(models.TextChoices):
        SCRUB = "scrub", "Scrub GPU memory"
        INVENTORY = "inventory", "Report inventory"
        ATTEST = "attest", "Sign attestation evidence"
        MIG = "mig", "Set a GPU's MIG layout"
        RESET_GPU = "reset_gpu", "Reset a GPU"
        ACCEPTANCE = "acceptance", "Run the acceptance checks"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SENT = "sent", "Sent to the agent"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey("cloud.Node", on_delete=models.CASCADE, related_name="agent_commands")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    reference = models.CharField(max_length=100, blank=True, help_text="What asked for it (an operation).")
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    result = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["created_at"]
        indexes = [models.Index(fields=["node", "state"], name="agent_command_queue_idx")]
        constraints = [models.UniqueConstraint(fields=["node", "kind", "reference"], name="agent_command_once")]

    def __str__(self):
        return f"{self.kind} {self.state} on {self.node_id}"


#
# IB-VPCs (DESIGN.md, IB-VPC)
#


class VPC(TeamOwnedModel):
    """
    A tenant's (or a team's) private InfiniBand network on one fabric: a partition whose P_Key is
    drawn from the fabric's pool, and an IPoIB subnet. A P_Key is taken from the pool for as long
    as the VPC is not ``deleted`` -- it becomes deleted only once the fabric confirms the
    partition is gone -- so two live VPCs never share a key (a database constraint).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=63)
    fabric = models.ForeignKey("cloud.Fabric", on_delete=models.PROTECT, related_name="vpcs")
    pkey = models.PositiveIntegerField("P_Key")
    cidr = models.CharField("IPoIB subnet", max_length=18)
    mtu = models.PositiveSmallIntegerField(default=4096)
    service_level = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(15)])
    rate_gbps = models.FloatField(null=True, blank=True, help_text="Rate limit; empty: the fabric's.")
    is_default = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=VPCState.choices, default=VPCState.PENDING)
    state_reason = models.CharField(max_length=500, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "name"]
        verbose_name = "VPC"
        constraints = [
            models.UniqueConstraint(fields=["fabric", "pkey"], condition=~Q(state=VPCState.DELETED),
                                    name="vpc_pkey_unique_per_fabric"),
            models.UniqueConstraint(fields=["tenant", "name"], condition=~Q(state=VPCState.DELETED),
                                    name="vpc_name_unique_per_tenant"),
            models.UniqueConstraint(fields=["tenant", "fabric"], condition=Q(is_default=True) & ~Q(
                state=VPCState.DELETED), name="vpc_one_default_per_tenant_and_fabric"),
            models.CheckConstraint(condition=Q(pkey__gte=0x0001, pkey__lte=0x7FFE), name="vpc_pkey_in_range"),
            models.CheckConstraint(condition=Q(state__in=VPCState.values), name="vpc_state_valid"),
        ]

    def __str__(self):
        return f"{self.name} ({self.pkey:#06x})"

    @property
    def partition_name(self) -> str:
        """The partition's name on the fabric: says whose it is to an operator, nothing to a tenant."""
        return f"mrd_{self.id.hex[:12]}"


class VirtualFunction(models.Model):
    """
    An SR-IOV virtual function of a shared host's HCA port, with its own port GUID: what one VM
    or container joins its VPC with. Made on first use, reused once its instance has left.
    """

    id = models.BigAutoField(primary_key=True)
    port = models.ForeignKey("cloud.HCAPort", on_delete=models.CASCADE, related_name="virtual_functions")
    index = models.PositiveSmallIntegerField()
    guid = models.CharField("port GUID", max_length=16, unique=True)
    instance = models.ForeignKey("Instance", null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="virtual_functions")

    class Meta:
        ordering = ["port", "index"]
        constraints = [
            models.UniqueConstraint(fields=["port", "index"], name="vf_index_unique_per_port"),
            models.UniqueConstraint(fields=["instance"], condition=Q(instance__isnull=False),
                                    name="vf_one_per_instance"),
        ]

    def __str__(self):
        return f"{self.port}/vf{self.index}"


class PortMembership(models.Model):
    """
    A port GUID's full membership of a VPC's partition while an instance holds the port: written
    when provisioning joins it, ``left_at`` set when release has taken it out. A GUID is a live
    member of at most one partition -- so never of two tenants' -- by a database constraint.
    """

    id = models.BigAutoField(primary_key=True)
    vpc = models.ForeignKey(VPC, on_delete=models.PROTECT, related_name="memberships")
    instance = models.ForeignKey("Instance", on_delete=models.CASCADE, related_name="memberships")
    guid = models.CharField("port GUID", max_length=16)
    address = models.GenericIPAddressField("IPoIB address", protocol="IPv4", null=True, blank=True)
    joined_at = models.DateTimeField(auto_now_add=True)
    left_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "vpc__tenant"
    team_path = "vpc__team"

    class Meta:
        ordering = ["vpc", "joined_at", "guid"]
        constraints = [
            models.UniqueConstraint(fields=["guid"], condition=Q(left_at__isnull=True),
                                    name="port_guid_in_one_partition_at_a_time"),
            models.UniqueConstraint(fields=["vpc", "address"], condition=Q(left_at__isnull=True),
                                    name="ipoib_address_unique_per_vpc"),
        ]

    def __str__(self):
        return f"{self.guid} in {self.vpc}"


class FabricReconciliation(models.Model):
    """One comparison of a fabric's partitions with what the database says, and what it repaired."""

    id = models.BigAutoField(primary_key=True)
    fabric = models.ForeignKey("cloud.Fabric", on_delete=models.CASCADE, related_name="reconciliations")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    ok = models.BooleanField(default=False)
    error = models.TextField(blank=True)
    # [{"pkey": ..., "vpc": ..., "kind": "extra_member" | "missing_member" | ..., "guid": ..., "action": ...}]
    drift = models.JSONField(default=list)

    class Meta:
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["fabric", "-started_at"], name="reconciliation_latest_idx")]

    def __str__(self):
        return f"{self.fabric} at {self.started_at:%Y-%m-%d %H:%M:%S}"


# Models kept in modules of their own, loaded with these.
from provisioning.access_models import AddressAssignment, ConfigDrive  # noqa: E402, F401
from provisioning.feed_models import CapacityChange  # noqa: E402, F401
from provisioning.history_models import OccupancySample, QueueSample  # noqa: E402, F401
from provisioning.validation_models import NodeValidation  # noqa: E402, F401
