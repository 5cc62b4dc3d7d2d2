"""Staff's response to incidents: acknowledge, assign, resolve (services and /api/v1/incidents/), each audited."""

from __future__ import annotations

import pytest
from django.utils import timezone

from core.errors import Conflict, DomainError, Forbidden
from security.incident_response import incident_acknowledge, incident_assign, incident_resolve
from security.models import AuditEvent, Incident, IncidentNotice
from tenants.choices import PlatformRole
from tests.world import fleet_node, make_user, unique

pytestmark = pytest.mark.django_db
V1 = "/api/v1/incidents"


@pytest.fixture
def admin(world):
    return world.users["platform_admin"]


@pytest.fixture
def other_admin(db):
    return make_user(f"{unique('oncall')}@meridian.example", platform_role=PlatformRole.ADMIN)


def platform_incident(**fields) -> Incident:
    return Incident.objects.create(**{"kind": "gpu_reset", "summary": "gpu-a-001: GPU 3 reset (XID 79)",
                                      "evidence": {"cause": "xid"}, **fields})


def events(action: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action=action))


#
# Services
#


def test_acknowledge_records_who_and_when_once(admin, other_admin):
    incident = platform_incident()
    first = incident_acknowledge(actor=admin, incident=incident)
    again = incident_acknowledge(actor=other_admin, incident=incident)
    assert first.acknowledged_by == admin and again.acknowledged_by == admin
    assert again.acknowledged_at == first.acknowledged_at
    [event] = events("incident.acknowledge")
    assert event.actor_email == admin.email and event.target_id == str(incident.pk)


def test_a_resolved_incident_cannot_be_acknowledged_or_assigned(admin):
    incident = platform_incident(resolved_at=timezone.now())  # detection saw the condition clear
    with pytest.raises(Conflict) as refused:
        incident_acknowledge(actor=admin, incident=incident)
    assert refused.value.get_codes() == "incident_resolved" and refused.value.status_code == 409
    with pytest.raises(Conflict):
        incident_assign(actor=admin, incident=incident, assignee=admin)
    assert not events("incident.acknowledge") and not events("incident.assign")


def test_only_platform_admins_act_and_only_they_can_be_assigned(world, admin):
    incident = platform_incident()
    for persona in ("platform_approver", "t1_owner"):
        with pytest.raises(Forbidden):
            incident_acknowledge(actor=world.users[persona], incident=incident)
        with pytest.raises(DomainError) as refused:
            incident_assign(actor=admin, incident=incident, assignee=world.users[persona])
        assert refused.value.get_codes() == {"assignee": ["not_staff"]}
    gone = make_user(f"{unique('gone')}@meridian.example", platform_role=PlatformRole.ADMIN, is_active=False)
    with pytest.raises(DomainError):
        incident_assign(actor=admin, incident=incident, assignee=gone)
    assert not events("incident.assign")


def test_assigning_tells_the_assignee_unless_they_took_it_themselves(admin, other_admin):
    incident = platform_incident()
    incident_assign(actor=admin, incident=incident, assignee=admin)
    assert not IncidentNotice.objects.exists()  # one's own doing needs no message
    incident_assign(actor=admin, incident=incident, assignee=other_admin)
    notices = {n.to: n for n in IncidentNotice.objects.all()}
    assert set(notices) == {other_admin.email}  # the previous assignee did it: no message to them
    assert f"assigned to you by {admin.email}" in notices[other_admin.email].subject
    assert f"/staff/incidents/{incident.pk}/" in notices[other_admin.email].body
    again = incident_assign(actor=admin, incident=incident, assignee=other_admin)
    assert again.assignee == other_admin and IncidentNotice.objects.count() == 1  # the same: nothing changes
    assign_events = events("incident.assign")
    assert len(assign_events) == 2
    assert assign_events[0].before == {"assignee": str(admin.pk)}
    assert assign_events[0].after["assignee_email"] == other_admin.email


def test_someone_else_acting_on_your_incident_tells_you(admin, other_admin):
    incident = platform_incident()
    incident_assign(actor=other_admin, incident=incident, assignee=admin)  # admin is told
    incident_acknowledge(actor=other_admin, incident=incident)  # and again
    incident_resolve(actor=other_admin, incident=incident, note="Reseated the riser card.")
    subjects = list(IncidentNotice.objects.filter(to=admin.email).order_by("created_at").values_list("subject",
                                                                                                    flat=True))
    assert len(subjects) == 3
    assert "acknowledged by" in subjects[1] and "resolved by" in subjects[2]
    incident_assign(actor=admin, incident=platform_incident(), assignee=admin)
    assert IncidentNotice.objects.count() == 3


def test_resolve_needs_a_note_keeps_it_and_is_idempotent(admin, other_admin):
    incident = platform_incident()
    for note in ("", "   "):
        with pytest.raises(DomainError):
            incident_resolve(actor=admin, incident=incident, note=note)
    with pytest.raises(DomainError):
        incident_resolve(actor=admin, incident=incident, note="x" * 2001)
    done = incident_resolve(actor=admin, incident=incident, note="  Replaced the GPU.  ")
    assert done.resolved_by == admin and done.resolution_note == "Replaced the GPU." and done.resolved_at
    again = incident_resolve(actor=other_admin, incident=incident, note="Something else")
    assert again.resolved_by == admin and again.resolution_note == "Replaced the GPU."
    assert again.resolved_at == done.resolved_at
    [event] = events("incident.resolve")
    assert event.after["note"] == "Replaced the GPU."


