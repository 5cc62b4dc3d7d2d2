"""
cloud-init for instances: the tenant's user-data, checked when a reservation is made, and each
instance's NoCloud config drive -- an ISO 9660 volume labelled ``cidata`` holding ``meta-data``
(instance id, hostname, the SSH keys), ``user-data`` (the tenant's), ``vendor-data`` (Meridian's:
report in with the host keys) and ``network-config`` (version 2: its private address). A VM gets
it as a CD-ROM, a bare-metal server through its BMC's virtual media; both fetch it from a URL
carrying a per-instance secret (``drive_url``).

The ISO is built once per instance and kept (``ConfigDrive``): a retried step inserts the same
bytes, and the keys in it are the reservation's keys when the instance was first given its drive.
It is deleted once the instance is cleaned (``drives_forget``).
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import secrets

import pycdlib
import yaml
from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse

from core.errors import invalid
from provisioning.addresses import pool
from provisioning.models import ConfigDrive, Instance
from provisioning.mounts import Mount

LABEL = "cidata"  # the NoCloud datasource looks for a volume of this label
# ISO 9660 names (8.3, upper case) beside the names Linux reads through Rock Ridge and Joliet.
FILES = {"meta-data": "METADATA.;1", "user-data": "USERDATA.;1", "vendor-data": "VENDORDA.;1",
         "network-config": "NETWORKC.;1"}
SCRIPT_STARTS = ("#!", "#cloud-boothook", "#include")


def user_data_check(text: str) -> str:
    """
    ``text`` if it is user-data cloud-init runs -- ``#cloud-config`` YAML that is a mapping, a
    script (``#!``), a boothook or an include list, or a MIME multipart -- within the size
    limit; otherwise a 400 on ``user_data`` saying what is wrong.
    """
    if not text:
        return ""
    limit = settings.MERIDIAN_USER_DATA_MAX_BYTES
    size = len(text.encode())
    if size > limit:
        raise invalid("user_data", f"user-data is {size:,} bytes; the limit is {limit:,} (as on EC2): fetch "
                                   "larger files from the instance (#include, or a script that downloads them).",
                      code="too_large")
    if "\x00" in text:
        raise invalid("user_data", "user-data is text: it holds a NUL byte.", code="invalid")
    first = text.lstrip("\ufeff").split("\n", 1)[0].strip()
    if first == "#cloud-config":
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or "not YAML"
            raise invalid("user_data", f"#cloud-config is not valid YAML{where}: {problem}.",
                          code="invalid") from None
        if document is not None and not isinstance(document, dict):
            raise invalid("user_data", "#cloud-config must be a mapping of modules (e.g. 'packages: [htop]').",
                          code="invalid")
        return text
    if first.startswith(SCRIPT_STARTS) or first.lower().startswith("content-type: multipart/"):
        return text
    raise invalid("user_data", "user-data must start with '#cloud-config' (YAML) or '#!' (a script).",
                  code="invalid")


def meta_data(instance: Instance, keys: list[str]) -> dict:
    return {"instance-id": str(instance.pk), "local-hostname": instance.name,
            "hostname": instance.address or instance.name, "public-keys": keys}


GUEST_AGENT_CONFIG = "/etc/meridian/guest-agent.json"


def vendor_data(report_url: str, mounts: list[Mount] = (), telemetry_url: str = "") -> str:
    """
    Meridian's own cloud-config: report in once booted, with the host's public keys (cloud-init's
    ``phone_home``), so the tenant sees the fingerprints before the first login; and the
    reservation's volumes mounted (a block volume formatted first if it has no file system yet:
    ``fs_setup`` never overwrites one); and where the optional in-guest agent posts the GPUs' telemetry
    (``GUEST_AGENT_CONFIG``, readable by root only: its URL holds the instance's secret). The tenant's
    user-data is merged over it and may turn it off.
    """
    config: dict = {"phone_home": {"url": report_url, "post": ["pub_key_rsa", "pub_key_ecdsa", "pub_key_ed25519",
                                                               "instance_id", "hostname", "fqdn"], "tries": 10}}
    if telemetry_url:
        config["write_files"] = [{"path": GUEST_AGENT_CONFIG, "permissions": "0600", "owner": "root:root",
                                  "content": json.dumps({"telemetry_url": telemetry_url})}]
    if mounts:
        blocks = [m for m in mounts if m.kind == "block"]
        if blocks:
            config["fs_setup"] = [{"label": m.volume[:16], "filesystem": "ext4", "device": m.source,
                                   "partition": "none", "overwrite": False} for m in blocks]
        config["mounts"] = [m.fstab() for m in mounts]
    return "#cloud-config\n" + yaml.safe_dump(config, sort_keys=False)


def network_config(instance: Instance, mac: str | None = None) -> dict:
    """
    Version 2 network config: the primary NIC (by MAC where Meridian chose it, as for a VM; else
    the first wired NIC) takes its private address from the region's pool beside DHCP's lease. A
    public address is one-to-one NAT at the region's edge, never on the NIC.
    """
    match = {"macaddress": mac} if mac else {"name": "en*"}
    nic: dict = {"match": match, "set-name": "eth0", "dhcp4": True}
    if instance.private_ip:
        prefix = pool(instance.node.region.slug, "private").prefixlen
        nic["addresses"] = [f"{ipaddress.ip_address(instance.private_ip)}/{prefix}"]
    return {"version": 2, "ethernets": {"primary": nic}}


def iso(files: dict[str, str]) -> bytes:
    """An ISO 9660 volume labelled ``cidata`` holding ``files`` (name -> text), with Rock Ridge and Joliet names."""
    volume = pycdlib.PyCdlib()
    volume.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=LABEL)
    try:
        for name, text in files.items():
            data = text.encode()
            volume.add_fp(io.BytesIO(data), len(data), f"/{FILES[name]}", rr_name=name, joliet_path=f"/{name}")
        out = io.BytesIO()
        volume.write_fp(out)
        return out.getvalue()
    finally:
        volume.close()


def read_iso(data: bytes) -> dict[str, str]:
    """The files of a config drive by their Rock Ridge names (what an instance reads): the tests' view."""
    volume = pycdlib.PyCdlib()
    volume.open_fp(io.BytesIO(data))
    try:
        files = {}
        for child in volume.list_children(rr_path="/"):
            if child.is_dot() or child.is_dotdot():
                continue
            name = child.rock_ridge.name().decode()
            out = io.BytesIO()
            volume.get_file_from_iso_fp(out, rr_path=f"/{name}")
            files[name] = out.getvalue().decode()
        files["_label"] = volume.pvd.volume_identifier.decode().strip()
        return files
    finally:
        volume.close()


def drive_for(instance: Instance, *, keys: list[str], mounts: list[Mount], mac: str | None = None) -> ConfigDrive:
    """
    The instance's config drive: made on first call with ``keys`` (authorized_keys lines) and the
    reservation's ``mounts`` (``mounts_for``, read once by the step for all its instances), then
    the same one -- a retried step, or a second worker racing the first, gets the stored ISO.
    """
    drive = ConfigDrive.objects.filter(instance=instance).first()
    if drive is not None:
        return drive
    reservation = instance.reservation
    token = secrets.token_urlsafe(32)
    files = {"meta-data": yaml.safe_dump(meta_data(instance, keys), sort_keys=False),
             "user-data": reservation.user_data or "#cloud-config\n{}\n",
             "vendor-data": vendor_data(report_url(instance, token), mounts,
                                        telemetry_url=instance_url(instance, token, "instance-gpu-telemetry")),
             "network-config": yaml.safe_dump(network_config(instance, mac), sort_keys=False)}
    image = iso(files)
    try:
        with transaction.atomic():
            return ConfigDrive.objects.create(instance=instance, token=token, iso=image,
                                              sha256=hashlib.sha256(image).hexdigest())
    except IntegrityError:
        return ConfigDrive.objects.get(instance=instance)


def drive_url(drive: ConfigDrive) -> str:
    """Where the BMC or hypervisor fetches the drive: Meridian's public URL and the drive's secret."""
    path = reverse("config-drive", kwargs={"instance_id": drive.instance_id, "token": drive.token})
    return settings.MERIDIAN_PUBLIC_URL.rstrip("/") + path


def report_url(instance: Instance, token: str) -> str:
    return instance_url(instance, token, "instance-report")


def instance_url(instance: Instance, token: str, name: str) -> str:
    """An ``instance-data`` URL of the instance, its secret in the path."""
    path = reverse(name, kwargs={"instance_id": instance.pk, "token": token})
    return settings.MERIDIAN_PUBLIC_URL.rstrip("/") + path


def drive_by_token(instance_id, token: str) -> ConfigDrive | None:
    """The drive of a live instance whose secret is ``token`` (compared in constant time), else None."""
    drive = (ConfigDrive.objects.select_related("instance__reservation")
             .filter(instance_id=instance_id).first())
    if drive is None or not secrets.compare_digest(drive.token.encode(), str(token).encode()):
        return None
    return drive


def drives_forget(instance_ids) -> int:
    """The cleaned instances' drives are deleted (their URLs answer 404 from now on); returns how many."""
    ids = list(instance_ids)
    return ConfigDrive.objects.filter(instance_id__in=ids).delete()[0] if ids else 0


__all__ = ["drive_by_token", "drive_for", "drive_url", "drives_forget", "iso", "meta_data", "network_config",
           "read_iso", "user_data_check", "vendor_data"]
