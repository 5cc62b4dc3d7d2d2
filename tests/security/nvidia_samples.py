"""
NVIDIA's genuine attestation samples, from the nv-local-gpu-verifier wheel (BSD-3-Clause) on the
package index: a Hopper attestation report, its certificate chain, the device and RIM root
certificates and production RIMs. The wheel is not installed (its pins clash with Meridian's): it
is downloaded once, checked against its pinned SHA-256, and its sample files are unpacked under
var/nvidia-samples/.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from security.device_pki import cert_to_pem, certs_from_pem

WHEEL = "nv-local-gpu-verifier==2.7.3"
WHEEL_SHA256 = "27259ce3d828ca102db17f4b70c7b85c1882a55f99153eb706fcb1866db0fe7a"
HOME = Path(__file__).resolve().parents[2] / "var" / "nvidia-samples"
# What the sample report states (and the nonce its request carries).
NONCE = "931d8dd0add203ac3d8b4fbde75e115278eefcdceac5b87671a748f32364dfcb"
VBIOS = "96.00.9F.00.01"
DRIVER = "550.90.07"
DEVICE_ID = "NVIDIA:GH100:48B02D92494BADF4"


def fetch() -> Path:
    """The unpacked samples, downloading the pinned wheel the first time (safe across test workers)."""
    if (HOME / "complete").exists():
        return HOME
    with tempfile.TemporaryDirectory() as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                        "--dest", scratch, WHEEL], check=True, timeout=300)
        wheel = next(Path(scratch).glob("*.whl"))
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        if digest != WHEEL_SHA256:
            raise RuntimeError(f"{wheel.name} has SHA-256 {digest}, not the pinned {WHEEL_SHA256}")
        unpacked = Path(scratch) / "samples"
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member.startswith(("verifier/samples/", "verifier/certs/")) and not member.endswith(".py"):
                    target = unpacked / Path(member).name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.read(member))
        (unpacked / "complete").write_text(WHEEL + "\n")
        HOME.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(unpacked, HOME)
        except OSError:  # another worker got there first
            shutil.rmtree(unpacked, ignore_errors=True)
    return HOME


def report_bytes(home: Path) -> bytes:
    return bytes.fromhex((home / "hopperAttestationReport.txt").read_text().strip())


def chain_pems(home: Path) -> list[str]:
    return [cert_to_pem(cert) for cert in certs_from_pem((home / "hopperCertChain.txt").read_bytes())]
