"""
NVIDIA's genuine Hopper attestation sample through Meridian's verifier (security.verify, the step a
real agent's evidence goes through), and every tampering refused with its own reason.

The wheel's RIMs are genuine but describe other firmware (VBIOS 96.00.5E/74/6D, driver 545.00)
than the sample report (VBIOS 96.00.9F.00.01, driver 550.90.07), and their signing certificates
expired in 2025: they are proven to verify against NVIDIA's RIM root at a date they were valid, and
to be refused for the report. The end-to-end pass uses RIMs for the report's own versions, signed
by a test RIM CA with NVIDIA's documents as templates.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta

import pytest

from security import device_pki as pki
from security import rim, spdm
from security.attestation import NodeEvidence, NonceRecord, verify
from security.chains import Revocation, Trust
from tests.security import nvidia_samples, rim_maker

UUID = "GPU-11111111-2222-3333-4444-555555555555"
SERIAL = "1650124000001"
NOW = datetime.now(UTC)
WHILE_NVIDIA_RIMS_WERE_VALID = datetime(2024, 6, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def samples(nvidia_samples_dir):
    return nvidia_samples_dir


@functools.cache
def _test_rim_ca():
    since = datetime(2020, 1, 1, tzinfo=UTC)  # valid on the dates NVIDIA's own RIMs are checked at, too
    root_key, root = pki.make_root("Test RIM Root", not_before=since)
    ca_key, ca = pki.make_intermediate(root_key, root, "Test RIM CA", not_before=since)
    signer_key, signer = pki.make_device(ca_key, ca, gpu_uuid="Test RIM Signer", serial="1", not_before=since,
                                         not_after=since + timedelta(days=3650))
    return root, signer_key, [signer, ca]


@pytest.fixture(scope="module")
def rims(samples):
    """Driver and VBIOS RIMs for the report's versions: NVIDIA's split of indices, the report's values."""
    report = spdm.parse(nvidia_samples.report_bytes(samples))
    values = {index - 1: value.hex() for index, value in report.measurements.items()}
    _, signer_key, chain = _test_rim_ca()
    made = {}
    for kind, version, template in (
            (rim.DRIVER, nvidia_samples.DRIVER, "Driver_RIM_test_no_gpu.swidtag"),
            (rim.VBIOS, nvidia_samples.VBIOS, "1010_0200_882_96005E0001_test_no_gpu.swidtag")):
        document = (samples / template).read_bytes()
        active = _active_indices(document)
        made[(kind, version.lower())] = rim_maker.resign(document, version=version, key=signer_key, chain=chain,
                                                         measurements={i: values[i] for i in active})
    return made


def _active_indices(document: bytes) -> set[int]:
    root = rim._parse(document)
    return {int(r.get("index")) for r in root.iterfind(f"{{{rim.SWID}}}Payload/{{{rim.SWID}}}Resource")
            if r.get("active") == "True"} - {0, 7, 8}  # the drivers' RIM leaves these to the VBIOS one


def gpu(samples, *, report: bytes | None = None, chain: list[str] | None = None, cc_mode="on") -> dict:
    report = nvidia_samples.report_bytes(samples) if report is None else report
    return {"format": "nvidia-spdm", "uuid": UUID, "serial": SERIAL, "gpu_model": "h100-sxm", "cc_mode": cc_mode,
            "report": None if cc_mode == "off" else report.hex(),
            "certificate_chain": chain or nvidia_samples.chain_pems(samples)}


def check(samples, rims, evidence_gpu=None, *, nonce=nvidia_samples.NONCE, now=NOW, revoked=frozenset(),
          strict=False, good_until=None, identities=None, rim_roots=None):
    device_root = pki.cert_from_pem((samples / "verifier_device_root.pem").read_bytes())
    evidence = NodeEvidence.from_dict({"node": "hgx-real-01", "nonce": nonce,
                                       "gpus": [evidence_gpu or gpu(samples)]})
    record = NonceRecord(value=nonce, issued_at=now - timedelta(seconds=30), expires_at=now + timedelta(minutes=5),
                         used=False)
    return verify(evidence, nonce=record, roots=[device_root], revoked=set(revoked), references={},
                  node_gpus={UUID: (SERIAL, "h100-sxm")}, now=now, strict_roots=[device_root] if strict else [],
                  good_until=good_until, rim_roots=rim_roots or [_test_rim_ca()[0]], rims=rims,
                  identities=identities)


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


