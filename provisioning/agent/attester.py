"""
Signing attestation evidence on the node. A GPU's evidence is signed by the GPU's own device key
(on real hardware the GPU signs its SPDM measurement report and NVIDIA's attestation SDK collects
it; that backend plugs in here). The simulated attester holds, per GPU, a real P-384 device key
and certificate chain, so the control plane's real verifier checks it as it would a real GPU.
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
