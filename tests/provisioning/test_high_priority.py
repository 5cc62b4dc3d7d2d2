"""
High-priority teams: the team's record, applying (thresholds, overrides, one pending at a time),
review by a platform approver outside the team (concurrency included), withdrawal, expiry and
revocation by the periodic task, and the bonus in the priority score.
"""

import threading
from datetime import timedelta

import pytest
import time_machine
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from rest_framework.test import APIClient

from provisioning.high_priority import services as hp
from provisioning.scheduling.team_record import team_inputs_many
from provisioning.services import reservation_rescore
from provisioning.tasks import hp_revoke_due as hp_revoke_due_task
from security.audit import audit_record
from security.models import AuditEvent
from tenants.choices import PlatformRole, TeamRole, TenantRole
from tenants.models import HighPriorityApplication, Membership, Notification, Team, TeamMembership
from tests.provisioning.factories import make_reservation
from tests.world import issue_token, make_user, team_record, unique

URL = "/api/v1/high-priority-applications/"
NOTIFICATIONS = "/api/v1/notifications/"


def errors(response) -> list[dict]:
    return response.json()["errors"]


def code(response) -> str:
    return errors(response)[0]["code"]


@pytest.fixture
def team(world) -> Team:
    """t1's team with no application pending (the world files one)."""
    HighPriorityApplication.objects.filter(team=world.t1.team).update(state="withdrawn")
    return world.t1.team


def apply(world, persona="t1_member", **body):
    return world.client(persona).post(URL, {"team": str(world.t1.team.pk), "note": "Paper deadline.", **body},
                                      format="json")


def review(world, application_id, decision="approve", persona="platform_approver", note="The record qualifies."):
    return world.client(persona).post(f"{URL}{application_id}/review/", {"decision": decision, "note": note},
                                      format="json")


def applied(world) -> dict:
    """A pending application of t1's team, whose record qualifies."""
    team_record(world.t1.team)
    response = apply(world)
    assert response.status_code == 201, response.content
    return response.json()


def platform_client(world, user):
    client = world.client("anon")
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_token(user, None)}")
    return client


#
# The team's record
#


def test_record_counts_fulfilment_release_delay_and_unplanned_changes(world, team):
    """Fulfilment over 30 days, average lateness (early releases count 0) and this month's changes after scheduling."""
    made = team_record(team, used=3, no_show=1, late_s=120)
    early = team_record(team, used=1)[0]
    early.released_at = early.ends_at - timedelta(minutes=30)
    early.save(update_fields=["released_at"])
    queued = make_reservation(world, team=team, state="cancelled")  # cancelled before it was ever scheduled
    other_team = Team.objects.create(tenant=team.tenant, name="Other", slug=unique("other"))
    elsewhere = make_reservation(world, team=other_team, state="cancelled", scheduled_at=timezone.now())
    with transaction.atomic():
        for action, target in [("reservation.extend", made[0]), ("reservation.cancel", made[1]),
                               ("reservation.cancel", queued), ("reservation.cancel", elsewhere)]:
            audit_record(actor=world.users["t1_member"], action=action, target=target)

    record = hp.team_hp_record(team, now=timezone.now())

    assert record.fulfilment_rate_30d == pytest.approx(4 / 5)
    assert record.avg_release_delay_s == pytest.approx(3 * 120 / 4)
    assert record.unplanned_changes_month == 2


def test_changes_of_last_month_do_not_count_this_month(world, team):
    """The unplanned-change count starts again on the first of the month."""
    reservation = team_record(team)[0]
    with time_machine.travel(timezone.now() - timedelta(days=40)), transaction.atomic():
        audit_record(actor=None, action="reservation.extend", target=reservation)
    assert hp.team_hp_record(team, now=timezone.now()).unplanned_changes_month == 0


def test_team_without_reservations_has_no_fulfilment_rate_and_is_not_eligible(world, team):
    snapshot = hp.hp_assess(team)
    assert snapshot["figures"]["fulfilment_rate_30d"] is None
    assert snapshot["eligible"] is False
    assert snapshot["reasons"] == ["no reservations in the last 30 days, so no fulfilment rate to qualify on"]


