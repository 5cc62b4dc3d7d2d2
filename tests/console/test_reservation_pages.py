"""
The reservation pages: the form (checked by the API's own rules), the live estimate, a
reservation's page with its score and progress, and cancel/extend/release -- scoped like the API.
"""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.models import Price, SpotPrice
from cloud.models import Region
from provisioning.models import Reservation
from security.models import AuditEvent
from tests.world import small_fleet, vm_offering

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet(world):
    return small_fleet(4)


def form(**extra):
    data = {"name": "finetune", "mode": "offering", "offering": vm_offering().slug, "count": 1,
            "region": "us-east-1", "start_mode": "now", "duration_hours": 2, "billing_term": "on_demand",
            "eviction_policy": "soft", "urgency": "normal"}
    data.update(extra)
    return data


def test_a_member_reserves_through_the_form_and_lands_on_its_page(console, fleet):
    client = console("t1_member")
    response = client.post("/reservations/new/", form())
    assert response.status_code == 302, response.content.decode()[:2000]
    reservation = Reservation.objects.get(name="finetune")
    assert response["Location"] == f"/reservations/{reservation.pk}/"
    assert reservation.state == "scheduled" and reservation.gpus == 1
    page = client.get(response["Location"]).content.decode()
    assert "finetune" in page and "Priority score" in page and "Scheduled" in page
    assert AuditEvent.objects.filter(action__startswith="reservation", target_id=str(reservation.pk)).exists()


@pytest.mark.parametrize("bad, field_text", [
    ({"name": ""}, "This field is required"),
    ({"count": 0}, "greater than or equal to 1"),
    ({"offering": ""}, "Choose an offering"),
    ({"count": 3, "offering": vm_offering.__name__ and "h100-vm-8x"}, "comes in units of 8"),
    ({"billing_term": "spot"}, "needs the most you will pay"),
    ({"start_mode": "window"}, "Give the start time"),
    ({"region": "mars-1"}, "Select a valid choice"),
    ({"duration_hours": 100000}, "less than or equal to"),
    ({"ssh_public_key": "not a key"}, "SSH"),
])
def test_bad_input_shows_what_to_fix_and_makes_nothing(console, fleet, bad, field_text):
    if bad.get("offering") == "h100-vm-8x":
        bad["offering"] = vm_offering(8).slug
    response = console("t1_member").post("/reservations/new/", form(**bad))
    assert response.status_code == 400
    assert field_text in response.content.decode()
    assert not Reservation.objects.filter(name="finetune").exists()


def test_over_quota_is_shown_on_the_form_with_the_numbers(console, world, fleet):
    from tenants.models import Quota

    Quota.objects.create(tenant=world.t1.tenant, resource="gpus", limit=1)
    response = console("t1_member").post("/reservations/new/", form(offering=vm_offering(8).slug, count=8))
    assert response.status_code == 400
    assert "The tenant quota for GPUs is 1" in response.content.decode()


def test_the_estimate_shows_availability_price_quota_and_start(console, fleet):
    response = console("t1_member").post("/reservations/estimate/", form(count=2, duration_hours=3))
    body = response.content.decode()
    assert response.status_code == 200
    assert "us-east-1" in body and "Price estimate" in body and "Expected start" in body
    offering = vm_offering()
    assert f"${(offering.price_per_gpu_hour * 6):.2f}".rstrip("0") in body.replace(",", "")


def test_the_estimate_of_a_bad_form_names_the_problem(console, fleet):
    body = console("t1_member").post("/reservations/estimate/", form(count=0)).content.decode()
    assert "greater than or equal to 1" in body and "Price estimate" not in body


def test_viewer_sees_no_write_buttons_and_cannot_post(console, world, fleet):
    reservation = world.t1.objects[Reservation]
    client = console("t1_viewer")
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert "Cancel</button>" not in page and "Extend" not in page
    assert client.post(f"/reservations/{reservation.pk}/cancel/").status_code == 403
    assert client.post("/reservations/new/", form()).status_code == 403
    reservation.refresh_from_db()
    assert reservation.state == "queued"


