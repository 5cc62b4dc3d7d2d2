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
    assert "Available" in body and "500 GiB of 102,400" in body  # the overall line
    assert body.count("0 GiB of 102,400") >= 2  # the kinds it is not (block, object)
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


def test_snapshot_restore_and_delete_from_the_page(console, world, classes):
    client = console("t1_member")
    create(client, storage_class=classes["shared_fs"].pk)
    volume = Volume.objects.get(name="ckpt")
    volume_converge(volume.pk)
    body = client.post(f"/volumes/{volume.pk}/snapshot/", {"name": "before"}, follow=True).content.decode()
    assert "A snapshot before of ckpt is being taken." in body
    from storage.models import VolumeSnapshot
    from storage.steps import snapshot_converge

    snapshot = VolumeSnapshot.objects.get(name="before")
    snapshot_converge(snapshot.pk)
    body = client.get("/volumes/").content.decode()
    assert "Restore to a new volume" in body
    body = client.post(f"/snapshots/{snapshot.pk}/restore/", {"name": "ckpt-old"}, follow=True).content.decode()
    assert "ckpt-old is being restored from before." in body
    assert Volume.objects.get(name="ckpt-old").source_snapshot_id == snapshot.pk
    body = client.post(f"/snapshots/{snapshot.pk}/delete/", follow=True).content.decode()
    assert "being restored from this snapshot" in body  # ckpt-old is still being made
    assert console("t2_member").post(f"/snapshots/{snapshot.pk}/delete/").status_code == 404


def test_checkpoint_tiers_keys_and_a_restore_from_the_page(console, world, classes):
    from storage.checkpoints import tier_pass
    from storage.drivers.simulated import SimulatedStorage
    from storage.models import Checkpoint

    client = console("t1_member")
    create(client, storage_class=classes["shared_fs"].pk)
    create(client, storage_class=classes["object"].pk, name="archive", size_gib=100)
    fs, bucket = Volume.objects.get(name="ckpt"), Volume.objects.get(name="archive")
    volume_converge(fs.pk)
    volume_converge(bucket.pk)
    body = client.get("/volumes/").content.decode()
    assert f'<option value="{bucket.pk}"' in body and "Checkpoint tiers" in body and "Issue keys" in body
    body = client.post(f"/volumes/{fs.pk}/tiers/", {"cold_volume": bucket.pk, "keep_hot": 0,
                                                    "demote_after_hours": 1}, follow=True).content.decode()
    assert "older ones unused for 1 h move to archive" in body
    SimulatedStorage().write_chunk(ref=fs.backend_ref, key="checkpoints/step-9/model.pt", index=0, chunk=1024,
                                   data=b"x" * 1000)
    tier_pass(now=timezone.now() + timedelta(hours=2))
    body = client.get("/volumes/").content.decode()
    assert "step-9" in body and "Moving to the cold tier" in body and "<meter" in body
    Checkpoint.objects.filter(name="step-9").update(state="cold")
    body = client.post(f"/checkpoints/{Checkpoint.objects.get().pk}/restore/", follow=True).content.decode()
    assert "step-9 is on its way back to ckpt." in body

    keys = client.post(f"/volumes/{bucket.pk}/keys/")
    assert keys.status_code == 200 and keys["Cache-Control"] == "no-store"
    assert "shown this once" in keys.content.decode() and 'data-copy="the secret access key"' in keys.content.decode()
    refused = client.post(f"/volumes/{fs.pk}/keys/", follow=True).content.decode()
    assert "Access keys open object storage" in refused
    assert console("t1_viewer").post(f"/volumes/{bucket.pk}/keys/").status_code == 403


def test_a_snapshot_or_restore_without_a_proper_name_is_refused_and_makes_nothing(console, world, classes):
    from storage.models import VolumeSnapshot
    from storage.steps import snapshot_converge

    client = console("t1_member")
    create(client, storage_class=classes["shared_fs"].pk)
    volume = Volume.objects.get(name="ckpt")
    volume_converge(volume.pk)
    for name in ("", "Bad Name"):
        body = client.post(f"/volumes/{volume.pk}/snapshot/", {"name": name}, follow=True).content.decode()
        assert "Use lower-case letters" in body
    assert not VolumeSnapshot.objects.exists()
    client.post(f"/volumes/{volume.pk}/snapshot/", {"name": "good"})
    snapshot = VolumeSnapshot.objects.get()
    snapshot_converge(snapshot.pk)
    body = client.post(f"/snapshots/{snapshot.pk}/restore/", {"name": ""}, follow=True).content.decode()
    assert "Use lower-case letters" in body and Volume.objects.count() == 1