@pytest.mark.parametrize(("used", "no_show", "late_s"), [(3, 0, 0), (19, 1, 0), (20, 0, 400), (1, 1, 0)])
def test_snapshot_is_eligible_exactly_when_every_check_is_met(world, team, used, no_show, late_s):
    team_record(team, used=used, no_show=no_show, late_s=late_s)
    snapshot = hp.hp_assess(team)
    assert snapshot["eligible"] is all(check["met"] for check in snapshot["checks"])
    assert len(snapshot["reasons"]) == sum(not check["met"] for check in snapshot["checks"])


def test_thresholds_come_from_the_setting_at_call_time(world, team, settings):
    """A stricter MERIDIAN_HP_THRESHOLDS refuses a record the defaults accept; a misspelt key is an error."""
    team_record(team, used=3, late_s=100)
    assert hp.hp_assess(team)["eligible"] is True
    settings.MERIDIAN_HP_THRESHOLDS = {"max_avg_release_delay_s": 60}
    assert hp.hp_assess(team)["reasons"] == ["average release delay 1.7 min is not under 1.0 min"]
    settings.MERIDIAN_HP_THRESHOLDS = {"max_release_delay": 60}
    with pytest.raises(ValueError, match="unknown high-priority threshold key"):
        hp.hp_thresholds()


#
# Applying
#


def test_application_below_the_thresholds_is_refused_with_the_reasons(world, team):
    """409 hp_thresholds_not_met lists every missed threshold; nothing is filed or audited."""
    team_record(team, used=3, no_show=1, late_s=600)
    events = AuditEvent.objects.count()

    response = apply(world)

    assert response.status_code == 409, response.content
    error = errors(response)[0]
    assert error["code"] == "hp_thresholds_not_met"
    assert error["meta"]["reasons"] == ["fulfilment rate 75.0% is not above 95.0%",
                                        "average release delay 10.0 min is not under 5.0 min"]
    assert "fulfilment rate 75.0%" in error["detail"]
    assert {c["name"]: c["met"] for c in error["meta"]["checks"]} == {
        "fulfilment_rate_30d": False, "avg_release_delay_s": False, "unplanned_changes_month": True}
    assert not HighPriorityApplication.objects.filter(team=team).exclude(state="withdrawn").exists()
    assert AuditEvent.objects.count() == events


def test_qualifying_team_applies_with_its_record_frozen(world, team):
    """201 pending, the snapshot shows the figures, thresholds and each check met; one audit event."""
    data = applied(world)

    assert data["state"] == "pending"
    assert data["team"] == str(team.pk)
    assert data["applied_by"] == world.users["t1_member"].email
    snapshot = data["snapshot"]
    assert snapshot["eligible"] is True and snapshot["reasons"] == []
    assert snapshot["figures"] == {"fulfilment_rate_30d": 1.0, "avg_release_delay_s": 0.0,
                                   "unplanned_changes_month": 0}
    assert snapshot["thresholds"] == {"min_fulfilment": 0.95, "max_avg_release_delay_s": 300.0,
                                      "max_unplanned_changes": 2}
    assert all(check["met"] for check in snapshot["checks"])
    event = AuditEvent.objects.get(action="high_priority_application.create", target_id=data["id"])
    assert event.actor_id == world.users["t1_member"].pk


def test_second_pending_application_is_a_409(world, team):
    first = applied(world)

    response = apply(world, "t1_admin")

    assert response.status_code == 409
    assert code(response) == "hp_application_pending"
    assert errors(response)[0]["meta"]["application"] == first["id"]


def test_viewer_cannot_apply_even_inside_the_team(world, team):
    """Viewers do not apply (403), in the team or not: neither with their token (it only reads) nor signed in."""
    team_record(team)
    assert apply(world, "t1_viewer").status_code == 403
    TeamMembership.objects.create(team=team, user=world.users["t1_viewer"], role=TeamRole.MEMBER)
    assert code(apply(world, "t1_viewer")) == "token_read_only"
    session = APIClient()
    session.force_login(world.users["t1_viewer"])
    response = session.post(URL, {"team": str(world.t1.team.pk), "note": "Paper deadline."}, format="json")
    assert response.status_code == 403
    assert code(response) == "permission_denied"