def checks_of(verdict) -> set[str]:
    return {reason.check for reason in verdict.reasons}


def test_the_genuine_report_passes_and_states_the_gpus_identity_and_versions(samples, rims):
    verdict = check(samples, rims)

    assert verdict.status == "pass", verdict.reasons
    summary = verdict.gpus[0]
    assert summary["identity"] == nvidia_samples.DEVICE_ID
    assert (summary["vbios"], summary["driver"]) == (nvidia_samples.VBIOS, nvidia_samples.DRIVER)
    assert summary["evidence"] == "nvidia-spdm" and summary["cc_mode"] == "on"


def test_one_flipped_byte_in_a_measurement_breaks_the_signature_and_the_comparison(samples, rims):
    report = nvidia_samples.report_bytes(samples)
    # Block 2's value starts 37 (request) + 8 (header) + 55 (block 1) + 7 (block 2's header) bytes in.
    verdict = check(samples, rims, gpu(samples, report=flipped(report, 37 + 8 + 55 + 7)))

    assert verdict.status == "fail"
    assert {"bad_signature", "measurement_mismatch"} <= checks_of(verdict)
    assert any("measurement 1 is" in reason.detail for reason in verdict.reasons)


def test_a_flipped_signature_byte_is_refused(samples, rims):
    report = nvidia_samples.report_bytes(samples)
    verdict = check(samples, rims, gpu(samples, report=flipped(report, len(report) - 10)))

    assert checks_of(verdict) == {"bad_signature"}


def test_a_chain_with_a_forged_intermediate_is_refused(samples, rims):
    chain = nvidia_samples.chain_pems(samples)
    genuine = pki.cert_from_pem(chain[2])
    key, forged_root = pki.make_root("forger")
    forged = pki.make_device(key, forged_root, gpu_uuid="x", serial="y")[1]
    # Same subject as NVIDIA's provisioner CA, signed by another key: the name matches, the signature does not.
    forged = (pki.x509.CertificateBuilder().subject_name(genuine.subject).issuer_name(genuine.issuer)
              .public_key(forged.public_key()).serial_number(genuine.serial_number)
              .not_valid_before(genuine.not_valid_before_utc).not_valid_after(genuine.not_valid_after_utc)
              .add_extension(pki.x509.BasicConstraints(ca=True, path_length=None), critical=True)
              .sign(key, pki.hashes.SHA384()))
    verdict = check(samples, rims, gpu(samples, chain=[*chain[:2], pki.cert_to_pem(forged), *chain[3:]]))

    assert verdict.status == "fail"
    assert "chain_signature" in checks_of(verdict)


def test_a_chain_without_nvidias_root_is_refused(samples, rims):
    verdict = check(samples, rims, gpu(samples, chain=nvidia_samples.chain_pems(samples)[:2]))

    assert "untrusted_root" in checks_of(verdict) or "chain_signature" in checks_of(verdict)
    assert verdict.status == "fail"


def test_a_tampered_rim_is_refused(samples, rims):
    key = (rim.VBIOS, nvidia_samples.VBIOS.lower())
    document = rims[key]
    at = document.index(b"Hash0=\"", document.index(b"index=\"2\"")) + 7
    tampered = {**rims, key: document[:at] + (b"1" if document[at:at + 1] != b"1" else b"2") + document[at + 1:]}

    verdict = check(samples, tampered)

    assert verdict.status == "fail"
    assert checks_of(verdict) == {"rim_signature"}


def test_a_wrong_nonce_is_refused(samples, rims):
    verdict = check(samples, rims, nonce="ab" * 32)

    assert "nonce_mismatch" in checks_of(verdict)
    assert verdict.status == "fail"


def test_a_revoked_certificate_in_the_chain_is_refused(samples, rims):
    brom = pki.cert_from_pem(nvidia_samples.chain_pems(samples)[1])
    verdict = check(samples, rims, revoked={(brom.issuer.rfc4514_string(), brom.serial_number)})

    assert checks_of(verdict) == {"revoked"}


