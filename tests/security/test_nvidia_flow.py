"""
The real evidence path through the database: a real agent (``--nvml real``, pynvml patched to
answer with NVIDIA's genuine sample) answers an attest command; the control plane verifies it in
the same ``attestation_submit`` step as the simulated fleet's, against the NVIDIA device root and
the RIMs staff imported; the GPU's device ID is pinned and a receipt states it. Then the staff
imports: RIMs (verified on import) and OCSP responses (verified, never stale, the newest kept).
"""

from __future__ import annotations

import base64
from datetime import timedelta

import pynvml
import pytest
from django.utils import timezone

from cloud.models import GPU, Node
from provisioning.agent.agent import Agent
from provisioning.agent.attester import NvidiaAttester
from provisioning.agent.nvml import RealNVML
from security import device_pki as pki
from security import spdm
from security.models import AttestationNonce, OcspStatus, ReferenceManifest
from security.services import attestation_outcome, attestation_submit, trust_anchor_add
from tests.provisioning.test_nvml_backend import FakeNVML, table
from tests.security import nvidia_samples, ocsp_maker, rim_maker
from tests.world import small_fleet

V1 = "/api/v1"


@pytest.fixture
def sample_host(nvidia_samples_dir, monkeypatch):
    """pynvml answering as a one-GPU Hopper host in CC mode, its attestation report the genuine sample."""
    gpus = table()[:1]
    fake = FakeNVML(gpus)
    fake.install(monkeypatch)
    report = nvidia_samples.report_bytes(nvidia_samples_dir)
    chain = "".join(nvidia_samples.chain_pems(nvidia_samples_dir)).encode()
    asked = []

    def attestation_report(handle, nonce):
        asked.append(bytes(nonce))
        answer = pynvml.c_nvmlConfComputeGpuAttestationReport_t()
        answer.attestationReportSize = len(report)
        answer.attestationReport[:len(report)] = list(report)
        return answer

    def certificate(handle):
        answer = pynvml.c_nvmlConfComputeGpuCertificate_t()
        answer.attestationCertChainSize = len(chain)
        answer.attestationCertChain[:len(chain)] = list(chain)
        return answer

    state = {"ccFeature": pynvml.NVML_CC_SYSTEM_FEATURE_ENABLED,
             "devToolsMode": pynvml.NVML_CC_SYSTEM_DEVTOOLS_MODE_OFF}
    monkeypatch.setattr(pynvml, "nvmlSystemGetConfComputeState", lambda: pynvml.c_nvmlConfComputeSystemState_t(
        environment=pynvml.NVML_CC_SYSTEM_ENVIRONMENT_PROD, **state))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetConfComputeGpuAttestationReport", attestation_report)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetConfComputeGpuCertificate", certificate)
    nvml = RealNVML()
    yield {"nvml": nvml, "gpu": gpus[0], "state": state, "asked": asked}
    nvml.shutdown()


@pytest.fixture
def real_node(world, sample_host, nvidia_samples_dir):
    """A fleet node whose one GPU is the sample's, NVIDIA's device root trusted, RIMs for its versions imported."""
    small_fleet(2)
    node = Node.objects.filter(pool="bare_metal").order_by("hostname").first()
    keep = node.gpus.order_by("index").first()
    node.gpus.exclude(pk=keep.pk).delete()
    GPU.objects.filter(pk=keep.pk).update(uuid=sample_host["gpu"]["uuid"], serial=sample_host["gpu"]["serial"])
    trust_anchor_add(actor=None, name="NVIDIA Device Identity CA", purpose="device",
                     certificate_pem=(nvidia_samples_dir / "verifier_device_root.pem").read_text())
    signer_key, chain = rim_maker.trusted_rim_ca()
    report = spdm.parse(nvidia_samples.report_bytes(nvidia_samples_dir))
    values = {index - 1: value.hex() for index, value in report.measurements.items()}
    for version, indices in ((nvidia_samples.DRIVER, range(1, 30)), (nvidia_samples.VBIOS, range(30, 64))):
        document = rim_maker.minimal_rim(version=version, measurements={i: values[i] for i in indices},
                                         key=signer_key, chain=chain)
        world.client("platform_admin").post(f"{V1}/reference-manifests/", {"document": document.decode()},
                                            format="json")
    assert ReferenceManifest.objects.count() == 2
    return node


