"""
The OpenSM fabric driver: partitions.conf rendered and parsed, and the file changed safely.

The expected files are written by hand from OpenSM's documented grammar: opensm(8), section
PARTITION CONFIGURATION (``man/opensm.8.in`` in linux-rdma/opensm), and its older twin
``doc/partition-config.txt``:

    <Partition Definition>:[<newline>]<Partition Properties>;
    Partition Definition: [PartitionName][=PKey][,ipoib_bc_flags][,defmember=full|limited]
    Port Specifier:       <PortGUID>[=[full|limited]]
    "PKey - P_Key value for this partition. Only low 15 bits will be used."
    "values for rate, mtu, and scope ... should be specified as defined in the IBTA
     specification (for example, mtu=4 for 2048)"
    keywords: ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS, SELF; "Line content followed after '#'
    character is comment"; example "Default=0x7fff : ALL, ALL_SWITCHES=full, SELF=full ;"
"""

from __future__ import annotations

import os
import stat
import sys
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from provisioning.drivers import opensm
from provisioning.drivers.base import DriverError
from provisioning.drivers.fabric import DEFAULT_PKEY, MTUS, PKEY_MAX, PKEY_MIN, RATE_CODES, Partition, PartitionSpec
from provisioning.drivers.opensm import DEFAULT_SPEC, OpenSMFabric, parse, render

A, B, C = "0002c90300a1b2c3", "0002c90300a1b2c4", "0002c90300a1b2c5"
# opensm(8): the default partition with every end port limited, switches and the SM's port full.
DEFAULT_LINE = "Default=0x7fff, ipoib, mtu=4, sl=0 : ALL=limited, ALL_SWITCHES=full, SELF=full;\n"


def vpc(pkey=0x0001, name="vpc_1a2b", members=None, **settings) -> Partition:
    return Partition(PartitionSpec(pkey=pkey, name=name, **settings), dict(members or {}))


def body(text: str) -> str:
    """The file without its header comment."""
    return "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))


# Rendering, against the documented grammar.


def test_render_writes_the_default_partition_with_ca_ports_limited_only():
    """The default line is always there; ALL=limited caps every CA port, ALL_SWITCHES/SELF are full."""
    text = render({})
    assert text.startswith("# ") and "Meridian" in text.splitlines()[0]
    # opensm(8) example "Default=0x7fff : ALL, ALL_SWITCHES=full, SELF=full ;" with ALL's
    # membership spelled out and the IPoIB broadcast group's default MTU (mtu=4, 2048 bytes).
    assert body(text) == DEFAULT_LINE
    assert "ALL=full" not in text and "ALL_CAS=full" not in text


def test_render_one_partition_in_opensm_syntax():
    """name=PKey (15-bit base), ipoib, mtu/rate/sl as IBTA codes, then GUIDs 0x-prefixed with membership."""
    text = render({1: vpc(mtu=4096, rate_gbps=40, members={B: "limited", A: "full"})})
    assert body(text) == (
        DEFAULT_LINE
        # 4096 bytes -> mtu=5; 40 Gb/s -> rate=7 (IBTA rate code); sl=0; members in GUID order.
        + "vpc_1a2b=0x0001, ipoib, mtu=5, rate=7, sl=0 : 0x0002c90300a1b2c3=full, 0x0002c90300a1b2c4=limited;\n"
    )


@pytest.mark.parametrize(("mtu", "code"), [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)])
def test_mtu_codes(mtu, code):
    """IBTA MTU codes, 'mtu=4 for 2048'."""
    assert f", mtu={code}, " in body(render({7: vpc(pkey=7, mtu=mtu)})).splitlines()[1]


@pytest.mark.parametrize(("gbps", "code"), [(2.5, 2), (10, 3), (100, 16), (200, 17), (400, 21)])
def test_rate_codes(gbps, code):
    """IBTA rate codes (rate=3 is 10 Gb/s, OpenSM's default)."""
    assert f", rate={code}, " in body(render({7: vpc(pkey=7, rate_gbps=gbps)})).splitlines()[1]


def test_no_rate_keeps_opensm_default_and_no_ipoib_leaves_the_flag_out():
    line = body(render({0x12: vpc(pkey=0x12, name="storage", ipoib=False, service_level=3)})).splitlines()[1]
    assert line == "storage=0x0012, mtu=5, sl=3 :;"  # "Empty list means no ports in this partition."


