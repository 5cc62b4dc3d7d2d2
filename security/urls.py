"""The console's security pages: the tenant's audit log."""

from django.urls import path

from security import views

urlpatterns = [
    path("audit/", views.audit_log, name="audit-log"),
]
