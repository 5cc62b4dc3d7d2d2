"""
The UFM fabric driver against a local server that speaks UFM's PKeys REST API as NVIDIA documents
it: NVIDIA UFM Enterprise REST API Guide, "PKey GUIDs Rest API"
(docs.nvidia.com/networking/display/UFMEnterpriseRESTAPILatest/PKey+GUIDs+Rest+API) -- create an
empty PKey (POST /ufmRest/resources/pkeys/add), add GUIDs (POST /ufmRest/resources/pkeys), get one
or all PKeys (guids_data, qos_conf), update QoS (PUT /ufmRest/resources/pkeys/qos_conf), remove
GUIDs (DELETE /ufmRest/resources/pkeys/<pkey>/guids/<guids>) and delete a PKey -- and the UFM
Enterprise User Manual, "PKeys Window" (0x7fff is UFM's read-only management key).

No database: plain functions, each with its own server.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import pytest

from provisioning.drivers.base import DriverError
from provisioning.drivers.fabric import DEFAULT_PKEY, FULL, LIMITED, PartitionSpec
from provisioning.drivers.ufm import UFMFabric
from tests.provisioning.ufm_server import UFMServer

PASSWORD = "s3cret-ufm-pass"
A, B, C = "0002c90300a1b2c1", "0002c90300a1b2c2", "0002c90300a1b2c3"


@pytest.fixture
def ufm():
    server = UFMServer(username="admin", password=PASSWORD).start()
    yield server
    server.stop()


@pytest.fixture
def fabric(ufm) -> UFMFabric:
    return UFMFabric(url=ufm.url, username="admin", password=PASSWORD, timeout_s=2.0)


def raw(ufm, method: str, path: str, body=None, password: str = PASSWORD) -> tuple[int, object]:
    """One request straight to the server, for what the driver never sends."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(ufm.url + path, data=data, method=method)
    token = base64.b64encode(f"admin:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


# -- partitions ------------------------------------------------------------------------------------

def test_read_has_the_default_partition(fabric):
    found = fabric.read()
    assert list(found) == [DEFAULT_PKEY]
    assert found[DEFAULT_PKEY].spec.name == "management"
    assert found[DEFAULT_PKEY].members == {}


def test_create_then_read_settings(fabric, ufm):
    spec = PartitionSpec(pkey=0x12, name="tenant-a", mtu=4096, rate_gbps=200, service_level=3, ipoib=True)
    fabric.ensure_partition(spec)
    assert fabric.read()[0x12].spec == spec
    assert ufm.writes()[0][:2] == ("POST", "/ufmRest/resources/pkeys/add")
    assert ufm.writes()[0][3] == {"pkey": "0x12", "partition_name": "tenant-a", "index0": False, "ip_over_ib": True,
                                  "mtu_limit": 5, "service_level": 3, "rate_limit": 200}


def test_ensure_is_idempotent(fabric, ufm):
    spec = PartitionSpec(pkey=0x12, name="tenant-a", mtu=2048, rate_gbps=100)
    fabric.ensure_partition(spec)
    fabric.ensure_partition(spec)
    assert len(ufm.writes()) == 1


def test_rate_left_to_ufm_keeps_its_default(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", mtu=2048))
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", mtu=2048))
    assert "rate_limit" not in ufm.writes()[0][3]
    assert len(ufm.writes()) == 1
    assert fabric.read()[0x12].spec.rate_gbps == 2.5


def test_update_settings_keeps_members(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", mtu=2048, rate_gbps=100))
    fabric.set_members(0x12, {A: FULL})
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", mtu=4096, rate_gbps=200, service_level=5))
    got = fabric.read()[0x12]
    assert (got.spec.mtu, got.spec.rate_gbps, got.spec.service_level) == (4096, 200, 5)
    assert got.members == {A: FULL}
    assert ufm.writes()[-1][:2] == ("PUT", "/ufmRest/resources/pkeys/qos_conf")


def test_turning_ipoib_off_keeps_members(fabric):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", ipoib=True))
    fabric.set_members(0x12, {A: FULL, B: LIMITED})
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", ipoib=False))
    got = fabric.read()[0x12]
    assert got.spec.ipoib is False
    assert got.members == {A: FULL, B: LIMITED}


def test_turning_ipoib_off_on_an_empty_partition(fabric):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", ipoib=True, rate_gbps=100))
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", ipoib=False, rate_gbps=100))
    assert fabric.read()[0x12].spec == PartitionSpec(pkey=0x12, name="t", ipoib=False, rate_gbps=100)


def test_partition_created_meanwhile_is_fine(fabric, ufm):
    """Another worker created it between our read and our add: UFM refuses the add, we carry on."""
    raw(ufm, "POST", "/ufmRest/resources/pkeys/add", {"pkey": "0x12", "mtu_limit": 4})
    real, calls = fabric._partition, []
    fabric._partition = lambda pkey: real(pkey) if calls.append(pkey) or len(calls) > 1 else None
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", mtu=4096))
    assert fabric.read()[0x12].spec.mtu == 4096


def test_delete_and_repeat(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t"))
    fabric.set_members(0x12, {A: FULL})
    fabric.delete_partition(0x12)
    fabric.delete_partition(0x12)
    assert 0x12 not in fabric.read()
    assert [w[:2] for w in ufm.writes()[-2:]] == [("DELETE", "/ufmRest/resources/pkeys/0x12")] * 2


# -- members ---------------------------------------------------------------------------------------

def test_add_full_and_limited_members(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t"))
    fabric.set_members(0x12, {A: FULL, B.upper(): LIMITED, "0x" + C: FULL})
    assert fabric.read()[0x12].members == {A: FULL, B: LIMITED, C: FULL}
    posts = [w[3] for w in ufm.writes() if w[:2] == ("POST", "/ufmRest/resources/pkeys")]
    assert posts == [
        {"pkey": "0x12", "guids": [A, C], "memberships": ["full", "full"], "ip_over_ib": True, "index0": True},
        {"pkey": "0x12", "guids": [B], "memberships": ["limited"], "ip_over_ib": True, "index0": False},
    ]


def test_change_membership_and_repeat(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t"))
    fabric.set_members(0x12, {A: FULL, B: FULL})
    fabric.set_members(0x12, {A: LIMITED, B: FULL})
    before = len(ufm.writes())
    fabric.set_members(0x12, {A: LIMITED, B: FULL})
    assert len(ufm.writes()) == before
    assert fabric.read()[0x12].members == {A: LIMITED, B: FULL}
    assert ufm.writes()[-1][3]["guids"] == [A]


def test_set_members_on_a_missing_partition(fabric, ufm):
    with pytest.raises(DriverError) as caught:
        fabric.set_members(0x44, {A: FULL})
    assert not caught.value.transient
    assert "0x44" in str(caught.value) and "ensure_partition" in str(caught.value)
    assert ufm.writes() == []


def test_remove_members_and_repeat(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t"))
    fabric.set_members(0x12, {A: FULL, B: LIMITED, C: FULL})
    fabric.remove_members(0x12, [A, "0x" + B])
    assert fabric.read()[0x12].members == {C: FULL}
    assert ufm.writes()[-1][:2] == ("DELETE", f"/ufmRest/resources/pkeys/0x12/guids/{A},{B}")
    before = len(ufm.writes())
    fabric.remove_members(0x12, [A, B])
    fabric.remove_members(0x99, [A])
    assert len(ufm.writes()) == before


def test_removing_the_last_member_keeps_the_partition(fabric):
    """UFM drops a P_Key with its last GUID; the driver puts it back, empty, with its settings."""
    spec = PartitionSpec(pkey=0x12, name="tenant-a", mtu=4096, rate_gbps=100, service_level=2, ipoib=False)
    fabric.ensure_partition(spec)
    fabric.set_members(0x12, {A: FULL})
    fabric.remove_members(0x12, [A])
    got = fabric.read()[0x12]
    assert got.spec == spec
    assert got.members == {}


# -- the default partition -------------------------------------------------------------------------

def test_default_partition_members_and_tenants_as_limited(fabric, ufm):
    ufm.fabric.pkeys[DEFAULT_PKEY]["members"] = {A: ("full", True), B: ("limited", False)}
    found = fabric.read()[DEFAULT_PKEY]
    assert found.members == {A: FULL, B: LIMITED}
    fabric.set_members(DEFAULT_PKEY, {C: LIMITED})  # UFM already gives every port limited membership
    fabric.remove_members(DEFAULT_PKEY, [C])  # only there by UFM's default: nothing to take out
    assert ufm.writes() == []


def test_default_partition_refuses_full_tenants(fabric, ufm):
    with pytest.raises(DriverError) as caught:
        fabric.set_members(DEFAULT_PKEY, {C: FULL})
    assert not caught.value.transient and "never full" in str(caught.value)
    ufm.fabric.default_membership = "full"
    with pytest.raises(DriverError) as caught:
        fabric.set_members(DEFAULT_PKEY, {C: LIMITED})
    assert not caught.value.transient and "limited members of the default partition" in str(caught.value)
    assert ufm.writes() == []


def test_default_partition_is_ufms(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=DEFAULT_PKEY, name="Default", mtu=512))
    with pytest.raises(DriverError) as caught:
        fabric.ensure_partition(PartitionSpec(pkey=DEFAULT_PKEY, name="Default", mtu=4096))
    assert not caught.value.transient and "manages the default partition" in str(caught.value)
    with pytest.raises(DriverError):
        fabric.delete_partition(DEFAULT_PKEY)
    assert ufm.writes() == []


# -- errors ----------------------------------------------------------------------------------------

def test_bad_credentials(ufm):
    wrong = "wrong-" + PASSWORD
    fabric = UFMFabric(url=ufm.url, username="admin", password=wrong)
    with pytest.raises(DriverError) as caught:
        fabric.read()
    message = str(caught.value)
    assert not caught.value.transient
    assert "401" in message and "'admin'" in message and "password" in message
    assert wrong not in message and PASSWORD not in message


def test_refused_request_is_for_good(fabric, ufm):
    fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t"))
    ufm.fail_next(400)
    with pytest.raises(DriverError) as caught:
        fabric.set_members(0x12, {A: FULL})
    assert not caught.value.transient
    assert "HTTP 400" in str(caught.value) and "Injected fault" in str(caught.value)


def test_rate_ufm_does_not_take_is_for_good(fabric):
    with pytest.raises(DriverError) as caught:
        fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t", rate_gbps=400))
    assert not caught.value.transient and "rate_limit" in str(caught.value)


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_server_errors_are_transient(fabric, ufm, status):
    ufm.fail_next(status)
    with pytest.raises(DriverError) as caught:
        fabric.read()
    assert caught.value.transient and f"HTTP {status}" in str(caught.value)
    assert DEFAULT_PKEY in fabric.read()


def test_server_down_is_transient(ufm):
    url = ufm.url
    ufm.stop()
    fabric = UFMFabric(url=url, username="admin", password=PASSWORD, timeout_s=1.0)
    with pytest.raises(DriverError) as caught:
        fabric.ensure_partition(PartitionSpec(pkey=0x12, name="t"))
    assert caught.value.transient and "Could not reach UFM" in str(caught.value)
    assert PASSWORD not in str(caught.value)


def test_timeout_is_transient(ufm):
    ufm.delay_s = 0.5
    fabric = UFMFabric(url=ufm.url, username="admin", password=PASSWORD, timeout_s=0.1)
    with pytest.raises(DriverError) as caught:
        fabric.read()
    assert caught.value.transient and "did not answer within 0.1s" in str(caught.value)


# -- input checked before any request --------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda f: f.set_members(0x12, {"not-a-guid": FULL}),
    lambda f: f.set_members(0x12, {"0002c90300a1b2c1ff": FULL}),
    lambda f: f.set_members(0x12, {A: "partial"}),
    lambda f: f.set_members(0x8000, {A: FULL}),
    lambda f: f.set_members(0, {A: FULL}),
    lambda f: f.remove_members(0x12, ["xyz"]),
    lambda f: f.remove_members(0x10000, [A]),
    lambda f: f.delete_partition(0x8001),
    lambda f: f.delete_partition(-1),
    lambda f: f.ensure_partition({"pkey": 0x12}),
])
def test_bad_input_sends_nothing(fabric, ufm, call):
    with pytest.raises(DriverError) as caught:
        call(fabric)
    assert not caught.value.transient
    assert ufm.requests == []


def test_spec_out_of_range_never_reaches_ufm():
    with pytest.raises(ValueError):
        PartitionSpec(pkey=0x8000, name="t")


# -- the server refuses what UFM refuses -----------------------------------------------------------

@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", "/ufmRest/resources/pkeys/add", {"pkey": "0x7fff"}, 400),
    ("POST", "/ufmRest/resources/pkeys/add", {"pkey": "0x8000"}, 400),
    ("POST", "/ufmRest/resources/pkeys/add", {"pkey": "12"}, 400),
    ("POST", "/ufmRest/resources/pkeys/add", {"pkey": "0x12", "mtu_limit": 7}, 400),
    ("POST", "/ufmRest/resources/pkeys", {"pkey": "0x12", "guids": ["abc"]}, 400),
    ("POST", "/ufmRest/resources/pkeys", {"pkey": "0x12", "guids": [A], "membership": "partial"}, 400),
    ("POST", "/ufmRest/resources/pkeys", {"pkey": "0x12", "guids": [A], "memberships": ["full", "full"]}, 400),
    ("POST", "/ufmRest/resources/pkeys", {"pkey": "0x12", "guids": [A], "membership": "full",
                                          "memberships": ["full"]}, 400),
    ("POST", "/ufmRest/resources/pkeys", {"pkey": "0x12", "guids": []}, 400),
    ("DELETE", f"/ufmRest/resources/pkeys/0x33/guids/{A}", None, 404),
    ("POST", "/ufmRest/actions/remove_guids_from_pkey", {"pkey": "0x33", "guids": [A]}, 404),
    ("DELETE", "/ufmRest/resources/pkeys/0x33", None, 404),
    ("DELETE", "/ufmRest/resources/pkeys/0x7fff", None, 400),
    ("PUT", "/ufmRest/resources/pkeys/qos_conf", {"pkey": "0x33", "mtu_limit": 4}, 404),
])
def test_server_refuses_like_ufm(ufm, method, path, body, status):
    code, answer = raw(ufm, method, path, body)
    assert code == status
    assert answer["error"]


def test_server_wants_basic_auth(ufm):
    assert raw(ufm, "GET", "/ufmRest/resources/pkeys", password="nope")[0] == 401
    assert raw(ufm, "GET", "/ufmRest/resources/pkeys") == (200, ["0x7fff"])
    assert raw(ufm, "GET", "/ufmRest/resources/pkeys/0x44?guids_data=true") == (200, {})


def ufm_port(guid: str, number: int, logical: str | None, physical: str | None, **extra) -> dict:
    """A port as UFM's "Get All Ports" lists it (the fields the driver reads, and some it does not)."""
    port = {"guid": guid, "name": f"{guid}_{number}", "number": number, "description": "Computer IB Port",
            "lid": 17, "mtu": 4096, "severity": "Info", **extra}
    if logical is not None:
        port["logical_state"] = logical
    if physical is not None:
        port["physical_state"] = physical
    return port


def test_port_states_from_ufms_ports(fabric, ufm):
    ufm.fabric.ports = [
        ufm_port("b83fd20300000001", 1, "Active", "LinkUp"),
        ufm_port("b83fd20300000002", 1, "Down", "Polling"),
        ufm_port("b83fd20300000003", 1, "Init", "LinkUp"),  # coming up, before the SM's sweep: tells nothing
        ufm_port("b83fd20300000004", 1, "N/A", "Link Up"),  # no logical state: the physical one decides
        ufm_port("b83fd20300000005", 1, None, "Disabled"),
        ufm_port("b83fd20300000006", 1, "N/A", "N/A"),  # tells nothing: left out
        ufm_port("b83fd20300000007", 1, "Armed", "LinkUp"),
        ufm_port("b83fd20300000008", 3, "Down", "Polling", description="Switch IB Port"),  # not a host's
    ]
    asked = ["0xB83FD20300000001", *(f"b83fd2030000000{i}" for i in range(2, 9)), "not-a-guid"]
    assert fabric.port_states(asked) == {
        "b83fd20300000001": "up", "b83fd20300000002": "down", "b83fd20300000004": "up",
        "b83fd20300000005": "down",
    }
    assert ufm.writes() == [] and ufm.requests[-1][2] == {"sys_type": "Computer"}  # read-only, hosts only


def test_port_states_match_a_port_by_its_name_and_a_down_entry_wins(fabric, ufm):
    ufm.fabric.ports = [
        {"name": "b83fd20300000011_1", "description": "Computer IB Port", "logical_state": "Active",
         "physical_state": "LinkUp"},  # no guid field
        ufm_port("b83fd20300000012", 1, "Active", "LinkUp"),
        ufm_port("b83fd20300000012", 1, "Down", "Polling"),
        "not a port",
    ]
    assert fabric.port_states(["b83fd20300000011", "b83fd20300000012"]) == {
        "b83fd20300000011": "up", "b83fd20300000012": "down"}


def test_port_states_ask_nothing_for_no_ports_and_fail_clearly(fabric, ufm):
    assert fabric.port_states([]) == {}
    assert ufm.requests == []
    ufm.fail_next(503)
    with pytest.raises(DriverError) as failed:
        fabric.port_states(["b83fd20300000001"])
    assert failed.value.transient and "503" in str(failed.value)
