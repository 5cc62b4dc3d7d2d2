"""Read-only admin pages of the lifecycle: writes go through services, secrets never show."""

from django.contrib import admin

from core.admin import ReadOnlyAdmin
from provisioning.models import (
    VPC,
    AgentCommand,
    AgentState,
    FabricReconciliation,
    Instance,
    NodeCredential,
    Operation,
    PortMembership,
    Reservation,
    StepRun,
)


class StepRunInline(admin.TabularInline):
    model = StepRun
    fields = ["name", "attempt", "state", "error", "started_at", "finished_at"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Reservation)
class ReservationAdmin(ReadOnlyAdmin):
    list_display = ["name", "tenant", "offering", "units", "state", "score", "starts_at", "ends_at"]
    list_filter = ["state", "billing_term"]
    search_fields = ["name", "id"]
    exclude = ["ssh_public_key"]


@admin.register(Operation)
class OperationAdmin(ReadOnlyAdmin):
    list_display = ["kind", "state", "step", "attempt", "progress", "reservation", "node", "updated_at"]
    list_filter = ["kind", "state"]
    inlines = [StepRunInline]


@admin.register(Instance)
class InstanceAdmin(ReadOnlyAdmin):
    list_display = ["name", "kind", "state", "node", "address", "reservation"]
    list_filter = ["kind", "state"]


@admin.register(AgentState)
class AgentStateAdmin(ReadOnlyAdmin):
    list_display = ["node", "last_seen_at", "agent_version"]


@admin.register(AgentCommand)
class AgentCommandAdmin(ReadOnlyAdmin):
    list_display = ["kind", "state", "node", "reference", "created_at", "done_at"]
    list_filter = ["kind", "state"]


@admin.register(NodeCredential)
class NodeCredentialAdmin(ReadOnlyAdmin):
    list_display = ["key_id", "node", "created_at", "revoked_at"]
    exclude = ["secret"]


@admin.register(VPC)
class VPCAdmin(ReadOnlyAdmin):
    list_display = ["name", "tenant", "fabric", "pkey", "cidr", "state", "is_default"]
    list_filter = ["state", "fabric"]
    search_fields = ["name", "tenant__slug"]


@admin.register(PortMembership)
class PortMembershipAdmin(ReadOnlyAdmin):
    list_display = ["guid", "vpc", "instance", "address", "joined_at", "left_at"]
    search_fields = ["guid"]


@admin.register(FabricReconciliation)
class FabricReconciliationAdmin(ReadOnlyAdmin):
    list_display = ["fabric", "started_at", "finished_at", "ok"]
    list_filter = ["ok", "fabric"]
