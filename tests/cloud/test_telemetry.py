"""
GPU telemetry (cloud.telemetry): ingestion in constant queries, the node agent's bad inputs
(ENGINEERING.md §7) refused with nothing stored, rollups (means, maxima, standard deviations from
sums; idempotent), retention, port flaps, the staff and tenant reads, and the out-of-band readings
of a bare-metal node a tenant holds.
"""

from __future__ import annotations

import math
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from cloud import telemetry
from cloud.choices import NodePool, NodeState
from cloud.fleet import HGX_PCI_BUS_IDS
from cloud.models import (
    GPU,
    GPUSample,
    GPUSampleRollup,
    GPUTelemetry,
    HCAPort,
    HCAPortStatus,
    Node,
    NodeBMCReading,
)
from core.db import PREPARE_THRESHOLD
from core.errors import DomainError, Forbidden
from operations import bmc
from provisioning.drivers import Target, fabric_driver_for
from provisioning.drivers.simulated import SimulatedPower
from provisioning.models import Allocation, Reservation
from tests.world import h100, small_fleet, unique

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def fleet(db):
    return small_fleet(4)


def node_with(gpus: int) -> Node:
    """A node with ``gpus`` GPUs (64 is more than any real server, which is the point)."""
    template = Node.objects.order_by("hostname").first()
    node = Node.objects.create(
        hostname=unique("wide-node"),
        region=template.region,
        fabric=template.fabric,
        leaf=template.leaf,
        pool=NodePool.SHARED,
        bmc_address="https://bmc/redfish/v1",
        cpu_cores=64,
        ram_gib=512,
        nvme_tb="3.84",
        gpus_installed=gpus,
        state=NodeState.IN_SERVICE,
    )
    GPU.objects.bulk_create(
        [
            GPU(
                node=node,
                index=i,
                uuid=f"GPU-{uuid.uuid4()}",
                serial=unique("sn"),
                pci_bus_id=HGX_PCI_BUS_IDS[i] if i < 8 else f"0000:{i:02x}:00.0",
                model=h100(),
                memory_mib=81920,
            )
            for i in range(gpus)
        ]
    )
    return node


def sample(gpu_uuid: str, **readings) -> dict:
    return {
        "uuid": gpu_uuid,
        "utilization_pct": 50,
        "memory_used_mib": 1024,
        "memory_total_mib": 81559,
        "temperature_c": 45,
        "power_w": 300.5,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "processes": 1,
        "xids": [],
        **readings,
    }


def samples_of(node: Node, **readings) -> list[dict]:
    return [sample(u, **readings) for u in node.gpus.order_by("index").values_list("uuid", flat=True)]


def ports_of(node: Node, link: str = "up") -> list[dict]:
    return [{"guid": guid, "link": link} for guid in node.ib_ports.order_by("index").values_list("guid", flat=True)]


def stored() -> tuple[int, int, int]:
    return GPUSample.objects.count(), GPUTelemetry.objects.count(), HCAPortStatus.objects.count()


#
# Ingestion
#


def test_ingest_stores_raw_samples_latest_and_ports(fleet):
    node = fleet[0]
    result = telemetry.ingest(node=node, samples=samples_of(node), ports=ports_of(node), now=T0)
    assert stored() == (8, 8, 8)
    latest = GPUTelemetry.objects.get(gpu=node.gpus.get(index=3))
    assert (latest.utilization_pct, latest.memory_total_mib, latest.power_w, latest.sampled_at) == (
        50,
        81559,
        300.5,
        T0,
    )
    assert [r.previous for r in result.gpus] == [None] * 8
    assert {p.link for p in result.ports} == {"up"} and all(p.previous is None for p in result.ports)