def test_a_rim_for_another_vbios_is_refused(samples, rims):
    # NVIDIA's genuine RIM for VBIOS 96.00.5E.00.01, filed as if it were the report's 96.00.9F.00.01.
    genuine = (samples / "1010_0200_882_96005E0001_PROD.swidtag").read_bytes()
    nvidia_rim_root = pki.cert_from_pem((samples / "verifier_RIM_root.pem").read_bytes())
    swapped = {**rims, (rim.VBIOS, nvidia_samples.VBIOS.lower()): genuine}

    verdict = check(samples, swapped, now=WHILE_NVIDIA_RIMS_WERE_VALID,
                    rim_roots=[nvidia_rim_root, _test_rim_ca()[0]])

    assert checks_of(verdict) == {"rim_version_mismatch"}
    assert "describes 96.00.5E.00.01" in verdict.reasons[0].detail


def test_nvidias_genuine_rims_verify_against_its_rim_root_while_their_signer_was_valid(samples):
    root = pki.cert_from_pem((samples / "verifier_RIM_root.pem").read_bytes())
    names = sorted(path.name for path in samples.glob("*_PROD.swidtag"))
    assert len(names) >= 20

    for name in names:
        manifest, reasons = rim.verify((samples / name).read_bytes(), trust=Trust.of([root]), revocation=Revocation(),
                                       now=WHILE_NVIDIA_RIMS_WERE_VALID)
        assert reasons == [], name
        assert manifest.kind == rim.VBIOS and manifest.measurements
        assert name.split("_")[3].startswith(manifest.version.replace(".", "")[:8])

    _, reasons = rim.verify((samples / names[0]).read_bytes(), trust=Trust.of([root]), revocation=Revocation(),
                            now=NOW)
    assert {reason.check for reason in reasons} == {"expired"}  # the signer and its L3 CA lapsed in 2025


def test_a_report_whose_versions_have_no_rim_is_reference_unavailable(samples, rims):
    verdict = check(samples, {})

    assert verdict.status == "reference_unavailable"
    assert checks_of(verdict) == {"reference_missing"}
    assert "import NVIDIA's RIM" in verdict.reasons[0].detail


def test_a_strict_root_without_fresh_ocsp_statuses_is_reference_unavailable(samples, rims):
    chain = [pki.cert_from_pem(pem) for pem in nvidia_samples.chain_pems(samples)]
    ids = [(cert.issuer.rfc4514_string(), cert.serial_number) for cert in chain[:-1]]

    missing = check(samples, rims, strict=True)
    stale = check(samples, rims, strict=True, good_until={key: NOW - timedelta(hours=1) for key in ids})
    fresh = check(samples, rims, strict=True, good_until={key: NOW + timedelta(days=1) for key in ids})

    assert missing.status == stale.status == "reference_unavailable"
    assert checks_of(missing) == checks_of(stale) == {"revocation_unknown"}
    assert len(missing.reasons) == 4  # every certificate below the root
    assert "went stale" in stale.reasons[0].detail
    assert fresh.status == "pass"


def test_cc_mode_off_is_a_not_capable_state(samples, rims):
    verdict = check(samples, rims, gpu(samples, cc_mode="off"))

    assert verdict.status == "not_capable"
    assert "conf-compute" in verdict.reasons[0].detail


def test_a_uuid_that_attested_as_another_device_is_refused(samples, rims):
    verdict = check(samples, rims, identities={UUID: "NVIDIA:GH100:0000000000000000"})

    assert checks_of(verdict) == {"identity_mismatch"}


@pytest.mark.parametrize("change, message", [
    (lambda data: data[:40], "bytes"),
    (lambda data: b"\x10" + data[1:], "not SPDM 1.1 GET_MEASUREMENTS"),
    (lambda data: data[:-1], "fields add up"),
])
def test_a_malformed_report_is_refused_at_parse_with_what_is_wrong(samples, change, message):
    with pytest.raises(ValueError, match=message):
        NodeEvidence.from_dict({"node": "n", "nonce": nvidia_samples.NONCE,
                                "gpus": [gpu(samples, report=change(nvidia_samples.report_bytes(samples)))]})


def test_a_chain_whose_first_certificate_does_not_parse_is_a_reason_not_a_crash(samples, rims):
    broken = "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"
    verdict = check(samples, rims, gpu(samples, chain=[broken, *nvidia_samples.chain_pems(samples)[1:]]))

    assert verdict.status == "fail"
    assert "malformed_certificate" in checks_of(verdict)
    assert verdict.gpus[0]["identity"] == ""
