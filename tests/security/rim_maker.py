"""
Reference integrity manifests signed by a test RIM CA: NVIDIA's own RIM documents as templates,
with the version and golden values replaced and the XML signature made again (signxml, ECDSA
P-384, C14N 1.1, enveloped, the signer's chain in KeyInfo) -- the shape NVIDIA signs.
"""

from __future__ import annotations

from lxml import etree
from signxml import XMLSigner
from signxml.algorithms import CanonicalizationMethod, DigestAlgorithm, SignatureMethod

from security.device_pki import cert_to_pem, key_to_pem, make_device, make_intermediate, make_root
from security.rim import DSIG, SHA384, SWID
from security.services import trust_anchor_add


def resign(template: bytes, *, version: str, measurements: dict[int, str], key, chain) -> bytes:
    """``template`` re-issued for ``version``: each index of ``measurements`` active with that one value, others off."""
    root = etree.fromstring(template)
    for signature in root.findall(f"{{{DSIG}}}Signature"):
        root.remove(signature)
    root.find(f"{{{SWID}}}Meta").set("colloquialVersion", version)
    for resource in root.iterfind(f"{{{SWID}}}Payload/{{{SWID}}}Resource"):
        index = int(resource.get("index"))
        for name in list(resource.attrib):
            if etree.QName(name).namespace == SHA384:
                del resource.attrib[name]
        resource.set("active", "True" if index in measurements else "False")
        resource.set("alternatives", "1")
        resource.set(f"{{{SHA384}}}Hash0", measurements.get(index, "0" * 96))
    signer = XMLSigner(signature_algorithm=SignatureMethod.ECDSA_SHA384, digest_algorithm=DigestAlgorithm.SHA384,
                       c14n_algorithm=CanonicalizationMethod.CANONICAL_XML_1_1)
    signed = signer.sign(root, key=key_to_pem(key).encode(), cert=[cert_to_pem(cert) for cert in chain])
    return etree.tostring(signed)


def minimal_rim(*, version: str, measurements: dict[int, str], key, chain) -> bytes:
    """A RIM of NVIDIA's shape built from nothing (for tests without NVIDIA's wheel)."""
    root = etree.Element(f"{{{SWID}}}SoftwareIdentity", nsmap={None: SWID, "ns2": SHA384},
                         attrib={"name": "GH100", "tagId": f"test-{version}", "version": "1.0"})
    etree.SubElement(root, f"{{{SWID}}}Meta", attrib={"colloquialVersion": version, "product": "GH100",
                                                      "edition": "GPU"})
    payload = etree.SubElement(root, f"{{{SWID}}}Payload")
    for index in range(max(measurements, default=0) + 1):
        etree.SubElement(payload, f"{{{SWID}}}Resource", attrib={
            "type": "Measurement", "index": str(index), "active": "True" if index in measurements else "False",
            "alternatives": "1", f"{{{SHA384}}}Hash0": measurements.get(index, "0" * 96)})
    return resign(etree.tostring(root), version=version, measurements=measurements, key=key, chain=chain)


def trusted_rim_ca():
    """A RIM CA whose root Meridian trusts (purpose rim): (signer key, chain) for resign/minimal_rim."""
    root_key, root = make_root("Test RIM Root")
    ca_key, ca = make_intermediate(root_key, root, "Test RIM CA")
    signer_key, signer = make_device(ca_key, ca, gpu_uuid="Test RIM Signer", serial="1")
    trust_anchor_add(actor=None, name="Test RIM root", certificate_pem=cert_to_pem(root), purpose="rim")
    return signer_key, [signer, ca]
