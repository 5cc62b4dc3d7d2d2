"""
The high-priority pages: a team's status, record and applications with the apply and withdraw
forms; the staff review list and page (approve or reject with a note, the reviewer-in-team and
lost-race refusals), a platform admin's application on a team's behalf; who sees what.
"""

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from provisioning.high_priority import services as hp
from tenants.choices import PlatformRole, TeamRole, TenantRole
from tenants.models import HighPriorityApplication, Membership, Notification, Team, TeamMembership
from tests.world import hp_snapshot, make_user, team_record, unique
from web.console import SESSION_TEAM

pytestmark = pytest.mark.django_db

PAGE = "/high-priority/"
STAFF = "/staff/high-priority/"


@pytest.fixture
def team(world) -> Team:
    """t1's team with no application pending (the world files one)."""
    HighPriorityApplication.objects.filter(team=world.t1.team).update(state="withdrawn")
    return world.t1.team


def apply_url(team) -> str:
    return reverse("high-priority-apply", args=[team.pk])


def review_url(application) -> str:
    return reverse("staff-high-priority-review", args=[application.pk])


def pending_of(team) -> HighPriorityApplication:
    return HighPriorityApplication.objects.get(team=team, state="pending")


def applied(console, team) -> HighPriorityApplication:
    """t1's team, with a qualifying record, applies through the page."""
    team_record(team)
    response = console("t1_member").post(apply_url(team), {"note": "Paper deadline in May."})
    assert response.status_code == 302, response.content.decode()
    return pending_of(team)


def approver_in(team, *, tenant_role=TenantRole.MEMBER, in_team=True) -> Client:
    """A platform approver who is also in ``team``'s tenant (and the team), signed in platform-wide."""
    user = make_user(f"{unique('approver')}@example.com", platform_role=PlatformRole.APPROVER)
    Membership.objects.create(tenant=team.tenant, user=user, role=tenant_role)
    if in_team:
        TeamMembership.objects.create(team=team, user=user, role=TeamRole.MEMBER)
    client = Client()
    client.force_login(user)
    return client


#
# Team side
#


def test_member_applies_when_eligible_and_sees_it_pending(console, world, team):
    """A qualifying record opens the form; the filed application is listed pending with its frozen record."""
    team_record(team)
    client = console("t1_member")
    page = client.get(PAGE).content.decode()
    assert "The record meets every threshold" in page
    assert f'action="{apply_url(team)}"' in page and "disabled" not in page
    assert "100.0%" in page and "&gt; 95.0%" in page and "&lt; 5.0 min" in page and "≤ 2" in page

    response = client.post(apply_url(team), {"note": "Paper deadline in May."}, follow=True)

    application = pending_of(team)
    assert response.redirect_chain[-1][0] == f"{PAGE}#application-{application.pk}"
    body = response.content.decode()
    assert f'id="application-{application.pk}"' in body
    assert "Pending review" in body and "Paper deadline in May." in body
    assert "is filed; a platform reviewer decides it" in body
    assert application.applied_by == world.users["t1_member"] and application.snapshot["eligible"] is True
    assert "An application is pending review" in body  # and the form closes while it waits


def test_below_the_thresholds_the_page_says_why_and_an_attempt_files_nothing(console, world, team):
    """The record's shortfalls are listed, the form is disabled, and a post anyway is the service's 409."""
    team_record(team, used=3, no_show=1, late_s=600)
    client = console("t1_member")
    page = client.get(PAGE).content.decode()
    assert "fulfilment rate 75.0% is not above 95.0%" in page
    assert "average release delay 10.0 min is not under 5.0 min" in page
    assert "✗ not met" in page and "disabled" in page
    before = HighPriorityApplication.objects.count()

    response = client.post(apply_url(team), {"note": "Please."})

    assert response.status_code == 409
    body = response.content.decode()
    assert "does not meet the high-priority thresholds: fulfilment rate 75.0% is not above 95.0%; average " \
           "release delay 10.0 min is not under 5.0 min" in body
    assert HighPriorityApplication.objects.count() == before


