"""The staff fleet and node pages: staff only, a fixed query count however big the fleet, node actions."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from cloud.choices import Health, NodeState
from cloud.fleet import FleetSpec, build_fleet
from cloud.models import GPU, Node
from provisioning.models import Allocation, Operation, Reservation
from security.models import Incident
from tests.world import small_fleet

pytestmark = pytest.mark.django_db

TENANT_PERSONAS = ["t1_viewer", "t1_member", "t1_owner", "t2_member"]


@pytest.fixture
def fleet(world) -> list[Node]:
    return small_fleet(8)


def bare_metal(fleet) -> Node:
    return next(n for n in sorted(fleet, key=lambda n: n.hostname) if n.state == NodeState.AVAILABLE)


def tile_of(body: str, hostname: str) -> str:
    """The class attribute of the fleet tile whose label names ``hostname``."""
    match = re.search(r'<a class="(tile [^"]*)" href="[^"]*" title="' + re.escape(hostname) + ":", body)
    assert match, f"no tile for {hostname}"
    return match.group(1)


def staff_urls(node: Node) -> list[tuple[str, str]]:
    base = f"/staff/fleet/nodes/{node.pk}/"
    return [("get", "/staff/fleet/"), ("get", base), ("get", f"{base}progress/"),
            ("post", f"{base}maintenance/"), ("post", f"{base}return/"), ("post", f"{base}validate/"),
            ("get", f"{base}maintenance/")]


@pytest.mark.parametrize("persona", TENANT_PERSONAS)
def test_tenant_users_get_404_on_every_fleet_url(console, fleet, persona):
    client = console(persona)
    node = bare_metal(fleet)
    for method, url in staff_urls(node):
        response = getattr(client, method)(url, {"reason": "x"} if method == "post" else None)
        assert response.status_code == 404, (method, url, response.status_code)
    node.refresh_from_db()
    assert node.state == NodeState.AVAILABLE


def test_tenant_user_keeps_the_tenant_chosen_after_trying_a_staff_page(console, world, fleet):
    client = console("t1_member")
    client.get("/staff/fleet/")
    assert world.t1.tenant.name in client.get("/").content.decode()


def test_signed_out_goes_to_login(console, fleet):
    response = console("anon").get("/staff/fleet/")
    assert response.status_code == 302 and response["Location"].startswith("/login/")


@pytest.mark.parametrize("persona", ["platform_approver", "platform_admin"])
def test_staff_read_the_fleet_and_a_node(console, fleet, persona):
    client = console(persona)
    node = bare_metal(fleet)
    body = client.get("/staff/fleet/").content.decode()
    assert node.hostname in body and node.leaf.name in body and node.fabric.name in body
    page = client.get(f"/staff/fleet/nodes/{node.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    gpu = node.gpus.order_by("index").first()
    assert gpu.serial in text and node.ib_ports.first().guid in text
    assert ("Drain: hold for maintenance" in text) is (persona == "platform_admin")


def test_approver_reads_but_cannot_act(console, fleet):
    client = console("platform_approver")
    node = bare_metal(fleet)
    base = f"/staff/fleet/nodes/{node.pk}/"
    assert client.post(f"{base}maintenance/", {"reason": "disk swap"}).status_code == 403
    assert client.post(f"{base}validate/").status_code == 403
    node.refresh_from_db()
    assert node.state == NodeState.AVAILABLE
    assert not Operation.objects.filter(node=node).exists()


def test_admin_holds_a_node_for_maintenance_and_returns_it(console, fleet):
    client = console("platform_admin")
    node = bare_metal(fleet)
    base = f"/staff/fleet/nodes/{node.pk}/"
    response = client.post(f"{base}maintenance/", {"reason": "Replace a PSU"}, follow=True)
    node.refresh_from_db()
    assert node.state == NodeState.MAINTENANCE and node.state_reason == "Replace a PSU"
    body = response.content.decode()
    assert "held for maintenance" in body and "Return to service" in body
    client.post(f"{base}return/")
    node.refresh_from_db()
    assert node.state == NodeState.AVAILABLE


def test_maintenance_needs_a_reason(console, fleet):
    node = bare_metal(fleet)
    response = console("platform_admin").post(f"/staff/fleet/nodes/{node.pk}/maintenance/", {"reason": " "},
                                               follow=True)
    assert "Give a reason" in response.content.decode()
    node.refresh_from_db()
    assert node.state == NodeState.AVAILABLE


def test_a_refused_action_is_a_message_not_a_500(console, world, fleet):
    """A node carrying a tenant's work cannot be held: the service's 409 is shown on the page."""
    node = bare_metal(fleet)
    gpu = node.gpus.get(index=0)
    now = timezone.now()
    Allocation.objects.create(reservation=world.t1.objects[Reservation], gpu=gpu, node=node, mem_lo=0,
                              mem_hi=gpu.memory_mib, starts_at=now - timedelta(hours=1),
                              ends_at=now + timedelta(hours=1))
    client = console("platform_admin")
    response = client.post(f"/staff/fleet/nodes/{node.pk}/maintenance/", {"reason": "PSU"}, follow=True)
    body = response.content.decode()
    assert response.status_code == 200 and "drain it before maintenance" in body
    assert world.t1.tenant.name in body  # the GPU's current holder
    node.refresh_from_db()
    assert node.state == NodeState.AVAILABLE
    # Returning a node that is not held is refused the same way.
    body = client.post(f"/staff/fleet/nodes/{node.pk}/return/", follow=True).content.decode()
    assert "cannot move to" in body


def test_validation_starts_and_the_page_polls_while_it_runs(console, fleet):
    client = console("platform_admin")
    node = bare_metal(fleet)
    base = f"/staff/fleet/nodes/{node.pk}/"
    client.post(f"{base}validate/")
    node.refresh_from_db()
    assert node.state == NodeState.VALIDATING
    operation = Operation.objects.get(node=node, kind="validate")
    page = client.get(base).content.decode()
    assert f'hx-get="{base}progress/"' in page and 'hx-trigger="every 2s"' in page
    partial = client.get(f"{base}progress/", HTTP_HX_REQUEST="true").content.decode()
    assert 'hx-trigger="every 2s"' in partial and "<html" not in partial
    Operation.objects.filter(pk=operation.pk).update(state="succeeded", finished_at=timezone.now())
    partial = client.get(f"{base}progress/", HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in partial  # polling stops when nothing runs


def test_unknown_action_and_node_are_404(console, fleet):
    client = console("platform_admin")
    node = bare_metal(fleet)
    assert client.post(f"/staff/fleet/nodes/{node.pk}/explode/").status_code == 404
    assert client.get("/staff/fleet/nodes/00000000-0000-0000-0000-000000000000/").status_code == 404


def test_a_faulty_node_is_coloured_faulty(console, fleet):
    faulty, failing = sorted(fleet, key=lambda n: n.hostname)[:2]
    Node.objects.filter(pk=faulty.pk).update(state=NodeState.FAULTY)
    GPU.objects.filter(node=failing, index=3).update(health=Health.FAILED)
    body = console("platform_admin").get("/staff/fleet/").content.decode()
    assert "state-faulty" in tile_of(body, faulty.hostname).split()
    failing_tile = tile_of(body, failing.hostname).split()
    assert "health-failed" in failing_tile and f"state-{failing.state}" in failing_tile
    assert "Faulty: 1" in body  # the count on top


def test_filters_by_region_and_state(console, fleet):
    client = console("platform_admin")
    build_fleet(FleetSpec(regions=1, first_region=1, nodes_per_fabric=4))
    other = Node.objects.exclude(region=fleet[0].region).first()
    body = client.get("/staff/fleet/", {"region": fleet[0].region.slug}).content.decode()
    assert fleet[0].hostname in body and other.hostname not in body
    shared = Node.objects.filter(region=fleet[0].region, state=NodeState.IN_SERVICE).first()
    body = client.get("/staff/fleet/", {"state": NodeState.IN_SERVICE}).content.decode()
    assert shared.hostname in body and bare_metal(fleet).hostname not in body
    response = client.get("/staff/fleet/", {"state": "on-fire", "region": "atlantis"})
    assert response.status_code == 200 and "Select a valid choice" in response.content.decode()


def test_fleet_query_count_does_not_grow_with_nodes(console, fleet, django_assert_max_num_queries):
    client = console("platform_admin")
    client.get("/staff/fleet/")  # warm the session
    with CaptureQueriesContext(connection) as small:
        assert client.get("/staff/fleet/").status_code == 200
    build_fleet(FleetSpec(regions=1, first_region=1, nodes_per_fabric=80))
    Node.objects.filter(hostname__endswith="n0003").update(state=NodeState.FAULTY)
    with django_assert_max_num_queries(len(small)):
        body = client.get("/staff/fleet/").content.decode()
    assert body.count('<a class="tile ') == Node.objects.count()


def test_node_page_query_count_does_not_grow_with_history(console, world, fleet, django_assert_max_num_queries):
    client = console("platform_admin")
    node = bare_metal(fleet)
    url = f"/staff/fleet/nodes/{node.pk}/"
    client.get(url)
    with CaptureQueriesContext(connection) as few:
        client.get(url)
    for i in range(5):
        operation = Operation.objects.create(node=node, kind="attest", state="succeeded", step="verify")
        operation.steps.create(node=node, name="verify", attempt=1, state="succeeded", finished_at=timezone.now())
        Incident.objects.create(kind="xid", summary=f"XID 79 #{i}", node_id=node.pk)
    with django_assert_max_num_queries(len(few)):
        body = client.get(url).content.decode()
    assert "XID 79 #4" in body


def test_a_faulty_node_goes_to_repair_and_back_through_validation(console, world):
    from cloud.models import Node
    from tests.world import small_fleet

    node = small_fleet(2)[0]
    Node.objects.filter(pk=node.pk).update(state="faulty")
    admin = console("platform_admin")
    assert "Send to repair" in admin.get(f"/staff/fleet/nodes/{node.pk}/").content.decode()
    assert console("platform_approver").post(f"/staff/fleet/nodes/{node.pk}/repair/").status_code == 403
    admin.post(f"/staff/fleet/nodes/{node.pk}/repair/", {"reason": "PSU swap"})
    node.refresh_from_db()
    assert node.state == "repair"
    admin.post(f"/staff/fleet/nodes/{node.pk}/repaired/")
    node.refresh_from_db()
    assert node.state == "validating"


def tile_title(body: str, hostname: str) -> str:
    match = re.search(r'<a class="tile [^"]*" href="[^"]*" title="(' + re.escape(hostname) + ':[^"]*)"', body)
    assert match, f"no tile for {hostname}"
    return match.group(1)


def hold(world, node: Node, gpus: int) -> None:
    """``gpus`` GPUs of ``node`` held now by a reservation of the world's first tenant."""
    from tests.provisioning.factories import held, make_reservation

    now = timezone.now()
    held(make_reservation(world, state="active"), list(node.gpus.order_by("index")[:gpus]),
         start=now - timedelta(minutes=5), end=now + timedelta(hours=1))


