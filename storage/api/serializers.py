"""The storage API's shapes."""

from __future__ import annotations

from rest_framework import serializers

from provisioning.models import Reservation
from storage.checkpoints import progress
from storage.choices import NAME
from storage.models import Checkpoint, CheckpointPolicy, StorageClass, Volume, VolumeAttachment, VolumeSnapshot
from tenants.models import Team
from web.api.base import BoundedListField, ScopedRelatedField, StrictIntegerField, StrictSerializer

MOUNT_PATH = r"^/[A-Za-z0-9._/-]{1,199}$"


class StorageClassSerializer(serializers.ModelSerializer):
    region = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = StorageClass
        fields = ["id", "slug", "name", "kind", "region", "price_per_gib_month", "min_gib", "max_gib", "is_active"]
        read_only_fields = fields


class AttachmentSerializer(serializers.ModelSerializer):
    reservation_name = serializers.CharField(source="reservation.name", read_only=True)

    class Meta:
        model = VolumeAttachment
        fields = ["id", "reservation", "reservation_name", "read_only", "mount_path", "attached_at", "detached_at"]
        read_only_fields = fields


class VolumeSerializer(serializers.ModelSerializer):
    storage_class = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    kind = serializers.CharField(source="storage_class.kind", read_only=True)
    region = serializers.SlugRelatedField(source="storage_class.region", slug_field="slug", read_only=True)
    team = serializers.UUIDField(source="team_id", read_only=True, allow_null=True)
    encrypted = serializers.SerializerMethodField(help_text="Its data key exists (false once deleted: crypto-erased).")
    attached_to = serializers.SerializerMethodField()

    class Meta:
        model = Volume
        fields = ["id", "name", "storage_class", "kind", "region", "size_gib", "target_gib", "state", "state_reason",
                  "team", "encrypted", "key_destroyed_at", "attached_to", "created_at", "updated_at"]
        read_only_fields = fields

    def get_encrypted(self, volume) -> bool:
        return bool(volume.wrapped_key)

    def get_attached_to(self, volume) -> list[dict]:
        live = [a for a in volume.attachments.all() if a.detached_at is None]
        return AttachmentSerializer(live, many=True).data


class VolumeCreateSerializer(StrictSerializer):
    name = serializers.RegexField(NAME, max_length=63, help_text="Lower-case letters, digits and dashes.")
    storage_class = serializers.SlugRelatedField(
        slug_field="slug", queryset=StorageClass.objects.all(), required=False,
        help_text="A storage class's slug (GET /storage-classes/); a snapshot's own class when left out.")
    size_gib = StrictIntegerField(min_value=1, max_value=2**31 - 1, required=False,
                                  help_text="GiB; a snapshot's size when left out.")
    team = ScopedRelatedField(queryset=Team.objects.all(), required=False, allow_null=True)
    snapshot = ScopedRelatedField(queryset=VolumeSnapshot.objects.select_related("volume__storage_class"),
                                  required=False, help_text="Restore this snapshot of yours into the new volume.")

    def validate(self, attrs):
        taken = attrs.get("snapshot")
        if taken is None:
            missing = [field for field in ("storage_class", "size_gib") if field not in attrs]
            if missing:
                raise serializers.ValidationError({field: ["This field is required."] for field in missing},
                                                  code="required")
            return attrs
        attrs.setdefault("storage_class", taken.volume.storage_class)
        attrs.setdefault("size_gib", taken.size_gib)
        return attrs


class ResizeSerializer(StrictSerializer):
    size_gib = StrictIntegerField(min_value=1, max_value=2**31 - 1, help_text="The new size; larger than now.")


class AttachSerializer(StrictSerializer):
    reservation = ScopedRelatedField(queryset=Reservation.objects.all(), help_text="A reservation of your tenant.")
    read_only = serializers.BooleanField(default=False)
    mount_path = serializers.RegexField(MOUNT_PATH, required=False,
                                        help_text="Where bare metal and containers mount it; /mnt/<name> if left out.")
    restore = BoundedListField(child=serializers.CharField(max_length=255), max_length=50, required=False,
                               help_text="Cold checkpoints of this file system to bring back before the "
                                         "reservation's hand-over (their names).")


class DetachSerializer(StrictSerializer):
    reservation = ScopedRelatedField(queryset=Reservation.objects.all())


class CheckpointPolicySerializer(serializers.ModelSerializer):
    cold_volume_name = serializers.CharField(source="cold_volume.name", read_only=True)

    class Meta:
        model = CheckpointPolicy
        fields = ["cold_volume", "cold_volume_name", "prefix", "demote_after_hours", "keep_hot", "scanned_at"]
        read_only_fields = fields


class CheckpointPolicyWriteSerializer(StrictSerializer):
    cold_volume = ScopedRelatedField(queryset=Volume.objects.all(),
                                     help_text="An object volume of your tenant in the same region: the cold tier.")
    prefix = serializers.RegexField(r"^[A-Za-z0-9._-][A-Za-z0-9._/-]{0,198}$", default="checkpoints/",
                                    help_text="Each entry under it (in the file system) is one checkpoint.")
    demote_after_hours = StrictIntegerField(min_value=1, max_value=24 * 365, default=24)
    keep_hot = StrictIntegerField(min_value=0, max_value=1000, default=2)

    def validate_prefix(self, value):
        if ".." in value.split("/"):
            raise serializers.ValidationError("A path inside the file system, without '..'.")
        return value


class CheckpointSerializer(serializers.ModelSerializer):
    volume_name = serializers.CharField(source="volume.name", read_only=True)
    percent = serializers.SerializerMethodField(help_text="How far a move is (100 when none is in flight).")
    eta = serializers.SerializerMethodField(help_text="When the move in flight should end, at its rate so far.")

    class Meta:
        model = Checkpoint
        fields = ["id", "volume", "volume_name", "name", "state", "state_reason", "size_bytes", "written_at",
                  "last_used_at", "moved_bytes", "percent", "eta", "move_started_at", "moved_at", "restore_for"]
        read_only_fields = fields

    def get_percent(self, checkpoint) -> int:
        return progress(checkpoint).percent

    def get_eta(self, checkpoint) -> str | None:
        eta = progress(checkpoint).eta
        return eta.isoformat() if eta else None


class RestoreSerializer(StrictSerializer):
    reservation = ScopedRelatedField(queryset=Reservation.objects.all(), required=False, allow_null=True,
                                     help_text="Its hand-over waits until the checkpoint is back.")


class CredentialsSerializer(serializers.Serializer):
    access_key_id = serializers.CharField()
    secret_access_key = serializers.CharField(help_text="Shown once: keep it.")
    bucket = serializers.CharField()
    endpoint = serializers.CharField()


class SnapshotSerializer(serializers.ModelSerializer):
    volume_name = serializers.CharField(source="volume.name", read_only=True)

    class Meta:
        model = VolumeSnapshot
        fields = ["id", "volume", "volume_name", "name", "size_gib", "state", "state_reason", "created_at",
                  "updated_at"]
        read_only_fields = fields


class SnapshotCreateSerializer(StrictSerializer):
    volume = ScopedRelatedField(queryset=Volume.objects.select_related("storage_class"),
                                help_text="A block volume or file system of yours.")
    name = serializers.RegexField(NAME, max_length=63, help_text="Lower-case letters, digits and dashes.")