def test_ingest_returns_each_new_sample_with_the_one_before(fleet):
    """What failure detection needs for cloud.health.evaluate_gpu, with no further query."""
    node = fleet[0]
    telemetry.ingest(node=node, samples=samples_of(node, ecc_uncorrected=1), ports=[], now=T0)
    later = samples_of(node, ecc_uncorrected=1)
    later[2] = sample(later[2]["uuid"], ecc_uncorrected=3, xids=[79], temperature_c=93)
    result = telemetry.ingest(node=node, samples=later, ports=[], now=T0 + timedelta(seconds=10))
    third = next(r for r in result.gpus if r.index == 2)
    assert (third.sample["ecc_uncorrected"], third.previous["ecc_uncorrected"]) == (3, 1)
    assert third.sample["xids"] == [79] and third.previous["sampled_at"] == T0 and third.previous["xids"] == []
    from cloud.health import FailurePolicy, evaluate_gpu

    causes = {
        f.cause
        for f in evaluate_gpu(sample=third.sample, previous=third.previous, recent_xids=0, policy=FailurePolicy())
    }
    assert causes == {"xid_79", "uncorrectable_ecc", "over_temperature"}
    assert GPUTelemetry.objects.get(gpu_id=third.gpu_id).xids == [79]
    assert GPUSample.objects.filter(gpu_id=third.gpu_id).order_by("sampled_at").last().xid_count == 1


def test_ingest_takes_the_same_queries_for_8_gpus_as_for_64(fleet):
    counts = {}
    for gpus in (8, 64):
        node = node_with(gpus)
        HCAPort.objects.bulk_create(
            [HCAPort(node=node, index=i, guid=f"{0xA000 + 0x100 * gpus + i:016x}") for i in range(gpus)]
        )
        telemetry.ingest(node=node, samples=samples_of(node), ports=ports_of(node), now=T0)  # first: inserts
        samples, ports = samples_of(node, utilization_pct=70), ports_of(node, "down")
        with CaptureQueriesContext(connection) as queries:
            telemetry.ingest(node=node, samples=samples, ports=ports, now=T0 + timedelta(seconds=10))
        counts[gpus] = len(queries)
        assert GPUSample.objects.filter(gpu__node=node).count() == 2 * gpus
        assert set(GPUTelemetry.objects.filter(node=node).values_list("utilization_pct", flat=True)) == {70}
        assert set(HCAPortStatus.objects.filter(port__node=node).values_list("link", flat=True)) == {"down"}
    # PostgreSQL: one read (GPUs with their latest, ports with their status), one write. SQLite: the
    # same through the ORM, a few statements more. Never one per GPU.
    assert counts[8] == counts[64] <= 7, counts


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: PostgreSQL's")
def test_the_hot_statements_are_prepared_unless_the_database_options_say_not(fleet):
    """
    Django leaves psycopg's preparing off; the heartbeat's statements turn it on for their own
    server-binding cursors (prepared on the fifth use), unless OPTIONS name ``prepare_threshold``.
    """
    from unittest import mock

    node = Node.objects.order_by("hostname").first()
    connection.ensure_connection()
    raw = connection.connection
    before = raw.prepare_threshold
    try:
        raw.prepare_threshold = None
        with mock.patch.dict(connection.settings_dict["OPTIONS"], {"prepare_threshold": None}):
            telemetry.node_known(node)
        assert raw.prepare_threshold is None  # behind a transaction-mode pooler: left off
        for _ in range(PREPARE_THRESHOLD + 1):
            telemetry.node_known(node)
        assert raw.prepare_threshold == PREPARE_THRESHOLD
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
                ["%json_agg(json_build_array(g.id, g.index, g.uuid%"],
            )
            assert cursor.fetchone()[0] == 1
            # and they run on their generic plan, planned once (PostgreSQL's default re-plans
            # some for the values of every run)
            cursor.execute("SHOW plan_cache_mode")
            assert cursor.fetchone()[0] == "force_generic_plan"
    finally:
        raw.prepare_threshold = before


