"""
Checkpoint tiers on the simulated backend (storage.checkpoints, storage.moves): the newest stay
hot, older unused ones move to the cold volume chunk by chunk with their progress, a restore brings
them back (before the hand-over of a reservation that asked for one), a worker killed mid-move or a
second run of the same move neither loses nor doubles a chunk, a move that fails for good leaves the
data where it was and nothing half copied, and bad requests are refused with nothing changed.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from storage import moves
from storage.checkpoints import progress, scan, tier_pass
from storage.drivers.simulated import SimulatedStorage
from storage.models import Checkpoint, CheckpointPolicy, Volume, VolumeAttachment
from storage.moves import checkpoint_move, cold_key
from tests.provisioning.pipeline import reservation, reserve_on_small_fleet
from tests.storage.test_volumes import made

pytestmark = pytest.mark.django_db
CHUNK = 1024
SIZES = {"model.pt": 5000, "optim.pt": 2048}  # 5 chunks + 2 chunks


@pytest.fixture
def tiers(world, classes, settings):
    settings.MERIDIAN_STORAGE_CHUNK_BYTES = CHUNK
    fs = made(world, name="ckpt", storage_class="us-east-1-shared-fs", size_gib=500)
    cold = made(world, name="archive", storage_class="us-east-1-object", size_gib=500)
    answer = world.client("t1_member").put(f"/api/v1/volumes/{fs.pk}/checkpoint-policy/", {
        "cold_volume": str(cold.pk), "demote_after_hours": 6, "keep_hot": 1}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["cold_volume_name"] == "archive" and answer.json()["prefix"] == "checkpoints/"
    return fs, cold


def code(answer) -> str:
    return answer.json()["errors"][0]["code"]


def write(volume: Volume, name: str, sizes=SIZES) -> None:
    """A training job saves checkpoint ``name`` (its files of ``sizes``) into the file system."""
    driver = SimulatedStorage()
    for file, size in sizes.items():
        for index in range(-(-size // CHUNK)):
            driver.write_chunk(ref=volume.backend_ref, key=f"checkpoints/{name}/{file}", index=index, chunk=CHUNK,
                               data=b"x" * min(CHUNK, size - index * CHUNK))


def files(volume: Volume, prefix="") -> dict[str, int]:
    return {key: info.size for key, info in SimulatedStorage().files(ref=volume.backend_ref, prefix=prefix).items()}


def demoting(fs: Volume) -> Checkpoint:
    """Two checkpoints written, the pass run 7 hours on: the older one (keep_hot 1) is being demoted."""
    write(fs, "a")
    write(fs, "b")
    tier_pass(now=timezone.now() + timedelta(hours=7))
    return Checkpoint.objects.get(state="demoting")


def run_moves(slice_s=0.0, limit=100) -> list[str]:
    """Run every move in flight to its end, one slice at a time (slice 0: a chunk per run), as the workers would."""
    outcomes = []
    for _ in range(limit):
        moving = list(Checkpoint.objects.filter(state__in=("demoting", "restoring")).values_list("pk", flat=True))
        if not moving:
            return outcomes
        outcomes += [checkpoint_move(pk, slice_s=slice_s) for pk in moving]
    raise AssertionError(f"moves did not finish: {outcomes[-5:]}")


def test_the_newest_stay_hot_and_older_unused_ones_go_cold_and_come_back(world, tiers):
    fs, cold = tiers
    write(fs, "step-100")
    write(fs, "step-200")
    later = timezone.now() + timedelta(hours=7)
    assert tier_pass(now=later) == {"scanned": 1, "demoting": 1}  # keep_hot 1: step-200 stays
    old = Checkpoint.objects.get(volume=fs, name="step-100")
    assert old.state == "demoting" and old.size_bytes == 7048
    assert Checkpoint.objects.get(volume=fs, name="step-200").state == "hot"

    assert checkpoint_move(old.pk, slice_s=0) == "continues"  # one chunk per run: progress shows
    old.refresh_from_db()
    assert 0 < progress(old).percent < 100 and old.moved_bytes == CHUNK
    outcomes = run_moves()
    assert outcomes[-1] == "done"
    old.refresh_from_db()
    assert old.state == "cold" and old.moved_bytes == 7048 and progress(old).percent == 100
    assert files(fs) == {f"checkpoints/step-200/{f}": size for f, size in SIZES.items()}  # gone from the hot tier
    assert files(cold) == {cold_key(old, f"checkpoints/step-100/{f}"): size for f, size in SIZES.items()}

    answer = world.client("t1_member").post(f"/api/v1/checkpoints/{old.pk}/restore/", {}, format="json")
    assert answer.status_code == 202 and answer.json()["state"] == "restoring"
    run_moves(slice_s=10)
    old.refresh_from_db()
    assert old.state == "hot" and old.last_used_at > timezone.now() - timedelta(minutes=1)
    assert files(fs, "checkpoints/step-100/") == {f"checkpoints/step-100/{f}": s for f, s in SIZES.items()}
    assert files(cold) == {}
    assert tier_pass(now=timezone.now() + timedelta(hours=1))["demoting"] == 0  # just used: stays hot


def test_a_worker_killed_between_a_chunk_and_its_record_loses_and_doubles_nothing(world, tiers, monkeypatch):
    fs, cold = tiers
    checkpoint = demoting(fs)
    real = SimulatedStorage.write_chunk
    writes = []

    def killed_after_third(self, **kwargs):
        real(self, **kwargs)
        writes.append(kwargs["index"])
        if len(writes) == 3:
            raise SystemExit("worker killed after the chunk was written, before it was recorded")

    monkeypatch.setattr(SimulatedStorage, "write_chunk", killed_after_third)
    with pytest.raises(SystemExit):
        checkpoint_move(checkpoint.pk, slice_s=60)
    monkeypatch.undo()
    checkpoint.refresh_from_db()
    assert checkpoint.moved_bytes == 2 * CHUNK and checkpoint.state == "demoting"  # two recorded
    assert run_moves(slice_s=60) == ["done"]
    checkpoint.refresh_from_db()
    assert checkpoint.state == "cold" and checkpoint.moved_bytes == 7048
    assert sum(files(cold).values()) == 7048


def test_a_second_run_of_the_same_move_stops_when_the_cursor_moved(world, tiers, monkeypatch):
    fs, _ = tiers
    checkpoint = demoting(fs)
    real = SimulatedStorage.write_chunk

    def other_run_moves_on(self, **kwargs):  # meanwhile another worker records the same chunk
        real(self, **kwargs)
        Checkpoint.objects.filter(pk=checkpoint.pk).update(cursor_chunk=1, moved_bytes=CHUNK)

    monkeypatch.setattr(SimulatedStorage, "write_chunk", other_run_moves_on)
    assert checkpoint_move(checkpoint.pk, slice_s=60) == "stopped"
    monkeypatch.undo()
    assert Checkpoint.objects.get(pk=checkpoint.pk).moved_bytes == CHUNK  # counted once


def test_a_move_that_fails_for_good_leaves_the_data_where_it_was_and_nothing_half_copied(world, tiers, settings):
    fs, cold = tiers
    checkpoint = demoting(fs)
    checkpoint_move(checkpoint.pk, slice_s=0)  # a chunk in the cold volume already
    assert files(cold)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "broken_rate": {"storage_write": 1.0}}
    assert checkpoint_move(checkpoint.pk, slice_s=60) == "failed"
    checkpoint.refresh_from_db()
    assert checkpoint.state == "hot" and "Moving to the cold tier failed" in checkpoint.state_reason
    assert files(fs, "checkpoints/a/") and files(cold) == {}


def test_a_transient_error_is_tried_again(world, tiers, settings):
    fs, _ = tiers
    checkpoint = demoting(fs)
    settings.MERIDIAN_SIMULATION = {**settings.MERIDIAN_SIMULATION, "failure_rate": {"storage_read": 1.0}}
    with pytest.raises(moves.TryAgain):
        checkpoint_move(checkpoint.pk)
    assert Checkpoint.objects.get(pk=checkpoint.pk).attempts == 1


def test_a_restore_asked_with_a_reservation_is_finished_before_its_hand_over(world, tiers, steps, settings):
    settings.MERIDIAN_STEP_WAITS = 1000  # the harness runs a wait's next look at once: let it look long enough
    fs, _ = tiers
    write(fs, "step-1")
    write(fs, "step-2")
    tier_pass(now=timezone.now() + timedelta(hours=7))
    run_moves(slice_s=60)
    cold_one = Checkpoint.objects.get(state="cold")
    first = reserve_on_small_fleet(world, kind="bare_metal")
    answer = world.client("t1_member").post(f"/api/v1/volumes/{fs.pk}/attach/", {
        "reservation": first, "restore": [cold_one.name]}, format="json")
    assert answer.status_code == 200, answer.content
    cold_one.refresh_from_db()
    assert cold_one.state == "restoring" and str(cold_one.restore_for_id) == first

    ran = steps.run(limit=100, settle=False)
    assert ("provision", "hand_over", "waiting") in ran and reservation(first).state != "active"
    run_moves(slice_s=60)
    steps.run()
    assert reservation(first).state == "active"
    assert Checkpoint.objects.get(pk=cold_one.pk).state == "hot"


def test_bad_requests_are_refused_and_change_nothing(world, tiers):
    fs, cold = tiers
    client = world.client("t1_member")
    block = made(world, name="disk", storage_class="us-east-1-block", size_gib=100)
    answer = client.put(f"/api/v1/volumes/{block.pk}/checkpoint-policy/", {"cold_volume": str(cold.pk)},
                        format="json")
    assert answer.status_code == 400 and code(answer) == "not_tierable"
    answer = client.put(f"/api/v1/volumes/{fs.pk}/checkpoint-policy/", {"cold_volume": str(block.pk)},
                        format="json")
    assert answer.status_code == 400 and code(answer) == "not_object_storage"
    for body in ({"cold_volume": str(cold.pk), "prefix": "../etc"}, {"cold_volume": str(cold.pk), "keep_hot": -1},
                 {"cold_volume": str(cold.pk), "demote_after_hours": "6"}):
        assert client.put(f"/api/v1/volumes/{fs.pk}/checkpoint-policy/", body, format="json").status_code == 400
    other = made(world, persona="t2_member", name="theirs", storage_class="us-east-1-object", size_gib=100)
    answer = client.put(f"/api/v1/volumes/{fs.pk}/checkpoint-policy/", {"cold_volume": str(other.pk)}, format="json")
    assert answer.status_code == 400  # another tenant's volume is not found
    assert CheckpointPolicy.objects.get(volume=fs).cold_volume_id == cold.pk and \
        CheckpointPolicy.objects.get(volume=fs).keep_hot == 1

    first = reserve_on_small_fleet(world, kind="bare_metal")
    answer = client.post(f"/api/v1/volumes/{fs.pk}/attach/", {"reservation": first, "restore": ["nope"]},
                         format="json")
    assert answer.status_code == 400 and code(answer) == "checkpoint_not_found"
    assert not VolumeAttachment.objects.filter(volume=fs).exists()  # the attach is undone with it

    write(fs, "a")
    write(fs, "b")
    tier_pass(now=timezone.now() + timedelta(hours=7))
    demoting = Checkpoint.objects.get(state="demoting")
    answer = client.post(f"/api/v1/checkpoints/{demoting.pk}/restore/", {}, format="json")
    assert answer.status_code == 409 and code(answer) == "checkpoint_moving"
    assert world.client("t2_member").get(f"/api/v1/checkpoints/{demoting.pk}/").status_code == 404
    assert world.client("t1_viewer").post(f"/api/v1/checkpoints/{demoting.pk}/restore/", {},
                                          format="json").status_code == 403


def test_the_scan_follows_the_file_system(world, tiers):
    fs, _ = tiers
    write(fs, "a")
    policy = CheckpointPolicy.objects.get(volume=fs)
    assert scan(policy) == 1
    write(fs, "a", {"model.pt": 9000})  # rewritten larger
    scan(policy)
    assert Checkpoint.objects.get(volume=fs, name="a").size_bytes == 9000 + SIZES["optim.pt"]
    for key in files(fs):
        SimulatedStorage().remove(ref=fs.backend_ref, key=key)  # the tenant removed it
    assert scan(policy) == 0 and not Checkpoint.objects.filter(volume=fs).exists()
