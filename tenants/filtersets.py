"""
Filters of the tenancy lists. Related objects are filtered by plain id, never by a choice field
over an unscoped queryset: that would answer "invalid choice" for a random id and an empty page
for another tenant's, telling the two apart.
"""

import django_filters

from .models import APIToken, Invitation, Quota, TeamMembership


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