def test_another_tenants_reservation_is_a_404_everywhere(console, world, fleet):
    theirs = world.t2.objects[Reservation]
    client = console("t1_owner")
    for url in (f"/reservations/{theirs.pk}/", f"/reservations/{theirs.pk}/progress/"):
        assert client.get(url).status_code == 404
    assert client.post(f"/reservations/{theirs.pk}/cancel/").status_code == 404
    assert theirs.name not in client.get("/reservations/").content.decode()
    theirs.refresh_from_db()
    assert theirs.state == "queued"


def test_cancel_from_the_page(console, world, fleet):
    reservation = world.t1.objects[Reservation]
    client = console("t1_member")
    response = client.post(f"/reservations/{reservation.pk}/cancel/")
    assert response.status_code == 302
    reservation.refresh_from_db()
    assert reservation.state == "cancelled"
    # Cancelling twice names the current state instead of failing.
    client.post(f"/reservations/{reservation.pk}/cancel/")
    assert "is &#x27;cancelled&#x27;" in client.get(f"/reservations/{reservation.pk}/").content.decode()


def test_extend_refuses_bad_hours_and_changes_nothing(console, world, fleet):
    client = console("t1_member")
    client.post("/reservations/new/", form())
    reservation = Reservation.objects.get(name="finetune")
    ends = reservation.ends_at
    client.post(f"/reservations/{reservation.pk}/extend/", {"hours": "soon"})
    reservation.refresh_from_db()
    assert reservation.ends_at == ends
    assert "Give the extra time in hours" in client.get(f"/reservations/{reservation.pk}/").content.decode()
    client.post(f"/reservations/{reservation.pk}/extend/", {"hours": "1"})
    reservation.refresh_from_db()
    assert (reservation.ends_at - ends).total_seconds() == 3600


def test_the_progress_partial_polls_only_while_it_moves(console, world, fleet):
    reservation = world.t1.objects[Reservation]
    client = console("t1_member")
    assert 'hx-trigger="every 2s"' in client.get(f"/reservations/{reservation.pk}/progress/").content.decode()
    client.post(f"/reservations/{reservation.pk}/cancel/")
    assert 'hx-trigger="every 2s"' not in client.get(f"/reservations/{reservation.pk}/progress/").content.decode()


def test_a_queued_reservation_explains_its_score(console, world, fleet):
    reservation = world.t1.objects[Reservation]
    from provisioning.services import reservation_rescore

    reservation_rescore(reservation)
    page = console("t1_viewer").get(f"/reservations/{reservation.pk}/").content.decode()
    assert "Urgency asked" in page and "Contribution" in page and "Position" in page


def test_list_queries_do_not_grow_with_rows(console, world, fleet, django_assert_max_num_queries):
    client = console("t1_owner")
    client.get("/reservations/")
    with django_assert_max_num_queries(12):
        client.get("/reservations/")
    for i in range(20):
        Reservation.objects.create(tenant=world.t1.tenant, team=world.t1.team, name=f"r{i}", offering=vm_offering(),
                                   gpu_model=vm_offering().gpu_model, units=1, gpus=1, regions=["us-east-1"],
                                   duration=world.t1.objects[Reservation].duration, state="queued")
    with django_assert_max_num_queries(12):
        assert client.get("/reservations/").status_code == 200


def test_the_progress_poll_asks_for_a_full_redraw_once_the_state_moves(console, world, fleet):
    """Instances, allocation and receipts change with the state: the page redraws itself then."""
    reservation = world.t1.objects[Reservation]
    client = console("t1_member")
    url = f"/reservations/{reservation.pk}/progress/"
    same = client.get(url, {"shown": "queued"}, HTTP_HX_REQUEST="true")
    assert same.status_code == 200 and "HX-Refresh" not in same
    client.post(f"/reservations/{reservation.pk}/cancel/")
    moved = client.get(url, {"shown": "queued"}, HTTP_HX_REQUEST="true")
    assert moved.status_code == 204 and moved["HX-Refresh"] == "true"


def test_an_active_reservation_shows_its_usage_evidence_and_policy(console, world, fleet):
    client = console("t1_member")
    client.post("/reservations/new/", form())
    reservation = Reservation.objects.get(name="finetune")
    Reservation.objects.filter(pk=reservation.pk).update(state="active")
    page = client.get(f"/reservations/{reservation.pk}/").content.decode()
    assert "Usage" in page and "released as a no-show after 15 idle minutes" in page


