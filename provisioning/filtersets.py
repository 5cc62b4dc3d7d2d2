"""Filters of the reservation and operation lists (related objects by id or slug, never by choice)."""

import django_filters

from provisioning.models import Instance, Operation, Reservation


class ReservationFilterSet(django_filters.FilterSet):
    team = django_filters.UUIDFilter(field_name="team_id")
    offering = django_filters.CharFilter(field_name="offering__slug", max_length=50)
    region = django_filters.CharFilter(field_name="region__slug", max_length=50)
    state = django_filters.MultipleChoiceFilter(choices=Reservation._meta.get_field("state").choices)

    class Meta:
        model = Reservation
        fields = ["team", "offering", "region", "state", "billing_term"]


class OperationFilterSet(django_filters.FilterSet):
    reservation = django_filters.UUIDFilter(field_name="reservation_id")

    class Meta:
        model = Operation
        fields = ["reservation", "kind", "state"]


class InstanceFilterSet(django_filters.FilterSet):
    reservation = django_filters.UUIDFilter(field_name="reservation_id")
    state = django_filters.MultipleChoiceFilter(choices=Instance._meta.get_field("state").choices)

    class Meta:
        model = Instance
        fields = ["reservation", "state", "kind"]
