"""
Server time of the console's main pages, on the demo fleet (2 regions x 64 nodes) and on the
1,280-node benchmark fleet, with a tenant history and a queue behind them. Each page is
rendered in-process through the whole middleware stack (Django's test client: no network, no
browser), 20 times after a warm-up; prints p50/p95 in ms and the number of SQL queries per
page, which must be the same on both fleets (query counts do not grow with rows). Targets:
under 100 ms on the demo fleet, under 300 ms on the 1,280-node fleet (p95).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/console_pages.py
"""

import os
import time
from datetime import timedelta

from common import drop_database, percentile, setup_django

os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
DB = "meridian_bench_console"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "20"))
# Each fleet with its p95 target in ms.
FLEETS = [("demo fleet (2 x 64 nodes)", {"regions": 2, "nodes": 64}, 100.0),
          ("1,280-node fleet", {"regions": 1, "nodes": 1280}, 300.0)]


def seed(fleet: dict) -> dict:
    """The demo world on this fleet, a history for acme and a queue of other tenants' work."""
    from django.utils import timezone

    from cloud.models import Node, Offering
    from config.demo import seed_demo
    from provisioning.admission import Ask
    from provisioning.history import history_sample
    from provisioning.models import Reservation
    from provisioning.services import reservation_create
    from tenants.models import Membership, Tenant, User
    from tenants.scoping import Principal

    seed_demo(**fleet)
    alice = User.objects.get(email="alice@acme.example")
    acme = Membership.objects.get(user=alice).tenant
    actor = Principal(user=alice, tenant=acme, role="owner")
    offering = Offering.objects.filter(kind="vm", gpus_per_unit=1).order_by("slug").first()
    region = offering and Node.objects.filter(pool="shared", gpus__model=offering.gpu_model).first().region
    placed = []
    for i in range(60):  # placed at once by the fast path: GPUs held, allocations, audit events
        placed.append(reservation_create(actor=actor, ask=Ask(
            name=f"run-{i}", offering=offering, units=1, regions=(region,), duration=timedelta(hours=4))))
    other = Tenant.objects.exclude(pk=acme.pk).first()
    now = timezone.now()
    queued = Reservation.objects.bulk_create([  # a queue of 2,000 behind them
        Reservation(tenant=other, name=f"queued-{i}", offering=offering, gpu_model=offering.gpu_model, units=1,
                    gpus=1, regions=[region.slug], duration=timedelta(hours=2), state="queued", score=i / 2000,
                    submitted_at=now)
        for i in range(2000)])
    for hours in range(24, 0, -1):  # a day of history: each queued reservation's place, the fleet's occupancy
        history_sample(now - timedelta(hours=hours))
    return {"reservation": placed[0].pk, "node": Node.objects.filter(pool="shared").first().pk,
            "queued": queued[0].pk,
            "estimate": {"name": "x", "mode": "offering", "offering": offering.slug, "count": "2",
                         "region": region.slug, "start_mode": "now", "duration_hours": "3",
                         "billing_term": "on_demand", "eviction_policy": "soft", "urgency": "normal"}}


def pages(ids: dict) -> list[tuple[str, str, str, dict | None]]:
    """(who, name, URL, form data): a POST where there is form data (the estimate), else a GET."""
    tenant = [("dashboard", "/"), ("reservations", "/reservations/"), ("new reservation", "/reservations/new/"),
              ("estimate (htmx)", "/reservations/estimate/", ids["estimate"]),
              ("reservation", f"/reservations/{ids['reservation']}/"),
              ("progress (htmx)", f"/reservations/{ids['reservation']}/progress/"),
              ("vpcs", "/vpcs/"), ("tokens", "/tokens/"), ("teams", "/teams/"), ("quotas", "/quotas/"),
              ("audit log", "/audit/"), ("notifications", "/notifications/"), ("high priority", "/high-priority/")]
    staff = [("staff problems", "/staff/"), ("staff fleet", "/staff/fleet/"),
             ("staff node", f"/staff/fleet/nodes/{ids['node']}/"),
             ("staff queue", "/staff/queue/"), ("staff tenants", "/staff/tenants/"),
             ("staff search", "/staff/search/?q=queued-1"),
             ("queued reservation (staff)", f"/reservations/{ids['queued']}/"),
             ("staff quotas", "/staff/quotas/"), ("staff high priority", "/staff/high-priority/")]
    return ([("alice", *page) if len(page) == 3 else ("alice", *page, None) for page in tenant]
            + [("admin", name, url, None) for name, url in staff])


class QueryCounter(list):
    """An execute wrapper that remembers each statement (counts whatever DEBUG says)."""

    def __call__(self, execute, sql, params, many, context):
        self.append(sql)
        return execute(sql, params, many, context)


def measure(ids: dict) -> dict:
    from django.db import connection
    from django.test import Client

    from tenants.models import User
    from web.console import SESSION_TENANT

    clients = {"alice": Client(raise_request_exception=False), "admin": Client(raise_request_exception=False)}
    clients["alice"].force_login(User.objects.get(email="alice@acme.example"))
    session = clients["alice"].session
    session[SESSION_TENANT] = "acme"
    session.save()
    clients["admin"].force_login(User.objects.get(email="admin@meridian.example"))
    results = {}
    for who, name, url, data in pages(ids):
        client = clients[who]

        def fetch(client=client, url=url, data=data):
            return client.get(url) if data is None else client.post(url, data, HTTP_HX_REQUEST="true")

        first = fetch()
        if first.status_code != 200:
            results[name] = {"status": first.status_code}
            continue
        queries = QueryCounter()
        with connection.execute_wrapper(queries):
            fetch()
        times = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            fetch()
            times.append(time.perf_counter() - started)
        results[name] = {"p50_ms": round(percentile(times, 50) * 1000, 1),
                         "p95_ms": round(percentile(times, 95) * 1000, 1), "queries": len(queries)}
    return results


def main():
    table = {}
    for label, fleet, _target in FLEETS:
        setup_django(DB)
        from django.core.cache import cache
        from django.db import connections

        cache.clear()
        ids = seed(fleet)
        table[label] = measure(ids)
        connections.close_all()
        drop_database(DB)
    names = list(next(iter(table.values())))
    targets = {label: target for label, _, target in FLEETS}
    print(f"console page server time, {ROUNDS} rounds (p95 targets: "
          + ", ".join(f"{label} < {target:.0f} ms" for label, target in targets.items()) + "); queries per page")
    print(f"{'page':28}" + "".join(f"{label:>34}" for label in table))
    for name in names:
        cells = []
        for label in table:
            r = table[label][name]
            cells.append(f"status {r['status']}" if "status" in r else
                         f"p50 {r['p50_ms']:6.1f} p95 {r['p95_ms']:6.1f} q {r['queries']:3}")
        print(f"{name:28}" + "".join(f"{c:>34}" for c in cells))
    for label, rows in table.items():
        worst = max((r["p95_ms"] for r in rows.values() if "p95_ms" in r), default=0)
        failed = [n for n, r in rows.items() if "status" in r]
        print(f"{label}: worst p95 {worst:.1f} ms ({'met' if worst < targets[label] else 'NOT met'}"
              f"{'; not 200: ' + ', '.join(failed) if failed else ''})")
    grown = [n for n in names if len({t[n].get("queries") for t in table.values()}) > 1]
    print(f"pages whose query count differs between fleets: {', '.join(grown) or 'none'}")


if __name__ == "__main__":
    main()