def _bad(node: Node, other: Node) -> dict:
    first = node.gpus.order_by("index").first().uuid
    return {
        "memory_used_over_total": ([sample(first, memory_used_mib=90_000, memory_total_mib=81_559)], 400),
        "negative_utilization": ([sample(first, utilization_pct=-1)], 400),
        "utilization_over_100": ([sample(first, utilization_pct=101)], 400),
        "negative_memory": ([sample(first, memory_used_mib=-5)], 400),
        "negative_power": ([sample(first, power_w=-3.0)], 400),
        "temperature_over_200": ([sample(first, temperature_c=250)], 400),
        "negative_ecc": ([sample(first, ecc_uncorrected=-1)], 400),
        "a_string_reading": ([sample(first, utilization_pct="50")], 400),
        "a_boolean_reading": ([sample(first, processes=True)], 400),
        "a_fractional_counter": ([sample(first, ecc_corrected=1.5)], 400),
        "not_a_number": ([sample(first, power_w=float("nan"))], 400),
        "xids_not_a_list": ([sample(first, xids="79")], 400),
        "xid_not_an_integer": ([sample(first, xids=["79"])], 400),
        "too_many_xids": ([sample(first, xids=[13] * 65)], 400),
        "no_uuid": ([{"utilization_pct": 5}], 400),
        "not_an_object": (["GPU-x"], 400),
        "the_same_gpu_twice": ([sample(first), sample(first)], 400),
        "another_nodes_gpu": ([sample(other.gpus.first().uuid)], 403),
        "more_samples_than_gpus": (samples_of(node) + [sample(f"GPU-{uuid.uuid4()}")], 400),
        "a_hundred_thousand_samples": ([sample(first)] * 100_000, 400),
    }


def test_bad_samples_are_refused_and_nothing_is_stored(fleet, subtests):
    """Each bad input of ENGINEERING.md §7 is a 400 or 403 with a message, and no row is written."""
    node, other = fleet[0], fleet[1]
    for name, (samples, status) in _bad(node, other).items():
        with subtests.test(name):
            # A valid sample and port ride along: they must not be stored either.
            good = [
                s for s in samples_of(node) if s["uuid"] not in {x.get("uuid") for x in samples if isinstance(x, dict)}
            ][:1]
            with pytest.raises((DomainError, Forbidden)) as raised:
                telemetry.ingest(node=node, samples=good + samples, ports=ports_of(node), now=T0)
            assert raised.value.status_code == status, raised.value.detail
            assert str(raised.value.detail)
            assert stored() == (0, 0, 0)


@pytest.mark.parametrize(
    ("ports", "status"),
    [
        ([{"guid": "not-a-guid", "link": "up"}], 400),
        ([{"guid": "00000000000000aa", "link": "sideways"}], 400),
        (["up"], 400),
    ],
)
def test_bad_ports_are_refused(fleet, ports, status):
    node = fleet[0]
    with pytest.raises(DomainError) as raised:
        telemetry.ingest(node=node, samples=samples_of(node), ports=ports, now=T0)
    assert raised.value.status_code == status
    assert stored() == (0, 0, 0)


def test_unknown_ports_are_skipped_and_the_rest_is_stored(fleet, caplog):
    """
    A port GUID the node has no HCAPort for -- SR-IOV virtual functions under /sys/class/infiniband,
    a newly fitted HCA, another node's GUID -- is skipped and logged once with the GUIDs, not
    refused: refusing it refused every heartbeat of such a host, and the watchdog failed it. Its
    own ports and samples are stored; nothing is written for the unknown GUIDs.
    """
    node, other = fleet[0], fleet[1]
    vfs = [{"guid": f"0x{0xAB + i:016x}", "link": "up"} for i in range(len(ports_of(node)))]  # more than it has
    with caplog.at_level("WARNING", logger="cloud.telemetry.ingestion"):
        result = telemetry.ingest(
            node=node, samples=samples_of(node), ports=ports_of(node) + vfs + ports_of(other)[:1], now=T0
        )
    assert {p.guid for p in result.ports} == {p["guid"] for p in ports_of(node)}
    assert stored() == (node.gpus.count(), node.gpus.count(), node.ib_ports.count())
    assert not HCAPortStatus.objects.filter(port__node=other).exists()
    warnings = [r.getMessage() for r in caplog.records if "no HCAPort" in r.getMessage()]
    assert len(warnings) == 1 and "00000000000000ab" in warnings[0] and ports_of(other)[0]["guid"] in warnings[0]

    only_unknown = telemetry.ingest(node=node, samples=[], ports=vfs[:1], now=T0 + timedelta(seconds=10))
    assert only_unknown.ports == [] and HCAPortStatus.objects.count() == node.ib_ports.count()


