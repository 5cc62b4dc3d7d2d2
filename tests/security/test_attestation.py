"""
security.attestation on real signatures from security.device_pki: one test per way evidence can
be wrong, each asserting the verdict is not a pass and names that failure's own check code. No
database: the verifier is pure.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from security import chains
from security.attestation import (
    ChainCache,
    GPUEvidence,
    NodeEvidence,
    NonceRecord,
    Verdict,
    canonical_bytes,
    verify,
)
from security.device_pki import (
    cert_from_pem,
    cert_to_pem,
    certs_from_pem,
    key_from_pem,
    key_to_pem,
    make_device,
    make_intermediate,
    make_root,
    reference_measurements,
    sign_gpu_evidence,
)

NOW = datetime.now(UTC).replace(microsecond=0)
NONCE = "5e" * 32
OTHER_NONCE = "a1" * 32
GENERATED = int(NOW.timestamp()) - 2
MODEL, VBIOS, DRIVER = "h100-sxm", "96.00.89.00.01", "550.54.15"
REFERENCE = reference_measurements(MODEL, VBIOS, DRIVER)


@dataclass(frozen=True)
class Gpu:
    uuid: str
    serial: str
    key: object
    cert: x509.Certificate


@dataclass(frozen=True)
class Pki:
    root_key: object
    root: x509.Certificate
    inter_key: object
    inter: x509.Certificate
    gpus: tuple[Gpu, ...]

    def device(self, index: int, **kwargs) -> Gpu:
        """A further GPU under the same intermediate (not one of the node's eight)."""
        uuid, serial = gpu_ids(index)
        key, cert = make_device(self.inter_key, self.inter, gpu_uuid=uuid, serial=serial, **kwargs)
        return Gpu(uuid, serial, key, cert)


def gpu_ids(index: int) -> tuple[str, str]:
    return f"GPU-{index:08x}-1111-2222-3333-444455556666", f"16501240{index:05d}"


@functools.cache
def pki() -> Pki:
    root_key, root = make_root("Meridian Test Device Root")
    inter_key, inter = make_intermediate(root_key, root, "Meridian Test Device Provisioner")
    gpus = []
    for index in range(8):
        uuid, serial = gpu_ids(index)
        key, cert = make_device(inter_key, inter, gpu_uuid=uuid, serial=serial)
        gpus.append(Gpu(uuid, serial, key, cert))
    return Pki(root_key, root, inter_key, inter, tuple(gpus))


def chain_of(gpu: Gpu) -> list[str]:
    return [cert_to_pem(gpu.cert), cert_to_pem(pki().inter)]


def signed(gpu: Gpu, *, key=None, chain: list[str] | None = None, **fields) -> GPUEvidence:
    values = {"uuid": gpu.uuid, "serial": gpu.serial, "gpu_model": MODEL, "vbios": VBIOS, "driver": DRIVER,
              "measurements": REFERENCE, "nonce": NONCE, "generated_at": GENERATED}
    values.update(fields)
    return sign_gpu_evidence(key or gpu.key, chain or chain_of(gpu), **values)


@functools.cache
def honest_gpus() -> tuple[GPUEvidence, ...]:
    return tuple(signed(gpu) for gpu in pki().gpus)


def node(*, first: GPUEvidence | None = None, gpus: list[GPUEvidence] | None = None,
         nonce: str = NONCE) -> NodeEvidence:
    """The node's eight GPUs' honest evidence, the first replaced or all of it given."""
    reports = list(gpus if gpus is not None else honest_gpus())
    if first is not None:
        reports[0] = first
    return NodeEvidence(node="gpu-node-01.test", nonce=nonce, gpus=reports)


def check(evidence: NodeEvidence, **overrides) -> Verdict:
    arguments = {
        "nonce": NonceRecord(NONCE, NOW - timedelta(seconds=10), NOW + timedelta(seconds=50), used=False),
        "roots": [pki().root],
        "revoked": set(),
        "references": {(MODEL, VBIOS, DRIVER): REFERENCE},
        "node_gpus": {gpu.uuid: (gpu.serial, MODEL) for gpu in pki().gpus},
        "now": NOW,
    }
    arguments.update(overrides)
    return verify(evidence, **arguments)


def assert_fails(verdict: Verdict, check_code: str, gpu: str | None = "any", status: str = "fail") -> None:
    assert verdict.status == status, verdict.reasons
    codes = {(reason.gpu, reason.check) for reason in verdict.reasons}
    if gpu == "any":
        assert check_code in verdict.checks, verdict.reasons
    else:
        assert (gpu, check_code) in codes, verdict.reasons


#
# Passing
#


def test_a_valid_eight_gpu_report_passes():
    verdict = check(node())

    assert verdict.status == "pass", verdict.reasons
    assert verdict.reasons == []
    assert [summary["uuid"] for summary in verdict.gpus] == [gpu.uuid for gpu in pki().gpus]
    assert verdict.gpus[0]["measurements"]["9"] == REFERENCE[9]
    assert json.loads(json.dumps(verdict.to_dict()))["status"] == "pass"


def test_a_chain_of_the_device_certificate_alone_passes_with_a_trusted_intermediate():
    evidence = node(gpus=[signed(gpu, chain=[cert_to_pem(gpu.cert)]) for gpu in pki().gpus])

    assert check(evidence, intermediates=[pki().inter]).status == "pass"
    assert_fails(check(evidence), "untrusted_root")


def test_the_evidence_survives_a_round_trip_through_json():
    evidence = node()
    decoded = NodeEvidence.from_dict(json.loads(json.dumps(evidence.to_dict())))

    assert decoded == evidence
    assert check(decoded).status == "pass"


def test_canonical_bytes_are_the_documented_encoding():
    gpu = GPUEvidence(uuid="GPU-1", serial="S1", gpu_model="h100-sxm", vbios="96.00", driver="550",
                      measurements={2: "b" * 96, 10: "c" * 96, 0: "a" * 96}, nonce="0" * 64, generated_at=1750000000,
                      certificate_chain=["ignored"], signature="ignored")

    assert canonical_bytes(gpu) == (
        b'{"driver":"550","generated_at":1750000000,"gpu_model":"h100-sxm","measurements":{"0":"' + b"a" * 96
        + b'","10":"' + b"c" * 96 + b'","2":"' + b"b" * 96 + b'"},"nonce":"' + b"0" * 64
        + b'","serial":"S1","uuid":"GPU-1","vbios":"96.00"}')


def test_keys_and_certificates_survive_pem():
    gpu = pki().gpus[0]

    assert cert_from_pem(cert_to_pem(gpu.cert)) == gpu.cert
    assert key_from_pem(key_to_pem(gpu.key)).public_key() == gpu.key.public_key()
    assert certs_from_pem("".join(chain_of(gpu))) == [gpu.cert, pki().inter]


#
# Certificate chains
#


def test_a_self_signed_device_certificate_fails():
    gpu = pki().gpus[0]
    # Issued by the device's own certificate with the device's own key: subject = issuer, self-signed.
    forged = make_device(gpu.key, gpu.cert, gpu_uuid=gpu.uuid, serial=gpu.serial, key=gpu.key)[1]
    evidence = node(first=signed(gpu, chain=[cert_to_pem(forged)]))

    assert forged.issuer == forged.subject
    forged.verify_directly_issued_by(forged)
    assert_fails(check(evidence), "untrusted_root", gpu.uuid)


def test_a_chain_to_an_untrusted_root_fails():
    gpu = pki().gpus[0]
    other_key, other_root = make_root("Some Other Root")
    inter_key, inter = make_intermediate(other_key, other_root, "Some Other Provisioner")
    key, cert = make_device(inter_key, inter, gpu_uuid=gpu.uuid, serial=gpu.serial)
    evidence = node(first=signed(gpu, key=key, chain=[cert_to_pem(cert), cert_to_pem(inter), cert_to_pem(other_root)]))

    assert_fails(check(evidence), "untrusted_root", gpu.uuid)


def test_the_right_issuer_name_with_the_wrong_key_fails_on_the_signature():
    gpu = pki().gpus[0]
    impostor_key, impostor_root = make_root(pki().root.subject.rfc4514_string().removeprefix("CN="))
    inter_key, inter = make_intermediate(impostor_key, impostor_root, "Meridian Test Device Provisioner")
    key, cert = make_device(inter_key, inter, gpu_uuid=gpu.uuid, serial=gpu.serial)
    evidence = node(first=signed(gpu, key=key, chain=[cert_to_pem(cert), cert_to_pem(inter)]))

    assert impostor_root.subject == pki().root.subject
    assert_fails(check(evidence), "chain_signature", gpu.uuid)


def test_an_intermediate_without_the_ca_basic_constraint_fails():
    gpu = pki().gpus[0]
    inter_key, inter = make_intermediate(pki().root_key, pki().root, "Not A CA", ca=False)
    key, cert = make_device(inter_key, inter, gpu_uuid=gpu.uuid, serial=gpu.serial)
    evidence = node(first=signed(gpu, key=key, chain=[cert_to_pem(cert), cert_to_pem(inter)]))

    assert_fails(check(evidence), "not_a_ca", gpu.uuid)


def test_a_device_certificate_used_as_a_ca_fails():
    victim, signer = pki().gpus[0], pki().gpus[1]
    key, cert = make_device(signer.key, signer.cert, gpu_uuid=victim.uuid, serial=victim.serial)
    evidence = node(first=signed(victim, key=key, chain=[cert_to_pem(cert), *chain_of(signer)]))

    assert_fails(check(evidence), "not_a_ca", victim.uuid)


def test_a_ca_certificate_as_the_device_certificate_fails():
    gpu = pki().gpus[0]
    evidence = node(first=signed(gpu, key=pki().inter_key, chain=[cert_to_pem(pki().inter)]))

    assert_fails(check(evidence), "leaf_is_ca", gpu.uuid)


def test_an_exceeded_path_length_fails():
    gpu = pki().gpus[0]
    upper_key, upper = make_intermediate(pki().root_key, pki().root, "Upper", path_length=0)
    lower_key, lower = make_intermediate(upper_key, upper, "Lower")
    key, cert = make_device(lower_key, lower, gpu_uuid=gpu.uuid, serial=gpu.serial)
    evidence = node(first=signed(gpu, key=key, chain=[cert_to_pem(c) for c in (cert, lower, upper)]))

    assert_fails(check(evidence), "path_length", gpu.uuid)


def test_a_revoked_device_certificate_fails():
    gpu = pki().gpus[0]
    revoked = {(gpu.cert.issuer.rfc4514_string(), gpu.cert.serial_number)}

    verdict = check(node(), revoked=revoked)

    assert_fails(verdict, "revoked", gpu.uuid)
    assert {reason.gpu for reason in verdict.reasons} == {gpu.uuid}


def test_a_revoked_intermediate_fails_every_gpu_under_it():
    inter = pki().inter
    verdict = check(node(), revoked={(inter.issuer.rfc4514_string(), inter.serial_number)})

    assert_fails(verdict, "revoked")
    assert {reason.gpu for reason in verdict.reasons if reason.check == "revoked"} == {g.uuid for g in pki().gpus}


def test_an_expired_device_certificate_fails():
    gpu = pki().device(0, not_before=NOW - timedelta(days=400), not_after=NOW - timedelta(hours=1))
    evidence = node(first=signed(gpu))

    assert_fails(check(evidence), "expired", gpu.uuid)


def test_a_device_certificate_not_yet_valid_fails():
    gpu = pki().device(0, not_before=NOW + timedelta(days=1))
    evidence = node(first=signed(gpu))

    assert_fails(check(evidence), "not_yet_valid", gpu.uuid)


def test_a_chain_that_does_not_parse_fails():
    gpu = pki().gpus[0]
    evidence = node(first=replace(signed(gpu), certificate_chain=["-----BEGIN CERTIFICATE-----\nnope\n"]))

    assert_fails(check(evidence), "malformed_certificate", gpu.uuid)


#
# Signature and identity
#


def test_a_signature_by_another_key_fails():
    gpu, other = pki().gpus[0], pki().gpus[1]
    evidence = node(first=signed(gpu, key=other.key))

    assert_fails(check(evidence), "bad_signature", gpu.uuid)


def test_a_measurement_changed_after_signing_fails():
    gpu = pki().gpus[0]
    honest = signed(gpu)
    tampered = replace(honest, measurements={**honest.measurements, 3: "0" * 96})

    verdict = check(node(first=tampered))

    assert_fails(verdict, "bad_signature", gpu.uuid)
    assert_fails(verdict, "measurement_mismatch", gpu.uuid)


def test_a_signed_measurement_that_differs_from_the_reference_fails():
    gpu = pki().gpus[0]
    evidence = node(first=signed(gpu, measurements={**REFERENCE, 3: "0" * 96}))

    verdict = check(evidence)

    assert_fails(verdict, "measurement_mismatch", gpu.uuid)
    assert verdict.checks == {"measurement_mismatch"}


def test_missing_and_extra_measurements_fail():
    gpu = pki().gpus[0]
    measurements = {index: digest for index, digest in REFERENCE.items() if index != 4} | {42: "f" * 96}

    verdict = check(node(first=signed(gpu, measurements=measurements)))

    details = [reason.detail for reason in verdict.reasons if reason.check == "measurement_mismatch"]
    assert verdict.status == "fail"
    assert any("4 is missing" in detail for detail in details)
    assert any("42 is not in the reference" in detail for detail in details)


def test_a_valid_certificate_of_one_gpu_used_for_anothers_evidence_fails():
    gpu_a, gpu_b = pki().gpus[0], pki().gpus[1]
    evidence = node(gpus=[signed(gpu_b, key=gpu_a.key, chain=chain_of(gpu_a)), *honest_gpus()[:1],
                          *honest_gpus()[2:]])

    verdict = check(evidence)

    assert_fails(verdict, "identity_mismatch", gpu_b.uuid)
    assert "bad_signature" not in verdict.checks


#
# Nonce and freshness
#


def test_a_replayed_nonce_fails():
    used = NonceRecord(NONCE, NOW - timedelta(seconds=10), NOW + timedelta(seconds=50), used=True)

    assert_fails(check(node(), nonce=used), "nonce_replayed", None)


def test_an_expired_nonce_fails():
    expired = NonceRecord(NONCE, NOW - timedelta(seconds=120), NOW - timedelta(seconds=60), used=False)

    assert_fails(check(node(), nonce=expired), "nonce_expired", None)


def test_evidence_for_another_challenge_fails():
    gpu = pki().gpus[0]

    assert_fails(check(node(nonce=OTHER_NONCE)), "nonce_mismatch", None)
    assert_fails(check(node(first=signed(gpu, nonce=OTHER_NONCE))), "nonce_mismatch", gpu.uuid)


def test_a_stale_report_fails():
    long_lived = NonceRecord(NONCE, NOW - timedelta(hours=1), NOW + timedelta(seconds=50), used=False)
    old = [signed(gpu, generated_at=GENERATED - 600) for gpu in pki().gpus]

    verdict = check(node(gpus=old), nonce=long_lived)

    assert_fails(verdict, "stale", pki().gpus[0].uuid)


def test_a_report_generated_before_the_challenge_or_in_the_future_fails():
    gpu = pki().gpus[0]

    assert_fails(check(node(first=signed(gpu, generated_at=GENERATED - 60))), "stale", gpu.uuid)
    assert_fails(check(node(first=signed(gpu, generated_at=GENERATED + 60))), "stale", gpu.uuid)


#
# The node's GPUs
#


def test_evidence_for_a_gpu_the_node_does_not_own_fails():
    stranger = pki().device(99)
    evidence = node(gpus=[*honest_gpus(), signed(stranger)])

    verdict = check(evidence)

    assert_fails(verdict, "foreign_gpu", stranger.uuid)
    assert verdict.checks == {"foreign_gpu"}


def test_a_gpu_registered_with_another_serial_fails():
    gpu = pki().gpus[0]
    owned = {g.uuid: (g.serial, MODEL) for g in pki().gpus} | {gpu.uuid: ("another-serial", MODEL)}

    assert_fails(check(node(), node_gpus=owned), "foreign_gpu", gpu.uuid)


def test_a_missing_gpu_fails():
    missing = pki().gpus[7]

    verdict = check(node(gpus=list(honest_gpus()[:7])))

    assert_fails(verdict, "gpu_missing", missing.uuid)
    assert verdict.checks == {"gpu_missing"}


def test_a_gpu_reported_twice_fails():
    evidence = node(gpus=[*honest_gpus(), honest_gpus()[0]])

    assert_fails(check(evidence), "duplicate_gpu", pki().gpus[0].uuid)


#
# Reference values
#


def test_an_unknown_vbios_makes_the_reference_unavailable():
    gpu = pki().gpus[0]
    owned = {g.uuid: (g.serial, MODEL) for g in pki().gpus}
    evidence = node(first=signed(gpu, vbios="96.00.99.00.01"))

    verdict = check(evidence, node_gpus=owned)

    assert_fails(verdict, "reference_missing", gpu.uuid, status="reference_unavailable")
    assert verdict.checks == {"reference_missing"}


def test_an_unknown_vbios_with_another_failure_fails():
    gpu = pki().gpus[0]
    evidence = node(first=signed(gpu, vbios="96.00.99.00.01", key=pki().gpus[1].key))

    verdict = check(evidence)

    assert_fails(verdict, "reference_missing", gpu.uuid, status="fail")
    assert "bad_signature" in verdict.checks


def test_references_stored_as_json_are_accepted():
    stored = {(MODEL, VBIOS, DRIVER): {str(index): digest.upper() for index, digest in REFERENCE.items()}}

    assert check(node(), references=stored).status == "pass"


#
# The chain cache
#


def test_the_cache_skips_chain_work_but_still_checks_the_signature(monkeypatch):
    links = []
    real = chains.issued_by
    monkeypatch.setattr(chains, "issued_by", lambda cert, issuer: links.append(1) or real(cert, issuer))
    cache = ChainCache()

    assert check(node(), cache=cache).status == "pass"
    first = len(links)
    assert check(node(), cache=cache).status == "pass"
    tampered = replace(honest_gpus()[0], signature=honest_gpus()[1].signature)
    verdict = check(node(first=tampered), cache=cache)

    assert first == 16  # device -> intermediate -> root, for eight GPUs
    assert len(links) == first
    assert cache.hits == 16 and cache.misses == 8
    assert_fails(verdict, "bad_signature", pki().gpus[0].uuid)


def test_the_cache_honours_a_revocation_added_later():
    cache = ChainCache()
    gpu = pki().gpus[0]
    assert check(node(), cache=cache).status == "pass"

    verdict = check(node(), cache=cache, revoked={(gpu.cert.issuer.rfc4514_string(), gpu.cert.serial_number)})

    assert cache.hits == 8
    assert_fails(verdict, "revoked", gpu.uuid)


def test_the_cache_is_not_served_for_another_set_of_roots():
    cache = ChainCache()
    _, other_root = make_root("Another Root")
    assert check(node(), cache=cache).status == "pass"

    assert_fails(check(node(), cache=cache, roots=[other_root]), "untrusted_root")


def test_the_cache_is_not_served_after_a_certificate_expires():
    cache = ChainCache()
    gpu = pki().device(0, not_after=NOW + timedelta(hours=1))
    evidence = node(first=signed(gpu))
    assert check(evidence, cache=cache).status == "pass"

    later = NOW + timedelta(hours=2)
    verdict = check(evidence, cache=cache, now=later,
                    nonce=NonceRecord(NONCE, later - timedelta(seconds=10), later + timedelta(seconds=50), False))

    assert_fails(verdict, "expired", gpu.uuid)


def test_a_failed_chain_is_not_cached():
    cache = ChainCache()
    inter = pki().inter
    check(node(), cache=cache, revoked={(inter.issuer.rfc4514_string(), inter.serial_number)})

    assert len(cache) == 0


#
# Malformed evidence
#


def _mutations():
    def drop(name):
        return lambda d: d["gpus"][0].pop(name)

    def put(name, value):
        return lambda d: d["gpus"][0].__setitem__(name, value)

    return {
        "not an object": lambda d: d.clear() or d.update({"evidence": []}),
        "missing nonce": lambda d: d.pop("nonce"),
        "unknown member": lambda d: d.__setitem__("extra", 1),
        "gpus not a list": lambda d: d.__setitem__("gpus", {}),
        "no gpus": lambda d: d.__setitem__("gpus", []),
        "too many gpus": lambda d: d.__setitem__("gpus", d["gpus"] * 3),
        "node too long": lambda d: d.__setitem__("node", "n" * 300),
        "node nonce short": lambda d: d.__setitem__("nonce", "ab"),
        "missing signature": drop("signature"),
        "uuid not a string": put("uuid", 7),
        "uuid too long": put("uuid", "G" * 65),
        "empty serial": put("serial", ""),
        "control character": put("vbios", "96.00\n"),
        "non-ascii driver": put("driver", "550é"),
        "digest not hex": put("measurements", {"0": "z" * 96}),
        "digest too short": put("measurements", {"0": "a" * 95}),
        "digest upper case": put("measurements", {"0": "A" * 96}),
        "index not a number": put("measurements", {"x": "a" * 96}),
        "index with leading zero": put("measurements", {"01": "a" * 96}),
        "no measurements": put("measurements", {}),
        "nonce upper case": put("nonce", "5E" * 32),
        "generated_at a string": put("generated_at", "1750000000"),
        "generated_at a bool": put("generated_at", True),
        "generated_at a float": put("generated_at", 1750000000.5),
        "chain empty": put("certificate_chain", []),
        "chain not strings": put("certificate_chain", [1]),
        "chain not pem": put("certificate_chain", ["hello"]),
        "signature not base64": put("signature", "!!!"),
        "signature too long": put("signature", "A" * 400),
    }


@pytest.mark.parametrize("mutation", list(_mutations()))
def test_malformed_evidence_is_refused(mutation):
    data = copy.deepcopy(node().to_dict())
    _mutations()[mutation](data)

    with pytest.raises(ValueError):
        NodeEvidence.from_dict(data)


def test_a_non_object_is_refused():
    with pytest.raises(ValueError, match="must be an object"):
        NodeEvidence.from_dict([])


#
# Any change to a signed field
#

_HEX = "0123456789abcdef"
_TEXT_FIELDS = ("uuid", "serial", "gpu_model", "vbios", "driver")


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_single_character_change_of_a_signed_field_fails(data):
    honest = honest_gpus()[0]
    name = data.draw(st.sampled_from([*_TEXT_FIELDS, "nonce", "measurements", "generated_at"]))
    if name == "generated_at":
        tampered = replace(honest, generated_at=honest.generated_at + data.draw(st.sampled_from([-2, -1, 1, 2])))
    elif name == "measurements":
        index = data.draw(st.sampled_from(sorted(honest.measurements)))
        changed = _change_one(data, honest.measurements[index], _HEX)
        tampered = replace(honest, measurements={**honest.measurements, index: changed})
    else:
        alphabet = _HEX if name == "nonce" else "".join(chr(c) for c in range(0x20, 0x7F))
        tampered = replace(honest, **{name: _change_one(data, getattr(honest, name), alphabet)})

    verdict = check(node(first=tampered))

    assert verdict.status == "fail"
    assert (honest.uuid if name != "uuid" else tampered.uuid, "bad_signature") in {
        (reason.gpu, reason.check) for reason in verdict.reasons}


def _change_one(data, value: str, alphabet: str) -> str:
    position = data.draw(st.integers(0, len(value) - 1))
    replacement = data.draw(st.sampled_from([c for c in alphabet if c != value[position]]))
    return value[:position] + replacement + value[position + 1:]