def test_a_logical_gpu_no_offering_fits_is_a_form_error_not_a_500(console, fleet):
    spec = form(mode="spec", offering="", spec_kind="container", spec_min_fp16_tflops=100000, spec_min_memory_gib=4096)
    client = console("t1_member")
    response = client.post("/reservations/new/", spec)
    assert response.status_code == 400 and "errorlist" in response.content.decode() or "flash error" in \
        response.content.decode()
    assert client.post("/reservations/estimate/", spec).status_code == 200
    assert not Reservation.objects.filter(name="finetune").exists()


def test_a_member_cannot_estimate_against_another_teams_quota(console, world, fleet):
    from tenants.models import Team

    other = Team.objects.create(tenant=world.t1.tenant, name="Other team", slug="other")
    client = console("t1_member")
    page = client.get("/reservations/new/").content.decode()
    assert page.count(f'value="{other.pk}"') == 1  # in the top bar's team switcher only, not the form
    body = client.post("/reservations/estimate/", form(team=str(other.pk))).content.decode()
    assert "Price estimate" not in body and "Quota left" not in body


def test_the_polled_progress_partial_reads_nothing_for_the_top_bar(console, world, fleet,
                                                                   django_assert_max_num_queries):
    """The partial is polled every 2 s: the switchers' tenant and team lists are not read for it."""
    reservation = world.t1.objects[Reservation]
    client = console("t1_member")
    client.get(f"/reservations/{reservation.pk}/progress/")
    with django_assert_max_num_queries(7):  # 9 when the top bar's lists were read for every render
        client.get(f"/reservations/{reservation.pk}/progress/")


def test_the_estimate_of_a_full_region_says_when_gpus_free_up(console, fleet):
    client = console("t1_owner")
    assert client.post("/reservations/new/", form(offering=vm_offering(8).slug, count=8,
                                                  duration_hours=3)).status_code == 302
    body = client.post("/reservations/estimate/", form(count=1)).content.decode()
    assert "when GPUs free up in us-east-1" in body and "unknown" not in body.lower()


#
# The form and its estimate: what a person sees while filling it in
#


def untouched_form() -> dict:
    """What the form sends before anything is typed: its initial values, no name and no offering."""
    return form(name="", offering="", duration_hours=8)


def test_the_estimate_is_posted_so_the_ssh_key_and_csrf_token_stay_out_of_urls(console, world, fleet):
    """A GET would put the whole form in the URL, and so in every access log: the panel posts it."""
    from tests.provisioning.pipeline import SSH_KEY

    client = console("t1_member")
    page = client.get("/reservations/new/").content.decode()
    assert 'hx-post="/reservations/estimate/"' in page and "hx-get" not in page
    assert client.get("/reservations/estimate/", form()).status_code == 405
    answer = client.post("/reservations/estimate/", form(ssh_public_key=SSH_KEY))
    assert answer.status_code == 200 and "Price estimate" in answer.content.decode()

    strict = console("t1_member")
    strict.handler.enforce_csrf_checks = True
    assert strict.post("/reservations/estimate/", form()).status_code == 403


def test_an_untouched_form_gets_a_prompt_not_errors(console, fleet):
    """Nothing typed yet is nothing wrong: the panel says what it needs, in no error's red."""
    body = console("t1_member").post("/reservations/estimate/", untouched_form()).content.decode()
    assert "errorlist" not in body and "required" not in body
    assert "Choose an offering" in body
    page = console("t1_member").get("/reservations/new/").content.decode()
    assert "load" not in page.split('id="reservation-form"')[1].split(">")[0]  # no estimate of the empty form


def test_the_estimate_sums_up_beside_the_reserve_button(console, fleet):
    """On a phone the panel is below the form: the price and start are also next to the button."""
    body = console("t1_member").post("/reservations/estimate/", form(count=2, duration_hours=3)).content.decode()
    summary = body.split('id="estimate-summary"')[1].split("</p>")[0]
    assert 'hx-swap-oob="true"' in summary and "$14.94" in summary and "starting now" in summary
    page = console("t1_member").post("/reservations/new/", {**form(count=2, duration_hours=3), "action": "estimate"})
    button_row = page.content.decode().split('id="estimate-summary"')[1].split("Reserve</button>")[0]
    assert "$14.94" in button_row and "hx-swap-oob" not in button_row