def test_render_is_deterministic_partitions_by_pkey_members_by_guid():
    one = {0x20: vpc(pkey=0x20, name="b", members={C: "full", A: "full"}),
           0x03: vpc(pkey=0x03, name="a", members={B: "limited"})}
    two = {0x03: vpc(pkey=0x03, name="a", members={B: "limited"}),
           0x20: vpc(pkey=0x20, name="b", members={A: "full", C: "full"})}
    assert render(one) == render(two)
    lines = body(render(one)).splitlines()
    assert [line.split("=")[0] for line in lines] == ["Default", "a", "b"]
    assert lines[2].index(A) < lines[2].index(C)


def test_long_port_lists_wrap_between_ports():
    """'The Line can be wrapped after ':' ... and between': lines stay short, statement ends at ';'."""
    members = {f"{i:016x}": "full" for i in range(1, 1001)}
    text = render({5: vpc(pkey=5, members=members)})
    assert max(len(line) for line in text.splitlines()) < 200  # OpenSM reads lines into 4096 bytes
    statement = body(text).split(";\n")[1]
    assert statement.count("\n") == 249 and statement.splitlines()[1].startswith("    0x")
    assert parse(text)[5].members == members


def test_default_partition_settings_and_explicit_members_are_kept():
    default = Partition(PartitionSpec(pkey=DEFAULT_PKEY, name="Default", mtu=4096), {A: "limited"})
    assert body(render({DEFAULT_PKEY: default})) == (
        "Default=0x7fff, ipoib, mtu=5, sl=0 : ALL=limited, ALL_SWITCHES=full, SELF=full, 0x0002c90300a1b2c3=limited;\n")


@pytest.mark.parametrize("name", ["my vpc", "a=b", "a,b", "a:b", "a;b", "a#b", "", "x" * 32, "caf\u00e9"])
def test_names_opensm_would_misread_are_refused(name):
    with pytest.raises(ValueError, match="not an OpenSM partition name"):
        render({3: vpc(pkey=3, name=name)})


def test_zero_guid_and_bad_membership_are_refused():
    """OpenSM rejects GUID 0 (and a bad file makes it fall back to every port full in 0x7fff)."""
    with pytest.raises(ValueError, match="GUID"):
        render({3: vpc(pkey=3, members={"0" * 16: "full"})})
    with pytest.raises(ValueError, match="Membership"):
        render({3: vpc(pkey=3, members={A: "both"})})
    with pytest.raises(ValueError, match="filed under"):
        render({4: vpc(pkey=3)})


# Parsing.


def test_parse_of_render_gives_the_partitions_back():
    partitions = {1: vpc(rate_gbps=200, service_level=2, members={A: "full", B: "limited"}),
                  0x7FFE: vpc(pkey=0x7FFE, name="last", mtu=256, ipoib=False)}
    assert parse(render(partitions)) == {**partitions, DEFAULT_PKEY: Partition(DEFAULT_SPEC)}


def test_parse_of_an_empty_or_missing_file_is_the_default_partition_only():
    assert parse("") == {DEFAULT_PKEY: Partition(DEFAULT_SPEC)}
    assert parse("# nothing here\n\n") == {DEFAULT_PKEY: Partition(DEFAULT_SPEC)}


HAND_WRITTEN = """\
# partitions.conf written by an operator
Default=0x7fff, ipoib : ALL, ALL_SWITCHES=full, SELF=full ;   # the manual's example

# 0x8001 carries the full-membership bit; "Only low 15 bits will be used".
vpc_1a2b = 0x8001 , ipoib , mtu=5 , rate=7 , defmember=full :
    0x0002c90300a1b2c3, 0x0002c90300a1b2c4=limited,   # continued on the next line
    0x0002C90300A1B2C5 ;
storage=0x12, mtu=4, sl=3 : SELF=full, 0x0002c90300a1b2c3=both; legacy=0x13 : NONE;
ShareIO = 0x80 , defmember=full : 0x123451, 0x123452;
ShareIO = 0x80 : 0x123453, 0x123454, 0x123455=full;
ShareIO = 0x80, ipoib, mtu=3 : 1193046=f, mgid=ff12:401b::0707,sl=1
"""


