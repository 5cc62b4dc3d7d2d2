"""
What a simulated instance prints on its serial console as it boots: the kernel's first line,
cloud-init's stages and its block of SSH host keys (which Meridian reads, as a tenant would read
Nova's console output). The host keys are real ed25519 and ECDSA keys, derived from ``seed``: the
same boot prints the same keys, a new deployment (a new seed) new ones.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519

P256_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def host_keys(seed: str) -> list[str]:
    """The instance's public host keys as OpenSSH writes them (ed25519, then ECDSA P-256)."""
    material = hashlib.sha256(f"meridian-simulated-host-key|{seed}".encode()).digest()
    ed = ed25519.Ed25519PrivateKey.from_private_bytes(material).public_key()
    scalar = int.from_bytes(hashlib.sha256(material).digest(), "big") % (P256_ORDER - 1) + 1
    ecdsa = ec.derive_private_key(scalar, ec.SECP256R1()).public_key()
    openssh = serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    return [ed.public_bytes(*openssh).decode(), ecdsa.public_bytes(*openssh).decode()]


def boot_log(hostname: str, seed: str) -> str:
    keys = host_keys(seed)
    fingerprints = [f"256 SHA256:{_fingerprint(k)} root@{hostname} ({k.split()[0].split('-')[-1].upper()})"
                    for k in keys]
    return "\n".join([
        "[    0.000000] Linux version 6.8.0-48-generic (buildd@lcy02-amd64-010) #48-Ubuntu SMP",
        "[    2.114820] nvidia: loading out-of-tree module taints kernel.",
        "[    4.201337] cloud-init[712]: Cloud-init v. 24.4 running 'init-local'. Datasource DataSourceNoCloud "
        "[seed=/dev/sr0][dsmode=net].",
        "[    6.882104] cloud-init[901]: Cloud-init v. 24.4 running 'init'. Up 6.85 seconds.",
        "[    7.310452] cloud-init[901]: Generating public/private ed25519 key pair.",
        "[    9.004481] cloud-init[1120]: Cloud-init v. 24.4 running 'modules:config'. Up 8.99 seconds.",
        "ci-info: no authorized SSH keys fingerprints found for user root.",
        "<14>Dec  5 00:00:09 cloud-init: #############################################################",
        "<14>Dec  5 00:00:09 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----",
        *(f"<14>Dec  5 00:00:09 cloud-init: {line}" for line in fingerprints),
        "<14>Dec  5 00:00:09 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----",
        "<14>Dec  5 00:00:09 cloud-init: #############################################################",
        "-----BEGIN SSH HOST KEY KEYS-----",
        *(f"{key} root@{hostname}" for key in keys),
        "-----END SSH HOST KEY KEYS-----",
        "[   10.517733] cloud-init[1301]: Cloud-init v. 24.4 finished. Datasource DataSourceNoCloud "
        "[seed=/dev/sr0][dsmode=net]. Up 10.51 seconds",
        "",
        f"Ubuntu 24.04.1 LTS {hostname} ttyS0",
        "",
        f"{hostname} login: ",
    ])


def _fingerprint(key: str) -> str:
    blob = base64.b64decode(key.split()[1])
    return base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