def test_when_capacity_is_short_the_summary_says_how_short_and_when_it_starts(console, world, fleet):
    """ "6 of 8 GPUs free now in us-east-1: queued, expected start ..." beside the Reserve button."""
    from provisioning.models import Reservation

    Reservation.objects.filter(state="queued").delete()  # the world's: nothing waits ahead of this ask
    taken = world.client("t1_owner").post("/api/v1/reservations/", {
        "name": "first", "offering": vm_offering().slug, "gpus": 2, "regions": ["us-east-1"], "duration_hours": 3,
    }, format="json")
    assert taken.json()["state"] == "scheduled"
    body = console("t1_member").post("/reservations/estimate/", form(count=8)).content.decode()
    summary = body.split('id="estimate-summary"')[1].split("</p>")[0]
    assert "6 of 8 GPUs free now in us-east-1: queued, expected start" in summary


def test_the_estimate_needs_no_name(console, fleet):
    body = console("t1_member").post("/reservations/estimate/", form(name="")).content.decode()
    assert "Price estimate" in body and "errorlist" not in body


def test_the_estimate_follows_input_events_and_never_aborts_a_request(console, fleet):
    """input (typing, pasting, picking) drives it; a newer request waits for the one running, never aborts it."""
    page = console("t1_member").get("/reservations/new/").content.decode()
    tag = page.split('id="reservation-form"')[1].split(">")[0]
    assert 'hx-trigger="input delay:' in tag and "keyup" not in tag
    assert 'hx-sync="this:queue last"' in tag


def test_an_estimate_short_of_capacity_says_it_would_queue(console, fleet):
    """Not "available now" beside a queued start: how many are free, fewer than asked, and when."""
    client = console("t1_owner")
    assert client.post("/reservations/new/", form(offering=vm_offering(8).slug, count=8,
                                                  duration_hours=3)).status_code == 302
    body = client.post("/reservations/estimate/", form(count=1)).content.decode()
    assert "Available now" not in body
    assert "fewer than the 1 asked" in body and "Queued" in body


def test_every_field_error_comes_at_once(console, fleet):
    """A missing name and a bad SSH key are both named by the first submit, not one after the other."""
    response = console("t1_member").post("/reservations/new/", form(name="", ssh_public_key="not a key"))
    body = response.content.decode()
    assert response.status_code == 400
    assert "This field is required" in body and "Not an OpenSSH public key" in body


def test_the_first_field_with_an_error_gets_the_focus(console, fleet):
    response = console("t1_member").post("/reservations/new/", form(count=0, billing_term="spot"))
    body = response.content.decode()
    assert body.count(" autofocus") == 1
    count_input = body.split('id="id_count"')[0].rsplit("<input", 1)[1] + body.split('id="id_count"')[1].split(">")[0]
    assert "autofocus" in count_input


def test_a_viewer_gets_a_read_only_notice_instead_of_the_form(console, fleet):
    """A viewer may look but not reserve: no form to fill in for a 403, a notice that says so."""
    response = console("t1_viewer").get("/reservations/new/")
    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="reservation-form"' not in body and "ssh_public_key" not in body
    assert "viewer" in body and "cannot reserve" in body


def test_without_script_the_estimate_button_draws_the_panel_with_the_page(console, fleet):
    """The form's "Check price and availability" button posts the form back: the estimate, nothing made."""
    client = console("t1_member")
    page = client.get("/reservations/new/").content.decode()
    assert 'name="action" value="estimate"' in page
    response = client.post("/reservations/new/", {**form(count=2), "action": "estimate"})
    body = response.content.decode()
    assert response.status_code == 200
    assert "Price estimate" in body and 'value="finetune"' in body
    assert not Reservation.objects.filter(name="finetune").exists()


def test_the_page_says_it_updates_live_only_where_script_runs(console, world, fleet):
    """The "updating live" note is hidden until the console's script shows it; without script: reload."""
    reservation = world.t1.objects[Reservation]
    body = console("t1_member").get(f"/reservations/{reservation.pk}/").content.decode()
    assert "updating live" in body
    live_note = body.split("updating live")[0].rsplit("<", 1)[1]
    assert "hidden" in live_note and "data-script-only" in live_note
    assert "<noscript>" in body and "Reload the page" in body