def attest(node, nvml) -> object:
    """The control plane's challenge (the sample answers its own nonce), the agent's answer, the verdict."""
    now = timezone.now()
    AttestationNonce.objects.create(value=nvidia_samples.NONCE, node_id=node.pk, issued_at=now,
                                    expires_at=now + timedelta(minutes=2))
    agent = Agent(None, nvml, attester=NvidiaAttester(nvml), hostname=node.hostname)
    answer = agent.execute({"id": "c1", "kind": "attest", "payload": {"nonce": nvidia_samples.NONCE, "gpus": [0]}})
    assert answer["ok"], answer
    return attestation_submit(node=node, evidence=answer["evidence"], nonce=nvidia_samples.NONCE)


def test_a_real_agent_with_the_genuine_sample_passes_and_pins_the_device(real_node, sample_host):
    report = attest(real_node, sample_host["nvml"])

    assert report.status == "pass", report.reasons
    assert sample_host["asked"] == [bytes.fromhex(nvidia_samples.NONCE)]
    gpu = report.gpus[0]
    assert (gpu["identity"], gpu["vbios"], gpu["driver"]) == (nvidia_samples.DEVICE_ID, nvidia_samples.VBIOS,
                                                              nvidia_samples.DRIVER)
    assert real_node.gpus.get().attested_identity == nvidia_samples.DEVICE_ID


def test_cc_off_on_a_real_host_is_not_capable_and_holds_the_node(real_node, sample_host):
    sample_host["state"]["ccFeature"] = pynvml.NVML_CC_SYSTEM_FEATURE_DISABLED

    report = attest(real_node, sample_host["nvml"])
    attestation_outcome(node=real_node, report=report)

    assert report.status == "not_capable"
    assert sample_host["asked"] == []  # nothing asked of a GPU that cannot answer
    real_node.refresh_from_db()
    assert real_node.state == "reference_unavailable"


def test_a_rim_import_is_refused_with_the_reason_when_it_does_not_verify(world):
    signer_key, chain = rim_maker.trusted_rim_ca()
    document = rim_maker.minimal_rim(version="570.1", measurements={1: "a" * 96}, key=signer_key, chain=chain)
    stranger_key, stranger = pki.make_root("Not trusted")
    untrusted = rim_maker.minimal_rim(version="570.2", measurements={1: "a" * 96}, key=stranger_key, chain=[stranger])
    admin = world.client("platform_admin")

    tampered = admin.post(f"{V1}/reference-manifests/", {"document": document.decode().replace("a" * 96, "b" * 96)},
                          format="json")
    foreign = admin.post(f"{V1}/reference-manifests/", {"document": untrusted.decode()}, format="json")
    garbage = admin.post(f"{V1}/reference-manifests/", {"document": "<not-a-rim/>"}, format="json")
    good = admin.post(f"{V1}/reference-manifests/", {"document": document.decode()}, format="json")

    assert tampered.status_code == foreign.status_code == garbage.status_code == 400
    assert tampered.json()["errors"][0]["code"] == "rim_invalid"
    assert "rim_signature" in str(tampered.json())
    assert "untrusted_root" in str(foreign.json())
    assert "SoftwareIdentity" in str(garbage.json())
    assert good.status_code == 201
    assert good.json()["kind"] == "driver" and good.json()["measurements"] == {"1": ["a" * 96]}
    assert ReferenceManifest.objects.count() == 1