def test_resolving_a_platform_incident_resolves_its_tenants_copies_but_not_a_node_failures(admin, world):
    platform = platform_incident()
    copy = platform_incident(tenant_id=world.t1.tenant.pk, evidence={"platform_incident": str(platform.pk)})
    failure = platform_incident(kind="node_failure")
    waiting = platform_incident(kind="node_failure", tenant_id=world.t1.tenant.pk,
                                evidence={"platform_incident": str(failure.pk), "replacement": {"state": "pending"}})
    incident_resolve(actor=admin, incident=platform, note="The GPU came back after its reset.")
    incident_resolve(actor=admin, incident=failure, note="The node is in repair.")
    copy.refresh_from_db()
    waiting.refresh_from_db()
    assert copy.resolved_at is not None and copy.resolved_by is None
    assert waiting.resolved_at is None  # the replacement ends it when the tenant has hardware again
    assert [e.after["tenant_incidents_resolved"] for e in events("incident.resolve")] in ([1, 0], [0, 1])


def test_detection_resolving_an_acknowledged_incident_keeps_the_response(admin):
    incident = platform_incident()
    incident_acknowledge(actor=admin, incident=incident)
    Incident.objects.filter(pk=incident.pk).update(resolved_at=timezone.now())  # as detection does
    incident.refresh_from_db()
    assert incident.acknowledged_by == admin and incident.resolved_by is None
    assert incident_resolve(actor=admin, incident=incident, note="Already over.").resolved_by is None


#
# The API
#


def test_staff_list_filters_and_names_the_node(world, admin):
    node = fleet_node()
    on_node = platform_incident(node_id=node.pk)
    closed = platform_incident(kind="node_drain", resolved_at=timezone.now())
    client = world.client("platform_admin")

    listed = {row["id"]: row for row in client.get(f"{V1}/", {"open": "true"}).json()["results"]}
    assert str(on_node.pk) in listed and str(closed.pk) not in listed
    row = listed[str(on_node.pk)]
    assert row["node"] == node.hostname and row["region"] == node.region.slug and row["severity"] == "warning"
    assert row["state"] == "open" and row["evidence"] == {"cause": "xid"}

    by_kind = client.get(f"{V1}/", {"kind": "node_drain"}).json()["results"]
    assert [r["id"] for r in by_kind] == [str(closed.pk)]
    assert [r["id"] for r in client.get(f"{V1}/", {"node": str(node.pk)}).json()["results"]] == [str(on_node.pk)]
    client.post(f"{V1}/{on_node.pk}/assign/", {"assignee": str(admin.pk)}, format="json")
    mine = client.get(f"{V1}/", {"assignee": str(admin.pk)}).json()["results"]
    assert [(r["id"], r["assignee"], r["state"]) for r in mine] == [(str(on_node.pk), admin.email, "assigned")]


def test_actions_through_the_api(world, admin, other_admin):
    incident = platform_incident()
    client = world.client("platform_admin")
    acked = client.post(f"{V1}/{incident.pk}/acknowledge/", format="json")
    assert acked.status_code == 200 and acked.json()["acknowledged_by"] == admin.email
    assigned = client.post(f"{V1}/{incident.pk}/assign/", {"assignee": other_admin.email.upper()}, format="json")
    assert assigned.status_code == 200 and assigned.json()["assignee"] == other_admin.email
    resolved = client.post(f"{V1}/{incident.pk}/resolve/", {"note": "Fixed."}, format="json")
    assert resolved.status_code == 200
    assert resolved.json()["state"] == "resolved" and resolved.json()["resolution_note"] == "Fixed."
    late = client.post(f"{V1}/{incident.pk}/acknowledge/", format="json")
    assert late.status_code == 409 and late.json()["errors"][0]["code"] == "incident_resolved"
    assert client.post(f"{V1}/{incident.pk}/resolve/", {"note": "Again."}, format="json").status_code == 200


def test_a_tenant_reads_its_own_incidents_in_the_short_form_and_never_anothers(world):
    own = world.t1.objects[Incident]
    theirs = world.t2.objects[Incident]
    platform = platform_incident()
    client = world.client("t1_viewer")
    listed = client.get(f"{V1}/").json()["results"]
    assert [row["id"] for row in listed] == [str(own.pk)]
    assert set(listed[0]) == {"id", "kind", "summary", "state", "reservation_id", "gpus_affected",
                              "impact_started_at", "detected_at", "acknowledged_at", "restored_at", "resolved_at"}
    assert client.get(f"{V1}/{theirs.pk}/").status_code == 404
    assert client.get(f"{V1}/{platform.pk}/").status_code == 404
    assert world.client("t1_owner").post(f"{V1}/{own.pk}/acknowledge/", format="json").status_code == 403
    assert world.client("platform_approver").post(f"{V1}/{own.pk}/acknowledge/", format="json").status_code == 403


def test_acknowledge_refuses_a_body_it_does_not_take(world):
    incident = platform_incident()
    response = world.client("platform_admin").post(f"{V1}/{incident.pk}/acknowledge/", {"note": "x"}, format="json")
    assert response.status_code == 400 and response.json()["errors"][0]["code"] == "unknown_field"
    assert Incident.objects.get(pk=incident.pk).acknowledged_at is None
