"""The console's storage page: volumes, their attachments and the quota used; create, grow, attach, detach, delete."""

from datetime import timedelta

import pytest
from django.utils import timezone

from cloud.models import Region
from provisioning.models import Reservation
from storage.catalogue import default_storage_classes
from storage.models import Volume, VolumeAttachment
from storage.steps import volume_converge
from storage.usage import usage_sample
from tests.world import small_fleet, world_volume

pytestmark = pytest.mark.django_db


@pytest.fixture
def classes(world):
    small_fleet(4)
    return {c.kind: c for c in default_storage_classes(Region.objects.get(slug="us-east-1"))}


def create(client, **data):
    return client.post("/volumes/", {"name": "ckpt", "size_gib": 500, **data}, follow=True)


def test_a_member_creates_a_file_system_and_sees_it_with_the_quota_used(console, world, classes):
    client = console("t1_member")
    body = create(client, storage_class=classes["shared_fs"].pk).content.decode()
    assert "ckpt (500 GiB) is being created." in body and "Creating" in body
    volume = Volume.objects.get(name="ckpt")
    volume_converge(volume.pk)
    body = client.get("/volumes/").content.decode()
    assert "Available" in body and "<strong>500 GiB</strong> of your 102,400 GiB quota" in body
    assert 'href="/volumes/" aria-current="page"' in body


def test_form_errors_come_back_next_to_their_fields(console, world, classes):
    client = console("t1_member")
    body = create(client, storage_class=classes["shared_fs"].pk, size_gib=5, name="Bad").content.decode()
    assert "Use lower-case letters" in body
    body = create(client, storage_class=classes["shared_fs"].pk, size_gib=5).content.decode()
    assert "volumes are 100 to 1,048,576 GiB" in body
    assert not Volume.objects.exists()


def test_attach_grow_detach_and_delete_from_the_page(console, world, classes):
    client = console("t1_member")
    create(client, storage_class=classes["shared_fs"].pk)
    volume = Volume.objects.get(name="ckpt")
    volume_converge(volume.pk)
    queued = world.t1.objects[Reservation]
    body = client.get("/volumes/").content.decode()
    assert f'<option value="{queued.pk}">{queued.name}</option>' in body  # a reservation of its region
    body = client.post(f"/volumes/{volume.pk}/attach/", {"reservation": queued.pk, "read_only": "on"},
                       follow=True).content.decode()
    assert f"ckpt is attached to {queued.name}" in body and "read-only" in body
    refused = client.post(f"/volumes/{volume.pk}/delete/", follow=True).content.decode()
    assert f"ckpt: The volume is attached to {queued.name}: detach it first." in refused
    body = client.post(f"/volumes/{volume.pk}/grow/", {"size_gib": 800}, follow=True).content.decode()
    assert "ckpt is growing to 800 GiB." in body
    volume_converge(volume.pk)
    body = client.post(f"/volumes/{volume.pk}/detach/", {"reservation": queued.pk}, follow=True).content.decode()
    assert f"ckpt is detached from {queued.name}." in body
    body = client.post(f"/volumes/{volume.pk}/delete/", follow=True).content.decode()
    assert "ckpt is being deleted" in body
    assert VolumeAttachment.objects.get(volume=volume).detached_at is not None


@pytest.mark.parametrize(("data", "said"), [({"reservation": "junk"}, "Choose one of your reservations"),
                                            ({"size_gib": "big"}, "whole GiB")])
def test_junk_is_a_message_not_a_500(console, world, classes, data, said):
    client = console("t1_member")
    create(client, storage_class=classes["shared_fs"].pk)
    volume = Volume.objects.get(name="ckpt")
    volume_converge(volume.pk)
    verb = "attach" if "reservation" in data else "grow"
    response = client.post(f"/volumes/{volume.pk}/{verb}/", data, follow=True)
    assert response.status_code == 200 and said in response.content.decode()


def test_a_viewer_reads_but_changes_nothing_and_another_tenant_gets_404(console, world, classes):
    volume = world.t1.objects[Volume]
    body = console("t1_viewer").get("/volumes/").content.decode()
    assert volume.name in body and "New volume or file system" not in body and f"Change {volume.name}" not in body
    assert console("t1_viewer").post(f"/volumes/{volume.pk}/delete/").status_code == 403
    assert console("t1_viewer").post("/volumes/", {"name": "x"}).status_code == 403
    assert volume.name not in console("t2_member").get("/volumes/").content.decode()
    assert console("t2_member").post(f"/volumes/{volume.pk}/delete/").status_code == 404
    assert Volume.objects.get(pk=volume.pk).state == "available"


def test_the_dashboard_and_the_staff_tenants_page_show_storage(console, world, settings):
    settings.MERIDIAN_STORAGE_USAGE_SECONDS = 3600
    world_volume(world.t1.tenant)
    usage_sample(timezone.now() - timedelta(minutes=5))
    body = console("t1_owner").get("/").content.decode()
    assert "Storage this month (100 GiB now, 100 GiB-hours" in body
    staff = console("platform_admin").get("/staff/tenants/").content.decode()
    assert "100 GiB now" in staff