def test_a_port_reported_twice_is_refused(fleet):
    node = fleet[0]
    with pytest.raises(DomainError) as raised:
        telemetry.ingest(node=node, samples=samples_of(node), ports=ports_of(node) + ports_of(node)[:1], now=T0)
    assert raised.value.status_code == 400
    assert stored() == (0, 0, 0)


def test_extra_fields_are_ignored(fleet):
    """A sample cannot set anything but readings: ``tenant_id`` or ``state="free"`` change nothing."""
    node = fleet[0]
    gpu = node.gpus.order_by("index").first()
    GPU.objects.filter(pk=gpu.pk).update(state="allocated")
    telemetry.ingest(
        node=node, samples=[sample(gpu.uuid, state="free", tenant_id=str(uuid.uuid4()), node="x")], ports=[], now=T0
    )
    assert GPU.objects.get(pk=gpu.pk).state == "allocated"
    assert GPUTelemetry.objects.get(gpu=gpu).node_id == node.pk


def test_unsupported_readings_are_stored_as_none(fleet):
    node = fleet[0]
    gpu = node.gpus.order_by("index").first()
    telemetry.ingest(node=node, samples=[{"uuid": gpu.uuid}], ports=[], now=T0)
    latest = GPUTelemetry.objects.get(gpu=gpu)
    assert (latest.utilization_pct, latest.power_w, latest.ecc_uncorrected, latest.xids) == (None, None, None, [])


#
# Ports
#


def test_port_flaps_are_counted_inside_the_window(fleet, settings):
    settings.MERIDIAN_PORT_FLAP_WINDOW_S = 300
    node = fleet[0]
    guid = node.ib_ports.order_by("index").first().guid

    def report(link, at):
        return telemetry.ingest(node=node, samples=[], ports=[{"guid": guid, "link": link}], now=at).ports[0]

    first = report("up", T0)
    assert (first.previous, first.changes_in_window) == (None, 0)  # the first known state is no flap
    assert report("up", T0 + timedelta(seconds=10)).changes_in_window == 0
    assert report("down", T0 + timedelta(seconds=20)).changes_in_window == 1
    assert report("up", T0 + timedelta(seconds=30)).changes_in_window == 2
    flapping = report("down", T0 + timedelta(seconds=40))
    assert (flapping.previous, flapping.link, flapping.changes_in_window) == ("up", "down", 3)
    status = HCAPortStatus.objects.get(port__guid=guid)
    assert (status.changed_at, status.seen_at, status.window_started_at) == (
        T0 + timedelta(seconds=40),
        T0 + timedelta(seconds=40),
        T0 + timedelta(seconds=20),
    )
    assert telemetry.changes_in_window(status, T0 + timedelta(minutes=6)) == 0  # the window has passed
    again = report("up", T0 + timedelta(minutes=6))
    assert again.changes_in_window == 1  # a new window starts at the next change


#
# Rollups and retention
#


def _raw(gpu: GPU, at: datetime, utilization: int | None, **fields) -> GPUSample:
    return GPUSample(gpu=gpu, sampled_at=at, utilization_pct=utilization, **fields)


