"""
What an instance (or its BMC or hypervisor) reaches Meridian for, with no login: the URL's
per-instance secret is the credential (``provisioning.cloud_init``), as with a presigned URL.
A wrong secret, an unknown instance and a cleaned one all answer the same 404.

- ``config-drive.iso``: the NoCloud config drive the BMC's virtual media or the VM's CD-ROM reads.
- ``report`` (POST): cloud-init's ``phone_home`` once booted -- the instance's SSH host keys.
- ``spot/termination-time``: when a preempted spot instance is stopped (EC2's instance metadata
  path); 404 while no termination is set, as on EC2.
"""

from __future__ import annotations

from datetime import UTC

from django.http import Http404, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from provisioning import cloud_init, host_keys
from provisioning.choices import BillingTerm

REPORTED_KEYS = ("pub_key_ed25519", "pub_key_ecdsa", "pub_key_rsa")


def _drive(instance_id, token):
    drive = cloud_init.drive_by_token(instance_id, token)
    if drive is None:
        raise Http404("No such instance, or the link has expired.")
    return drive


@require_GET
def config_drive(request, instance_id, token):
    drive = _drive(instance_id, token)
    response = HttpResponse(bytes(drive.iso), content_type="application/x-iso9660-image")
    response["Content-Disposition"] = 'attachment; filename="cidata.iso"'
    response["Cache-Control"] = "no-store"
    response["X-Checksum-SHA256"] = drive.sha256
    return response


@csrf_exempt
@require_POST
def report(request, instance_id, token):
    """cloud-init's phone_home: form fields pub_key_*, instance_id, hostname. The first report's keys are kept."""
    drive = _drive(instance_id, token)
    said = request.POST.get("instance_id", "")
    if said and said != str(drive.instance_id):
        return JsonResponse({"code": "wrong_instance", "detail": "instance_id is not the instance of this URL."},
                            status=400)
    keys = host_keys.parse(request.POST.get(name, "") for name in REPORTED_KEYS)
    if not keys:
        return JsonResponse({"code": "no_host_keys", "detail": "Post pub_key_ed25519, pub_key_ecdsa or pub_key_rsa "
                                                               "(OpenSSH public key lines)."}, status=400)
    kept = host_keys.record(drive.instance, keys)
    return JsonResponse({"kept": kept, "host_keys": [k["fingerprint"] for k in drive.instance.host_keys or keys]})


@require_GET
def spot_termination_time(request, instance_id, token):
    reservation = _drive(instance_id, token).instance.reservation
    if reservation.billing_term != BillingTerm.SPOT or reservation.preempted_by_id is None \
            or reservation.released_at is None:
        raise Http404("No termination is scheduled.")
    at = reservation.released_at.astimezone(UTC)
    return HttpResponse(at.strftime("%Y-%m-%dT%H:%M:%SZ"), content_type="text/plain")