def test_member_outside_the_team_cannot_apply(world, team):
    team_record(team)
    TeamMembership.objects.filter(team=team, user=world.users["t1_member"]).delete()
    assert apply(world, "t1_member").status_code == 403
    assert apply(world, "t1_admin").status_code == 201  # tenant admins act for every team


def test_only_a_platform_admin_may_override_the_thresholds(world, team):
    """A member's override note is a 403; an approver does not file applications at all."""
    response = apply(world, override_note="We are important.")
    assert response.status_code == 403
    assert code(response) == "hp_override_not_allowed"
    assert apply(world, "platform_approver", override_note="x").status_code == 403


def test_platform_admin_override_is_accepted_audited_and_told_to_the_team(world, team):
    """Below the thresholds, a platform admin's application with an override note is filed, audited and notified."""
    response = apply(world, "platform_admin", override_note="New team; the launch contract requires it.")

    assert response.status_code == 201, response.content
    data = response.json()
    assert data["override_note"] == "New team; the launch contract requires it."
    assert data["snapshot"]["eligible"] is False
    assert data["snapshot"]["reasons"]
    event = AuditEvent.objects.get(action="high_priority_application.create", target_id=data["id"])
    assert event.actor_id == world.users["platform_admin"].pk
    assert event.after["override_note"] == "New team; the launch contract requires it."
    assert event.after["eligible"] is False
    notices = world.client("t1_member").get(NOTIFICATIONS, {"kind": "high_priority.applied"}).json()["results"]
    assert len(notices) == 1 and "launch contract" in notices[0]["body"]


#
# Review
#


def test_approval_gives_the_team_status_until_the_validity_ends(world, team, settings):
    """The team holds status for MERIDIAN_HP_VALIDITY_DAYS; the applicant and the team are told."""
    settings.MERIDIAN_HP_VALIDITY_DAYS = 30
    data = applied(world)
    with time_machine.travel(timezone.now(), tick=False):
        now = timezone.now()
        response = review(world, data["id"])

    assert response.status_code == 200, response.content
    approved = response.json()
    assert approved["state"] == "approved"
    assert approved["review_note"] == "The record qualifies."
    team.refresh_from_db()
    assert team.high_priority_until == now + timedelta(days=30)
    assert team.high_priority_application_id is not None and str(team.high_priority_application_id) == data["id"]
    assert team.is_high_priority() is True
    assert approved["expires_at"] is not None
    assert world.client("t1_member").get(f"/api/v1/teams/{team.pk}/").json()["high_priority_until"]
    event = AuditEvent.objects.get(action="high_priority_application.approve", target_id=data["id"])
    assert event.actor_id == world.users["platform_approver"].pk
    assert event.after["team_high_priority_until"] == team.high_priority_until.isoformat()
    told = world.client("t1_member").get(NOTIFICATIONS, {"kind": "high_priority.approved"}).json()["results"]
    assert len(told) == 1, "the applicant, in the team, reads the team's notice once"
    assert told[0]["team"] == str(team.pk) and told[0]["user"] is None


def test_an_applicant_who_left_the_team_is_told_in_person(world, team):
    """Out of the team, the applicant no longer reads the team's notice: the outcome comes to them alone, once."""
    data = applied(world)
    TeamMembership.objects.filter(team=team, user=world.users["t1_member"]).delete()

    assert review(world, data["id"]).status_code == 200

    told = world.client("t1_member").get(NOTIFICATIONS, {"kind": "high_priority.approved"}).json()["results"]
    assert [(n["user"], n["team"]) for n in told] == [(str(world.users["t1_member"].pk), None)]
    assert Notification.objects.filter(kind="high_priority.approved", user__isnull=True, team=team).count() == 1


