"""
cloud-init: user-data checked at create (400 naming user_data), and each instance's NoCloud config
drive -- an ISO read back here as an instance would read it -- carrying its keys, hostname, network
and the tenant's user-data; a VM gets it as a CD-ROM, bare metal through the BMC's virtual media.
The drive's URL is the instance's secret: a wrong one, another instance's, or a cleaned one is 404.
The host keys the instance printed or reported are shown to its tenant.
"""

import xml.etree.ElementTree as ET
from datetime import timedelta
from urllib.parse import urlencode, urlsplit

import pytest
import yaml
from django.utils import timezone

from provisioning import cloud_init, host_keys
from provisioning.drivers.simulated_console import host_keys as simulated_keys
from provisioning.models import ConfigDrive, Instance, Reservation, SimulatedDevice
from tests.provisioning.factories import offering
from tests.provisioning.pipeline import SSH_KEY, reservation
from tests.world import small_fleet

URL = "/api/v1/reservations/"
USER_DATA = "#cloud-config\npackages: [htop]\nruncmd:\n  - [nvidia-smi]\n"


@pytest.fixture
def fleet(world):
    Reservation.objects.all().delete()
    return small_fleet(4)


def reserve(world, kind="bare_metal", *, who="t1_member", **extra):
    count = {"nodes": 1} if kind == "bare_metal" else {"gpus": 1}
    body = {"name": "job", "offering": offering(kind, 8 if kind == "bare_metal" else 1).slug,
            "regions": ["us-east-1"], "duration_hours": 2, "ssh_public_key": SSH_KEY, **count, **extra}
    return world.client(who).post(URL, body, format="json")


def phone_home(api, path, fields):
    """As cloud-init's phone_home posts: a urlencoded form."""
    return api.post(path, urlencode(fields), content_type="application/x-www-form-urlencoded")


def drive_files(instance) -> dict:
    return cloud_init.read_iso(bytes(ConfigDrive.objects.get(instance=instance).iso))


def test_a_bare_metal_server_gets_its_config_drive_through_the_bmc(world, fleet, steps, api):
    response = reserve(world, user_data=USER_DATA)
    assert response.status_code == 201, response.json()
    steps.run()
    assert reservation(response.json()["id"]).state == "active"
    instance = Instance.objects.get(reservation_id=response.json()["id"])
    files = drive_files(instance)
    assert files["_label"] == "cidata"
    meta = yaml.safe_load(files["meta-data"])
    assert meta["instance-id"] == str(instance.pk) and meta["local-hostname"] == instance.name
    assert meta["public-keys"] == [SSH_KEY]
    assert files["user-data"] == USER_DATA
    network = yaml.safe_load(files["network-config"])
    assert network["ethernets"]["primary"]["addresses"][0].startswith(f"{instance.private_ip}/")
    vendor = yaml.safe_load(files["vendor-data"])
    assert "/report" in vendor["phone_home"]["url"] and str(instance.pk) in vendor["phone_home"]["url"]
    # The BMC's virtual CD holds the drive's URL, and that URL serves these very bytes, with no login.
    bmc = SimulatedDevice.objects.get(key=f"bmc:{instance.node.hostname}").state
    drive = ConfigDrive.objects.get(instance=instance)
    assert bmc["media"] == cloud_init.drive_url(drive)
    fetched = api.get(urlsplit(bmc["media"]).path)
    assert fetched.status_code == 200 and fetched["Content-Type"] == "application/x-iso9660-image"
    assert b"".join(fetched) == bytes(drive.iso)


def test_a_vm_gets_its_drive_as_a_cdrom_and_a_nic_with_the_address_it_is_configured_with(world, fleet, steps):
    response = reserve(world, "vm", user_data="#!/bin/sh\necho hello\n")
    assert response.status_code == 201, response.json()
    steps.run()
    instance = Instance.objects.get(reservation_id=response.json()["id"])
    domain = SimulatedDevice.objects.get(key=f"hypervisor:{instance.node.hostname}").state["domains"][instance.name]
    xml = ET.fromstring(domain["xml"])  # noqa: S314 -- our own XML
    cdrom = xml.find("./devices/disk[@device='cdrom']")
    drive = ConfigDrive.objects.get(instance=instance)
    assert cloud_init.drive_url(drive).endswith(cdrom.find("source").get("name"))
    assert cdrom.find("readonly") is not None
    mac = xml.find("./devices/interface/mac").get("address")
    files = drive_files(instance)
    assert yaml.safe_load(files["network-config"])["ethernets"]["primary"]["match"] == {"macaddress": mac}
    assert files["user-data"] == "#!/bin/sh\necho hello\n"
    assert yaml.safe_load(files["meta-data"])["public-keys"] == [SSH_KEY]