def test_rollup_computes_means_maxima_and_deviations_and_runs_once(fleet):
    node = fleet[0]
    a, b = node.gpus.order_by("index")[:2]
    minute = [10, 20, 30, 40, 50, 60]  # six samples, ten seconds apart
    rows = [
        _raw(
            a,
            T0 + timedelta(seconds=10 * i),
            u,
            temperature_c=40 + i,
            power_w=100.0 + i,
            processes=1,
            memory_used_mib=1000 * i,
            ecc_uncorrected=i // 3,
            xid_count=1 if i == 4 else 0,
        )
        for i, u in enumerate(minute)
    ]
    rows += [_raw(a, T0 + timedelta(minutes=1, seconds=10 * i), 0, processes=0) for i in range(6)]  # idle minute
    rows += [_raw(b, T0 + timedelta(seconds=5), None)]  # utilization not offered
    GPUSample.objects.bulk_create(rows)

    written = telemetry.rollup(now=T0 + timedelta(minutes=2, seconds=15))
    assert written == {"1m": 3, "1h": 0}
    busy = GPUSampleRollup.objects.get(gpu=a, period="1m", bucket=T0)
    point = telemetry.rollup_point(busy)
    mean = sum(minute) / 6
    assert (point["samples"], point["utilization_mean"], point["utilization_max"]) == (6, round(mean, 3), 60)
    assert point["utilization_std"] == pytest.approx(math.sqrt(sum((u - mean) ** 2 for u in minute) / 6), abs=1e-3)
    assert (point["temperature_mean"], point["temperature_max"]) == (42.5, 45)
    assert (point["power_mean"], point["power_max"], point["memory_used_max"]) == (102.5, 105.0, 5000)
    assert (point["ecc_uncorrected_max"], point["xid_count"], point["idle_samples"]) == (1, 1, 0)
    idle = GPUSampleRollup.objects.get(gpu=a, period="1m", bucket=T0 + timedelta(minutes=1))
    assert (idle.samples, idle.idle_samples) == (6, 6)
    unsupported = telemetry.rollup_point(GPUSampleRollup.objects.get(gpu=b, period="1m"))
    assert (unsupported["samples"], unsupported["utilization_mean"], unsupported["utilization_std"]) == (1, None, None)

    assert telemetry.rollup(now=T0 + timedelta(minutes=2, seconds=15)) == {"1m": 0, "1h": 0}  # nothing twice
    assert GPUSampleRollup.objects.get(pk=busy.pk).samples == 6
    assert GPUSampleRollup.objects.count() == 3


def test_a_minute_is_rolled_up_only_once_it_closed(fleet):
    node = fleet[0]
    gpu = node.gpus.order_by("index").first()
    GPUSample.objects.bulk_create([_raw(gpu, T0 + timedelta(seconds=s), 10) for s in (0, 30, 59)])
    assert telemetry.rollup(now=T0 + timedelta(seconds=65)) == {"1m": 0, "1h": 0}  # within the grace
    assert telemetry.rollup(now=T0 + timedelta(seconds=75)) == {"1m": 1, "1h": 0}
    assert GPUSampleRollup.objects.get(period="1m").samples == 3


def test_hours_are_the_sum_of_their_minutes(fleet):
    node = fleet[0]
    gpu = node.gpus.order_by("index").first()
    values = {}
    for minute in range(0, 120, 7):  # samples scattered over two hours
        for second in (0, 20, 40):
            values[T0 + timedelta(minutes=minute, seconds=second)] = (minute * 3 + second) % 101
    GPUSample.objects.bulk_create([_raw(gpu, at, u, power_w=float(u)) for at, u in values.items()])
    telemetry.rollup(now=T0 + timedelta(hours=2, minutes=1))
    hours = {r.bucket: r for r in GPUSampleRollup.objects.filter(period="1h")}
    assert set(hours) == {T0, T0 + timedelta(hours=1)}
    for start, row in hours.items():
        inside = [u for at, u in values.items() if start <= at < start + timedelta(hours=1)]
        point = telemetry.rollup_point(row)
        mean = sum(inside) / len(inside)
        assert point["samples"] == len(inside) and point["utilization_max"] == max(inside)
        assert point["utilization_mean"] == round(mean, 3)
        assert point["utilization_std"] == pytest.approx(
            math.sqrt(sum((u - mean) ** 2 for u in inside) / len(inside)), abs=1e-3
        )
    assert telemetry.rollup(now=T0 + timedelta(hours=2, minutes=1)) == {"1m": 0, "1h": 0}


