"""
The simulated fleet's device identities, so the real verifier runs everywhere: a demo device CA
(a root and an intermediate, kept in the database like the rest of the simulated hardware), one
ECDSA P-384 key and certificate per simulated GPU made on first use, the firmware versions the
simulated GPUs report, and what the operator of a demo registers for them (the demo root as a
trust anchor, reference values per GPU model: ``trust_simulated_fleet``).

Evidence can be told to misbehave for tests through ``MERIDIAN_SIMULATION["attestation"]``
(per hostname or ``"default"``): ``bad_measurement``, ``unknown_vbios``, ``wrong_key``,
``self_signed``, ``foreign_gpu``, ``stale_nonce``.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.db import IntegrityError, transaction

from cloud.models import GPUModel
from provisioning.models import SimulatedDevice
from security import device_pki
from security.models import ReferenceMeasurement, TrustAnchor

SIMULATED_VBIOS = "96.00.9f.00.01"
SIMULATED_DRIVER = "570.124.06"
CA_KEY = "pki:demo-device-ca"


def _device(key: str):
    try:
        with transaction.atomic():
            SimulatedDevice.objects.get_or_create(key=key)
    except IntegrityError:
        pass  # made by a racing process
    return SimulatedDevice.objects.select_for_update().get(key=key)


def demo_ca() -> dict:
    """The demo device CA's keys and certificates as PEM (made once, shared by every process)."""
    state = SimulatedDevice.objects.filter(key=CA_KEY).values_list("state", flat=True).first()
    if state and "intermediate_cert" in state:
        return state
    with transaction.atomic():
        row = _device(CA_KEY)
        if "intermediate_cert" not in row.state:
            root_key, root_cert = device_pki.make_root("Meridian Demo Device Root CA")
            int_key, int_cert = device_pki.make_intermediate(root_key, root_cert, "Meridian Demo GPU Intermediate CA")
            row.state = {"root_key": device_pki.key_to_pem(root_key), "root_cert": device_pki.cert_to_pem(root_cert),
                         "intermediate_key": device_pki.key_to_pem(int_key),
                         "intermediate_cert": device_pki.cert_to_pem(int_cert)}
            row.save(update_fields=["state"])
        return row.state


def gpu_identity(uuid: str, serial: str) -> dict:
    """A simulated GPU's device key and certificate chain (device, intermediate), made on first use."""
    key = f"gpu-identity:{uuid}"
    state = SimulatedDevice.objects.filter(key=key).values_list("state", flat=True).first()
    if state and "key" in state:
        return state
    ca = demo_ca()
    with transaction.atomic():
        row = _device(key)
        if "key" not in row.state:
            issuer_key = device_pki.key_from_pem(ca["intermediate_key"])
            issuer_cert = device_pki.cert_from_pem(ca["intermediate_cert"])
            device_key, device_cert = device_pki.make_device(issuer_key, issuer_cert, gpu_uuid=uuid, serial=serial)
            row.state = {"key": device_pki.key_to_pem(device_key),
                         "chain": [device_pki.cert_to_pem(device_cert), ca["intermediate_cert"]]}
            row.save(update_fields=["state"])
        return row.state


@transaction.atomic
def trust_simulated_fleet() -> None:
    """What an operator of the demo registers: the demo root as a trust anchor, and reference values."""
    ca = demo_ca()
    root = device_pki.cert_from_pem(ca["root_cert"])
    TrustAnchor.objects.update_or_create(
        fingerprint_sha256=device_pki.fingerprint_sha256(root),
        defaults={"name": "Meridian demo device root", "kind": TrustAnchor.Kind.ROOT,
                  "certificate_pem": ca["root_cert"], "subject": root.subject.rfc4514_string(),
                  "not_after": root.not_valid_after_utc, "is_active": True})
    for slug in GPUModel.objects.values_list("slug", flat=True):
        ReferenceMeasurement.objects.get_or_create(
            gpu_model=slug, vbios_version=SIMULATED_VBIOS, driver_version=SIMULATED_DRIVER,
            defaults={"measurements": {str(i): d for i, d in device_pki.reference_measurements(
                slug, SIMULATED_VBIOS, SIMULATED_DRIVER).items()}})


def attester_identities(node) -> dict[str, dict]:
    """What a simulated node agent signs with: per GPU UUID its device key, chain, serial, model and firmware."""
    return {gpu.uuid: {**gpu_identity(gpu.uuid, gpu.serial), "serial": gpu.serial, "gpu_model": gpu.model.slug,
                       "vbios": SIMULATED_VBIOS, "driver": SIMULATED_DRIVER}
            for gpu in node.gpus.select_related("model")}


def misbehaviour(hostname: str) -> str:
    table = settings.MERIDIAN_SIMULATION.get("attestation", {})
    return table.get(hostname, table.get("default", ""))


def simulated_evidence(node, nonce: str, gpus, *, mode: str = "", cc_mode: str | None = None) -> dict:
    """
    The evidence a simulated node answers ``nonce`` with for ``gpus`` (GPU rows), each signed by
    its own device key -- or wrong in the way ``mode`` says; ``cc_mode``: the GPUs' confidential-
    computing mode, when the simulated host is set up for it.
    """
    now = int(time.time())
    reports = []
    for gpu in gpus:
        identity = gpu_identity(gpu.uuid, gpu.serial)
        key, chain = device_pki.key_from_pem(identity["key"]), list(identity["chain"])
        vbios = "97.00.00.00.99" if mode == "unknown_vbios" else SIMULATED_VBIOS
        measurements = device_pki.reference_measurements(gpu.model.slug, vbios, SIMULATED_DRIVER)
        if mode == "bad_measurement":
            measurements[0] = "0" * 96
        if mode == "wrong_key":
            key, _ = device_pki.make_root("Not the device key")
        if mode == "self_signed":
            key, cert = device_pki.make_root(gpu.uuid)
            chain = [device_pki.cert_to_pem(cert)]
        uuid = f"GPU-{'0' * 8}-0000-0000-0000-{gpu.index:012d}" if mode == "foreign_gpu" else gpu.uuid
        evidence = device_pki.sign_gpu_evidence(
            key, chain, uuid=uuid, serial=gpu.serial, gpu_model=gpu.model.slug, vbios=vbios,
            driver=SIMULATED_DRIVER, measurements=measurements,
            nonce="f" * 64 if mode == "stale_nonce" else nonce, generated_at=now, cc_mode=cc_mode)
        reports.append(evidence.to_dict())
    return {"node": node.hostname, "nonce": nonce, "gpus": reports}