def test_the_drive_is_made_once_a_retried_step_inserts_the_same_bytes(world, fleet, steps):
    response = reserve(world)
    steps.run()
    instance = Instance.objects.get(reservation_id=response.json()["id"])
    first = ConfigDrive.objects.get(instance=instance)
    again = cloud_init.drive_for(instance, keys=["ssh-ed25519 AAAA other"], mounts=[])
    assert (again.token, bytes(again.iso)) == (first.token, bytes(first.iso))


@pytest.mark.parametrize("text, says", [
    ("#cloud-config\npackages: [htop\n", "not valid YAML at line"),
    ("#cloud-config\n- just\n- a list\n", "must be a mapping"),
    ("echo hello\n", "must start with '#cloud-config'"),
    ("#!/bin/sh\n" + "x" * 20_000, "the limit is 16,384"),
    ("#!/bin/sh\necho \x00\n", "Null characters"),
])
def test_bad_user_data_is_a_400_naming_the_field_and_nothing_is_made(world, fleet, text, says):
    before = Reservation.objects.count()
    response = reserve(world, user_data=text)
    assert response.status_code == 400, response.json()
    assert says in str(response.json())
    assert "user_data" in str(response.json())
    assert Reservation.objects.count() == before


def test_a_wrong_secret_another_instances_or_a_cleaned_instances_drive_is_404(world, fleet, steps, api):
    ids = reserve(world).json()["id"], reserve(world, who="t2_member").json()["id"]
    steps.run()
    first, second = (Instance.objects.get(reservation_id=pk) for pk in ids)
    mine, theirs = ConfigDrive.objects.get(instance=first), ConfigDrive.objects.get(instance=second)
    assert api.get(f"/instance-data/{first.pk}/{mine.token}/config-drive.iso").status_code == 200
    assert api.get(f"/instance-data/{first.pk}/{theirs.token}/config-drive.iso").status_code == 404
    assert api.get(f"/instance-data/{first.pk}/{mine.token[:-1]}x/config-drive.iso").status_code == 404
    assert world.client("t1_member").post(f"{URL}{first.reservation_id}/release/").status_code == 200
    steps.run()
    assert not ConfigDrive.objects.filter(instance=first).exists()
    assert api.get(f"/instance-data/{first.pk}/{mine.token}/config-drive.iso").status_code == 404
    assert api.get(f"/instance-data/{second.pk}/{theirs.token}/config-drive.iso").status_code == 200


def test_the_host_keys_printed_on_the_console_are_shown_and_a_later_report_cannot_swap_them(world, fleet, steps,
                                                                                           api):
    pk = reserve(world, "vm").json()["id"]
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    instance.refresh_from_db()
    shown = world.client("t1_member").get(f"/api/v1/instances/{instance.pk}/").json()
    assert [k["type"] for k in shown["host_keys"]] == ["ssh-ed25519", "ecdsa-sha2-nistp256"]
    printed = world.client("t1_member").get(f"/api/v1/instances/{instance.pk}/console/").json()
    assert "-----BEGIN SSH HOST KEY KEYS-----" in printed["output"] and printed["truncated"] is False
    assert [k["fingerprint"] for k in host_keys.from_console(printed["output"])] == [
        k["fingerprint"] for k in shown["host_keys"]]
    token = ConfigDrive.objects.get(instance=instance).token
    other = simulated_keys("someone else")[0]
    answer = phone_home(api, f"/instance-data/{instance.pk}/{token}/report", {"pub_key_ed25519": other})
    assert answer.status_code == 200 and answer.json()["kept"] is False
    instance.refresh_from_db()
    assert other not in [k["key"] for k in instance.host_keys]


