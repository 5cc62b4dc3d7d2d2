"""The staff console (platform roles only): fleet, incidents, queue and scheduler, quotas, high-priority reviews."""

from django.urls import path

from operations import staff_incidents, staff_queue, staff_tenants
from operations import staff_views as views

urlpatterns = [
    path("", views.staff_home, name="staff-home"),
    path("search/", views.search, name="staff-search"),
    path("fleet/", views.fleet, name="staff-fleet"),
    path("fleet/nodes/<uuid:pk>/", views.node_detail, name="staff-node"),
    path("fleet/nodes/<uuid:pk>/progress/", views.node_progress, name="staff-node-progress"),
    path("fleet/nodes/<uuid:pk>/<str:verb>/", views.node_act, name="staff-node-act"),
    path("queue/", staff_queue.queue, name="staff-queue"),
    path("queue/<uuid:pk>/<str:verb>/", staff_queue.queue_act, name="staff-queue-act"),
    path("incidents/", staff_incidents.incidents, name="staff-incidents"),
    path("incidents/<uuid:pk>/", staff_incidents.incident_detail, name="staff-incident"),
    path("incidents/<uuid:pk>/<str:verb>/", staff_incidents.incident_act, name="staff-incident-act"),
    path("tenants/", staff_tenants.tenants, name="staff-tenants"),
    path("quotas/", views.quotas, name="staff-quotas"),
    path("quotas/<uuid:pk>/", views.quota_edit, name="staff-quota-edit"),
    path("quotas/<uuid:pk>/delete/", views.quota_delete, name="staff-quota-delete"),
]