def test_prune_drops_only_what_is_past_retention_and_rolled_up(fleet, settings):
    settings.MERIDIAN_TELEMETRY_RETENTION = {
        "raw": timedelta(hours=1),
        "1m": timedelta(days=2),
        "1h": timedelta(days=90),
    }
    gpu = fleet[0].gpus.order_by("index").first()
    now = T0 + timedelta(days=100)
    GPUSample.objects.bulk_create([_raw(gpu, now - timedelta(minutes=m), 5) for m in (90, 70, 30)])
    assert telemetry.prune(now=now)["raw"] == 0  # nothing rolled up yet: nothing may go
    telemetry.rollup(now=now)
    rollups = [
        GPUSampleRollup(gpu=gpu, period=period, bucket=now - age, samples=1)
        for period, age in (
            ("1m", timedelta(days=3)),
            ("1m", timedelta(days=1)),
            ("1h", timedelta(days=91)),
            ("1h", timedelta(days=89)),
        )
    ]
    GPUSampleRollup.objects.bulk_create(rollups)
    deleted = telemetry.prune(now=now)
    assert deleted == {"raw": 2, "1m": 1, "1h": 1}
    assert list(GPUSample.objects.values_list("sampled_at", flat=True)) == [now - timedelta(minutes=30)]
    assert GPUSampleRollup.objects.filter(bucket=now - timedelta(days=1)).exists()
    assert GPUSampleRollup.objects.filter(bucket=now - timedelta(days=89)).exists()
    assert telemetry.prune(now=now) == {"raw": 0, "1m": 0, "1h": 0}


#
# Out of band: a bare-metal node a tenant holds
#


def test_a_held_bare_metal_node_is_read_through_its_bmc_and_fabric(fleet):
    held, idle = Node.objects.filter(pool=NodePool.BARE_METAL).order_by("hostname")[:2]
    Node.objects.filter(pk=held.pk).update(state=NodeState.ALLOCATED)
    SimulatedPower().set_power(Target(node_id=str(held.pk), hostname=held.hostname), True)
    SimulatedPower().set_readings(
        Target(node_id=str(held.pk), hostname=held.hostname),
        power_w=5600.0,
        gpu_celsius=[41, 42, 43, 44, 45, 46, 47, 99],
        health="warning",
    )
    down = held.ib_ports.order_by("index").first().guid
    fabric_driver_for(held.fabric).set_port_state(down, "down")

    result = bmc.bmc_collect(now=T0)
    assert result == {"nodes": 1, "failed": 0, "ports": 8}
    reading = NodeBMCReading.objects.get(node=held)
    assert (reading.power_w, reading.health) == (5600.0, "warning")
    assert {t["context"] for t in reading.temperatures} == {"CPU", "Intake", "GPU"}
    rows = list(GPUTelemetry.objects.filter(node=held).order_by("gpu__index"))
    assert [r.temperature_c for r in rows] == [41, 42, 43, 44, 45, 46, 47, 99]
    assert {(r.source, r.utilization_pct, r.ecc_uncorrected, r.power_w) for r in rows} == {("bmc", None, None, None)}
    statuses = dict(HCAPortStatus.objects.filter(port__node=held).values_list("port__guid", "link"))
    assert statuses.pop(down) == "down" and set(statuses.values()) == {"up"}
    assert set(HCAPortStatus.objects.values_list("source", flat=True)) == {"fabric"}
    assert not NodeBMCReading.objects.filter(node=idle).exists()  # its own agent reports it