#
# A reservation's page: its progress and its words
#


def provisioning_of(reservation, *, step: str, runs: list[tuple[str, str, int]], state: str = "running"):
    """A provision operation at ``step`` with StepRuns ``(name, state, seconds)`` started a minute ago, in order."""
    from django.utils import timezone

    from provisioning.models import Operation, StepRun

    Reservation.objects.filter(pk=reservation.pk).update(state="provisioning", state_reason="Provisioning.")
    operation = Operation.objects.create(tenant=reservation.tenant, reservation=reservation, kind="provision",
                                         step=step, state=state, attempt=1, progress=50)
    clock = timezone.now() - timedelta(minutes=1)
    Operation.objects.filter(pk=operation.pk).update(created_at=clock)
    for name, run_state, seconds in runs:
        run = StepRun.objects.create(operation=operation, name=name, attempt=1, state=run_state,
                                     error="n1: Waiting for the agent of n1 to answer the attestation challenge."
                                     if run_state == "waiting" else "")
        finished = clock + timedelta(seconds=seconds)
        StepRun.objects.filter(pk=run.pk).update(started_at=clock,
                                                 finished_at=None if run_state == "running" else finished)
        clock = finished
    return operation


BARE_METAL_STEPS = ["power_on_deploy", "write_image", "boot_from_disk", "join_network", "verify", "hand_over"]


@pytest.fixture
def bare_metal_reservation(world, fleet):
    from tests.provisioning.factories import make_reservation

    return make_reservation(world, units=2, state="scheduled")


def test_the_steps_are_one_row_each_with_names_and_durations(console, bare_metal_reservation):
    """Waiting runs of a step do not pile up as rows: one row per step, named for a person, with its time."""
    operation = provisioning_of(bare_metal_reservation, step="verify", runs=[
        ("power_on_deploy", "succeeded", 4), ("write_image", "succeeded", 12), ("boot_from_disk", "succeeded", 3),
        ("join_network", "succeeded", 2), ("verify", "waiting", 5), ("verify", "waiting", 5), ("verify", "waiting", 5),
        ("verify", "running", 0)])
    body = console("t1_member").get(f"/reservations/{bare_metal_reservation.pk}/progress/").content.decode()
    steps = body.split('class="steps"')[1].split("</ol>")[0]
    assert steps.count("<li") == len(BARE_METAL_STEPS)
    for name in BARE_METAL_STEPS:
        assert name not in steps
    assert "Write the OS image" in steps and "Check and attest the hardware" in steps and "Hand over access" in steps
    assert "12 s" in steps and "Waiting for the agent" in steps and steps.count("Waiting for the agent") == 1
    assert "n1: Waiting" not in steps  # the node is named once
    assert "Provisioning.</p>" not in body  # the state's own name is no reason
    assert "step 5 of 6" in body
    assert operation.progress == 50 and 'aria-valuenow="67"' in body  # 4 of 6 steps done, not the stored guess


def test_a_step_that_succeeded_after_waiting_shows_no_waiting_row(console, bare_metal_reservation):
    provisioning_of(bare_metal_reservation, step="hand_over", runs=[
        ("power_on_deploy", "succeeded", 4), ("write_image", "succeeded", 12), ("boot_from_disk", "succeeded", 3),
        ("join_network", "succeeded", 2), ("verify", "waiting", 5), ("verify", "waiting", 5),
        ("verify", "succeeded", 20), ("hand_over", "running", 0)])
    body = console("t1_member").get(f"/reservations/{bare_metal_reservation.pk}/progress/").content.decode()
    assert "state-waiting" not in body and "Waiting for the agent" not in body
    assert "30 s" in body  # verify took its waits and its run: 5 + 5 + 20 s


