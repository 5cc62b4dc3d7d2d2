"""Filters of the checkpoint list (the volume by id, never looked up: another tenant's reads as a missing one)."""

import django_filters

from storage.models import Checkpoint


class CheckpointFilterSet(django_filters.FilterSet):
    volume = django_filters.UUIDFilter(field_name="volume_id")
    state = django_filters.MultipleChoiceFilter(choices=Checkpoint._meta.get_field("state").choices)

    class Meta:
        model = Checkpoint
        fields = ["volume", "state"]
