"""
Volumes and file systems (storage.services, storage.steps): made, grown, attached, detached and
deleted through the API, their backend brought along by idempotent steps that a lost worker cannot
leave half done, quotas held under concurrency, and a delete that destroys the volume's key.
"""

from __future__ import annotations

import threading

import pytest

from security.models import AuditEvent
from storage.choices import StorageKind
from storage.drivers.simulated import SimulatedStorage
from storage.models import StorageClass, Volume, VolumeAttachment
from storage.services import attachments_release_ended
from storage.steps import TryAgain, orphans_remove, storage_reconcile, volume_converge
from tenants.models import Quota
from tests.provisioning.pipeline import reserve_vm

pytestmark = pytest.mark.django_db
URL = "/api/v1/volumes/"


def create(world, persona="t1_member", **body):
    payload = {"name": "ckpt", "storage_class": "us-east-1-shared-fs", "size_gib": 500, **body}
    return world.client(persona).post(URL, payload, format="json")


def made(world, persona="t1_member", **body) -> Volume:
    """A volume created through the API and its step run (as the worker would)."""
    response = create(world, persona, **body)
    assert response.status_code == 201, response.content
    volume = Volume.objects.get(pk=response.json()["id"])
    assert volume_converge(volume.pk) == "done"
    volume.refresh_from_db()
    return volume


def reserve(world, persona="t1_member", **extra) -> str:
    return str(reserve_vm(world, persona, **{"name": "train", **extra}).pk)


def test_a_volume_is_created_by_its_step_encrypted_and_audited(world, classes):
    response = create(world)
    assert response.status_code == 201 and response.json()["state"] == "creating"
    volume = Volume.objects.get(pk=response.json()["id"])
    assert SimulatedStorage.state(volume.backend_ref) == {}  # nothing on the backend before the step
    assert volume_converge(volume.pk) == "done"
    volume.refresh_from_db()
    assert volume.state == "available" and volume.wrapped_key and response.json()["encrypted"] is True
    assert SimulatedStorage.state(volume.backend_ref) == {"kind": "shared_fs", "size_gib": 500, "clients": []}
    assert AuditEvent.objects.filter(action="volume.create", target_id=str(volume.pk)).count() == 1


def test_a_step_run_again_after_its_worker_died_does_no_harm(world, classes, monkeypatch):
    """The backend made the volume, then the worker died before the state moved: the next run finishes it."""
    volume = Volume.objects.get(pk=create(world).json()["id"])
    from storage import steps

    def crash(*args, **kwargs):
        raise SystemExit("worker killed between the backend call and the commit")

    monkeypatch.setattr(steps, "_move", crash)
    with pytest.raises(SystemExit):
        volume_converge(volume.pk)
    monkeypatch.undo()
    assert Volume.objects.get(pk=volume.pk).state == "creating"
    assert volume_converge(volume.pk) == "done"
    assert volume_converge(volume.pk) == "nothing"  # a third run finds it settled
    assert SimulatedStorage.calls(volume.backend_ref) == {"storage_create": 2}  # asked twice, made once
    assert SimulatedStorage.state(volume.backend_ref)["size_gib"] == 500
    assert Volume.objects.get(pk=volume.pk).state == "available"


def test_transient_errors_are_tried_again_and_a_lasting_one_fails_the_volume(world, classes, settings):
    settings.MERIDIAN_SIMULATION = {"failure_rate": {"storage_create": 1.0}}
    settings.MERIDIAN_STORAGE_ATTEMPTS = 3
    volume = Volume.objects.get(pk=create(world).json()["id"])
    for _ in range(2):
        with pytest.raises(TryAgain):
            volume_converge(volume.pk)
    assert volume_converge(volume.pk) == "failed"
    volume.refresh_from_db()
    assert volume.state == "failed" and "Creating failed: Simulated storage timeout" in volume.state_reason
    settings.MERIDIAN_SIMULATION = {}
    assert world.client("t1_member").delete(f"{URL}{volume.pk}/").status_code == 202  # a failed one may go
    assert volume_converge(volume.pk) == "done"
    assert Volume.objects.get(pk=volume.pk).state == "deleted"


@pytest.mark.parametrize(("body", "attr", "code"), [
    ({"size_gib": 50}, "size_gib", "size_out_of_range"),  # under the class's 100 GiB
    ({"size_gib": 2_000_000}, "size_gib", "size_out_of_range"),
    ({"size_gib": "500"}, "size_gib", "invalid"),
    ({"name": "Bad Name"}, "name", "invalid"),
    ({"storage_class": "nowhere-shared-fs"}, "storage_class", "does_not_exist"),
])
def test_bad_creates_name_the_field_and_make_nothing(world, classes, body, attr, code):
    response = create(world, **body)
    assert response.status_code == 400
    assert (attr, code) in {(e["attr"], e["code"]) for e in response.json()["errors"]}
    assert not Volume.objects.exists()


