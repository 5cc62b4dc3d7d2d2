from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as BaseUserAdmin
from django.db import transaction

from core.admin import ReadOnlyAdmin
from security.audit import audit_record
from tenants.models import (
    APIToken,
    HighPriorityApplication,
    Invitation,
    Membership,
    Notification,
    Quota,
    Team,
    TeamMembership,
    Tenant,
    User,
)


@admin.register(User)
class UserAdmin(BaseUserAdmin):
    ordering = ["email"]
    list_display = ["email", "full_name", "platform_role", "is_active", "date_joined"]
    list_filter = ["platform_role", "is_active"]
    search_fields = ["email", "full_name"]
    fieldsets = [
        (None, {"fields": ["email", "password"]}),
        ("Profile", {"fields": ["full_name"]}),
        ("Platform", {"fields": ["platform_role", "is_active", "is_superuser"]}),
    ]
    add_fieldsets = [(None, {"classes": ["wide"], "fields": ["email", "password1", "password2"]})]
    filter_horizontal: list[str] = []

    @transaction.atomic
    def save_model(self, request, obj, form, change):
        """Granting platform roles happens here (superusers); it is audited like any service change."""
        super().save_model(request, obj, form, change)
        changed = {name: str(form.cleaned_data.get(name)) for name in form.changed_data if name != "password"}
        if "password" in form.changed_data:
            changed["password"] = "changed"
        audit_record(actor=request.user, action="user.update" if change else "user.create", target=obj,
                     tenant_id=None, after=changed)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    can_delete = False
    fields = ["user", "role"]

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Tenant)
class TenantAdmin(ReadOnlyAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]


@admin.register(Team)
class TeamAdmin(ReadOnlyAdmin):
    list_display = ["name", "slug", "tenant"]
    list_filter = ["tenant"]
    search_fields = ["name", "slug"]


@admin.register(TeamMembership)
class TeamMembershipAdmin(ReadOnlyAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role"]


@admin.register(Invitation)
class InvitationAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "email", "role", "team", "created_at", "expires_at", "accepted_at", "revoked_at"]
    readonly_fields = ["digest"]


@admin.register(Quota)
class QuotaAdmin(ReadOnlyAdmin):
    list_display = ["tenant", "team", "resource", "gpu_model", "limit"]
    list_filter = ["resource"]


@admin.register(APIToken)
class APITokenAdmin(ReadOnlyAdmin):
    list_display = ["name", "user", "tenant", "scope", "prefix", "expires_at", "revoked_at", "last_used_at"]
    list_filter = ["scope"]
    readonly_fields = ["prefix", "digest", "last_used_at"]


@admin.register(HighPriorityApplication)
class HighPriorityApplicationAdmin(ReadOnlyAdmin):
    list_display = ["team", "tenant", "state", "created_at", "reviewed_at", "expires_at"]
    list_filter = ["state"]


@admin.register(Notification)
class NotificationAdmin(ReadOnlyAdmin):
    list_display = ["title", "tenant", "user", "team", "kind", "created_at", "read_at"]
    list_filter = ["kind"]
