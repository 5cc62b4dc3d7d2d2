"""
The console's high-priority pages (team side and staff review); included at the site's root, so
the staff pages sit beside operations/staff_urls.py's under /staff/.
"""

from django.urls import path

from provisioning.high_priority import views

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
]