def test_a_class_off_sale_and_a_name_taken_are_refused(world, classes):
    made(world)
    assert create(world).json()["errors"][0]["code"] == "name_taken"
    StorageClass.objects.filter(kind=StorageKind.BLOCK).update(is_active=False)
    refused = create(world, name="disk", storage_class="us-east-1-block", size_gib=100)
    assert refused.status_code == 400  # not listed to tenants: not found, or not sold
    assert Volume.objects.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("quota", ["storage_gib of the tenant", "shared_fs_gib of the team"])
def test_the_storage_quota_holds_under_concurrent_creates(world, classes, quota):
    """Ten creates of 200 GiB race against a 1,000 GiB quota (overall, or of the class's kind): five win."""
    from django.db import connections

    from core.errors import QuotaExceeded
    from storage.services import volume_create

    resource, _, _, scope = quota.split()
    Quota.objects.create(tenant=world.t1.tenant, team=world.t1.team if scope == "team" else None,
                         resource=resource, limit=1000)
    actor, shared = world.principal("t1_member"), classes[StorageKind.SHARED_FS]
    outcomes, errors = [], []

    def one(i):
        try:
            volume_create(actor=actor, storage_class=shared, name=f"race-{i}", size_gib=200, team=world.t1.team)
            outcomes.append("made")
        except QuotaExceeded:
            outcomes.append("over quota")
        except Exception as exc:  # noqa: BLE001 -- any other failure fails the test
            errors.append(repr(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(10)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(outcomes) == ["made"] * 5 + ["over quota"] * 5
    assert sum(Volume.objects.values_list("target_gib", flat=True)) == 1000


def test_a_quota_of_one_kind_leaves_the_other_kinds_alone(world, classes):
    Quota.objects.create(tenant=world.t1.tenant, resource="shared_fs_gib", limit=600)
    assert create(world, name="a", size_gib=500).status_code == 201
    over = create(world, name="b", size_gib=200)
    assert over.status_code == 409 and over.json()["errors"][0]["meta"]["limit"] == 600
    assert "Shared file systems" in over.json()["errors"][0]["detail"] or "shared_fs_gib" in \
        over.json()["errors"][0]["detail"]
    assert create(world, name="c", storage_class="us-east-1-block", size_gib=200).status_code == 201
    shared = Volume.objects.get(name="a")
    volume_converge(shared.pk)
    grow = world.client("t1_member").post(f"{URL}{shared.pk}/resize/", {"size_gib": 700}, format="json")
    assert grow.status_code == 409  # a grow counts against its kind too


def test_grow_only_within_quota_and_the_backend_follows(world, classes):
    volume = made(world)
    client = world.client("t1_member")
    assert client.post(f"{URL}{volume.pk}/resize/", {"size_gib": 400}, format="json").json()["errors"][0]["code"] == \
        "size_not_larger"
    Quota.objects.create(tenant=world.t1.tenant, resource="storage_gib", limit=800)
    over = client.post(f"{URL}{volume.pk}/resize/", {"size_gib": 900}, format="json")
    assert over.status_code == 409 and over.json()["errors"][0]["meta"]["asked"] == 400
    grown = client.post(f"{URL}{volume.pk}/resize/", {"size_gib": 800}, format="json")
    assert grown.status_code == 202 and grown.json()["state"] == "resizing" and grown.json()["target_gib"] == 800
    assert volume_converge(volume.pk) == "done"
    volume.refresh_from_db()
    assert (volume.state, volume.size_gib) == ("available", 800)
    assert SimulatedStorage.state(volume.backend_ref)["size_gib"] == 800


def test_a_file_system_serves_many_reservations_and_outlives_them(world, classes):
    shared = made(world)
    first, second = reserve(world), reserve(world, name="eval")
    client = world.client("t1_member")
    for reservation in (first, second):
        answer = client.post(f"{URL}{shared.pk}/attach/", {"reservation": reservation, "read_only": True},
                             format="json")
        assert answer.status_code == 200, answer.content
    assert {a["reservation"] for a in client.get(f"{URL}{shared.pk}/").json()["attached_to"]} == {first, second}
    assert client.post(f"{URL}{shared.pk}/attach/", {"reservation": first}, format="json").status_code == 409
    assert client.post(f"/api/v1/reservations/{first}/cancel/").status_code == 200
    assert attachments_release_ended() == 1  # the ended reservation lets go; the file system stays
    third = reserve(world, name="next")
    assert client.post(f"{URL}{shared.pk}/attach/", {"reservation": third}, format="json").status_code == 200
    assert SimulatedStorage.state(shared.backend_ref)["size_gib"] == 500  # its data outlived the first


def test_a_block_volume_is_attached_to_one_reservation_at_a_time(world, classes):
    disk = made(world, name="disk", storage_class="us-east-1-block", size_gib=100)
    first, second = reserve(world), reserve(world, name="other")
    client = world.client("t1_member")
    assert client.post(f"{URL}{disk.pk}/attach/", {"reservation": first}, format="json").status_code == 200
    taken = client.post(f"{URL}{disk.pk}/attach/", {"reservation": second}, format="json")
    assert taken.status_code == 409 and taken.json()["errors"][0]["code"] == "volume_attached"
    assert client.delete(f"{URL}{disk.pk}/").json()["errors"][0]["code"] == "volume_attached"
    assert client.post(f"{URL}{disk.pk}/detach/", {"reservation": first}, format="json").status_code == 200
    assert client.post(f"{URL}{disk.pk}/attach/", {"reservation": second}, format="json").status_code == 200
    assert VolumeAttachment.objects.filter(volume=disk).count() == 2


def test_attaching_across_regions_or_an_object_bucket_is_refused(world, classes):
    from cloud.models import Region
    from storage.catalogue import default_storage_classes

    default_storage_classes(Region.objects.create(slug="eu-west-1", name="EU West"))
    far = made(world, name="far", storage_class="eu-west-1-shared-fs")
    bucket = made(world, name="bucket", storage_class="us-east-1-object", size_gib=10)
    here = reserve(world)
    client = world.client("t1_member")
    refused = client.post(f"{URL}{far.pk}/attach/", {"reservation": here}, format="json")
    assert refused.status_code == 400 and refused.json()["errors"][0]["code"] == "region_mismatch"
    assert "The volume is in eu-west-1" in refused.json()["errors"][0]["detail"]
    refused = client.post(f"{URL}{bucket.pk}/attach/", {"reservation": here}, format="json")
    assert refused.json()["errors"][0]["code"] == "not_attachable"
    assert not VolumeAttachment.objects.exists()


def test_another_tenants_reservation_is_not_found_for_an_attach(world, classes):
    mine = made(world)
    theirs = reserve(world, "t2_member")
    answer = world.client("t1_member").post(f"{URL}{mine.pk}/attach/", {"reservation": theirs}, format="json")
    assert answer.status_code == 400
    assert ("reservation", "does_not_exist") in {(e["attr"], e["code"]) for e in answer.json()["errors"]}
    assert world.client("t2_member").get(f"{URL}{mine.pk}/").status_code == 404


def test_delete_removes_the_backend_then_destroys_the_key_and_says_so(world, classes):
    volume = made(world)
    answer = world.client("t1_member").delete(f"{URL}{volume.pk}/")
    assert answer.status_code == 202 and answer.json()["state"] == "deleting"
    assert volume_converge(volume.pk) == "done"
    volume.refresh_from_db()
    assert volume.state == "deleted" and volume.wrapped_key == "" and volume.key_destroyed_at is not None
    assert SimulatedStorage.state(volume.backend_ref) == {}
    erase = AuditEvent.objects.get(action="volume.crypto_erase", target_id=str(volume.pk))
    assert erase.after == {"backend_ref": volume.backend_ref, "key": "destroyed"}
    assert str(volume.pk) not in {v["id"] for v in world.client("t1_member").get(URL).json()["results"]}
    assert create(world).status_code == 201  # its name is free again


def test_the_reconcile_sends_lost_steps_again_and_removes_orphans(world, classes, settings, monkeypatch):
    from datetime import timedelta

    from django.utils import timezone

    from storage import dispatch

    sent = []
    monkeypatch.setattr(dispatch, "send", lambda name, args, **options: sent.append(args[0]))
    volume = Volume.objects.get(pk=create(world).json()["id"])
    Volume.objects.filter(pk=volume.pk).update(updated_at=timezone.now() - timedelta(minutes=10))
    SimulatedStorage().create(ref="vol-00000000-0000-0000-0000-00000000beef", kind="block", size_gib=10)
    report = storage_reconcile()
    assert report["resent"] == 1 and str(volume.pk) in sent
    assert report["orphans"] == 1 and "vol-00000000-0000-0000-0000-00000000beef" not in SimulatedStorage().refs()
    assert orphans_remove() == 0


def test_an_attach_to_a_reservation_that_has_started_is_refused_with_what_to_do(world, classes):
    from provisioning.models import Reservation

    volume = made(world)
    started = Reservation.objects.get(pk=reserve(world))
    Reservation.objects.filter(pk=started.pk).update(state="active")
    answer = world.client("t1_member").post(f"{URL}{volume.pk}/attach/", {"reservation": str(started.pk)},
                                            format="json")
    assert answer.status_code == 409 and answer.json()["errors"][0]["code"] == "reservation_started"
    assert "before it starts" in answer.json()["errors"][0]["detail"]
    assert not VolumeAttachment.objects.filter(volume=volume).exists()
