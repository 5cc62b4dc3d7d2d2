"""
NVIDIA's reference integrity manifests (RIMs): ISO/IEC 19770-2 SWID tags listing, per measurement
index, whether the index is checked (``active``) and the SHA-384 values it may take
(``Hash0`` .. ``HashN``, one per alternative), enveloped in an XML signature (ECDSA P-384 over
SHA-384, C14N 1.1) whose KeyInfo carries the signer's chain up to NVIDIA's RIM root. A driver RIM
names a driver version (``550.90.07``), a VBIOS RIM a VBIOS version (``96.00.9F.00.01``).

The XML signature is checked with signxml (pinned) against the signer certificate; the chain, its
validity and revocation with security.chains against the operator's RIM roots. The manifest is
read from the XML that the signature covers, never from the document around it.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from lxml import etree
from signxml import DigestAlgorithm, SignatureConfiguration, SignatureMethod, XMLVerifier
from signxml.exceptions import InvalidInput, InvalidSignature

from security.chains import ChainCache, Reason, Revocation, Trust, verified_chain

MAX_VERSION = 64  # as evidence states versions (security.attestation.MAX_FIELD)
MAX_RIM = 512 * 1024  # NVIDIA's RIMs are about 20 KiB
SWID = "http://standards.iso.org/iso/19770/-2/2015/schema.xsd"
DSIG = "http://www.w3.org/2000/09/xmldsig#"
SHA384 = "http://www.w3.org/2001/04/xmlenc#sha384"
DRIVER, VBIOS = "driver", "vbios"
_VBIOS_VERSION = re.compile(r"[0-9a-f]{2}(\.[0-9a-f]{2}){4}", re.IGNORECASE)
_DIGEST = re.compile(r"[0-9a-f]{96}")
_HASH = re.compile(r"Hash(\d+)")
_CONFIG = dict(signature_methods=frozenset({SignatureMethod.ECDSA_SHA384, SignatureMethod.ECDSA_SHA512}),
               digest_algorithms=frozenset({DigestAlgorithm.SHA384, DigestAlgorithm.SHA512}))


@dataclass(frozen=True)
class Manifest:
    """What a verified RIM says: which firmware it describes and the golden values of its active indices."""

    kind: str
    version: str
    product: str
    tag_id: str
    measurements: dict[int, tuple[str, ...]]  # RIM index (0-based) -> the accepted SHA-384 values
    signer: str

    def to_dict(self) -> dict:
        return {"kind": self.kind, "version": self.version, "product": self.product, "tag_id": self.tag_id,
                "signer": self.signer,
                "measurements": {str(index): list(values) for index, values in sorted(self.measurements.items())}}


def kind_of(version: str) -> str:
    """A VBIOS version is five dot-separated hex bytes; anything else is a driver version."""
    return VBIOS if _VBIOS_VERSION.fullmatch(version) else DRIVER


def verify(document: bytes, *, trust: Trust, revocation: Revocation, now: datetime, label: str = "RIM",
           cache: ChainCache | None = None) -> tuple[Manifest | None, list[Reason]]:
    """Check a RIM's XML signature and its signer's chain at ``now``; the manifest only when both hold."""
    try:
        root = _parse(document)
        pems = _signer_chain(root)
    except ValueError as error:
        return None, [Reason(label, "rim_malformed", str(error))]
    # The chain first: an expired or revoked signer is reported as such, not as a bad signature.
    leaf, reasons = verified_chain(pems, trust=trust, revocation=revocation, now=now, label=label, cache=cache)
    if reasons:
        return None, reasons
    config = SignatureConfiguration(verification_time=now, **_CONFIG)
    try:
        signed = XMLVerifier().verify(root, x509_cert=pems[0], expect_config=config).signed_xml
    except (InvalidSignature, InvalidInput) as error:
        return None, [Reason(label, "rim_signature", f"the RIM's XML signature does not verify: {error}")]
    try:
        manifest = _manifest(signed, leaf.cert.subject.rfc4514_string())
    except ValueError as error:
        return None, [Reason(label, "rim_malformed", str(error))]
    return manifest, []


def _parse(document: bytes):
    if not isinstance(document, bytes) or not 0 < len(document) <= MAX_RIM:
        raise ValueError(f"a RIM is an XML document of 1 byte to {MAX_RIM // 1024} KiB")
    parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=False, load_dtd=False)
    try:
        root = etree.fromstring(document, parser)
    except etree.XMLSyntaxError as error:
        raise ValueError(f"the RIM is not well-formed XML: {error}") from None
    if root.tag != f"{{{SWID}}}SoftwareIdentity":
        raise ValueError(f"the RIM's root element is {root.tag}, not an ISO 19770-2 SoftwareIdentity")
    return root


def _signer_chain(root) -> list[str]:
    """The signer's certificate and the chain the RIM carries, as PEM (signer first)."""
    pems = []
    for element in root.iterfind(f"{{{DSIG}}}Signature/{{{DSIG}}}KeyInfo/{{{DSIG}}}X509Data/{{{DSIG}}}X509Certificate"):
        try:
            der = base64.b64decode("".join((element.text or "").split()), validate=True)
            cert = x509.load_der_x509_certificate(der)
        except (binascii.Error, ValueError) as error:
            raise ValueError(f"a certificate in the RIM's KeyInfo does not parse: {error}") from None
        pems.append(cert.public_bytes(serialization.Encoding.PEM).decode("ascii"))
    if not pems:
        raise ValueError("the RIM carries no signer certificate (KeyInfo/X509Data)")
    return pems


def _manifest(signed, signer: str) -> Manifest:
    meta = signed.find(f"{{{SWID}}}Meta")
    if meta is None or not meta.get("colloquialVersion"):
        raise ValueError("the RIM names no version (Meta colloquialVersion)")
    version = meta.get("colloquialVersion")
    if len(version) > MAX_VERSION or not (version.isascii() and version.isprintable()):
        raise ValueError(f"the RIM's version must be printable ASCII of at most {MAX_VERSION} characters")
    measurements: dict[int, tuple[str, ...]] = {}
    for resource in signed.iterfind(f"{{{SWID}}}Payload/{{{SWID}}}Resource"):
        if resource.get("type") != "Measurement" or resource.get("active", "").lower() != "true":
            continue
        index = int(resource.get("index", "-1")) if resource.get("index", "").isdigit() else -1
        if not 0 <= index < 256 or index in measurements:
            raise ValueError(f"measurement index {resource.get('index')!r} is out of range or repeated")
        values = _alternatives(resource)
        if not values:
            raise ValueError(f"measurement {index} is active but lists no SHA-384 value")
        measurements[index] = values
    return Manifest(kind=kind_of(version), version=version, product=meta.get("product", ""),
                    tag_id=signed.get("tagId", ""), measurements=measurements, signer=signer)


def _alternatives(resource) -> tuple[str, ...]:
    values = {}
    for name, value in resource.attrib.items():
        qualified = etree.QName(name)
        match = _HASH.fullmatch(qualified.localname)
        if match and qualified.namespace == SHA384:
            digest = value.lower()
            if not _DIGEST.fullmatch(digest):
                raise ValueError(f"measurement {resource.get('index')}: {qualified.localname} is not a SHA-384 digest")
            values[int(match.group(1))] = digest
    return tuple(values[number] for number in sorted(values))