def test_rejection_leaves_the_team_as_it_was_and_says_why(world, team):
    """A rejected renewal keeps the earlier approval; the team reads the outcome and the note."""
    first = applied(world)
    assert review(world, first["id"]).status_code == 200
    team.refresh_from_db()
    until = team.high_priority_until
    renewal = apply(world).json()

    response = review(world, renewal["id"], "reject", note="Renewal is early; apply in the last month.")

    assert response.status_code == 200
    assert response.json()["state"] == "rejected"
    team.refresh_from_db()
    assert team.high_priority_until == until
    assert str(team.high_priority_application_id) == first["id"]
    seen = world.client("t1_member").get(f"{URL}{renewal['id']}/").json()
    assert (seen["state"], seen["review_note"]) == ("rejected", "Renewal is early; apply in the last month.")
    notices = world.client("t1_member").get(NOTIFICATIONS, {"kind": "high_priority.rejected"}).json()["results"]
    assert notices and "apply in the last month" in notices[0]["body"]


def test_approved_renewal_replaces_the_earlier_approval(world, team):
    first = applied(world)
    review(world, first["id"])
    renewal = apply(world).json()
    with time_machine.travel(timezone.now() + timedelta(days=10)):
        assert review(world, renewal["id"]).status_code == 200
    assert HighPriorityApplication.objects.get(pk=first["id"]).state == "expired"
    team.refresh_from_db()
    assert str(team.high_priority_application_id) == renewal["id"]


def test_review_needs_a_note(world, team):
    data = applied(world)
    response = review(world, data["id"], note="")
    assert response.status_code == 400
    assert errors(response)[0]["attr"] == "note"
    assert HighPriorityApplication.objects.get(pk=data["id"]).state == "pending"


@pytest.mark.parametrize("tenant_role", [None, TenantRole.VIEWER, TenantRole.ADMIN])
def test_approver_in_the_team_or_running_its_tenant_cannot_review(world, team, tenant_role):
    """A platform approver who is in the team (or administers its tenant) gets 403 hp_reviewer_in_team."""
    data = applied(world)
    approver = make_user(f"{unique('approver')}@example.com", platform_role=PlatformRole.APPROVER)
    Membership.objects.create(tenant=team.tenant, user=approver, role=tenant_role or TenantRole.MEMBER)
    if tenant_role != TenantRole.ADMIN:
        TeamMembership.objects.create(team=team, user=approver, role=TeamRole.MEMBER)

    response = platform_client(world, approver).post(f"{URL}{data['id']}/review/",
                                                     {"decision": "approve", "note": "Looks fine."}, format="json")

    assert response.status_code == 403, response.content
    assert code(response) == "hp_reviewer_in_team"
    team.refresh_from_db()
    assert team.high_priority_until is None


def test_approver_in_another_team_of_the_tenant_may_review(world, team):
    data = applied(world)
    approver = make_user(f"{unique('approver')}@example.com", platform_role=PlatformRole.APPROVER)
    Membership.objects.create(tenant=team.tenant, user=approver, role=TenantRole.MEMBER)
    other = Team.objects.create(tenant=team.tenant, name="Other", slug=unique("other"))
    TeamMembership.objects.create(team=other, user=approver, role=TeamRole.MEMBER)

    response = platform_client(world, approver).post(f"{URL}{data['id']}/review/",
                                                     {"decision": "reject", "note": "Not now."}, format="json")

    assert response.status_code == 200, response.content


