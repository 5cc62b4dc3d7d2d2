"""
The Prometheus alerting rules and Grafana dashboards shipped in deploy/: promtool's own check and
unit tests of the rules (every alert fires when it should, not when it should not), the
annotations each alert carries and the runbook section each points at, the dashboards' shape, and
that every metric the rules and dashboards name is one Meridian's /metrics exports.

promtool comes from Debian's prometheus package (scripts/ensure-promtool); without it those two
tests skip on a developer's machine and fail in CI (tests/ci_required.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
import yaml
from django.core.cache import cache
from prometheus_client.parser import text_string_to_metric_families

from cloud.choices import NodeState
from cloud.models import GPU, GPUSampleRollup, Node, RollupPeriod
from operations import control_metrics
from operations.control_plane import Check, ControlPlaneStatus
from operations.tasks import alerts_evaluate
from provisioning.models import Allocation, Operation, Reservation, StepRun
from provisioning.scheduling.scheduler import LAST_CYCLE_KEY
from security.models import AttestationReport, Incident
from tests.world import h100, small_fleet, vm_offering

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "meridian-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "meridian-rules.test.yml"
DASHBOARDS = sorted((ROOT / "deploy" / "grafana").glob("*.json"))
ALERTING_DOC = ROOT / "docs" / "alerting.md"
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
METRIC = re.compile(r"\b((?:meridian|django)_[a-z0-9_]+)\b")
SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created", "_gsum", "_gcount")
PROMETHEUS_OWN = {"up"}  # written by Prometheus for every target, not by the target


@pytest.fixture
def promtool() -> str:
    """Prometheus's promtool (scripts/ensure-promtool installs Debian's)."""
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.skip("promtool is not installed (scripts/ensure-promtool)")
    return found


def alerts() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)  # noqa: S603
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


#
# The rules
#


def test_promtool_checks_the_rules(promtool):
    assert f"SUCCESS: {len(alerts())} rules found" in run([promtool, "check", "rules", RULES.name], RULES.parent)


def test_promtool_unit_tests_pass(promtool):
    assert "SUCCESS" in run([promtool, "test", "rules", RULE_TESTS.name], RULE_TESTS.parent)


def test_every_alert_is_unit_tested_firing_and_quiet():
    tested: dict[str, list[list]] = {}
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            tested.setdefault(check["alertname"], []).append(check["exp_alerts"])
    assert set(tested) == {rule["alert"] for rule in alerts()}
    for name, expectations in tested.items():
        assert any(expectations) and not all(expectations), f"{name}: test it both firing and quiet"


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the headings: lower case, punctuation dropped, spaces as hyphens."""
    return {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_every_alert_has_a_severity_its_annotations_and_a_runbook_section():
    sections = anchors(ALERTING_DOC.read_text())
    names = [rule["alert"] for rule in alerts()]
    assert len(names) == len(set(names))
    for rule in alerts():
        assert rule["labels"]["severity"] in {"page", "ticket"}, rule["alert"]
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, rule["alert"]
        assert annotations["runbook_url"] == f"docs/alerting.md#{rule['alert'].lower()}"
        assert rule["alert"].lower() in sections, f"docs/alerting.md has no section {rule['alert']}"
    assert {"page", "ticket"} == {rule["labels"]["severity"] for rule in alerts()}


#
# The dashboards
#


def panels_of(board: dict) -> list[dict]:
    found = []
    for panel in board["panels"]:
        found += [panel, *panel.get("panels", [])]
    return found


def test_dashboards_parse_with_unique_panel_ids_and_the_datasource_input():
    assert {path.stem for path in DASHBOARDS} == {"meridian-fleet", "meridian-scheduler", "meridian-tenant"}
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        assert board["uid"] not in uids
        uids.add(board["uid"])
        assert [i["name"] for i in board["__inputs"]] == ["DS_PROMETHEUS"]
        ids = [panel["id"] for panel in panels_of(board)]
        assert len(ids) == len(set(ids)), f"{path.name}: panel ids repeat"
        for panel in panels_of(board):
            if panel["type"] == "row":
                continue
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", (path.name, panel["title"])
            assert panel["targets"] and all(t["datasource"]["uid"] == "${DS_PROMETHEUS}" for t in panel["targets"])
            assert set(panel["gridPos"]) == {"h", "w", "x", "y"}


def test_the_tenant_dashboard_is_templated_by_tenant():
    board = json.loads((ROOT / "deploy" / "grafana" / "meridian-tenant.json").read_text())
    assert [v["name"] for v in board["templating"]["list"]] == ["tenant"]
    exprs = [t["expr"] for p in panels_of(board) for t in p.get("targets", ()) if "meridian_tenant_" in t["expr"]]
    assert exprs and all('tenant="$tenant"' in expr for expr in exprs)


#
# Every metric named is exported
#


def used_metrics() -> dict[str, set[str]]:
    """Metric name -> where it is used (the rules, a dashboard)."""
    used: dict[str, set[str]] = {}
    texts = [(RULES.name, RULES.read_text())]
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        exprs = [t["expr"] for p in panels_of(board) for t in p.get("targets", ())]
        exprs += [v["definition"] for v in board["templating"]["list"]]
        texts.append((path.name, "\n".join(exprs)))
    for where, text in texts:
        for name in METRIC.findall(text):
            used.setdefault(name, set()).add(where)
    for rule in alerts():
        for name in re.findall(r"\b([a-z_]+)\{", rule["expr"]):
            if name in PROMETHEUS_OWN:
                used.setdefault(name, set()).add(RULES.name)
    return used


@pytest.fixture
def seeded(world, monkeypatch):
    """A fleet with something in every series: spares, allocations, a queue, XIDs, incidents, held nodes."""
    nodes = small_fleet(4)
    Node.objects.filter(pk=nodes[0].pk).update(is_spare=True)
    gpus = list(GPU.objects.filter(node=nodes[1]).order_by("index"))
    held = Reservation.objects.create(
        tenant=world.t1.tenant, name="held", offering=vm_offering(), gpu_model=h100(), units=2, gpus=2,
        regions=["us-east-1"], duration=timedelta(hours=2), state="active", starts_at=NOW - timedelta(hours=1),
        ends_at=NOW + timedelta(hours=1), scheduled_at=NOW - timedelta(minutes=30))
    for gpu in gpus[:2]:
        Allocation.objects.create(reservation=held, gpu=gpu, node=gpu.node, mem_lo=0, mem_hi=gpu.memory_mib,
                                  starts_at=NOW - timedelta(hours=1), ends_at=NOW + timedelta(hours=1))
    operation = Operation.objects.create(tenant=world.t1.tenant, reservation=held, kind="provision")
    step = StepRun.objects.create(operation=operation, name="boot", attempt=1, state="succeeded")
    StepRun.objects.filter(pk=step.pk).update(started_at=NOW - timedelta(minutes=5), finished_at=NOW)
    GPUSampleRollup.objects.create(gpu=gpus[0], period=RollupPeriod.MINUTE, samples=6, xid_count=4,
                                   bucket=NOW - timedelta(minutes=2))
    Incident.objects.create(kind="utilization_fluctuation", node_id=nodes[1].pk, summary="x")
    Node.objects.filter(pk=nodes[2].pk).update(state=NodeState.REFERENCE_UNAVAILABLE)
    gpu = GPU.objects.filter(node=nodes[2]).select_related("model").first()
    AttestationReport.objects.create(
        node_id=nodes[2].pk, nonce="n", status="reference_unavailable",
        gpus=[{"uuid": gpu.uuid, "model": gpu.model.slug, "vbios": "96.00.99.00.01", "driver": "550.54.15"}],
        reasons=[{"gpu": gpu.uuid, "check": "reference_missing", "detail": "no reference measurements"}])
    cache.set(LAST_CYCLE_KEY, {"queued": 2, "placed": 1, "timings_ms": {"rank": 1.0, "plan": 4.0, "apply": 2.0},
                               "finished_at": (NOW - timedelta(seconds=1)).isoformat(), "leader": "sched-1"}, None)
    status = ControlPlaneStatus(checks={"database": Check(True, 1.0)}, scheduler_leader="sched-1",
                                scheduler_last_cycle_age_s=1.0, beat_last_run_age_s=2.0, workers=["celery@w1"],
                                queue_depths={"meridian": 3})
    monkeypatch.setattr(control_metrics, "read", lambda **_: status)
    return nodes


def test_every_metric_the_rules_and_dashboards_name_is_exported(world, seeded):
    alerts_evaluate.apply()  # a Celery task ran: its counter has a sample
    with time_machine.travel(NOW, tick=False):
        response = world.client("platform_admin").get("/metrics")
    assert response.status_code == 200
    sampled = {s.name for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}
    used = used_metrics()
    assert "meridian_region_spare_nodes" in used and "up" in used
    missing = {name: sorted(where) for name, where in used.items()
               if name not in PROMETHEUS_OWN and name not in sampled}
    assert not missing, f"named but not on /metrics (or with no sample in a seeded fleet): {missing}"
    for name in used:
        assert name in PROMETHEUS_OWN or name.endswith(SUFFIXES) or name.startswith("meridian_"), name