def test_parse_a_hand_written_file():
    found = parse(HAND_WRITTEN)
    assert set(found) == {DEFAULT_PKEY, 0x0001, 0x12, 0x13, 0x80}
    assert found[DEFAULT_PKEY] == Partition(PartitionSpec(pkey=DEFAULT_PKEY, name="Default", mtu=2048))
    assert found[1] == vpc(mtu=4096, rate_gbps=40, members={A: "full", B: "limited", C: "full"})
    assert found[0x12] == Partition(PartitionSpec(pkey=0x12, name="storage", mtu=2048, service_level=3, ipoib=False),
                                    {A: "full"})  # 'both' is full without allow_both_pkeys; SELF is no GUID
    assert found[0x13].members == {}
    share = found[0x80]
    # Merged as OpenSM merges a repeated P_Key: first name, defmember per definition, settings
    # from the definition with ipoib, 1193046 (decimal) = 0x123456, the mgid group skipped.
    assert share.spec == PartitionSpec(pkey=0x80, name="ShareIO", mtu=1024, ipoib=True)
    assert share.members == {"0000000000123451": "full", "0000000000123452": "full",
                             "0000000000123453": "limited", "0000000000123454": "limited",
                             "0000000000123455": "full", "0000000000123456": "full"}


def test_parse_then_render_keeps_what_the_model_holds():
    again = parse(render(parse(HAND_WRITTEN)))
    assert again == parse(HAND_WRITTEN)


def test_parse_keeps_explicit_default_members_and_drops_keywords():
    found = parse("Default=0x7fff : ALL_CAS=limited, ALL_ROUTERS, 0x0002c90300a1b2c3=full, SELF=full;\n")
    assert found[DEFAULT_PKEY].members == {A: "full"}
    assert found[DEFAULT_PKEY].spec.ipoib is False


@pytest.mark.parametrize(("text", "error"), [
    ("vpc=0x1 0x0002c90300a1b2c3;", "line 1: no partition definition"),
    ("vpc : 0x0002c90300a1b2c3;", "no P_Key"),
    ("vpc=0x8000 : ;", "zero"),
    ("vpc=0x1 : 0x0;", "port GUID"),
    ("vpc=0x1 : 0002c90300a1b2c3;", "not a number"),  # no 0x: OpenSM reads octal and fails
    ("vpc=0x1, mtu=6 : ;", "mtu=6"),
    ("vpc=0x1, rate=1 : ;", "rate=1"),
    ("vpc=0x1, sl=16 : ;", "sl=16"),
    ("# ok\nvpc=zz : ;", "line 2: P_Key 'zz'"),
])
def test_parse_refuses_what_it_cannot_represent(text, error):
    with pytest.raises(ValueError, match=error):
        parse(text)


guids = st.integers(min_value=1, max_value=(1 << 64) - 1).map(lambda value: f"{value:016x}")
memberships = st.dictionaries(guids, st.sampled_from(["full", "limited"]), max_size=12)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.+@/!$%", min_size=1,
                max_size=31)


@st.composite
def partition_maps(draw):
    pkeys = draw(st.sets(st.integers(min_value=PKEY_MIN, max_value=PKEY_MAX), max_size=6))
    found = {}
    for pkey in [*pkeys, DEFAULT_PKEY]:
        spec = PartitionSpec(pkey=pkey, name=draw(names), mtu=draw(st.sampled_from(MTUS)),
                             rate_gbps=draw(st.sampled_from([None, *RATE_CODES])),
                             service_level=draw(st.integers(0, 15)), ipoib=draw(st.booleans()))
        found[pkey] = Partition(spec, draw(memberships))
    return found


@settings(max_examples=150, deadline=None)
@given(partition_maps())
def test_round_trip_property(partitions):
    text = render(partitions)
    assert parse(text) == partitions
    assert render(parse(text)) == text


# The driver.


@pytest.fixture
def counter(tmp_path):
    """A reread command that appends a line to a file per run: how many rereads there were."""
    runs = tmp_path / "reread-runs"
    command = [sys.executable, "-c", f"open({str(runs)!r}, 'a').write('hup\\n')"]
    return command, lambda: len(runs.read_text().splitlines()) if runs.exists() else 0


@pytest.fixture
def conf(tmp_path):
    return tmp_path / "opensm" / "partitions.conf"


