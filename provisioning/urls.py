"""The console's provisioning pages: reservations, VPCs and quotas with their usage."""

from django.urls import path

from provisioning import quota_views, views
from provisioning.networks import views as vpc_views

urlpatterns = [
    path("reservations/", views.reservation_list, name="reservation-list"),
    path("reservations/new/", views.reservation_new, name="reservation-new"),
    path("reservations/estimate/", views.reservation_estimate, name="reservation-estimate"),
    path("reservations/<uuid:pk>/", views.reservation_detail, name="reservation-detail"),
    path("reservations/<uuid:pk>/progress/", views.reservation_progress, name="reservation-progress"),
    path("reservations/<uuid:pk>/<str:verb>/", views.reservation_act, name="reservation-act"),
    path("instances/<uuid:pk>/console/", views.instance_console, name="instance-console"),
    *vpc_views.urlpatterns,
    path("quotas/", quota_views.quota_list, name="quota-list"),
]
