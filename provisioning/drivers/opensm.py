"""
The fabric driver for OpenSM: the subnet manager's ``partitions.conf``, rewritten whole on every
change and re-read by OpenSM when it gets SIGHUP (opensm(8), NOTES: a HUP starts a heavy sweep,
and every heavy sweep parses the partition file again).

The file's grammar is the one of opensm(8), section PARTITION CONFIGURATION, and of
``doc/partition-config.txt`` in linux-rdma/opensm; where the text is silent, OpenSM's parser
(``opensm/osm_prtn_config.c``) decides:

    <Partition Definition>:[<newline>]<Partition Properties>;
    Partition Definition: [PartitionName][=PKey][,ipoib_bc_flags][,defmember=full|limited]
    Port Specifier:       <PortGUID>[=[full|limited]]      ('#' starts a comment)

What this module writes, and why:

* P_Keys are the 15-bit base, ``0x0001`` and not ``0x8001``: "Only low 15 bits will be used"
  (the PKey field above; ``osm_prtn_make_new`` clears 0x8000), because the membership bit belongs
  to each port (``=full`` / ``=limited``), not to the partition. ``parse`` accepts either form.
* Every port carries its membership explicitly and ``defmember`` is never written: a bare GUID
  means limited, and OpenSM versions that predate ``defmember`` ignore the flag.
* ``mtu=`` and ``rate=`` are IBTA codes ("mtu=4 for 2048"); a partition without ``rate`` keeps
  OpenSM's default (3, 10 Gb/s). ``sl=`` is always written; OpenSM applies it only with QoS on
  (otherwise it logs and uses SL 0), so the file says what was asked, not what the SM chose.
* The default partition is always written, first, as
  ``Default=0x7fff, ipoib, mtu=4, sl=0 : ALL=limited, ALL_SWITCHES=full, SELF=full;`` (its name
  and flags come from the partitions given): every end port, tenant CAs included, is at most a
  limited member; switches and the SM's own port are full members, as in the manual's example
  ``Default=0x7fff : ALL, ALL_SWITCHES=full, SELF=full ;``. Without any rule for 0x7FFF, OpenSM
  makes the same limited default; without a readable file it makes every port a full member.
* A file OpenSM cannot parse is worse than a stale one: on a parse error OpenSM falls back to
  the no-file default (every port a full member of 0x7FFF, so tenants can reach each other).
  ``render`` therefore refuses what OpenSM would refuse (a zero GUID, names with delimiters)
  and keeps lines far below the parser's 4096-byte line buffer by wrapping long port lists,
  which the grammar allows ("The Line can be wrapped after ':' ... and between").

How ``parse`` represents a file: one ``Partition`` per P_Key, the default 0x7FFF always among
them (OpenSM creates it unconditionally). Keywords (ALL, ALL_CAS, ALL_SWITCHES, ALL_ROUTERS,
SELF, NONE) are not ports, so they are left out of ``members``; the default partition's members
are the GUIDs listed by hand on its line, if any. Repeated P_Keys are merged as OpenSM merges
them: the first name, later memberships overwriting earlier ones; the settings are those of the
first definition with ``ipoib`` (the one that creates the IPoIB broadcast group), else the
first. ``both`` counts as full (it adds a limited key too only with ``allow_both_pkeys``).
Flags the model has no place for (scope, Q_Key, TClass, FlowLabel, multicast groups) and
keywords outside the default partition are read past, and gone once the driver rewrites the
file: Meridian owns it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from provisioning.drivers.base import DriverError
from provisioning.drivers.fabric import (
    DEFAULT_PKEY,
    FULL,
    LIMITED,
    MEMBERSHIPS,
    MTUS,
    RATE_CODES,
    FabricDriver,
    Partition,
    PartitionSpec,
    check_members,
)

HEADER = ("# OpenSM partitions.conf, managed by Meridian: changes made here by hand are overwritten.\n"
          "# Grammar: opensm(8), PARTITION CONFIGURATION. Tenant ports are limited members of 0x7fff.\n")
# What OpenSM gives the default partition when the file has no rule for it: ipoib, the IPoIB
# broadcast group's default MTU (4, 2048 bytes) and rate.
DEFAULT_SPEC = PartitionSpec(pkey=DEFAULT_PKEY, name="Default", mtu=2048, rate_gbps=None, service_level=0,
                             ipoib=True)
DEFAULT_PORTS = ("ALL=limited", "ALL_SWITCHES=full", "SELF=full")
KEYWORDS = ("NONE", "ALL", "ALL_CAS", "ALL_SWITCHES", "ALL_ROUTERS", "SELF")
MTU_CODES = {mtu: code for code, mtu in enumerate(MTUS, start=1)}
MTU_BY_CODE = {code: mtu for mtu, code in MTU_CODES.items()}
RATE_BY_CODE = {code: gbps for gbps, code in RATE_CODES.items()}
SERVICE_LEVELS = {sl: sl for sl in range(16)}
PORTS_PER_LINE = 4  # ~25 characters each: lines stay far below the 4096-byte buffer OpenSM reads them into
NAME_MAX = 31  # osm_prtn_t.name is char[32], filled with strncpy
DELIMITERS = "=,:;#"
# OpenSM's partition flags in the order its parser tries them; a flag may be abbreviated.
FLAGS = ("mtu", "rate", "scope", "Q_Key", "TClass", "sl", "FlowLabel", "ipoib", "defmember")
DEFAULT_REREAD = ("pkill", "-HUP", "opensm")


def check_name(name: str) -> str:
    """A partition name OpenSM keeps as given: 1-31 printable ASCII characters, none of ``=,:;#``."""
    if not re.fullmatch(rf"[!-~]{{1,{NAME_MAX}}}", name or "") or any(c in DELIMITERS for c in name):
        raise ValueError(f"'{name}' is not an OpenSM partition name: 1-{NAME_MAX} printable ASCII characters "
                         f"without spaces or any of {DELIMITERS}.")
    return name