@pytest.fixture
def fabric(conf, counter):
    conf.parent.mkdir()
    return OpenSMFabric(path=str(conf), reread_command=counter[0], timeout_s=10)


def test_read_of_a_missing_file_is_the_default_partition(fabric):
    assert fabric.read() == {DEFAULT_PKEY: Partition(DEFAULT_SPEC)}


def test_changes_write_the_rendered_file_and_reread_once_each(fabric, conf, counter):
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc_1a2b", rate_gbps=40))
    fabric.set_members(1, {"0x0002C90300A1B2C3": "full", B: "limited"})
    assert counter[1]() == 2
    assert body(conf.read_text()) == DEFAULT_LINE + (
        "vpc_1a2b=0x0001, ipoib, mtu=5, rate=7, sl=0 : 0x0002c90300a1b2c3=full, 0x0002c90300a1b2c4=limited;\n")
    assert fabric.read()[1].members == {A: "full", B: "limited"}
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc_1a2b", mtu=2048, rate_gbps=40))
    assert fabric.read()[1] == vpc(mtu=2048, rate_gbps=40, members={A: "full", B: "limited"})  # members stay
    fabric.remove_members(1, [A, C])
    assert fabric.read()[1].members == {B: "limited"}
    fabric.delete_partition(1)
    assert set(fabric.read()) == {DEFAULT_PKEY}
    assert counter[1]() == 5


def test_a_no_op_neither_rewrites_nor_rereads(fabric, conf, counter):
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    fabric.set_members(1, {A: "full"})
    before = conf.stat()
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    fabric.set_members(1, {A: "full"})
    fabric.remove_members(1, [B])
    fabric.remove_members(9, [A])
    fabric.delete_partition(9)
    after = conf.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert counter[1]() == 2


def test_no_op_on_a_missing_file_leaves_it_missing(fabric, conf, counter):
    fabric.delete_partition(9)
    fabric.remove_members(DEFAULT_PKEY, [A])
    assert not conf.exists() and counter[1]() == 0


def test_the_file_is_replaced_atomically_from_beside_it(fabric, conf, monkeypatch):
    """The new text goes to a temporary file in the same folder, fully written, then os.replace."""
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        with open(src) as handle:
            seen.append((os.path.dirname(src), os.path.dirname(dst), handle.read()))
        real_replace(src, dst)
    monkeypatch.setattr(opensm.os, "replace", replace)
    fabric.set_members(1, {A: "full"})
    (folder, target_folder, written), = seen
    assert folder == target_folder == str(conf.parent)
    assert written == conf.read_text() and written.endswith(";\n")


