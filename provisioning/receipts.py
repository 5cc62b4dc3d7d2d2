"""
Attestation receipts on allocations: before a hand-over, a passed attestation of the GPUs a
reservation gets is signed by Meridian (security.receipts, ES384, keys at
``/.well-known/jwks.json``) and kept on those allocations, so the tenant can later prove which
devices, firmware and measurements its work ran on.
"""

from __future__ import annotations

from django.utils import timezone

from cloud.choices import OfferingKind
from cloud.models import GPU
from provisioning.models import Allocation
from security.receipts import receipt_issue


def receipt_store(*, reservation, node, report, instances) -> str:
    """Sign the receipt for ``instances`` on ``node`` from a passed ``report`` and keep it on their allocations."""
    gpu_ids = {d["gpu_id"] for instance in instances for d in instance.devices}
    uuids = set(GPU.objects.filter(pk__in=gpu_ids).values_list("uuid", flat=True))
    claims = {
        "reservation": str(reservation.pk),
        "instances": sorted(str(instance.pk) for instance in instances),
        "verdict": report.status,
        "report": str(report.pk),
        "verified_at": report.verified_at.isoformat(),
        "gpus": [gpu for gpu in report.gpus if gpu.get("uuid") in uuids],
        # Confidential computing: the work runs only on GPUs whose evidence above shows CC mode on.
        "confidential": reservation.offering.confidential,
    }
    if reservation.offering.kind == OfferingKind.BARE_METAL:
        claims["node"] = node.hostname  # a server is the tenant's; a shared host's name is not
    token = receipt_issue(claims, subject=f"reservation:{reservation.pk}", audience=str(reservation.tenant_id))
    Allocation.objects.filter(reservation=reservation, node=node, gpu_id__in=gpu_ids,
                              ends_at__gt=timezone.now()).update(attestation_receipt=token)
    return token


def receipts_of(reservation) -> list[dict]:
    """The reservation's receipts, one per attested hand-over, with the GPUs each covers (by UUID)."""
    found: dict[str, dict] = {}
    rows = Allocation.objects.filter(reservation=reservation).exclude(attestation_receipt="").select_related(
        "gpu").order_by("gpu__uuid")
    for allocation in rows:
        entry = found.setdefault(allocation.attestation_receipt, {"receipt": allocation.attestation_receipt,
                                                                  "gpus": []})
        if allocation.gpu.uuid not in entry["gpus"]:
            entry["gpus"].append(allocation.gpu.uuid)
    return list(found.values())