# Rendering.


def render(partitions: Mapping[int, Partition]) -> str:
    """The complete partitions.conf for these partitions: the default one first, then by P_Key."""
    default = partitions.get(DEFAULT_PKEY) or Partition(DEFAULT_SPEC)
    lines = [HEADER, _definition(DEFAULT_PKEY, default, DEFAULT_PORTS)]
    lines += [_definition(pkey, partitions[pkey]) for pkey in sorted(partitions) if pkey != DEFAULT_PKEY]
    return "".join(lines)


def _definition(pkey: int, partition: Partition, keywords: Sequence[str] = ()) -> str:
    """One partition's statement; ports beyond the first line continue on indented lines."""
    spec = partition.spec
    if spec.pkey != pkey:
        raise ValueError(f"Partition {spec.pkey:#06x} is filed under P_Key {pkey:#06x}.")
    ports = [*keywords, *(_port(guid, membership) for guid, membership in sorted(partition.members.items()))]
    rows = [", ".join(ports[i:i + PORTS_PER_LINE]) for i in range(0, len(ports), PORTS_PER_LINE)] or [""]
    first = f"{_head(spec)} :" + (f" {rows[0]}" if rows[0] else "")
    return ",\n".join([first, *(f"    {row}" for row in rows[1:])]) + ";\n"


def _head(spec: PartitionSpec) -> str:
    """``name=0xPKEY[, ipoib], mtu=N[, rate=N], sl=N``; mtu and rate as IBTA codes."""
    flags = ["ipoib"] if spec.ipoib else []
    flags.append(f"mtu={MTU_CODES[spec.mtu]}")
    if spec.rate_gbps is not None:
        flags.append(f"rate={RATE_CODES[spec.rate_gbps]}")
    flags.append(f"sl={spec.service_level}")
    return ", ".join([f"{check_name(spec.name)}=0x{spec.pkey:04x}", *flags])


def _port(guid: str, membership: str) -> str:
    """``0x<16 hex digits>=full|limited``: OpenSM reads a GUID without 0x as octal or decimal."""
    if not re.fullmatch(r"[0-9a-f]{16}", guid) or int(guid, 16) == 0:
        raise ValueError(f"'{guid}' is not a port GUID OpenSM accepts (16 lower-case hex digits, not zero).")
    if membership not in MEMBERSHIPS:
        raise ValueError(f"Membership '{membership}' of {guid} is not full or limited.")
    return f"0x{guid}={membership}"


# Parsing.


@dataclass
class _Definition:
    """One ``Partition Definition`` as written; repeated P_Keys give several."""

    name: str
    pkey: int
    ipoib: bool = False
    mtu: int = DEFAULT_SPEC.mtu
    rate_gbps: float | None = None
    service_level: int = 0
    defmember: str = LIMITED


@dataclass
class _Found:
    """A P_Key's merged definitions: the first one's name, the settings' source, and its ports."""

    name: str
    settings: _Definition
    members: dict[str, str] = field(default_factory=dict)


