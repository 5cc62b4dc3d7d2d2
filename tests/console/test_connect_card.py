"""The reservation page's Connect card: the SSH command, the addresses, the time left and the cost so far."""

import pytest
from django.urls import reverse

from provisioning.models import Instance, Reservation
from tests.provisioning.pipeline import reserve_on_small_fleet

pytestmark = pytest.mark.django_db


def test_an_active_reservation_opens_with_how_to_connect(console, world, steps):
    pk = reserve_on_small_fleet(world, kind="bare_metal", public_ip=True)
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    assert 'id="connect"' not in page  # nothing to connect to before the hand-over
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    card = page.split('id="connect"')[1].split("</section>")[0]
    assert f"ssh ubuntu@{instance.public_ip}" in card
    assert instance.address in card and instance.private_ip in card
    ipoib = instance.memberships.filter(left_at__isnull=True).exclude(address=None).values_list("address", flat=True)
    assert ipoib and all(f"{address}" in card for address in ipoib)
    assert "left (until" in card and "so far" in card


def test_the_boot_log_page_shows_the_console_and_is_the_members(console, world, steps):
    from provisioning.lifecycle.steps import console_output

    pk = reserve_on_small_fleet(world)
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    card = page.split('id="connect"')[1].split("</section>")[0]
    assert instance.host_keys and instance.host_keys[0]["fingerprint"] in card  # read from its console at hand-over
    assert reverse("instance-console", args=[instance.pk]) in page
    log = console("t1_member").get(reverse("instance-console", args=[instance.pk]))
    assert log.status_code == 200
    assert "BEGIN SSH HOST KEY KEYS" in console_output(instance) and "SSH HOST KEY" in log.content.decode()
    assert console("t1_viewer").get(reverse("instance-console", args=[instance.pk])).status_code == 403
    assert console("t2_member").get(reverse("instance-console", args=[instance.pk])).status_code == 404
    viewer_page = console("t1_viewer").get(reverse("reservation-detail", args=[pk])).content.decode()
    assert reverse("instance-console", args=[instance.pk]) not in viewer_page


def test_an_ending_reservation_warns_and_extends_in_one_click(console, world, steps):
    from datetime import timedelta

    from django.utils import timezone

    pk = reserve_on_small_fleet(world)
    steps.run()
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    assert 'id="ending-soon"' not in page
    assert "<details><summary><strong>Priority score" in page  # placed: the score folds away
    Reservation.objects.filter(pk=pk).update(ends_at=timezone.now() + timedelta(minutes=20))
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    banner = page.split('id="ending-soon"')[1].split("</div>")[0]
    assert "ends in 1" in banner and "Extend by 1 hour" in banner
    viewer = console("t1_viewer").get(reverse("reservation-detail", args=[pk])).content.decode()
    assert 'id="ending-soon"' in viewer and "Extend by 1 hour" not in viewer.split('id="ending-soon"')[1]
    before = Reservation.objects.get(pk=pk).ends_at
    answer = console("t1_member").post(reverse("reservation-act", args=[pk, "extend"]), {"hours": "1"})
    assert answer.status_code == 302
    steps.run()
    assert Reservation.objects.get(pk=pk).ends_at >= before + timedelta(minutes=59)
    page = console("t1_member").get(reverse("reservation-detail", args=[pk])).content.decode()
    assert 'id="ending-soon"' not in page
    assert 'data-copy="the SSH command of' in page
