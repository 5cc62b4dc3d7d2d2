"""The SLA pages: the tenant's at /sla/, staff's at /staff/sla/ (included at the site root)."""

from django.urls import path

from provisioning.sla import views

urlpatterns = [
    path("sla/", views.sla_tenant, name="sla"),
    path("staff/sla/", views.sla_staff, name="staff-sla"),
    path("staff/sla/<uuid:pk>/", views.sla_staff_tenant, name="staff-sla-tenant"),
]
