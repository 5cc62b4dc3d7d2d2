"""
The control plane's own cost of storage's steps (storage.steps), in-process on the simulated
backend (no latency): BENCH_VOLUMES (400) volumes created through the service (admission, quota
under the tenant's lock, the audit event), their create steps run, then deleted and their delete
steps run (the backend removed, the key destroyed, the crypto-erase audited). Each phase is run by
1 and by 2 threads (each its own database connection, as two worker processes would be), and
prints volumes per second and the queries per volume.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/storage_steps.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import threading
import time

from common import drop_database, setup_django

DB = "meridian_bench_storage"
VOLUMES = int(os.environ.get("BENCH_VOLUMES", "400"))


def world():
    from cloud.models import Region
    from storage.catalogue import default_storage_classes
    from tenants.choices import TenantRole
    from tenants.models import Membership, Quota, Tenant, User
    from tenants.scoping import Principal

    tenant = Tenant.objects.create(name="Bench", slug="bench")
    Quota.objects.create(tenant=tenant, resource="storage_gib", limit=10**9)
    user = User.objects.create_user("bench@example.com", "x")
    Membership.objects.create(tenant=tenant, user=user, role=TenantRole.MEMBER)
    region, _ = Region.objects.get_or_create(slug="us-east-1", defaults={"name": "US East"})
    shared = next(c for c in default_storage_classes(region) if c.kind == "shared_fs")
    return Principal(user=user, tenant=tenant, role=TenantRole.MEMBER), shared


def run(threads: int, work, items) -> float:
    """Seconds for ``threads`` threads to do ``work(item)`` over ``items`` (split evenly)."""
    from django.db import connections

    def part(chunk):
        for item in chunk:
            work(item)
        connections.close_all()

    chunks = [items[i::threads] for i in range(threads)]
    started = time.perf_counter()
    pool = [threading.Thread(target=part, args=(chunk,)) for chunk in chunks]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return time.perf_counter() - started


def main():
    setup_django(DB)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from storage import dispatch
    from storage.models import Volume
    from storage.services import volume_create, volume_delete
    from storage.steps import volume_converge

    dispatch.send = lambda *args, **kwargs: None  # the steps are run here, not through a broker
    actor, shared = world()
    results = {}
    for threads in (1, 2):
        names = [f"t{threads}-v{i}" for i in range(VOLUMES)]
        create_s = run(threads, lambda name: volume_create(actor=actor, storage_class=shared, name=name,
                                                          size_gib=100), names)
        ids = list(Volume.objects.filter(name__in=names).values_list("pk", flat=True))
        step_s = run(threads, volume_converge, ids)
        volumes = list(Volume.objects.filter(pk__in=ids))
        delete_s = run(threads, lambda v: volume_delete(actor=actor, volume=v), volumes)
        erase_s = run(threads, volume_converge, ids)
        assert Volume.objects.filter(pk__in=ids, state="deleted").count() == VOLUMES
        results[threads] = {"create_per_s": round(VOLUMES / create_s), "create_step_per_s": round(VOLUMES / step_s),
                            "delete_per_s": round(VOLUMES / delete_s), "delete_step_per_s": round(VOLUMES / erase_s)}
        print(f"{threads} thread(s): create {results[threads]['create_per_s']}/s, its step "
              f"{results[threads]['create_step_per_s']}/s; delete {results[threads]['delete_per_s']}/s, its step "
              f"(backend removed, key destroyed) {results[threads]['delete_step_per_s']}/s")
    with CaptureQueriesContext(connection) as made:
        volume = volume_create(actor=actor, storage_class=shared, name="counted", size_gib=100)
    with CaptureQueriesContext(connection) as stepped:
        volume_converge(volume.pk)
    results["queries"] = {"create": len(made), "create_step": len(stepped)}
    print(f"queries per volume: create {len(made)}, its step {len(stepped)}")
    drop_database(DB)
    print("RESULT " + json.dumps(results))


if __name__ == "__main__":
    main()
