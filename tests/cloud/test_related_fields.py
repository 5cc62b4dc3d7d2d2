"""The API's related fields: each serializer gets fields of its own, and they share their querysets."""

from provisioning.api.serializers import ReservationCreateSerializer


def test_each_serializer_has_its_own_related_fields_sharing_one_queryset():
    first, second = ReservationCreateSerializer(), ReservationCreateSerializer()
    declared = ReservationCreateSerializer._declared_fields
    for name in ("offering", "team", "vpc"):
        mine, theirs = first.fields[name], second.fields[name]
        assert mine is not theirs and mine.parent is first and theirs.parent is second
        assert mine.queryset is theirs.queryset is declared[name].queryset
    regions = first.fields["regions"].child, second.fields["regions"].child
    assert regions[0] is not regions[1] and regions[0].parent is first.fields["regions"]
    assert regions[0].queryset is regions[1].queryset
    assert regions[0].asked == "region in service"  # the field's own arguments survive the copy