def test_a_shared_host_is_drawn_apart_from_a_bare_metal_node(console, fleet):
    shared = next(n for n in fleet if n.pool == "shared" and not n.is_spare)
    body = console("platform_admin").get("/staff/fleet/").content.decode()
    shared_tile, bare_tile = tile_of(body, shared.hostname).split(), tile_of(body, bare_metal(fleet).hostname).split()
    assert "pool-shared" in shared_tile and "pool-shared" not in bare_tile
    assert "Shared host" in tile_title(body, shared.hostname)


def test_a_tile_shows_how_many_of_its_gpus_are_in_use(console, world, fleet):
    shared = next(n for n in fleet if n.pool == "shared" and not n.is_spare)
    hold(world, shared, 3)

    body = console("platform_admin").get("/staff/fleet/").content.decode()

    assert "3 of 8 GPUs in use" in tile_title(body, shared.hostname)
    assert "used-3" in tile_of(body, shared.hostname).split()  # eighths of the tile filled
    idle = bare_metal(fleet)
    assert "0 of 8 GPUs in use" in tile_title(body, idle.hostname) and "used-0" in tile_of(body, idle.hostname)


def test_the_legend_is_shown_open_with_every_kind_of_tile(console, fleet):
    body = console("platform_admin").get("/staff/fleet/").content.decode()
    assert '<details class="card legend"' not in body
    legend = body[body.index('id="legend"'):]
    legend = legend[:legend.index("</section>")]
    assert "Shared host" in legend and "Bare-metal node" in legend and "in use" in legend


