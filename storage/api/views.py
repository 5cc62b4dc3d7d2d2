"""
Storage API: the classes on sale; the tenant's volumes with create, grow, attach, detach, delete,
access keys (object volumes) and a checkpoint policy (file systems); their checkpoints and restores.
"""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.response import Response

from provisioning.api.idempotency import IdempotentCreateMixin
from provisioning.api.views import IDEMPOTENCY_PARAMETER
from storage import checkpoints, services
from storage.api import serializers as s
from storage.api.filtersets import CheckpointFilterSet, SnapshotFilterSet
from storage.choices import VolumeState
from storage.models import Checkpoint, CheckpointPolicy, StorageClass, Volume, VolumeAttachment, VolumeSnapshot
from web.api.base import PlatformViewSet, ReadMixin, TenantScopedViewSet


class StorageClassViewSet(ReadMixin, PlatformViewSet):
    """Storage on sale per region, priced per GiB-month."""

    policy = "storage-classes"
    queryset = StorageClass.objects.select_related("region")
    serializer_class = s.StorageClassSerializer
    filterset_fields = ["kind", "region__slug"]
    ordering = ["region__slug", "kind", "slug"]


class VolumeViewSet(ReadMixin, IdempotentCreateMixin, TenantScopedViewSet):
    """The tenant's volumes and file systems (members see their teams' and the tenant-wide ones)."""

    policy = "volumes"
    queryset = Volume.objects.select_related("storage_class__region").prefetch_related(
        Prefetch("attachments", queryset=VolumeAttachment.objects.filter(detached_at__isnull=True)
                 .select_related("reservation")))
    serializer_class = s.VolumeSerializer
    create_serializer_class = s.VolumeCreateSerializer
    filterset_fields = ["state"]
    ordering_fields = ["name", "created_at", "size_gib"]
    ordering = ["name"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list" and "state" not in self.request.query_params:
            queryset = queryset.exclude(state=VolumeState.DELETED)  # history on request (?state=deleted)
        return queryset

    @extend_schema(request=s.VolumeCreateSerializer, responses={201: s.VolumeSerializer},
                   parameters=[IDEMPOTENCY_PARAMETER])
    def create(self, request, *args, **kwargs):
        """Create a volume: ``creating`` until its backend has it, then ``available``."""
        return super().create(request, *args, **kwargs)

    def create_once(self, request):
        data = s.VolumeCreateSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        attrs = data.validated_data
        volume = services.volume_create(actor=self.principal, storage_class=attrs["storage_class"], name=attrs["name"],
                                        size_gib=attrs["size_gib"], team=attrs.get("team"),
                                        snapshot=attrs.get("snapshot"))
        return Response(self._shown(volume), status=status.HTTP_201_CREATED)

    @extend_schema(responses={202: s.VolumeSerializer})
    def destroy(self, request, pk=None):
        """Delete a volume nothing has attached (409 otherwise): its key is destroyed once its backend removed it."""
        volume = services.volume_delete(actor=self.principal, volume=self.get_object())
        return Response(self._shown(volume), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=s.ResizeSerializer, responses={202: s.VolumeSerializer})
    @action(detail=True, methods=["post"])
    def resize(self, request, pk=None):
        """Grow the volume (never shrink): ``resizing`` until its backend has grown it."""
        volume = self.get_object()  # another tenant's: 404 before anything about the body
        data = s.ResizeSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        volume = services.volume_resize(actor=self.principal, volume=volume, size_gib=data.validated_data["size_gib"])
        return Response(self._shown(volume), status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=s.AttachSerializer, responses=s.VolumeSerializer)
    @action(detail=True, methods=["post"])
    def attach(self, request, pk=None):
        """Attach to a reservation of the same region: a block volume to one, a file system to many."""
        volume = self.get_object()
        data = s.AttachSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        services.volume_attach(actor=self.principal, volume=volume, **data.validated_data)
        return Response(self._shown(volume))

    @extend_schema(request=s.DetachSerializer, responses=s.VolumeSerializer)
    @action(detail=True, methods=["post"])
    def detach(self, request, pk=None):
        """Detach from a reservation."""
        volume = self.get_object()
        data = s.DetachSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        services.volume_detach(actor=self.principal, volume=volume, reservation=data.validated_data["reservation"])
        return Response(self._shown(volume))

    @extend_schema(responses={201: s.CredentialsSerializer})
    @action(detail=True, methods=["post"])
    def credentials(self, request, pk=None):
        """New access keys to an object volume's bucket and nothing else; the secret is shown once."""
        keys = services.volume_credentials(actor=self.principal, volume=self.get_object())
        return Response(s.CredentialsSerializer(keys).data, status=status.HTTP_201_CREATED)

    @extend_schema(methods=["GET"], responses=s.CheckpointPolicySerializer)
    @extend_schema(methods=["PUT"], request=s.CheckpointPolicyWriteSerializer, responses=s.CheckpointPolicySerializer)
    @action(detail=True, methods=["get", "put"], url_path="checkpoint-policy")
    def checkpoint_policy(self, request, pk=None):
        """A file system's checkpoint tiers: keep the newest hot, demote the unused to an object volume."""
        volume = self.get_object()
        if request.method == "GET":
            policy = CheckpointPolicy.objects.select_related("cold_volume").filter(volume=volume).first()
            if policy is None:
                raise NotFound("This volume has no checkpoint policy: PUT one to tier its checkpoints.")
            return Response(s.CheckpointPolicySerializer(policy).data)
        data = s.CheckpointPolicyWriteSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        policy = checkpoints.policy_set(actor=self.principal, volume=volume, **data.validated_data)
        return Response(s.CheckpointPolicySerializer(policy).data)

    def _shown(self, volume: Volume) -> dict:
        return s.VolumeSerializer(self.get_queryset().model.objects.prefetch_related(
            Prefetch("attachments", queryset=VolumeAttachment.objects.filter(detached_at__isnull=True)
                     .select_related("reservation"))).select_related("storage_class__region").get(pk=volume.pk)).data


class SnapshotViewSet(ReadMixin, IdempotentCreateMixin, TenantScopedViewSet):
    """Snapshots of the tenant's block volumes and file systems; a volume is restored from one (POST /volumes/)."""

    policy = "snapshots"
    queryset = VolumeSnapshot.objects.select_related("volume")
    serializer_class = s.SnapshotSerializer
    create_serializer_class = s.SnapshotCreateSerializer
    filterset_class = SnapshotFilterSet
    ordering_fields = ["created_at", "name"]
    ordering = ["-created_at"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list" and "state" not in self.request.query_params:
            queryset = queryset.exclude(state=VolumeState.DELETED)
        return queryset

    @extend_schema(request=s.SnapshotCreateSerializer, responses={201: s.SnapshotSerializer},
                   parameters=[IDEMPOTENCY_PARAMETER])
    def create(self, request, *args, **kwargs):
        """Take a snapshot: ``creating`` until its backend has it, then ``available``."""
        return super().create(request, *args, **kwargs)

    def create_once(self, request):
        data = s.SnapshotCreateSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        taken = services.snapshot_create(actor=self.principal, **data.validated_data)
        return Response(s.SnapshotSerializer(taken).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={202: s.SnapshotSerializer})
    def destroy(self, request, pk=None):
        """Delete a snapshot (409 while a volume is being restored from it)."""
        taken = services.snapshot_delete(actor=self.principal, snapshot=self.get_object())
        return Response(s.SnapshotSerializer(taken).data, status=status.HTTP_202_ACCEPTED)


class CheckpointViewSet(ReadMixin, TenantScopedViewSet):
    """Checkpoints of the tenant's file systems: where each is (hot, cold, on its way) and a move's progress."""

    policy = "checkpoints"
    queryset = Checkpoint.objects.select_related("volume")
    serializer_class = s.CheckpointSerializer
    filterset_class = CheckpointFilterSet
    ordering_fields = ["written_at", "name", "size_bytes"]
    ordering = ["-written_at"]

    @extend_schema(request=s.RestoreSerializer, responses={202: s.CheckpointSerializer})
    @action(detail=True, methods=["post"])
    def restore(self, request, pk=None):
        """Bring a cold checkpoint back to its file system; with a reservation, its hand-over waits for it."""
        checkpoint = self.get_object()
        data = s.RestoreSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        checkpoint = checkpoints.restore(actor=self.principal, checkpoint=checkpoint,
                                         reservation=data.validated_data.get("reservation"))
        return Response(s.CheckpointSerializer(self.get_queryset().get(pk=checkpoint.pk)).data,
                        status=status.HTTP_202_ACCEPTED)