def test_apply_needs_a_note(console, world, team):
    team_record(team)
    response = console("t1_member").post(apply_url(team), {"note": "  "})
    assert response.status_code == 400 and hp.NOTE_REQUIRED in response.content.decode()
    assert not HighPriorityApplication.objects.filter(team=team, state="pending").exists()


def test_a_second_application_while_one_is_pending_is_refused(console, world, team):
    first = applied(console, team)
    response = console("t1_admin").post(apply_url(team), {"note": "Again."})
    assert response.status_code == 409
    assert f"The team already has a pending application ({first.pk})" in response.content.decode()


def test_viewer_in_the_team_sees_no_form_and_is_refused(console, world, team):
    """Viewers read the team's record and applications; the form is not there and a post is a 403."""
    team_record(team)
    TeamMembership.objects.create(team=team, user=world.users["t1_viewer"], role=TeamRole.MEMBER)
    client = console("t1_viewer")
    page = client.get(PAGE).content.decode()
    assert team.name in page and "The record meets every threshold" in page
    assert apply_url(team) not in page and "Members of the team and the tenant's admins apply" in page

    assert client.post(apply_url(team), {"note": "Let me."}).status_code == 403
    assert not HighPriorityApplication.objects.filter(team=team, state="pending").exists()


def test_viewer_outside_every_team_sees_none(console, world, team):
    page = console("t1_viewer").get(PAGE).content.decode()
    assert "You are in no team" in page and team.name not in page.split("<main", 1)[1]


def test_admin_sees_every_team_and_the_switcher_narrows_it(console, world, team):
    other = Team.objects.create(tenant=team.tenant, name="Vision lab", slug=unique("vision"))
    client = console("t1_admin")
    page = client.get(PAGE).content.decode()
    assert f'id="team-{team.pk}"' in page and f'id="team-{other.pk}"' in page
    session = client.session
    session[SESSION_TEAM] = str(other.pk)
    session.save()
    page = client.get(PAGE).content.decode()
    assert f'id="team-{team.pk}"' not in page and f'id="team-{other.pk}"' in page


def test_member_withdraws_a_pending_application_once(console, world, team):
    application = applied(console, team)
    client = console("t1_member")
    url = reverse("high-priority-withdraw", args=[application.pk])
    response = client.post(url, follow=True)
    assert "is withdrawn" in response.content.decode()
    application.refresh_from_db()
    assert application.state == "withdrawn"

    again = client.post(url, follow=True).content.decode()
    assert "The application is withdrawn; only a pending application can be withdrawn." in again


def test_application_page_and_another_tenants_404(console, world, team):
    """The team reads its application's page; tenant B gets 404 on it, on withdraw, and never lists it."""
    application = applied(console, team)
    url = reverse("high-priority-application", args=[application.pk])
    page = console("t1_member").get(url).content.decode()
    assert "Paper deadline in May." in page and "Record when the team applied" in page and "Withdraw" in page

    outsider = console("t2_member")
    assert outsider.get(url).status_code == 404
    assert outsider.post(reverse("high-priority-withdraw", args=[application.pk])).status_code == 404
    assert str(application.pk) not in outsider.get(PAGE).content.decode()
    assert outsider.post(apply_url(team), {"note": "Theirs."}).status_code == 404
    assert console("t1_viewer").get(url).status_code == 404  # applications are the team's
    staff = console("platform_approver").get(url)
    assert staff.status_code == 302 and staff["Location"] == review_url(application)
    application.refresh_from_db()
    assert application.state == "pending"


#
# Staff review
#


@pytest.mark.parametrize("persona", ["t1_viewer", "t1_member", "t1_owner", "t2_member"])
def test_tenant_users_get_404_on_staff_pages(console, world, persona):
    application = world.t1.objects[HighPriorityApplication]
    client = console(persona)
    assert client.get(STAFF).status_code == 404
    assert client.get(review_url(application)).status_code == 404
    assert client.post(review_url(application), {"decision": "approve", "note": "Mine."}).status_code == 404
    assert client.post(reverse("staff-high-priority-apply"), {"team": str(world.t1.team.pk), "note": "x"}
                       ).status_code == 404
    application.refresh_from_db()
    assert application.state == "pending"


