"""
The console's high-priority pages (team side and staff review) and notifications; included at the
site's root, so the staff pages sit beside cloud/staff_urls.py's under /staff/.
"""

from django.urls import path

from . import high_priority_views as views

urlpatterns = [
    # Team side
    path("high-priority/", views.high_priority, name="high-priority"),
    path("high-priority/teams/<uuid:team_pk>/apply/", views.high_priority_apply, name="high-priority-apply"),
    path("high-priority/applications/<uuid:pk>/", views.high_priority_application, name="high-priority-application"),
    path("high-priority/applications/<uuid:pk>/withdraw/", views.high_priority_withdraw,
         name="high-priority-withdraw"),
    # Staff review
    path("staff/high-priority/", views.staff_high_priority, name="staff-high-priority"),
    path("staff/high-priority/apply/", views.staff_high_priority_apply, name="staff-high-priority-apply"),
    path("staff/high-priority/<uuid:pk>/", views.staff_high_priority_review, name="staff-high-priority-review"),
    # Notifications (names apart from the API router's "notifications-*")
    path("notifications/", views.notification_list, name="notification-list"),
    path("notifications/read-all/", views.notification_read_all, name="notification-read-all"),
    path("notifications/<uuid:pk>/read/", views.notification_read, name="notification-read"),
]
