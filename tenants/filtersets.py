"""
Filters of the tenancy lists. Related objects are filtered by plain id, never by a choice field
over an unscoped queryset: that would answer "invalid choice" for a random id and an empty page
for another tenant's, telling the two apart.
"""

import django_filters

from tenants.models import APIToken, HighPriorityApplication, Invitation, Notification, Quota, TeamMembership


class TeamMembershipFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")

    class Meta:
        model = TeamMembership
        fields = ["team", "role"]


class InvitationFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")

    class Meta:
        model = Invitation
        fields = ["team", "role"]


class APITokenFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")

    class Meta:
        model = APIToken
        fields = ["team", "scope"]


class QuotaFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")
    tenant = django_filters.UUIDFilter(field_name="tenant_id")
    gpu_model = django_filters.CharFilter(field_name="gpu_model__slug", max_length=50)

    class Meta:
        model = Quota
        fields = ["team", "tenant", "resource", "gpu_model"]


class HighPriorityApplicationFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")

    class Meta:
        model = HighPriorityApplication
        fields = ["team", "state"]


class NotificationFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")
    kind = django_filters.CharFilter(max_length=64)
    unread = django_filters.BooleanFilter(field_name="read_at", lookup_expr="isnull",
                                          label="true: only unread; false: only read.")

    class Meta:
        model = Notification
        fields = ["team", "kind", "unread"]