#
# Reads
#


def _allocated(world) -> tuple[Reservation, GPU]:
    """A t1 reservation holding one GPU of a shared host from T0 to T0 + 1 h."""
    reservation = world.t1.objects[Reservation]
    small_fleet(4)
    gpu = Node.objects.filter(pool=NodePool.SHARED).order_by("hostname").first().gpus.order_by("index").first()
    Allocation.objects.create(
        reservation=reservation,
        gpu=gpu,
        node=gpu.node,
        mem_lo=0,
        mem_hi=gpu.memory_mib,
        starts_at=T0,
        ends_at=T0 + timedelta(hours=1),
    )
    return reservation, gpu


def test_a_tenant_reads_only_its_reservations_gpus_while_they_were_its_own(world):
    reservation, gpu = _allocated(world)
    node = gpu.node
    neighbour = node.gpus.exclude(pk=gpu.pk).order_by("index").first()
    for at in (T0 - timedelta(minutes=5), T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)):
        telemetry.ingest(
            node=node,
            samples=[sample(gpu.uuid, utilization_pct=at.minute), sample(neighbour.uuid)],
            ports=[],
            now=at + timedelta(seconds=5),
        )
    telemetry.rollup(now=T0 + timedelta(minutes=4))

    url = f"/api/v1/reservations/{reservation.pk}/telemetry/"
    response = world.client("t1_member").get(url, {"since": (T0 - timedelta(hours=1)).isoformat()})
    assert response.status_code == 200, response.content
    body = response.json()
    assert [g["uuid"] for g in body["gpus"]] == [gpu.uuid]  # not the neighbour on the same host
    series = body["gpus"][0]["series"]
    assert [p["utilization_mean"] for p in series] == [1.0, 2.0]  # the earlier tenant's minute is not shown
    assert body["gpus"][0]["latest"]["utilization_pct"] == 2
    assert world.client("t2_member").get(url).status_code == 404
    raw = world.client("t1_member").get(url, {"period": "raw", "since": (T0 - timedelta(hours=1)).isoformat()})
    assert [p["utilization_pct"] for p in raw.json()["gpus"][0]["series"]] == [1, 2]


def test_a_gpu_no_longer_the_reservations_shows_no_latest(world):
    reservation, gpu = _allocated(world)
    telemetry.ingest(node=gpu.node, samples=[sample(gpu.uuid)], ports=[], now=T0 + timedelta(hours=2))
    body = world.client("t1_owner").get(f"/api/v1/reservations/{reservation.pk}/telemetry/").json()
    assert body["gpus"][0]["latest"] is None


def test_staff_read_a_gpus_latest_and_series(world):
    small_fleet(4)
    gpu = GPU.objects.order_by("node__hostname", "index").first()
    telemetry.ingest(node=gpu.node, samples=[sample(gpu.uuid, xids=[13])], ports=[], now=T0)
    telemetry.rollup(now=T0 + timedelta(minutes=2))
    url = f"/api/v1/gpus/{gpu.pk}/telemetry/"
    since = (T0 - timedelta(hours=1)).isoformat()
    staff = world.client("platform_approver")
    raw = staff.get(url, {"period": "raw", "since": since}).json()
    assert raw["latest"]["xids"] == [13] and raw["latest"]["source"] == "agent"
    assert [p["xids"] for p in raw["series"]] == [[13]]
    minute = staff.get(url, {"since": since}).json()
    assert minute["period"] == "1m" and minute["series"][0]["samples"] == 1
    assert staff.get(url, {"period": "1h", "since": since}).json()["series"] == []
    assert staff.get(url, {"period": "5m"}).status_code == 400
    assert staff.get(url, {"since": "yesterday"}).status_code == 400
    assert world.client("t1_owner").get(url).status_code == 403
