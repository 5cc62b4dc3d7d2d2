"""Filters of the checkpoint and snapshot lists: the volume by id, never looked up (another tenant's is missing)."""

import django_filters

from storage.models import Checkpoint, VolumeSnapshot


class CheckpointFilterSet(django_filters.FilterSet):
    volume = django_filters.UUIDFilter(field_name="volume_id")
    state = django_filters.MultipleChoiceFilter(choices=Checkpoint._meta.get_field("state").choices)

    class Meta:
        model = Checkpoint
        fields = ["volume", "state"]


class SnapshotFilterSet(django_filters.FilterSet):
    volume = django_filters.UUIDFilter(field_name="volume_id")
    state = django_filters.MultipleChoiceFilter(choices=VolumeSnapshot._meta.get_field("state").choices)

    class Meta:
        model = VolumeSnapshot
        fields = ["volume", "state"]
