"""
Attestation evidence from the node. On real hardware (NvidiaAttester) each GPU signs an SPDM
measurement report that NVML returns for the control plane's nonce; the simulated attester holds,
per GPU, a real P-384 device key and certificate chain and signs Meridian's JSON evidence, so the
control plane's real verifier checks both.
"""

from __future__ import annotations

import time

from security import device_pki


class SimulatedAttester:
    """
    ``identities``: GPU UUID -> {"key": PEM, "chain": [PEM, ...], "serial", "gpu_model", "vbios",
    "driver"}; the measurements are those of the simulated firmware version.
    """

    def __init__(self, identities: dict[str, dict]):
        self.identities = identities

    def evidence(self, hostname: str, nonce: str, gpus: list[dict]) -> dict:
        reports = []
        for gpu in gpus:
            identity = self.identities.get(gpu["uuid"])
            if identity is None:
                raise LookupError(f"no device identity for GPU {gpu['uuid']}")
            measurements = device_pki.reference_measurements(
                identity["gpu_model"], identity["vbios"], identity["driver"]
            )
            key = device_pki.key_from_pem(identity["key"])
            signed = device_pki.sign_gpu_evidence(
                key,
                identity["chain"],
                uuid=gpu["uuid"],
                serial=identity["serial"],
                gpu_model=identity["gpu_model"],
                vbios=identity["vbios"],
                driver=identity["driver"],
                measurements=measurements,
                nonce=nonce,
                generated_at=int(time.time()),
            )
            reports.append(signed.to_dict())
        return {"node": hostname, "nonce": nonce, "gpus": reports}


class NvidiaAttester:
    """
    Evidence from real NVIDIA GPUs (``--nvml real``): per GPU, the SPDM attestation report NVML
    returns for the control plane's nonce and the GPU's attestation certificate chain, in the
    ``nvidia-spdm`` format security.nvidia verifies. With CC mode off, a GPU sends ``cc_mode:
    off`` and no report: the control plane records it as not capable of attestation.
    """

    def __init__(self, nvml):
        self.nvml = nvml

    def evidence(self, hostname: str, nonce: str, gpus: list[dict]) -> dict:
        mode = self.nvml.cc_mode()
        reports = []
        for gpu in gpus:
            entry = {"format": "nvidia-spdm", "uuid": gpu["uuid"], "serial": gpu.get("serial") or "",
                     "gpu_model": gpu.get("name") or "", "cc_mode": mode, "report": None, "certificate_chain": []}
            if mode != "off":
                report, chain = self.nvml.cc_evidence(gpu["index"], bytes.fromhex(nonce))
                entry["report"] = report.hex()
                entry["certificate_chain"] = [device_pki.cert_to_pem(cert) for cert in device_pki.certs_from_pem(chain)]
            reports.append(entry)
        return {"node": hostname, "nonce": nonce, "gpus": reports}