def test_the_attestation_step_counts_the_nodes_verified(console, world, bare_metal_reservation):
    """Of a multi-node reservation's nodes, how many passed attestation so far: "verified 1 of 2 nodes"."""
    from django.utils import timezone

    from cloud.models import Node
    from provisioning.models import Instance
    from security.models import AttestationNonce, AttestationReport

    operation = provisioning_of(bare_metal_reservation, step="verify", runs=[
        ("power_on_deploy", "succeeded", 4), ("write_image", "succeeded", 4), ("boot_from_disk", "succeeded", 4),
        ("join_network", "succeeded", 4), ("verify", "waiting", 5)])
    nodes = list(Node.objects.filter(pool="bare_metal").order_by("hostname")[:2])
    for index, node in enumerate(nodes):
        Instance.objects.create(tenant=world.t1.tenant, reservation=bare_metal_reservation, node=node, index=index,
                                kind="bare_metal", name=node.hostname, provisioned_by=operation)
    now = timezone.now()
    AttestationNonce.objects.create(value="a" * 64, node_id=nodes[0].pk, reference=f"{operation.pk}:{nodes[0].pk}:0",
                                    issued_at=now, expires_at=now, used_at=now)
    AttestationNonce.objects.create(value="b" * 64, node_id=nodes[1].pk, reference=f"{operation.pk}:{nodes[1].pk}:0",
                                    issued_at=now, expires_at=now)
    AttestationReport.objects.create(node_id=nodes[0].pk, nonce="a" * 64, status="pass")
    body = console("t1_member").get(f"/reservations/{bare_metal_reservation.pk}/progress/").content.decode()
    assert "verified 1 of 2 nodes" in body


def test_the_bar_is_empty_while_scheduled_not_full(console, world, fleet):
    """At scheduled only the placement is done (its operation is at 100 %): provisioning has not begun."""
    client = console("t1_member")
    assert client.post("/reservations/new/", form()).status_code == 302
    reservation = Reservation.objects.get(name="finetune")
    assert reservation.state == "scheduled"
    body = client.get(f"/reservations/{reservation.pk}/progress/").content.decode()
    assert 'aria-valuenow="0"' in body and 'aria-valuenow="100"' not in body


def test_a_running_operation_says_about_how_long_is_left(console, world, bare_metal_reservation):
    """From the offering's recent provisionings: a typical time, and the ETA of this one."""
    from django.utils import timezone

    from provisioning.models import Operation
    from tests.provisioning.factories import make_reservation

    for _ in range(3):
        done = make_reservation(world, units=1, state="active", offering=bare_metal_reservation.offering)
        finished = Operation.objects.create(tenant=done.tenant, reservation=done, kind="provision", step="hand_over",
                                            state="succeeded", progress=100)
        Operation.objects.filter(pk=finished.pk).update(created_at=timezone.now() - timedelta(minutes=10),
                                                        finished_at=timezone.now() - timedelta(minutes=6))
    provisioning_of(bare_metal_reservation, step="write_image", runs=[("power_on_deploy", "succeeded", 30),
                                                                      ("write_image", "running", 0)])
    body = console("t1_member").get(f"/reservations/{bare_metal_reservation.pk}/progress/").content.decode()
    assert "usually takes 4 min" in body and "about 3 min left" in body


def test_why_it_waits_names_the_gpu_model_once_on_the_page(console, world, fleet):
    """The scheduler's reason names the model (not its id), and the page shows the one current reason once."""
    from cloud.models import GPUModel
    from provisioning.scheduling.scheduler import run_cycle

    client = console("t1_owner")
    assert client.post("/reservations/new/", form(offering=vm_offering(8).slug, count=8)).status_code == 302
    assert client.post("/reservations/new/", form(name="second")).status_code == 302
    second = Reservation.objects.get(name="second")
    assert second.state == "queued"
    run_cycle()
    second.refresh_from_db()
    model = GPUModel.objects.get(pk=second.gpu_model_id)
    assert model.name in second.state_reason and str(model.pk) not in second.state_reason
    page = client.get(f"/reservations/{second.pk}/").content.decode()
    assert page.count(second.state_reason) == 1 and "Why it waits" in page


