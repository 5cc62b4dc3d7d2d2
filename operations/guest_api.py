"""
GPU telemetry from inside an instance: GPUs passed through to a VM are bound to vfio-pci and
vanish from the host's NVML, so the host's agent cannot see them (nor a bare-metal server's, which
runs no Meridian agent). An optional in-guest agent (``python -m provisioning.agent --guest``)
reads them with the guest's own NVML and posts its samples here, with the per-instance secret the
config drive's metadata gave it. Only the instance's own GPUs are accepted; the samples go through
the same ingestion and failure detection as the host agent's (source ``guest``): XIDs, ECC and
utilization (the no-show rule) come from the one place that sees them.

The readings are the tenant's claims: a GPU a guest reports failing is taken out and comes back
only after it passes validation again (burn-in and attestation), so a false report costs the
fleet a validation, never a tenant's neighbour.
"""

from __future__ import annotations

import json

from django.http import Http404, JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from cloud import telemetry
from cloud.models import GPU, TelemetrySource
from core.errors import DomainError
from operations.detection import judge_samples
from provisioning import cloud_init
from provisioning.choices import InstanceState

MAX_BODY = 64 * 1024


@csrf_exempt
@require_POST
def gpu_telemetry(request, instance_id, token):
    """{"samples": [...]}: one sample per GPU of this instance, as the node agent's heartbeat carries them."""
    drive = cloud_init.drive_by_token(instance_id, token)
    if drive is None or drive.instance.state != InstanceState.ACTIVE:
        raise Http404("No such instance, or the link has expired.")
    instance = drive.instance
    if len(request.body) > MAX_BODY:
        return _refused(413, "too_large", f"The body is {len(request.body)} bytes; at most {MAX_BODY}.")
    try:
        samples = json.loads(request.body or b"{}").get("samples")
    except (ValueError, AttributeError):
        return _refused(400, "invalid", 'Send JSON: {"samples": [{"uuid": "GPU-...", ...}]}.')
    if not isinstance(samples, list) or not samples:
        return _refused(400, "invalid", '"samples" must be a non-empty list, one sample per GPU of this instance.')
    own = set(GPU.objects.filter(pk__in=[d["gpu_id"] for d in instance.devices]).values_list("uuid", flat=True))
    foreign = sorted({str(s.get("uuid")) for s in samples if isinstance(s, dict)} - own)
    if foreign or len(samples) > len(own):
        return _refused(403, "not_this_instances_gpu", f"This instance holds {len(own)} GPU(s); "
                                                       f"{', '.join(foreign[:4]) or 'the extra samples'} are not its.")
    now = timezone.now()
    try:
        checked = telemetry.ingest_check(node=instance.node, samples=samples, ports=[], now=now,
                                         source=TelemetrySource.GUEST)
    except DomainError as error:  # a reading out of range, a malformed sample: nothing is stored
        codes = error.get_codes()
        return _refused(error.status_code, codes if isinstance(codes, str) else "invalid", str(error.detail))
    telemetry.ingest_write(checked)
    findings = judge_samples(node=instance.node, ingested=checked.ingested, now=now)
    return JsonResponse({"stored": len(checked.readings), "findings": len(findings)})


def _refused(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"code": code, "detail": detail}, status=status)
