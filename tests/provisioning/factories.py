"""Reservations and offerings for provisioning tests, built straight through the ORM."""

from datetime import timedelta

from cloud.models import GPUModel, Offering
from provisioning.models import Allocation, Reservation
from tests.world import World, unique


def offering(kind="bare_metal", gpus_per_unit=8, slots_per_gpu=1, model="h100-80gb-sxm", **extra) -> Offering:
    model = GPUModel.objects.get(slug=model)
    defaults = {"name": f"{kind} {gpus_per_unit}x {model.slug}", "kind": kind, "gpu_model": model,
                "gpus_per_unit": gpus_per_unit, "slots_per_gpu": slots_per_gpu, "price_per_gpu_hour": "2.00",
                "isolation_mode": "mig" if slots_per_gpu > 1 else "exclusive", **extra}
    return Offering.objects.get_or_create(slug=f"{kind}-{model.slug}-{gpus_per_unit}-{slots_per_gpu}",
                                          defaults=defaults)[0]


def make_reservation(world: World, *, side="t1", units=1, state="pending", **fields) -> Reservation:
    chosen = fields.pop("offering", None) or offering()
    gpus = 0 if chosen.slots_per_gpu > 1 else units * chosen.gpus_per_unit
    return Reservation.objects.create(
        tenant=world.side(side).tenant, name=unique("reservation"), offering=chosen, gpu_model=chosen.gpu_model,
        units=units, gpus=gpus, regions=["us-east-1"], duration=timedelta(hours=1), state=state, **fields,
    )


def held(reservation: Reservation, gpus, *, start, end) -> list[Allocation]:
    """
    Whole ``gpus`` held by ``reservation`` over ``[start, end)``, written as they stand: history
    and work that began a while ago included, which binding refuses to start (PostgreSQL's
    exclusion constraint still checks them).
    """
    return Allocation.objects.bulk_create(
        Allocation(reservation=reservation, gpu_id=g.pk, node_id=g.node_id, mem_lo=0, mem_hi=g.memory_mib,
                   starts_at=start, ends_at=end) for g in gpus)