def parse(text: str) -> dict[int, Partition]:
    """The partitions a partitions.conf defines (see the module docstring); ValueError naming the line."""
    found: dict[int, _Found] = {}
    current = None  # the definition whose port list runs on, across lines, until its ';'
    for lineno, line in enumerate(text.split("\n"), start=1):
        pieces = line.split("#", 1)[0].split(";")
        for index, piece in enumerate(pieces):
            try:
                if piece.strip():
                    if current is None:
                        header, colon, piece = piece.partition(":")
                        if not colon:
                            raise ValueError("no partition definition (name=PKey :) found")
                        current = _open(found, _parse_head(header))
                    _parse_ports(piece, found[current.pkey].members, current.defmember)
            except ValueError as exc:
                raise ValueError(f"line {lineno}: {exc}") from None
            if index < len(pieces) - 1:
                current = None
    partitions = {pkey: _partition(pkey, entry) for pkey, entry in found.items()}
    partitions.setdefault(DEFAULT_PKEY, Partition(DEFAULT_SPEC))
    return partitions


def _open(found: dict[int, _Found], definition: _Definition) -> _Definition:
    """Start or continue the P_Key's entry; the first definition with ipoib supplies the settings."""
    entry = found.get(definition.pkey)
    if entry is None:
        found[definition.pkey] = _Found(definition.name, definition)
    elif definition.ipoib and not entry.settings.ipoib:
        entry.settings = definition
    return definition


def _parse_head(header: str) -> _Definition:
    """``[name][=PKey][,flag[=value]]...``; a name starting with a digit is the P_Key (OpenSM's rule)."""
    first, *flags = header.split(",")
    name, equals, number = (part.strip() for part in first.partition("="))
    if not equals and name[:1].isdigit():
        name, number = "", name
    if not number:
        raise ValueError(f"partition '{name}' has no P_Key (OpenSM would make one up)")
    pkey = _c_number(number, "P_Key") & 0x7FFF
    if not pkey:
        raise ValueError(f"P_Key {number} of '{name}' is zero in its low 15 bits")
    definition = _Definition(name=name or f"{pkey:04x}", pkey=pkey)
    for flag in flags:
        _parse_flag(definition, *(part.strip() for part in flag.partition("=")[::2]))
    return definition


def _parse_flag(definition: _Definition, flag: str, value: str) -> None:
    """One partition flag, matched as OpenSM does (the first flag name it abbreviates)."""
    known = next((name for name in FLAGS if flag and name.startswith(flag)), None)
    if known == "ipoib":
        definition.ipoib = True
    elif known == "mtu":
        definition.mtu = _decode(_c_number(value, "mtu"), MTU_BY_CODE, "mtu")
    elif known == "rate":
        definition.rate_gbps = _decode(_c_number(value, "rate"), RATE_BY_CODE, "rate")
    elif known == "sl":
        definition.service_level = _decode(_c_number(value, "sl"), SERVICE_LEVELS, "sl")
    elif known == "defmember":
        definition.defmember = _membership(value)


SAFE_DEFAULT_KEYWORDS = {("ALL", LIMITED), ("ALL_SWITCHES", FULL), ("SELF", FULL), ("ALL_CAS", LIMITED),
                         ("ALL_SWITCHES", LIMITED), ("SELF", LIMITED)}


def keyword_grants(text: str) -> list[str]:
    """
    Keyword memberships that could let tenants reach each other: any keyword in a tenant
    partition, or a keyword other than the safe ones (ALL=limited, ALL_SWITCHES=full, SELF=full)
    in the default partition. Empty for every file ``render`` writes.
    """
    found = []
    for statement in "\n".join(line.split("#", 1)[0] for line in text.split("\n")).split(";"):
        header, colon, ports = statement.partition(":")
        if not colon:
            continue
        try:
            definition = _parse_head(header)
        except ValueError:
            continue  # parse() reports it
        for token in ports.split(","):
            name, equals, flag = (part.strip() for part in token.partition("="))
            if name == "mgid":
                break
            keyword = next((k for k in KEYWORDS if name and k.startswith(name) and not name.startswith("0")), None)
            if keyword is None or keyword == "NONE":
                continue
            try:
                membership = _membership(flag) if equals else definition.defmember
            except ValueError:
                membership = flag
            if definition.pkey != DEFAULT_PKEY or (keyword, membership) not in SAFE_DEFAULT_KEYWORDS:
                found.append(f"{keyword}={membership} in {definition.pkey:#06x}")
    return found


def _parse_ports(text: str, members: dict[str, str], defmember: str) -> None:
    """``PortGUID[=full|limited], ...`` into ``members``; keywords are skipped, ``mgid=`` ends the line."""
    for token in text.split(","):
        name, equals, flag = (part.strip() for part in token.partition("="))
        if not name:
            continue
        if name == "mgid":
            return
        if any(keyword.startswith(name) for keyword in KEYWORDS):
            continue
        members[_guid(name)] = _membership(flag) if equals else defmember


