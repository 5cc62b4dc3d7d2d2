"""/api/v1/: every app's resources on one router, so the route walkers in the tests see them all."""

from django.urls import path
from rest_framework import routers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.reverse import reverse

from billing.api import views as billing_api
from cloud.api import views as cloud
from inference.api import views as inference_api
from operations import api as operations_api
from operations import incident_api
from provisioning.api import high_priority, images, networks, offerings, sla
from provisioning.api import views as provisioning
from security.api import views as security
from security.api.views import AuditEventViewSet
from storage.api import views as storage_api
from tenants.api import views as tenants
from web.api.base import PrincipalMixin
from webhooks.api import views as webhooks_api

# The endpoints beside the router's resources, by the name the root lists them under.
PLAIN_ENDPOINTS = {"me": "me", "audit-chain": "audit-chain", "invitations/accept": "invitation-accept",
                   "schema": "schema", "docs": "swagger-ui"}


class APIRootView(PrincipalMixin, routers.APIRootView):
    """
    GET /api/v1/: every resource by name with its URL, the endpoints beside them, the schema and
    the docs. Open to anyone, like the schema it points to; each resource decides who may use it.
    """

    permission_classes = [AllowAny]

    def get(self, request, *args, **kwargs):
        listed = dict(super().get(request, *args, **kwargs).data)
        listed.update({name: reverse(url_name, request=request) for name, url_name in PLAIN_ENDPOINTS.items()})
        return Response(listed)


class Router(routers.DefaultRouter):
    APIRootView = APIRootView


router = Router()
router.register("tenants", tenants.TenantViewSet, basename="tenants")
router.register("teams", tenants.TeamViewSet, basename="teams")
router.register("memberships", tenants.MembershipViewSet, basename="memberships")
router.register("team-memberships", tenants.TeamMembershipViewSet, basename="team-memberships")
router.register("invitations", tenants.InvitationViewSet, basename="invitations")
router.register("api-tokens", tenants.APITokenViewSet, basename="api-tokens")
router.register("ssh-keys", tenants.SSHKeyViewSet, basename="ssh-keys")
router.register("quotas", tenants.QuotaViewSet, basename="quotas")
router.register("high-priority-applications", high_priority.HighPriorityApplicationViewSet,
                basename="high-priority-applications")
router.register("notifications", tenants.NotificationViewSet, basename="notifications")
router.register("audit-events", AuditEventViewSet, basename="audit-events")
router.register("reservations", provisioning.ReservationViewSet, basename="reservations")
router.register("operations", provisioning.OperationViewSet, basename="operations")
router.register("instances", provisioning.InstanceViewSet, basename="instances")
router.register("vpcs", networks.VPCViewSet, basename="vpcs")
router.register("storage-classes", storage_api.StorageClassViewSet, basename="storage-classes")
router.register("volumes", storage_api.VolumeViewSet, basename="volumes")
router.register("snapshots", storage_api.SnapshotViewSet, basename="snapshots")
router.register("checkpoints", storage_api.CheckpointViewSet, basename="checkpoints")
router.register("prices", billing_api.PriceViewSet, basename="prices")
router.register("usage", billing_api.UsageViewSet, basename="usage")
router.register("invoices", billing_api.InvoiceViewSet, basename="invoices")
router.register("budgets", billing_api.BudgetViewSet, basename="budgets")
router.register("commitments", billing_api.CommitmentViewSet, basename="commitments")
router.register("credits", billing_api.CreditViewSet, basename="credits")
router.register("webhooks", webhooks_api.WebhookEndpointViewSet, basename="webhooks")
router.register("endpoints", inference_api.EndpointViewSet, basename="endpoints")
router.register("webhook-deliveries", webhooks_api.WebhookDeliveryViewSet, basename="webhook-deliveries")
router.register("spot-prices", billing_api.SpotPriceViewSet, basename="spot-prices")
router.register("regions", cloud.RegionViewSet, basename="regions")
router.register("gpu-models", cloud.GPUModelViewSet, basename="gpu-models")
router.register("offerings", offerings.OfferingViewSet, basename="offerings")
router.register("images", images.ImageViewSet, basename="images")
router.register("fabrics", cloud.FabricViewSet, basename="fabrics")
router.register("nodes", operations_api.NodeViewSet, basename="nodes")
router.register("gpus", cloud.GPUViewSet, basename="gpus")
router.register("trust-anchors", security.TrustAnchorViewSet, basename="trust-anchors")
router.register("revocations", security.RevocationViewSet, basename="revocations")
router.register("reference-measurements", security.ReferenceMeasurementViewSet, basename="reference-measurements")
router.register("reference-manifests", security.ReferenceManifestViewSet, basename="reference-manifests")
router.register("ocsp-statuses", security.OcspStatusViewSet, basename="ocsp-statuses")
router.register("attestation-reports", security.AttestationReportViewSet, basename="attestation-reports")
router.register("sla", sla.SLAViewSet, basename="sla")
router.register("incidents", incident_api.IncidentViewSet, basename="incidents")

urlpatterns = [
    path("me/", tenants.MeView.as_view(), name="me"),
    path("audit-chain/", security.AuditChainView.as_view(), name="audit-chain"),
    path("invitations/accept/", tenants.InvitationAcceptView.as_view(), name="invitation-accept"),
    *router.urls,
]