def test_staff_list_shows_pending_first_with_the_frozen_record(console, world, team):
    decided = HighPriorityApplication.objects.create(tenant=team.tenant, team=team, note="Last year's.",
                                                     state="rejected", snapshot=hp_snapshot(eligible=False))
    application = applied(console, team)
    body = console("platform_approver").get(STAFF).content.decode()
    assert body.index(f'id="application-{application.pk}"') < body.index(f'id="application-{decided.pk}"')
    assert world.t1.tenant.name in body and team.name in body and world.users["t1_member"].email in body
    assert "Paper deadline in May." in body and "Fulfilment rate, last 30 days: 100.0% (&gt; 95.0%)" in body
    assert "50.0%" in body and "not met" in body  # the rejected one's record
    assert f'id="application-{world.t2.objects[HighPriorityApplication].pk}"' in body  # every tenant's
    assert "Apply on a team's behalf" not in body  # approvers review, they do not file


def test_approver_outside_the_team_approves_and_the_team_sees_it(console, world, team):
    application = applied(console, team)
    client = console("platform_approver")
    page = client.get(review_url(application)).content.decode()
    assert "Record when filed" in page and "✓ met" in page and 'name="decision"' in page

    response = client.post(review_url(application), {"decision": "approve", "note": "The record qualifies."})

    assert response.status_code == 302 and response["Location"] == review_url(application)
    team.refresh_from_db()
    application.refresh_from_db()
    assert application.state == "approved" and application.reviewed_by == world.users["platform_approver"]
    assert team.high_priority_until == application.expires_at and team.is_high_priority()
    seen = console("t1_member").get(PAGE).content.decode()
    assert "High priority</span> until" in seen and "Approved" in seen
    assert "Reviewer's note:</strong> The record qualifies." in seen
    assert Notification.objects.filter(team=team, kind="high_priority.approved").exists()


def test_rejected_override_shows_the_team_the_outcome_and_the_reasons(console, world, team):
    """A platform admin files over the thresholds; a reviewer rejects; the team reads note and reasons."""
    admin = console("platform_admin")
    assert "Apply on a team's behalf" in admin.get(STAFF).content.decode()
    refused = admin.post(reverse("staff-high-priority-apply"), {"team": str(team.pk), "note": "Launch."})
    assert refused.status_code == 409 and "does not meet the high-priority thresholds" in refused.content.decode()

    filed = admin.post(reverse("staff-high-priority-apply"),
                       {"team": str(team.pk), "note": "Launch.", "override_note": "Contract requires it."})

    application = pending_of(team)
    assert filed.status_code == 302 and filed["Location"] == review_url(application)
    assert application.override_note == "Contract requires it." and application.applied_by == world.users[
        "platform_admin"]
    response = console("platform_approver").post(review_url(application),
                                                 {"decision": "reject", "note": "No record yet; apply in June."})
    assert response.status_code == 302
    seen = console("t1_member").get(PAGE).content.decode()
    assert "Rejected" in seen and "No record yet; apply in June." in seen
    assert "no reservations in the last 30 days, so no fulfilment rate to qualify on" in seen
    assert "Contract requires it." in seen
    team.refresh_from_db()
    assert team.high_priority_until is None


def test_approver_cannot_file_an_application(console, world, team):
    team_record(team)
    response = console("platform_approver").post(reverse("staff-high-priority-apply"),
                                                 {"team": str(team.pk), "note": "For them."})
    assert response.status_code == 403 and hp.APPROVERS_DO_NOT_APPLY in response.content.decode()
    assert not HighPriorityApplication.objects.filter(team=team, state="pending").exists()


