"""Valid bodies and rows for the staff's attestation imports, for the route-wide tests (role matrix, bad input)."""

from __future__ import annotations

import base64
import secrets
from datetime import timedelta

from django.utils import timezone

from security import device_pki as pki
from security.models import OcspStatus, ReferenceManifest
from security.services import trust_anchor_add
from tests.security import ocsp_maker, rim_maker


def rim_body(version: str | None = None) -> dict:
    """A RIM signed by a freshly trusted RIM CA (a driver version of its own)."""
    signer_key, chain = rim_maker.trusted_rim_ca()
    version = version or f"570.{secrets.randbelow(10**6)}"
    document = rim_maker.minimal_rim(version=version, measurements={1: "a" * 96, 2: "b" * 96}, key=signer_key,
                                     chain=chain)
    return {"document": document.decode()}


def ocsp_body() -> dict:
    """An OCSP response from a freshly trusted CA for one of its certificates."""
    key, root = pki.make_root(f"OCSP Root {secrets.token_hex(3)}")
    trust_anchor_add(actor=None, name="ocsp root", certificate_pem=pki.cert_to_pem(root))
    _, device = pki.make_device(key, root, gpu_uuid=f"GPU-{secrets.token_hex(4)}", serial=secrets.token_hex(4))
    return {"response": base64.b64encode(ocsp_maker.response(key, root, device)).decode()}


def make_manifests(n: int) -> None:
    ReferenceManifest.objects.bulk_create([ReferenceManifest(
        kind="driver", version=f"570.{secrets.token_hex(3)}", signer="CN=Signer", document="<x/>",
        measurements={"1": ["a" * 96]}) for _ in range(n)])


def make_ocsp_statuses(n: int) -> None:
    now = timezone.now()
    OcspStatus.objects.bulk_create([OcspStatus(issuer="CN=CA", serial_number=secrets.token_hex(8), status="good",
                                               this_update=now, next_update=now + timedelta(days=1))
                                    for _ in range(n)])
