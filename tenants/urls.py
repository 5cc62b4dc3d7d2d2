"""The console's tenant pages: teams and members, API tokens and invitations."""

from django.urls import path

from tenants import notification_views, views

urlpatterns = [
    # API tokens
    path("tokens/", views.token_list, name="token-list"),
    path("tokens/new/", views.token_create, name="token-create"),
    path("tokens/<uuid:pk>/issued/", views.token_issued, name="token-issued"),
    path("tokens/<uuid:pk>/revoke/", views.token_revoke, name="token-revoke"),
    # SSH keys
    path("ssh-keys/", views.ssh_key_list, name="ssh-key-list"),
    path("ssh-keys/new/", views.ssh_key_create, name="ssh-key-create"),
    path("ssh-keys/<uuid:pk>/remove/", views.ssh_key_remove, name="ssh-key-remove"),
    # Teams, members and invitations
    path("teams/", views.team_list, name="team-list"),
    path("teams/new/", views.team_create, name="team-create"),
    path("teams/<uuid:team_pk>/members/", views.team_membership_add, name="team-membership-add"),
    path("teams/team-members/<uuid:pk>/role/", views.team_membership_role, name="team-membership-role"),
    path("teams/team-members/<uuid:pk>/remove/", views.team_membership_remove, name="team-membership-remove"),
    path("teams/members/<uuid:pk>/role/", views.membership_role, name="membership-role"),
    path("teams/members/<uuid:pk>/remove/", views.membership_remove, name="membership-remove"),
    path("teams/invitations/new/", views.invitation_create, name="invitation-create"),
    path("teams/invitations/<uuid:pk>/", views.invitation_created, name="invitation-created"),
    path("teams/invitations/<uuid:pk>/revoke/", views.invitation_revoke, name="invitation-revoke"),
    # Notifications (names apart from the API router's "notifications-*")
    path("notifications/", notification_views.notification_list, name="notification-list"),
    path("notifications/read-all/", notification_views.notification_read_all, name="notification-read-all"),
    path("notifications/<uuid:pk>/read/", notification_views.notification_read, name="notification-read"),
]