def _partition(pkey: int, entry: _Found) -> Partition:
    s = entry.settings
    spec = PartitionSpec(pkey=pkey, name=entry.name, mtu=s.mtu, rate_gbps=s.rate_gbps,
                         service_level=s.service_level, ipoib=s.ipoib)
    return Partition(spec, entry.members)


def _membership(flag: str) -> str:
    """full, limited or both as OpenSM reads them: abbreviations count, anything else is limited."""
    return FULL if "full".startswith(flag) or (flag and "both".startswith(flag)) else LIMITED


def _guid(text: str) -> str:
    """A GUID as OpenSM reads it (``strtoull`` base 0: 0x hex, leading-0 octal, decimal), normalised."""
    value = _c_number(text, "port GUID")
    if not 0 < value < 1 << 64:
        raise ValueError(f"'{text}' is not a port GUID (OpenSM refuses zero)")
    return f"{value:016x}"


def _c_number(text: str, what: str) -> int:
    """A number in C's ``strtoul(text, &end, 0)`` notation, the whole text consumed."""
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", text):
        return int(text, 16)
    if re.fullmatch(r"0[0-7]*", text):
        return int(text, 8)
    if re.fullmatch(r"[1-9][0-9]*", text):
        return int(text)
    raise ValueError(f"{what} '{text}' is not a number")


def _decode(code: int, table: Mapping[int, object], what: str):
    if code not in table:
        raise ValueError(f"{what}={code} is not one of the codes Meridian knows ({', '.join(map(str, table))})")
    return table[code]


# The driver.