@pytest.fixture
def device_ca(world):
    """A device root that requires OCSP status, an intermediate, and a GPU certificate below it."""
    root_key, root = pki.make_root("Strict GPU Root")
    ca_key, ca = pki.make_intermediate(root_key, root, "Strict GPU CA")
    _, device = pki.make_device(ca_key, ca, gpu_uuid="GPU-strict", serial="S1")
    trust_anchor_add(actor=None, name="strict", certificate_pem=pki.cert_to_pem(root), revocation_required=True)
    trust_anchor_add(actor=None, name="strict CA", certificate_pem=pki.cert_to_pem(ca), kind="intermediate")
    return {"ca_key": ca_key, "ca": ca, "device": device, "root_key": root_key, "root": root}


def post_ocsp(world, der: bytes, issuers=()):
    return world.client("platform_admin").post(f"{V1}/ocsp-statuses/", {
        "response": base64.b64encode(der).decode(), "issuers": [pki.cert_to_pem(cert) for cert in issuers]},
        format="json")


def test_an_ocsp_response_from_the_issuer_is_recorded_and_the_newest_wins(world, device_ca):
    ca, key, device = device_ca["ca"], device_ca["ca_key"], device_ca["device"]
    older = ocsp_maker.response(key, ca, device, status="revoked", this_update=timezone.now() - timedelta(hours=2))

    first = post_ocsp(world, ocsp_maker.response(key, ca, device))
    stale_news = post_ocsp(world, older)

    assert first.status_code == 201 and first.json()[0]["status"] == "good"
    assert stale_news.status_code == 201 and stale_news.json()[0]["status"] == "good"  # older than the one held
    assert OcspStatus.objects.get().serial_number == f"{device.serial_number:x}"


def flip_last(der: bytes) -> bytes:
    return der[:-1] + bytes([der[-1] ^ 0x01])


@pytest.mark.parametrize("case, message", [
    ("stale", "went stale"),
    ("wrong_key", "does not verify"),
    ("undelegated", "not delegated"),
    ("unknown_issuer", "none of the certificates Meridian knows"),
    ("not_ocsp", "not a DER OCSP response"),
])
def test_a_bad_ocsp_response_is_refused_and_records_nothing(world, device_ca, case, message):
    ca, key, device = device_ca["ca"], device_ca["ca_key"], device_ca["device"]
    other_key, other = pki.make_root("elsewhere")
    responder_key, responder = pki.make_device(key, ca, gpu_uuid="responder", serial="R")
    der = {
        "stale": lambda: ocsp_maker.response(key, ca, device, this_update=timezone.now() - timedelta(days=3),
                                             next_update=timezone.now() - timedelta(days=1)),
        "wrong_key": lambda: flip_last(ocsp_maker.response(key, ca, device)),  # the signature ends the DER
        "undelegated": lambda: ocsp_maker.response(key, ca, device, signer=responder, signer_key=responder_key),
        "unknown_issuer": lambda: ocsp_maker.response(other_key, other, pki.make_device(other_key, other,
                                                                                         gpu_uuid="x", serial="y")[1]),
        "not_ocsp": lambda: b"\x30\x03\x02\x01\x01",
    }[case]()

    answer = post_ocsp(world, der)

    assert answer.status_code == 400, answer.json()
    assert answer.json()["errors"][0]["code"] == "ocsp_invalid"
    assert message in str(answer.json())
    assert not OcspStatus.objects.exists()


def test_an_issuer_given_with_the_response_must_chain_to_a_trust_anchor(world, device_ca):
    other_key, other = pki.make_root("elsewhere")
    _, device = pki.make_device(other_key, other, gpu_uuid="x", serial="y")

    answer = post_ocsp(world, ocsp_maker.response(other_key, other, device), issuers=[other])

    assert answer.status_code == 400
    assert answer.json()["errors"][0]["code"] == "untrusted_issuer"


def test_a_rim_whose_version_is_longer_than_a_version_is_a_400(world):
    signer_key, chain = rim_maker.trusted_rim_ca()
    document = rim_maker.minimal_rim(version="5" * 80, measurements={1: "a" * 96}, key=signer_key, chain=chain)

    answer = world.client("platform_admin").post(f"{V1}/reference-manifests/", {"document": document.decode()},
                                                 format="json")

    assert answer.status_code == 400, answer.content
    assert "version" in str(answer.json()) and not ReferenceManifest.objects.exists()