@pytest.mark.django_db(transaction=True)
def test_two_approvals_at_once_one_wins_the_other_is_409(world):
    """Two reviewers approve the same application at once: exactly one 200, one 409 naming the new state."""
    HighPriorityApplication.objects.filter(team=world.t1.team).update(state="withdrawn")
    data = applied(world)
    barrier = threading.Barrier(2)
    outcomes = []

    def approve(persona):
        try:
            barrier.wait(timeout=10)
            response = review(world, data["id"], persona=persona)
            outcomes.append((response.status_code, response.json()))
        except Exception as exc:  # noqa: BLE001 -- recorded, so the test fails with the cause
            outcomes.append((0, repr(exc)))
        finally:
            connection.close()

    threads = [threading.Thread(target=approve, args=(p,)) for p in ("platform_approver", "platform_admin")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(status for status, _ in outcomes) == [200, 409], outcomes
    refused = next(body for status, body in outcomes if status == 409)
    assert refused["errors"][0]["code"] == "hp_application_not_pending"
    assert refused["errors"][0]["meta"]["current_state"] == "approved"
    assert AuditEvent.objects.filter(action="high_priority_application.approve").count() == 1


#
# Withdraw
#


def test_team_withdraws_a_pending_application_once(world, team):
    data = applied(world)
    response = world.client("t1_member").post(f"{URL}{data['id']}/withdraw/")
    assert response.status_code == 200
    assert response.json()["state"] == "withdrawn"

    again = world.client("t1_admin").post(f"{URL}{data['id']}/withdraw/")
    assert again.status_code == 409
    assert code(again) == "hp_application_not_pending"
    late_review = review(world, data["id"])
    assert late_review.status_code == 409
    assert errors(late_review)[0]["meta"]["current_state"] == "withdrawn"


#
# Expiry and revocation
#


def approve_now(world) -> HighPriorityApplication:
    data = applied(world)
    assert review(world, data["id"]).status_code == 200
    return HighPriorityApplication.objects.get(pk=data["id"])


def test_status_expires_when_its_time_is_up(world, team):
    """Past expires_at the score bonus stops at once, and the periodic run marks it expired and tells the team."""
    application = approve_now(world)
    key = (team.tenant_id, team.pk, None)

    with time_machine.travel(application.expires_at + timedelta(hours=1)):
        assert team_inputs_many([key], now=timezone.now(), weights=_weights())[key].high_priority is False
        report = hp.hp_revoke_due()

    assert report == {"expired": 1, "revoked": 0, "kept": 0, "errors": 0}
    application.refresh_from_db()
    team.refresh_from_db()
    assert application.state == "expired"
    assert "ran out" in application.state_reason
    assert team.high_priority_until is None and team.high_priority_application_id is None
    event = AuditEvent.objects.get(action="high_priority_application.expire")
    assert event.actor_id is None and event.target_id == str(application.pk)
    assert Notification.objects.filter(team=team, kind="high_priority.expired").count() == 1


def test_status_is_revoked_when_the_record_falls_below_the_thresholds(world, team):
    """No-shows drop fulfilment below 95 %: revoked with the reason; running again changes nothing."""
    application = approve_now(world)
    team_record(team, used=0, no_show=1)

    report = hp_revoke_due_task()

    assert report == {"expired": 0, "revoked": 1, "kept": 0, "errors": 0}
    application.refresh_from_db()
    team.refresh_from_db()
    assert application.state == "revoked"
    assert "fulfilment rate 75.0% is not above 95.0%" in application.state_reason
    assert team.high_priority_until is None
    event = AuditEvent.objects.get(action="high_priority_application.revoke")
    assert event.after["reasons"] == ["fulfilment rate 75.0% is not above 95.0%"]
    seen = world.client("t1_member").get(f"{URL}{application.pk}/").json()
    assert seen["state"] == "revoked" and "75.0%" in seen["state_reason"]
    notices = world.client("t1_member").get(NOTIFICATIONS, {"kind": "high_priority.revoked"}).json()["results"]
    assert len(notices) == 1 and "75.0%" in notices[0]["body"]

    assert hp.hp_revoke_due() == {"expired": 0, "revoked": 0, "kept": 0, "errors": 0}


def test_status_is_kept_while_the_record_qualifies(world, team):
    approve_now(world)
    assert hp.hp_revoke_due() == {"expired": 0, "revoked": 0, "kept": 1, "errors": 0}
    team.refresh_from_db()
    assert team.is_high_priority() is True


def test_revocation_runs_hourly_from_beat():
    assert settings.CELERY_BEAT_SCHEDULE["tenants.hp_revoke_due"] == {"task": "tenants.hp_revoke_due",
                                                                      "schedule": 3600.0}


#
# The priority score
#


def _weights():
    from provisioning.services import weights

    return weights()


def test_approved_teams_reservation_gets_the_high_priority_factor(world, team):
    """The score breakdown of an approved team's reservation carries the bonus; a tenant-wide one does not."""
    approve_now(world)
    mine = make_reservation(world, team=team, state="queued")
    tenant_wide = make_reservation(world, state="queued")

    reservation_rescore(mine)
    reservation_rescore(tenant_wide)

    bonus = {f["name"]: f for f in mine.score_breakdown["factors"]}["high_priority"]
    assert bonus["value"] == 1.0
    assert bonus["contribution"] == pytest.approx(_weights().high_priority)
    assert {f["name"]: f for f in tenant_wide.score_breakdown["factors"]}["high_priority"]["value"] == 0.0


def test_team_record_reads_every_owner_status_in_one_query(world, team, django_assert_max_num_queries):
    """team_inputs_many adds one query for the high-priority status of all the teams it scores."""
    approve_now(world)
    others = [Team.objects.create(tenant=team.tenant, name=f"T{i}", slug=unique("t")) for i in range(3)]
    keys = [(team.tenant_id, t.pk, None) for t in [team, *others]] + [(team.tenant_id, None, None)]
    with django_assert_max_num_queries(5):
        records = team_inputs_many(keys, now=timezone.now(), weights=_weights())
    assert [records[k].high_priority for k in keys] == [True, False, False, False, False]


#
# Who sees what
#


def test_other_tenant_cannot_see_or_touch_the_application(world, team):
    """Tenant B gets 404 on A's application and never lists it, even filtering by A's team."""
    data = applied(world)
    client = world.client("t2_owner")
    assert client.get(f"{URL}{data['id']}/").status_code == 404
    assert client.post(f"{URL}{data['id']}/withdraw/").status_code == 404
    assert data["id"] not in {row["id"] for row in client.get(URL).json()["results"]}
    assert client.get(URL, {"team": str(team.pk)}).json()["results"] == []
    assert HighPriorityApplication.objects.get(pk=data["id"]).state == "pending"


def test_viewer_outside_the_team_does_not_see_its_application(world, team):
    """Applications are the team's: a tenant viewer outside it gets 404, tenant admins see it."""
    data = applied(world)
    assert world.client("t1_viewer").get(f"{URL}{data['id']}/").status_code == 404
    assert world.client("t1_admin").get(f"{URL}{data['id']}/").status_code == 200


def test_application_outlives_its_applicants_account(world, team):
    """A deleted applicant leaves the application listed, with no applicant."""
    data = applied(world)
    HighPriorityApplication.objects.filter(pk=data["id"]).update(applied_by=None)
    assert world.client("t1_admin").get(f"{URL}{data['id']}/").json()["applied_by"] is None


def test_the_admin_who_filed_on_a_teams_behalf_cannot_also_approve_it(world, team):
    """An override application is decided by another platform reviewer, never by the admin who filed it."""
    filed = apply(world, "platform_admin", override_note="Launch contract.").json()
    response = review(world, filed["id"], persona="platform_admin")
    assert response.status_code == 403 and code(response) == "hp_reviewer_is_applicant"
    assert review(world, filed["id"]).status_code == 200  # the platform approver may


def test_an_override_approval_is_not_revoked_for_the_record_it_was_granted_on(world, team):
    """Granted below the thresholds on purpose: the hourly check revokes it only if the record got worse."""
    team_record(team, used=1, no_show=1)  # 50 % fulfilment: below the thresholds
    filed = apply(world, "platform_admin", override_note="Launch contract.").json()
    assert review(world, filed["id"]).status_code == 200
    assert hp.hp_revoke_due()["revoked"] == 0
    team.refresh_from_db()
    assert team.high_priority_until is not None
    team_record(team, used=0, no_show=2)  # worse than when it was granted
    assert hp.hp_revoke_due()["revoked"] == 1
    application = HighPriorityApplication.objects.get(pk=filed["id"])
    assert application.state == "revoked" and "worsened" in application.state_reason