def test_the_node_page_names_steps_and_incidents_in_words(console, fleet):
    from provisioning.lifecycle.steps import step_title

    node = bare_metal(fleet)
    operation = Operation.objects.create(node=node, kind="attest", state="failed", step="power_on_deploy")
    operation.steps.create(node=node, name="power_on_deploy", attempt=1, state="failed", finished_at=timezone.now())
    Incident.objects.create(kind="node_suspect", summary="No heartbeat for 2 periods.", node_id=node.pk)

    body = console("platform_admin").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()

    assert "<td>power_on_deploy</td>" not in body and "<td>node_suspect</td>" not in body
    assert f"<td>{step_title('power_on_deploy')}</td>" in body and "<td>Node suspect</td>" in body


def test_a_nodes_page_shows_each_gpus_last_hour_and_when_its_agent_was_heard(console, fleet):
    from cloud.models import GPUSampleRollup, GPUTelemetry, RollupPeriod
    from provisioning.models import AgentState

    node = bare_metal(fleet)
    gpu = node.gpus.order_by("index").first()
    now = timezone.now()
    AgentState.objects.update_or_create(node=node, defaults={"last_seen_at": now - timedelta(seconds=30)})
    GPUTelemetry.objects.update_or_create(gpu=gpu, defaults={
        "sampled_at": now, "utilization_pct": 87, "memory_used_mib": 1024, "memory_total_mib": 81920,
        "temperature_c": 71, "power_w": 612.0, "ecc_corrected": 0, "ecc_uncorrected": 0, "processes": 1,
        "xids": [79], "source": "agent", "node": node})
    start = now.replace(second=0, microsecond=0) - timedelta(minutes=10)
    GPUSampleRollup.objects.bulk_create([GPUSampleRollup(
        gpu=gpu, period=RollupPeriod.MINUTE, bucket=start + timedelta(minutes=i), samples=6, utilization_samples=6,
        utilization_sum=6 * 80.0, utilization_sumsq=6 * 6400.0, power_samples=6, power_sum=6 * 600.0)
        for i in range(5)])
    text = console("platform_admin").get(f"/staff/fleet/nodes/{node.pk}/").content.decode()
    assert "Utilization: min 80 %, mean 80 %, max 80 %" in text and "Power: min 600 W" in text
    assert "87 % · 71 °C · 612 W" in text and "XID 79" in text
    assert re.search(r"Agent heard</dt><dd>\s*0\xa0minutes ago", text)