def test_an_instance_reports_its_host_keys_with_cloud_inits_phone_home(world, fleet, steps, api, monkeypatch):
    from provisioning.lifecycle import steps as lifecycle_steps

    monkeypatch.setattr(lifecycle_steps, "console_output", lambda *a, **k: "")  # a console nobody keeps
    pk = reserve(world).json()["id"]
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    instance.refresh_from_db()
    assert instance.host_keys == [] and instance.reported_at is None
    token = ConfigDrive.objects.get(instance=instance).token
    ed, ecdsa = simulated_keys(str(instance.pk))
    report = f"/instance-data/{instance.pk}/{token}/report"
    assert phone_home(api, report, {"instance_id": "i-other", "pub_key_ed25519": ed}).status_code == 400
    assert phone_home(api, report, {"hostname": "x"}).status_code == 400
    answer = phone_home(api, f"/instance-data/{instance.pk}/{token}/report",
                        {"instance_id": str(instance.pk), "pub_key_ed25519": ed + " root@host\n",
                         "pub_key_ecdsa": ecdsa, "pub_key_rsa": "not a key"})
    assert answer.status_code == 200 and answer.json()["kept"] is True
    instance.refresh_from_db()
    assert [k["key"] for k in instance.host_keys] == [ed, ecdsa] and instance.reported_at is not None


def test_console_output_is_the_members_and_another_tenants_instance_is_404(world, fleet, steps):
    pk = reserve(world, "vm").json()["id"]
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    assert world.client("t2_member").get(f"/api/v1/instances/{instance.pk}/console/").status_code == 404
    assert world.client("t1_viewer").get(f"/api/v1/instances/{instance.pk}/console/").status_code == 403


def test_a_preempted_spot_instance_reads_its_termination_time(world, fleet, steps, api):
    spot = offering("vm", 1)
    type(spot).objects.filter(pk=spot.pk).update(spot_available=True, spot_floor_price="1.00")
    response = reserve(world, "vm", billing_term="spot", spot_max_price="1.50")
    assert response.status_code == 201, response.json()
    pk = response.json()["id"]
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    token = ConfigDrive.objects.get(instance=instance).token
    path = f"/instance-data/{instance.pk}/{token}/spot/termination-time"
    assert api.get(path).status_code == 404  # nothing set yet, as on EC2
    at = (timezone.now() + timedelta(minutes=2)).replace(microsecond=0)
    Reservation.objects.filter(pk=instance.reservation_id).update(
        preempted_by=Reservation.objects.exclude(pk=instance.reservation_id).first()
        or Reservation.objects.get(pk=instance.reservation_id), released_at=at)
    answer = api.get(path)
    assert answer.status_code == 200 and answer.content.decode() == at.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_soft_eviction_tells_the_time_in_its_reason_the_metadata_and_a_notification(world, fleet, steps, api):
    from django.db import transaction

    from provisioning.services import reservation_evict
    from tenants.models import Notification

    spot = offering("vm", 1)
    type(spot).objects.filter(pk=spot.pk).update(spot_available=True, spot_floor_price="1.00")
    pk = reserve(world, "vm", billing_term="spot", spot_max_price="1.50").json()["id"]
    steps.run()
    instance = Instance.objects.get(reservation_id=pk)
    preemptor = reserve(world, "vm").json()["id"]
    at = (timezone.now() + timedelta(minutes=2)).replace(microsecond=0)
    with transaction.atomic():
        reservation_evict(victim_id=pk, by=Reservation.objects.get(pk=preemptor), at=at)
    victim = Reservation.objects.get(pk=pk)
    stamp = at.strftime("%Y-%m-%d %H:%M:%S")
    assert stamp in victim.state_reason and "save your work" in victim.state_reason
    assert str(preemptor) not in victim.state_reason  # never who: the preemptor may be another tenant's
    token = ConfigDrive.objects.get(instance=instance).token
    answer = api.get(f"/instance-data/{instance.pk}/{token}/spot/termination-time")
    assert answer.content.decode() == at.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert Notification.objects.filter(kind__icontains="evict", link__contains=str(pk)).exists()


def test_host_keys_are_parsed_and_fingerprinted_as_ssh_keygen_does():
    ed = simulated_keys("x")[0]
    parsed = host_keys.parse([ed + " root@x", ed, "garbage", "ssh-ed25519 !!!"])
    assert len(parsed) == 1 and parsed[0]["key"] == ed and parsed[0]["fingerprint"].startswith("SHA256:")
    assert len(parsed[0]["fingerprint"]) == len("SHA256:") + 43