class OpenSMFabric(FabricDriver):
    """
    One OpenSM's partitions.conf at ``path``. Every change takes an exclusive lock on
    ``<path>.lock``, reads the file, renders it whole and swaps it in atomically, then runs
    ``reread_command`` (a SIGHUP to opensm by default; no shell) so OpenSM applies it. A failed
    reread is owed (``<path>.reread-pending``) and run again by the next call that changes
    nothing, so retrying a step whose file write went through still reaches OpenSM.
    """

    def __init__(self, *, path: str, reread_command: Sequence[str] | str | None = DEFAULT_REREAD,
                 timeout_s: float = 30.0):
        self.path = os.path.abspath(os.fspath(path))
        self.reread_command = shlex.split(reread_command) if isinstance(reread_command, str) else (
            list(reread_command) if reread_command else None)
        self.timeout_s = float(timeout_s)

    def __repr__(self):
        return f"OpenSMFabric({self.path})"

    def read(self) -> dict[int, Partition]:
        text = self._load()
        unsafe = keyword_grants(text or "")
        if unsafe:
            # Fail closed: a keyword can make every port a full member, which no read-back of GUIDs shows.
            raise DriverError(f"{self.path} grants membership by keyword ({'; '.join(unsafe)}); isolation cannot be "
                              "proven. Remove those entries (Meridian writes only its own lines and the default "
                              "line ALL=limited).", transient=False)
        return self._parse(text)

    def ensure_partition(self, spec: PartitionSpec) -> None:
        try:
            check_name(spec.name)
        except ValueError as exc:
            raise DriverError(str(exc), transient=False) from None

        def change(partitions):
            old = partitions.get(spec.pkey)
            partitions[spec.pkey] = Partition(spec, dict(old.members) if old else {})
        self._change(change)

    def delete_partition(self, pkey: int) -> None:
        if pkey == DEFAULT_PKEY:
            raise DriverError("The default partition 0x7fff cannot be deleted.", transient=False)
        self._change(lambda partitions: partitions.pop(pkey, None))

    def set_members(self, pkey: int, members: Mapping[str, str]) -> None:
        checked = _checked(members)
        if pkey == DEFAULT_PKEY and FULL in checked.values():
            raise DriverError("Ports are never made full members of the default partition 0x7fff "
                              "(tenants would reach each other over it).", transient=False)

        def change(partitions):
            if pkey not in partitions:
                raise DriverError(f"Partition {pkey:#06x} does not exist in {self.path}.", transient=False)
            partitions[pkey].members.update(checked)
        self._change(change)

    def remove_members(self, pkey: int, guids: Iterable[str]) -> None:
        gone = set(check_members(dict.fromkeys(guids, FULL)))

        def change(partitions):
            partition = partitions.get(pkey)
            for guid in gone if partition else ():
                partition.members.pop(guid, None)
        self._change(change)

    # One change: lock, read, change, write when different, reread.

    def _change(self, change: Callable[[dict[int, Partition]], object]) -> None:
        with self._locked():
            before = self._load()
            partitions = self._parse(before)
            unchanged = before if before is not None else render(partitions)
            change(partitions)
            after = self._render(partitions)
            if after != unchanged:
                self._owe_reread()
                self._replace(after)
            self._reread_if_owed()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Exclusive ``flock`` on ``<path>.lock`` (one per open, so threads exclude each other too)."""
        try:
            fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._error("cannot open the lock file beside", exc) from None
        try:
            deadline = time.monotonic() + self.timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise DriverError(f"{self.path} stayed locked by another writer for {self.timeout_s:g} s.",
                                          transient=True) from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)

    def _load(self) -> str | None:
        """The file's text; None when there is none (OpenSM then runs its built-in default)."""
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as exc:
            raise DriverError(f"{self.path} is not text: {exc}", transient=False) from None
        except OSError as exc:
            raise self._error("cannot read", exc) from None

    def _parse(self, text: str | None) -> dict[int, Partition]:
        try:
            return parse(text or "")
        except ValueError as exc:
            raise DriverError(f"{self.path} cannot be read as a partitions.conf ({exc}); fix it by hand.",
                              transient=False) from None

    def _render(self, partitions: dict[int, Partition]) -> str:
        try:
            return render(partitions)
        except ValueError as exc:
            raise DriverError(f"{self.path} cannot be written: {exc}", transient=False) from None

    def _replace(self, text: str) -> None:
        """Write a temporary file beside the old one, fsync it, rename it over, fsync the folder."""
        folder, base = os.path.split(self.path)
        mode = self._mode()
        try:
            fd, temporary = tempfile.mkstemp(prefix=f".{base}.", suffix=".tmp", dir=folder)
        except OSError as exc:
            raise self._error("cannot write beside", exc) from None
        try:
            with os.fdopen(fd, "w", encoding="ascii", newline="\n") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, self.path)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(temporary)
            raise self._error("cannot replace", exc) from None
        _fsync_folder(folder)

    def _mode(self) -> int:
        """The old file's permission bits, kept across the swap; 0644 for a new file (OpenSM reads it)."""
        try:
            return os.stat(self.path).st_mode & 0o7777
        except FileNotFoundError:
            return 0o644

    @property
    def _pending(self) -> str:
        return f"{self.path}.reread-pending"

    def _owe_reread(self) -> None:
        """Recorded before the swap, so that no failure after it can lose the reread."""
        if self.reread_command:
            try:
                with open(self._pending, "w"):
                    pass
            except OSError as exc:
                raise self._error("cannot mark a reread owed beside", exc) from None

    def _reread_if_owed(self) -> None:
        if not os.path.exists(self._pending):
            return
        if self.reread_command:
            self._reread()
        with suppress(FileNotFoundError):
            os.unlink(self._pending)

    def _reread(self) -> None:
        """Run the reread command: a missing program is a setting to fix, a failing one worth a retry."""
        command = self.reread_command
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=self.timeout_s,  # noqa: S603
                                  check=False)
        except subprocess.TimeoutExpired:
            raise DriverError(f"{shlex.join(command)} took over {self.timeout_s:g} s.", transient=True) from None
        except OSError as exc:
            raise DriverError(f"Cannot run {shlex.join(command)} ({exc.strerror or exc}); fix reread_command in "
                              "MERIDIAN_FABRICS.", transient=False) from None
        if done.returncode != 0:
            said = (done.stderr or done.stdout or "").strip() or "no output"
            raise DriverError(f"{shlex.join(command)} exited with {done.returncode}: {said}", transient=True)

    def _error(self, doing: str, exc: OSError) -> DriverError:
        """An OSError on the file: lacking permission or folder is a setting to fix, the rest transient."""
        for_good = isinstance(exc, PermissionError | FileNotFoundError | NotADirectoryError | IsADirectoryError)
        return DriverError(f"{self.path}: {doing} it ({exc.strerror or exc}).", transient=not for_good)


def _checked(members: Mapping[str, str]) -> dict[str, str]:
    """``check_members``, and no zero GUID: OpenSM rejects it and would fall back to its open default."""
    checked = check_members(members)
    if "0" * 16 in checked:
        raise DriverError("Port GUID 0 is not a port (OpenSM refuses it).", transient=False)
    return checked


def _fsync_folder(folder: str) -> None:
    """Make the rename itself durable: without it a crash may bring the old file back."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