@pytest.mark.parametrize(("tenant_role", "in_team"), [(TenantRole.MEMBER, True), (TenantRole.ADMIN, False)])
def test_approver_in_the_team_or_running_its_tenant_is_refused(console, world, team, tenant_role, in_team):
    """The page says why there is no form; a post anyway is the service's 403 with the same words."""
    application = applied(console, team)
    client = approver_in(team, tenant_role=tenant_role, in_team=in_team)
    page = client.get(review_url(application))
    assert page.status_code == 200
    assert "You belong to this team" in page.content.decode() and 'name="decision"' not in page.content.decode()

    response = client.post(review_url(application), {"decision": "approve", "note": "Looks fine."})

    assert response.status_code == 403
    assert hp.REVIEWER_IN_TEAM.replace("'", "&#x27;") in response.content.decode()
    application.refresh_from_db()
    team.refresh_from_db()
    assert application.state == "pending" and team.high_priority_until is None


def test_reject_without_a_note_is_a_form_error(console, world, team):
    application = applied(console, team)
    response = console("platform_approver").post(review_url(application), {"decision": "reject", "note": ""})
    assert response.status_code == 400
    assert hp.NOTE_REQUIRED in response.content.decode()
    application.refresh_from_db()
    assert application.state == "pending"


def test_second_review_of_a_decided_application_is_a_409_naming_its_state(console, world, team):
    """Two reviewers: the one who comes second reads that it is approved already; nothing changes."""
    application = applied(console, team)
    assert console("platform_approver").post(review_url(application),
                                             {"decision": "approve", "note": "Fine."}).status_code == 302

    late = console("platform_admin").post(review_url(application), {"decision": "reject", "note": "No."})

    assert late.status_code == 409
    body = late.content.decode()
    assert "The application is approved; only a pending application can be reviewed." in body
    assert 'name="decision"' not in body
    application.refresh_from_db()
    assert application.state == "approved" and application.review_note == "Fine."


#
# Query counts
#


def _more_applications(world, team, n: int) -> None:
    """``n`` decided applications of ``team``, each with an applicant, a reviewer and a frozen record."""
    HighPriorityApplication.objects.bulk_create([
        HighPriorityApplication(tenant=team.tenant, team=team, applied_by=world.users["t1_admin"], note=f"Old {i}.",
                                state="rejected", reviewed_by=world.users["platform_approver"],
                                review_note="Not then.", snapshot=hp_snapshot(eligible=i % 2 == 0))
        for i in range(n)
    ])


def test_team_page_query_count_does_not_grow_with_applications(console, world, team,
                                                              django_assert_max_num_queries):
    applied(console, team)
    client = console("t1_member")
    client.get(PAGE)
    with CaptureQueriesContext(connection) as few:
        client.get(PAGE)
    _more_applications(world, team, 8)
    with django_assert_max_num_queries(len(few)):
        body = client.get(PAGE).content.decode()
    assert body.count("Old ") >= 8


def test_staff_pages_query_count_does_not_grow_with_applications(console, world, team,
                                                                django_assert_max_num_queries):
    application = applied(console, team)
    client = console("platform_admin")
    client.get(STAFF)
    with CaptureQueriesContext(connection) as few:
        client.get(STAFF)
    _more_applications(world, team, 8)
    _more_applications(world, world.t2.team, 8)
    for i in range(4):
        extra = Team.objects.create(tenant=world.t2.tenant, name=f"Extra {i}", slug=unique("extra"))
        HighPriorityApplication.objects.create(tenant=extra.tenant, team=extra, note=f"Pending {i}.",
                                               applied_by=world.users["t2_member"], snapshot=hp_snapshot(eligible=True))
    with django_assert_max_num_queries(len(few)):
        body = client.get(STAFF).content.decode()
    assert "Pending 3." in body and body.count("Old ") >= 16
    with django_assert_max_num_queries(len(few) + 6):  # the review page adds the record now (hp_assess)
        assert client.get(review_url(application)).status_code == 200
