"""
GPUs inside VMs: the host's NVML cannot see GPUs passed through to a VM, so the optional in-guest
agent posts them, with the per-instance secret the config drive's vendor-data wrote. Only the
instance's own GPUs are accepted; the samples go through the host agent's ingestion and failure
detection (source "guest").
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
import yaml
from django.utils import timezone

from cloud.models import GPU, GPUTelemetry
from operations.bmc import vm_gpu_collect
from provisioning.agent.guest import GuestReporter
from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML
from provisioning.cloud_init import GUEST_AGENT_CONFIG, read_iso
from provisioning.drivers.simulated import SimulatedPower
from provisioning.lifecycle.steps import target_of
from provisioning.models import ConfigDrive, Instance, Reservation
from security.models import Incident
from tests.provisioning.pipeline import SSH_KEY
from tests.world import small_fleet, vm_offering


@pytest.fixture
def vms(world, steps):
    Reservation.objects.all().delete()
    small_fleet(4)
    made = []
    for persona in ("t1_member", "t2_member"):
        answer = world.client(persona).post("/api/v1/reservations/", {
            "name": "vm", "offering": vm_offering(1).slug, "gpus": 1, "regions": ["us-east-1"], "duration_hours": 1,
            "ssh_public_key": SSH_KEY}, format="json")
        assert answer.status_code == 201, answer.json()
        made.append(answer.json()["id"])
    steps.run()
    return [Instance.objects.get(reservation_id=pk, state="active") for pk in made]


def telemetry_url(instance) -> str:
    """The URL the config drive's vendor-data gave the guest agent."""
    files = read_iso(bytes(ConfigDrive.objects.get(instance=instance).iso))
    written = yaml.safe_load(files["vendor-data"])["write_files"]
    assert [f["path"] for f in written] == [GUEST_AGENT_CONFIG] and written[0]["permissions"] == "0600"
    return json.loads(written[0]["content"])["telemetry_url"]


def path_of(url: str) -> str:
    return url[url.index("/instance-data/"):]


def own_gpu(instance) -> GPU:
    return GPU.objects.get(pk=instance.devices[0]["gpu_id"])


def post(client, url, samples):
    return client.post(path_of(url), json.dumps({"samples": samples}), content_type="application/json")


def test_a_guest_posts_its_own_gpus_telemetry_and_it_is_stored_as_the_guests(client, vms):
    vm = vms[0]
    gpu = own_gpu(vm)

    answer = post(client, telemetry_url(vm), [{"uuid": gpu.uuid, "utilization_pct": 87, "temperature_c": 61,
                                                "power_w": 512.5, "memory_used_mib": 40960, "xids": []}])

    assert answer.status_code == 200, answer.json()
    assert answer.json() == {"stored": 1, "findings": 0}
    latest = GPUTelemetry.objects.get(gpu=gpu)
    assert (latest.source, latest.utilization_pct, latest.temperature_c) == ("guest", 87, 61)


def test_a_guest_cannot_report_another_instances_gpu(client, vms):
    mine, theirs = vms
    answer = post(client, telemetry_url(mine), [{"uuid": own_gpu(theirs).uuid, "utilization_pct": 0}])

    assert answer.status_code == 403
    assert answer.json()["code"] == "not_this_instances_gpu"
    assert not GPUTelemetry.objects.filter(gpu=own_gpu(theirs), source="guest").exists()


@pytest.mark.parametrize("body, status", [
    (b"not json", 400),
    (b'{"samples": []}', 400),
    (b'{"samples": [{"uuid": "%s", "utilization_pct": 500}]}', 400),
])
def test_bad_guest_telemetry_is_refused_and_stores_nothing(client, vms, body, status):
    vm = vms[0]
    raw = body.replace(b"%s", own_gpu(vm).uuid.encode()) if b"%s" in body else body

    answer = client.post(path_of(telemetry_url(vm)), raw, content_type="application/json")

    assert answer.status_code == status, answer.content
    assert "detail" in answer.json()
    assert not GPUTelemetry.objects.filter(gpu=own_gpu(vm), source="guest").exists()


def test_a_wrong_secret_or_a_released_instance_is_a_404(client, vms, world, steps):
    vm = vms[0]
    url = telemetry_url(vm)
    wrong = url.rsplit("/", 2)[0] + "/not-the-secret/gpu-telemetry"

    assert post(client, wrong, [{"uuid": own_gpu(vm).uuid}]).status_code == 404
    world.client("t1_member").post(f"/api/v1/reservations/{vm.reservation_id}/release/")
    steps.run()
    assert post(client, url, [{"uuid": own_gpu(vm).uuid}]).status_code == 404


def test_an_xid_only_the_guest_sees_reaches_failure_detection(client, vms):
    vm = vms[0]
    gpu = own_gpu(vm)

    answer = post(client, telemetry_url(vm), [{"uuid": gpu.uuid, "utilization_pct": 50, "xids": [79]}])

    assert answer.status_code == 200 and answer.json()["findings"] >= 1
    assert Incident.objects.filter(gpu_ids__contains=[str(gpu.pk)]).exists() or \
        GPU.objects.get(pk=gpu.pk).health != "healthy"


def test_the_guest_agent_posts_what_the_guests_nvml_sees(vms, live_server, tmp_path):
    vm = vms[0]
    config = tmp_path / "guest-agent.json"
    config.write_text(json.dumps({"telemetry_url": live_server.url + path_of(telemetry_url(vm))}))
    nvml = SimulatedNVML([SimulatedGPU(index=0, uuid=own_gpu(vm).uuid, memory_mib=81920)])
    nvml.set_utilization(0, 73)

    answer = GuestReporter(nvml, config).turn()

    assert answer == {"stored": 1, "findings": 0}
    assert GPUTelemetry.objects.get(gpu=own_gpu(vm)).utilization_pct == 73


def test_the_guest_agent_keeps_xids_it_could_not_deliver(tmp_path):
    config = tmp_path / "guest-agent.json"
    config.write_text(json.dumps({"telemetry_url": "http://127.0.0.1:9/instance-data/x/y/gpu-telemetry"}))
    nvml = SimulatedNVML([SimulatedGPU(index=0, uuid="GPU-guest", memory_mib=81920)])
    nvml.inject_xid(0, 48)
    reporter = GuestReporter(nvml, config, timeout=0.5)

    with pytest.raises(ConnectionError, match="posting GPU telemetry"):
        reporter.turn()
    assert reporter.sampler.unsent_xids == {"GPU-guest": [48]}


def test_the_bmc_fills_in_a_vm_gpu_nobody_else_reported_and_leaves_fresh_ones(vms):
    silent, reported = vms
    now = timezone.now()
    GPUTelemetry.objects.filter(gpu__in=[own_gpu(silent), own_gpu(reported)]).delete()
    GPUTelemetry.objects.create(gpu=own_gpu(reported), node=reported.node, sampled_at=now, utilization_pct=40,
                                source="guest", xids=[])
    SimulatedPower().set_readings(target_of(silent.node), gpu_celsius=[70 + i for i in range(8)])

    result = vm_gpu_collect(now=now + timedelta(seconds=1))

    assert result["gpus"] >= 1
    filled = GPUTelemetry.objects.get(gpu=own_gpu(silent))
    assert (filled.source, filled.temperature_c) == ("bmc", 70 + own_gpu(silent).index)
    assert GPUTelemetry.objects.get(gpu=own_gpu(reported)).source == "guest"  # fresh: left alone
