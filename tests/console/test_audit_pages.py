"""The audit log: tenant admins and owners read their tenant's events, filtered and paginated."""

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from security.models import AuditEvent
from tenants import services
from tenants.models import APIToken, Membership

pytestmark = pytest.mark.django_db


def add_events(tenant, n: int, *, action="test.event", actor="robot@example.com") -> None:
    AuditEvent.objects.bulk_create([
        AuditEvent(tenant_id=tenant.pk, action=action, actor_email=actor, target_type="tests.thing",
                   target_id=str(uuid.uuid4()), after={"n": i, "nested": {"ok": True}})
        for i in range(n)
    ])


def test_admins_and_owners_read_the_log(console, world):
    for persona in ("t1_admin", "t1_owner"):
        response = console(persona).get(reverse("audit-log"))
        assert response.status_code == 200
        body = response.content.decode()
        assert "invitation.create" in body and "api_token.create" in body


def test_members_and_viewers_may_not(console):
    for persona in ("t1_viewer", "t1_member"):
        assert console(persona).get(reverse("audit-log")).status_code == 403


def test_nobody_posts_to_the_log(console):
    for persona in ("t1_viewer", "t1_admin", "t1_owner"):
        assert console(persona).post(reverse("audit-log"), {"action": "x"}).status_code == 403


def test_only_the_tenants_own_events_are_shown(console, world):
    add_events(world.t2.tenant, 3, action="t2.secret")
    body = console("t1_admin").get(reverse("audit-log")).content.decode()
    assert "t2.secret" not in body
    t2_token = world.t2.objects[APIToken]
    assert str(t2_token.pk)[:8] not in body


def test_newest_first_with_before_and_after_in_details(console, world):
    target = Membership.objects.get(user=world.users["t1_member"])
    services.membership_set_role(actor=world.principal("t1_owner"), membership=target, role="viewer")
    body = console("t1_admin").get(reverse("audit-log")).content.decode()
    rows = body.split("<tbody>", 1)[1]
    assert rows.index("membership.update") < rows.index("invitation.create")
    first = rows.split("</details>")[0]
    assert "<details>" in first and "<pre>member</pre>" in first and "<pre>viewer</pre>" in first
    assert ">token</span>" in first  # made with the owner's API token


def test_filter_by_action_and_actor(console, world):
    add_events(world.t1.tenant, 2, action="thing.made", actor="a@example.com")
    add_events(world.t1.tenant, 3, action="thing.made", actor="b@example.com")
    add_events(world.t1.tenant, 4, action="thing.gone", actor="a@example.com")
    client = console("t1_admin")
    page = client.get(reverse("audit-log"), {"action": "thing.made"}).context["page"]
    assert page.paginator.count == 5 and {e.action for e in page} == {"thing.made"}
    page = client.get(reverse("audit-log"), {"action": "thing.made", "actor": "a@example.com"}).context["page"]
    assert page.paginator.count == 2
    page = client.get(reverse("audit-log"), {"actor": "system"}).context["page"]
    assert all(e.actor_email == "" for e in page)
    body = client.get(reverse("audit-log")).content.decode()
    assert '<option value="thing.gone" >' in body and '<option value="b@example.com" >' in body


def test_pages_of_fifty_keep_the_filter(console, world):
    add_events(world.t1.tenant, 120, action="bulk.event")
    client = console("t1_admin")
    first = client.get(reverse("audit-log"), {"action": "bulk.event"})
    assert len(first.context["page"].object_list) == 50
    assert "?action=bulk.event&amp;page=2" in first.content.decode()
    last = client.get(reverse("audit-log"), {"action": "bulk.event", "page": "3"})
    assert len(last.context["page"].object_list) == 20
    seen = {e.pk for e in first.context["page"]} | {e.pk for e in last.context["page"]}
    assert len(seen) == 70


def test_query_count_does_not_grow_with_events(console, world, django_assert_max_num_queries):
    client = console("t1_admin")
    client.get(reverse("audit-log"))
    with CaptureQueriesContext(connection) as few:
        client.get(reverse("audit-log"))
    add_events(world.t1.tenant, 60)
    add_events(world.t1.tenant, 5, actor="")
    with django_assert_max_num_queries(len(few)):
        response = client.get(reverse("audit-log"))
    assert len(response.context["page"].object_list) == 50


def event_row(body: str, target_id) -> str:
    """The table row of the event whose target is ``target_id``."""
    rows = body.split("<tbody>", 1)[1].split("<td><time ")  # each event's row opens with its time
    return next(row for row in rows if str(target_id) in row)


def test_a_target_is_named_and_linked_not_a_model_and_a_uuid(console, world):
    from provisioning.models import VPC
    from tests.world import world_vpc

    vpc = world_vpc(world.t1.tenant)
    AuditEvent.objects.create(tenant_id=world.t1.tenant.pk, action="vpc.update", actor_email="a@example.com",
                              target_type=VPC._meta.label_lower, target_id=str(vpc.pk), after={"name": vpc.name})

    body = console("t1_admin").get(reverse("audit-log")).content.decode()

    row = event_row(body, vpc.pk)
    assert f'<a href="/vpcs/{vpc.pk}/">VPC {vpc.name}</a>' in row
    assert "provisioning.vpc" not in row
    member = Membership.objects.get(user=world.users["t1_member"])
    services.membership_set_role(actor=world.principal("t1_owner"), membership=member, role="viewer")
    body = console("t1_admin").get(reverse("audit-log")).content.decode()
    assert f'<a href="/teams/">Member {world.users["t1_member"].email}</a>' in body


def test_a_target_that_is_gone_shows_its_kind_and_a_short_id_without_a_link(console, world):
    gone = uuid.uuid4()
    AuditEvent.objects.create(tenant_id=world.t1.tenant.pk, action="reservation.cancel", actor_email="a@example.com",
                              target_type="provisioning.reservation", target_id=str(gone))

    row = event_row(console("t1_admin").get(reverse("audit-log")).content.decode(), gone)

    assert "Reservation" in row and "<a href" not in row
    assert "provisioning.reservation" not in row


def test_another_tenants_object_is_never_named(console, world):
    from provisioning.models import VPC
    from tests.world import world_vpc

    theirs = world_vpc(world.t2.tenant)
    AuditEvent.objects.create(tenant_id=world.t1.tenant.pk, action="vpc.update", actor_email="a@example.com",
                              target_type=VPC._meta.label_lower, target_id=str(theirs.pk))

    row = event_row(console("t1_admin").get(reverse("audit-log")).content.decode(), theirs.pk)
    assert theirs.name not in row and f"/vpcs/{theirs.pk}/" not in row


def test_actions_and_values_read_as_words_rounded_and_in_utc(console, world):
    AuditEvent.objects.create(tenant_id=world.t1.tenant.pk, action="api_token.create", actor_email="a@example.com",
                              target_type="tests.thing", target_id="t-1",
                              after={"score": 0.7234567891, "starts_at": "2026-03-04T05:06:07.891234+00:00"})

    row = event_row(console("t1_admin").get(reverse("audit-log")).content.decode(), "t-1")

    assert "API token create" in row
    assert "<pre>0.723</pre>" in row and "0.7234567891" not in row
    assert "<pre>2026-03-04 05:06:07 UTC</pre>" in row