def test_a_failed_replace_leaves_the_old_file_whole(fabric, conf, monkeypatch, counter):
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    old = conf.read_text()

    def replace(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(opensm.os, "replace", replace)
    with pytest.raises(DriverError, match="No space left") as caught:
        fabric.set_members(1, {A: "full"})
    assert caught.value.transient
    assert conf.read_text() == old
    assert sorted(p.name for p in conf.parent.iterdir()) == ["partitions.conf", "partitions.conf.lock",
                                                               "partitions.conf.reread-pending"]


def test_the_file_mode_is_kept(fabric, conf):
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    assert stat.S_IMODE(conf.stat().st_mode) == 0o644
    conf.chmod(0o640)
    fabric.set_members(1, {A: "full"})
    assert stat.S_IMODE(conf.stat().st_mode) == 0o640


def test_a_failing_reread_is_transient_with_its_stderr(conf):
    conf.parent.mkdir()
    command = [sys.executable, "-c", "import sys; sys.stderr.write('opensm: no process found'); sys.exit(1)"]
    failing = OpenSMFabric(path=str(conf), reread_command=command)
    with pytest.raises(DriverError, match="exited with 1: opensm: no process found") as caught:
        failing.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    assert caught.value.transient
    assert parse(conf.read_text())[1].spec.name == "vpc"  # the file is written; OpenSM has not read it


def test_a_reread_owed_is_run_by_the_retry_although_the_file_is_unchanged(conf, counter):
    conf.parent.mkdir()
    spec = PartitionSpec(pkey=1, name="vpc")
    failing = OpenSMFabric(path=str(conf), reread_command=[sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(DriverError):
        failing.ensure_partition(spec)
    retry = OpenSMFabric(path=str(conf), reread_command=counter[0])
    retry.ensure_partition(spec)
    assert counter[1]() == 1
    retry.ensure_partition(spec)
    assert counter[1]() == 1


def test_a_missing_reread_program_is_not_transient(conf):
    conf.parent.mkdir()
    broken = OpenSMFabric(path=str(conf), reread_command="/nonexistent/bin/opensm-reread --now")
    with pytest.raises(DriverError, match="reread_command") as caught:
        broken.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    assert not caught.value.transient


def test_a_reread_past_its_timeout_is_transient(conf):
    conf.parent.mkdir()
    slow = OpenSMFabric(path=str(conf), reread_command=[sys.executable, "-c", "import time; time.sleep(5)"],
                        timeout_s=0.3)
    with pytest.raises(DriverError, match="took over") as caught:
        slow.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    assert caught.value.transient


def test_no_reread_command_only_writes(conf):
    conf.parent.mkdir()
    quiet = OpenSMFabric(path=str(conf), reread_command=None)
    quiet.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    assert 1 in quiet.read() and not (conf.parent / "partitions.conf.reread-pending").exists()


def test_concurrent_writers_lose_nothing(fabric, counter):
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    wanted = {f"{0x0002c90300000001 + i:016x}": "full" for i in range(20)}
    errors = []

    def add(guid):
        try:
            OpenSMFabric(path=fabric.path, reread_command=counter[0], timeout_s=30).set_members(1, {guid: "full"})
        except Exception as exc:  # any failure at all fails the test below
            errors.append(exc)
    threads = [threading.Thread(target=add, args=(guid,)) for guid in wanted]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert fabric.read()[1].members == wanted
    assert counter[1]() == 21


def test_set_members_on_a_missing_partition_is_not_transient(fabric, conf, counter):
    with pytest.raises(DriverError, match="does not exist") as caught:
        fabric.set_members(0x42, {A: "full"})
    assert not caught.value.transient
    assert not conf.exists() and counter[1]() == 0


@pytest.mark.parametrize("members", [{"not-a-guid": "full"}, {A: "owner"}, {"0x0": "full"},
                                     {"0002c90300a1b2c3ff": "limited"}])
def test_bad_members_are_refused_before_the_file_is_touched(fabric, conf, counter, members):
    fabric.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    before = conf.stat()
    with pytest.raises(DriverError) as caught:
        fabric.set_members(1, members)
    assert not caught.value.transient
    assert conf.stat().st_mtime_ns == before.st_mtime_ns and counter[1]() == 1


def test_the_default_partition_never_gets_full_members_nor_goes(fabric, counter):
    with pytest.raises(DriverError, match="never made full members") as caught:
        fabric.set_members(DEFAULT_PKEY, {A: "full"})
    assert not caught.value.transient
    with pytest.raises(DriverError, match="cannot be deleted"):
        fabric.delete_partition(DEFAULT_PKEY)
    fabric.set_members(DEFAULT_PKEY, {A: "limited"})
    assert fabric.read()[DEFAULT_PKEY].members == {A: "limited"}


def test_a_bad_partition_name_is_refused(fabric, conf):
    with pytest.raises(DriverError, match="not an OpenSM partition name") as caught:
        fabric.ensure_partition(PartitionSpec(pkey=1, name="my vpc"))
    assert not caught.value.transient and not conf.exists()


def test_a_file_it_cannot_parse_is_left_alone(fabric, conf, counter):
    conf.write_text("vpc=0x1 : 0002c90300a1b2c3;\n")
    with pytest.raises(DriverError, match="fix it by hand") as caught:
        fabric.ensure_partition(PartitionSpec(pkey=2, name="vpc2"))
    assert not caught.value.transient
    with pytest.raises(DriverError, match="fix it by hand"):
        fabric.read()
    assert conf.read_text() == "vpc=0x1 : 0002c90300a1b2c3;\n" and counter[1]() == 0


def test_a_missing_folder_is_a_setting_to_fix(tmp_path):
    lost = OpenSMFabric(path=str(tmp_path / "nowhere" / "partitions.conf"), reread_command=None)
    with pytest.raises(DriverError) as caught:
        lost.ensure_partition(PartitionSpec(pkey=1, name="vpc"))
    assert not caught.value.transient