def test_the_page_uses_names_units_and_rounding_a_person_reads(console, world, fleet):
    """4 hours, not 4:00:00; 1 slot (1/7 GPU); human factor names; quota left to one decimal."""
    from tenants.models import Quota
    from tests.provisioning.factories import make_reservation, offering

    Quota.objects.create(tenant=world.t1.tenant, resource="gpus", limit=512)
    mig = offering(kind="container", gpus_per_unit=1, slots_per_gpu=7)
    reservation = make_reservation(world, offering=mig, units=1, state="queued")
    Reservation.objects.filter(pk=reservation.pk).update(duration=timedelta(hours=4))
    from provisioning.services import reservation_rescore

    reservation_rescore(reservation)
    page = console("t1_member").get(f"/reservations/{reservation.pk}/").content.decode()
    assert "4:00:00" not in page and "4 hours" in page
    assert "1 slot (1/7 of a GPU)" in page
    assert "high_priority" not in page and "fair_share" not in page and "High-priority team" in page
    body = console("t1_member").post("/reservations/estimate/", form(offering=mig.slug, count=1)).content.decode()
    assert "1/7 GPU" in body and "0.14" not in body
    assert "0.142857" not in body and "GPUs left" in body
    new = console("t1_member").get("/reservations/new/").content.decode()
    assert "Us East 1" not in new and "US East (us-east-1)" in new


def test_a_refusal_over_quota_rounds_its_numbers(console, world, fleet):
    """A slot is 1/7 GPU: the refusal says 0.1 asked, not 0.14285714285714285."""
    from tenants.models import Quota
    from tests.provisioning.factories import offering

    Quota.objects.create(tenant=world.t1.tenant, resource="gpus", limit=0)
    mig = offering(kind="container", gpus_per_unit=1, slots_per_gpu=7)
    body = console("t1_member").post("/reservations/new/", form(offering=mig.slug, count=1)).content.decode()
    assert "The tenant quota for GPUs is 0" in body and "0.1 asked" in body and "0.142857" not in body


def test_nodes_being_attested_are_not_counted_free(console, world, fleet):
    """An idle node proving itself again is not sold until it passes: the estimate does not count it."""
    from cloud.models import Node
    from provisioning.models import Operation
    from tests.provisioning.factories import offering

    bare_metal = offering()
    client = console("t1_member")
    before = client.post("/reservations/estimate/", form(offering=bare_metal.slug, count=1)).content.decode()
    assert "Now</strong>" in before
    for node in Node.objects.filter(pool="bare_metal"):
        Operation.objects.create(node=node, kind="attest", step="verify", state="running")
    body = client.post("/reservations/estimate/", form(offering=bare_metal.slug, count=1)).content.decode()
    assert "0 nodes free" in body and "Queued" in body


def test_the_form_and_the_catalogue_show_the_price_book_price_that_will_apply(console, world, fleet):
    offering, region = vm_offering(), Region.objects.get(slug="us-east-1")
    past = timezone.now() - timedelta(hours=1)
    Price.objects.create(offering=offering, term="on_demand", per_gpu_hour="3.100000", effective_from=past)
    Price.objects.create(offering=offering, region=region, term="on_demand", per_gpu_hour="2.900000",
                         effective_from=past)
    Price.objects.create(offering=offering, term="on_demand", per_gpu_hour="9.000000",
                         effective_from=timezone.now() + timedelta(days=3))  # not yet
    client = console("t1_member")
    page = client.get("/reservations/new/").content.decode()
    assert f"{offering.name} · VM · $3.10/GPU-h on demand" in page or '<td class="num">$3.10</td>' in page
    body = client.post("/reservations/estimate/", form(count=2, duration_hours=3)).content.decode()
    assert "$17.40" in body and "$2.90 per GPU-hour" in body  # us-east-1's own price: 2 GPUs x 3 h x 2.90
    listed = world.client("t1_viewer").get(f"/api/v1/offerings/{offering.pk}/").json()
    assert listed["prices"]["on_demand"] == "3.1000" and listed["price_per_gpu_hour"] == "2.4900"
    offering.spot_available, offering.spot_floor_price = True, Decimal("1.0000")
    offering.save()  # through the model: the catalogue's cache hears of it
    SpotPrice.objects.create(offering=offering, region=region, at=past, per_gpu_hour="1.7500", utilization="0.6")
    body = client.post("/reservations/estimate/", form(count=2, duration_hours=3, billing_term="spot",
                                                       spot_max_price="2.00")).content.decode()
    assert "$1.75 per GPU-hour" in body  # the market's price now, under the max
