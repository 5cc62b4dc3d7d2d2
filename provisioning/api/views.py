"""Reservation and operation API: thin views over provisioning.services."""

from datetime import timedelta

from django.db.models import Prefetch
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from cloud.api.serializers import TelemetryQuerySerializer
from provisioning import services, staff_actions
from provisioning.api import serializers as s
from provisioning.api.idempotency import HEADER, IdempotentCreateMixin
from provisioning.filtersets import InstanceFilterSet, OperationFilterSet, ReservationFilterSet
from provisioning.models import Instance, Operation, PortMembership, Reservation, StepRun
from provisioning.scheduling.queue import score_report
from web.api.base import ReadMixin, TenantScopedViewSet

IDEMPOTENCY_PARAMETER = OpenApiParameter(
    HEADER, location=OpenApiParameter.HEADER, required=False,
    description="Any unique string (a UUID): a retry with the same key and body returns the first response.",
)


class ReservationViewSet(ReadMixin, IdempotentCreateMixin, TenantScopedViewSet):
    """Reservations of the tenant (members see their teams' and the tenant-wide ones)."""

    policy = "reservations"
    queryset = Reservation.objects.select_related("offering", "gpu_model", "region")
    serializer_class = s.ReservationSerializer
    create_serializer_class = s.ReservationCreateSerializer
    filterset_class = ReservationFilterSet
    ordering_fields = ["submitted_at", "score", "starts_at", "state"]
    ordering = ["-submitted_at"]

    @extend_schema(request=s.ReservationCreateSerializer, responses={201: s.ReservationSerializer},
                   parameters=[IDEMPOTENCY_PARAMETER])
    def create(self, request, *args, **kwargs):
        """Reserve GPUs: answered ``scheduled`` when placed at once, else ``queued``."""
        return super().create(request, *args, **kwargs)

    def create_once(self, request):
        data = s.ReservationCreateSerializer(data=request.data, context=self.get_serializer_context())
        data.is_valid(raise_exception=True)
        reservation = services.reservation_create(actor=self.principal, ask=data.validated_data["ask"],
                                                  team=data.validated_data.get("team"))
        return Response(s.ReservationSerializer(reservation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        """Cancel before it is active; its capacity is free at once."""
        reservation = services.reservation_cancel(actor=self.principal, reservation=self.get_object())
        return Response(s.ReservationSerializer(reservation).data)

    @extend_schema(request=None, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    def release(self, request, pk=None):
        """Release early: the GPUs go back from now on."""
        reservation = services.reservation_release(actor=self.principal, reservation=self.get_object())
        return Response(s.ReservationSerializer(reservation).data)

    @extend_schema(request=s.ExtendSerializer, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    def extend(self, request, pk=None):
        """Make it longer on the same GPUs, if they are free for the extra time."""
        reservation = self.get_object()
        data = s.ExtendSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        reservation = services.reservation_extend(actor=self.principal, reservation=reservation,
                                                  by=timedelta(hours=data.validated_data["hours"]))
        return Response(s.ReservationSerializer(reservation).data)

    # Platform admins act on waiting work (tenants.permissions: these actions need platform_admin).

    def _staff_act(self, serializer_class, act):
        data = serializer_class(data=self.request.data)
        data.is_valid(raise_exception=True)
        outcome = act(actor=self.principal, reservation=self.get_object(), **data.validated_data)
        return Response(s.ReservationSerializer(outcome).data)

    @extend_schema(request=s.PriorityAdjustSerializer, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    def priority(self, request, pk=None):
        """Platform admins: raise or lower a waiting reservation's score (audited; its team is told)."""
        return self._staff_act(s.PriorityAdjustSerializer, staff_actions.reservation_adjust_priority)

    @extend_schema(request=s.StaffNoteSerializer, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    def hold(self, request, pk=None):
        """Platform admins: keep a waiting reservation out of every placement until it is let go."""
        return self._staff_act(s.StaffNoteSerializer, staff_actions.reservation_hold)

    @extend_schema(request=s.StaffNoteSerializer, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"], url_path="let-go")
    def let_go(self, request, pk=None):
        """Platform admins: put a held reservation back in the race for capacity."""
        return self._staff_act(s.StaffNoteSerializer, staff_actions.reservation_let_go)

    @extend_schema(request=s.StaffCancelSerializer, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"], url_path="operator-cancel")
    def operator_cancel(self, request, pk=None):
        """Platform admins: cancel a reservation that has not become active, with the reason its team reads."""
        return self._staff_act(s.StaffCancelSerializer, staff_actions.reservation_staff_cancel)

    @extend_schema(request=s.ContactSerializer, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    def contact(self, request, pk=None):
        """Platform admins: send the reservation's team a message (the reservation is unchanged)."""
        data = s.ContactSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        reservation = self.get_object()
        staff_actions.reservation_contact(actor=self.principal, reservation=reservation, **data.validated_data)
        return Response(s.ReservationSerializer(reservation).data)

    @extend_schema(responses=s.ReceiptSerializer(many=True))
    @action(detail=True, methods=["get"])
    def receipts(self, request, pk=None):
        """
        Signed attestation receipts (JWT, ES384) of the GPUs this reservation was handed over on;
        verify them with the keys at /.well-known/jwks.json.
        """
        from provisioning.receipts import receipts_of

        page = self.paginate_queryset(receipts_of(self.get_object()))
        return self.get_paginated_response(s.ReceiptSerializer(page, many=True).data)

    @extend_schema(responses=s.ScoreSerializer)
    @action(detail=True, methods=["get"])
    def score(self, request, pk=None):
        """Every factor of the priority score, the queue position and an estimated start."""
        return Response(s.ScoreSerializer(score_report(self.get_object())).data)

    @extend_schema(parameters=[TelemetryQuerySerializer], responses=s.ReservationTelemetrySerializer)
    @action(detail=True, methods=["get"])
    def telemetry(self, request, pk=None):
        """
        Telemetry of the reservation's GPUs, only from the time each was the reservation's: the
        latest sample and a series (1-minute buckets of the last hour by default).
        """
        from provisioning.telemetry import reservation_telemetry

        reservation = self.get_object()
        query = TelemetryQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        return Response(s.ReservationTelemetrySerializer(
            reservation_telemetry(reservation=reservation, **query.validated_data)).data)


    @extend_schema(responses=s.ReservationUsageSerializer)
    @action(detail=True, methods=["get"])
    def usage(self, request, pk=None):
        """
        Whether the reservation's GPUs are used, with the telemetry as evidence, and any pending
        no-show warning or overdue end: what is shown before anything is taken back.
        """
        from provisioning.lifecycle.no_shows import usage_report

        return Response(s.ReservationUsageSerializer(usage_report(self.get_object())).data)


class OperationViewSet(ReadMixin, TenantScopedViewSet):
    """Asynchronous changes of reservations, to poll for progress."""

    policy = "operations"
    queryset = Operation.objects.prefetch_related(Prefetch("steps", queryset=StepRun.objects.order_by("id")))
    serializer_class = s.OperationSerializer
    filterset_class = OperationFilterSet
    ordering_fields = ["created_at", "updated_at"]
    ordering = ["-created_at"]


class InstanceViewSet(ReadMixin, TenantScopedViewSet):
    """The servers, VMs and containers of the tenant's reservations, with how to reach them."""

    policy = "instances"
    queryset = Instance.objects.prefetch_related(
        Prefetch("memberships", queryset=PortMembership.objects.filter(left_at__isnull=True),
                 to_attr="live_memberships"))
    serializer_class = s.InstanceSerializer
    filterset_class = InstanceFilterSet
    ordering_fields = ["created_at", "index"]
    ordering = ["-created_at", "index"]

    @extend_schema(responses=s.ConsoleOutputSerializer)
    @action(detail=True, methods=["get"])
    def console(self, request, pk=None):
        """
        What the instance printed on its serial console (the last MERIDIAN_CONSOLE_OUTPUT_BYTES): its
        boot, cloud-init's run and its host keys. Containers have none. Members and above.
        """
        output, truncated = services.instance_console(instance=self.get_object())
        return Response({"output": output, "truncated": truncated})
