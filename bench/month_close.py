"""
Closing a month on the benchmark fleet (1,280 nodes x 8 GPUs = 10,240 GPUs), with BENCH_TENANTS
(1,000) tenants and about BENCH_RESERVATIONS (200,000) reservations that kept every GPU busy all
month, one after another (about 37 GPU-hours each); BENCH_COMMITTED_GPUS (80) of the GPUs are
commitments' capacity instead, held all month at a committed rate.

The meter records each closed hour as it goes, so by the month's end every hour but the last is in
the ledger: the setup writes those (7.4 million records, in SQL, as the hourly runs would have) and
their rollups. What is measured is the close itself -- the meter's run over the month's last hour
at full load, its look back for corrections, and every tenant's invoice finalized -- then the same
close again (it must change nothing), then the reads a tenant makes: the month-to-date spend from
the daily rollups as the dashboard reads it (``billing.spend.month_so_far``: per team, per day) and
the month's invoice draft (p95 over 50 tenants). Targets: close under 2
minutes, reads under 50 ms.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/month_close.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

from common import drop_database, setup_django

DB = "meridian_bench_close"
TENANTS = int(os.environ.get("BENCH_TENANTS", "1000"))
RESERVATIONS = int(os.environ.get("BENCH_RESERVATIONS", "200000"))
COMMITTED_GPUS = int(os.environ.get("BENCH_COMMITTED_GPUS", "80"))


def month() -> tuple[datetime, datetime]:
    this = datetime.now(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    last = (this - timedelta(days=1)).replace(day=1)
    return last, this


def fleet_and_work(start: datetime, end: datetime) -> int:
    """The fleet, the tenants and a month of back-to-back reservations on every GPU; returns how many."""
    from billing.models import Commitment, Invoice, InvoiceCounter, InvoiceLine, MeterState, UsageRecord, UsageRollup
    from cloud.models import GPU, Offering, Region
    from config.demo import seed_demo
    from provisioning.models import Allocation, Reservation
    from tenants.models import Team, Tenant

    seed_demo(regions=1, nodes=1280)
    # The demo's own five weeks of work and its closed month would overlap the bench's: gone.
    Allocation.objects.all().delete()
    for model in (UsageRecord, UsageRollup, InvoiceLine, Invoice, InvoiceCounter, MeterState):
        model.objects.all().delete()
    tenants = Tenant.objects.bulk_create(Tenant(slug=f"bench-{i}", name=f"Bench {i}") for i in range(TENANTS))
    teams = Team.objects.bulk_create(Team(tenant=t, slug="ml", name="ML") for t in tenants)
    offering = Offering.objects.filter(kind="vm", gpus_per_unit=1).first()
    gpus = list(GPU.objects.values_list("pk", "node_id", "node__region__slug"))
    regions = dict(Region.objects.values_list("slug", "pk"))
    hours = (end - start).total_seconds() / 3600
    mean = len(gpus) * hours / RESERVATIONS
    rng = random.Random(7)
    reservations, holds, commitments = [], [], []
    for n, (gpu, node, region) in enumerate(gpus[:COMMITTED_GPUS]):
        i = n % TENANTS
        reservations.append(Reservation(
            tenant=tenants[i], team=teams[i], name=f"c{n}", offering=offering, gpu_model_id=offering.gpu_model_id,
            units=1, gpus=1, regions=[region], duration=end - start, state="active", starts_at=start, ends_at=end,
            billing_term="reserved", committed=True))
        holds.append((gpu, node, start, end))
        commitments.append(Commitment(tenant=tenants[i], team=teams[i], name=f"c{n}", offering=offering,
                                      region_id=regions[region], gpus=1, months=1, starts_at=start, ends_at=end,
                                      rate="1.990000", reservation=reservations[-1]))
    for gpu, node, region in gpus[COMMITTED_GPUS:]:
        at = start
        while at < end:
            length = timedelta(hours=max(1.0, rng.uniform(0.2, 1.8) * mean))
            stop = min(at + length, end)
            i = rng.randrange(TENANTS)
            reservations.append(Reservation(
                tenant=tenants[i], team=teams[i], name=f"r{len(reservations)}", offering=offering,
                gpu_model_id=offering.gpu_model_id, units=1, gpus=1, regions=[region], duration=stop - at,
                state="released", starts_at=at, ends_at=stop))
            holds.append((gpu, node, at, stop))
            at = stop
    Reservation.objects.bulk_create(reservations, batch_size=5000)
    Allocation.objects.bulk_create((Allocation(reservation=r, gpu_id=gpu, node_id=node, mem_lo=0, mem_hi=80,
                                               starts_at=at, ends_at=stop)
                                    for r, (gpu, node, at, stop) in zip(reservations, holds, strict=True)),
                                   batch_size=5000)
    Commitment.objects.bulk_create(commitments)
    return len(reservations)


def ledger_until(start: datetime, until: datetime) -> int:
    """Every hour of ``[start, until)`` in the ledger, as the hourly meter runs would have written it (SQL)."""
    from django.db import connection

    from billing.models import MeterState
    from cloud.models import Offering

    price = Offering.objects.filter(kind="vm", gpus_per_unit=1).values_list("price_per_gpu_hour", flat=True).first()
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO billing_usagerecord (key, subject, resource, tenant_id, team_id, reservation_id, offering_id,
                region_id, term, starts_at, ends_at, quantity, unit_price, amount, currency, recorded_at)
            SELECT k, k, 'gpu', r.tenant_id, r.team_id, r.id, r.offering_id, n.region_id,
                   CASE WHEN c.id IS NULL THEN r.billing_term ELSE 'committed' END, lo, hi,
                   s, coalesce(c.rate, %(price)s), round(s * coalesce(c.rate, %(price)s) / 3600, 6), 'USD', now()
            FROM provisioning_allocation a
            JOIN provisioning_reservation r ON r.id = a.reservation_id
            LEFT JOIN billing_commitment c ON c.reservation_id = r.id
            JOIN cloud_node n ON n.id = a.node_id
            CROSS JOIN LATERAL generate_series(date_trunc('hour', a.starts_at), a.ends_at - interval '1 microsecond',
                                               interval '1 hour') AS w
            CROSS JOIN LATERAL (SELECT greatest(a.starts_at, w) AS lo, least(a.ends_at, w + interval '1 hour') AS hi,
                                       'gpu:' || a.id || ':' || extract(epoch FROM w)::bigint AS k) AS x
            CROSS JOIN LATERAL (SELECT extract(epoch FROM hi - lo)::numeric AS s) AS y
            WHERE w >= %(start)s AND w < %(until)s
        """, {"price": price, "start": start, "until": until})
        written = cursor.rowcount
    MeterState.objects.update_or_create(pk=1, defaults={"metered_until": until})
    return written


def rollups(start: datetime, until: datetime) -> None:
    from billing.meter import rollup_hours

    hours, at = set(), start
    while at < until:
        hours.add(at)
        at += timedelta(hours=1)
    rollup_hours(hours)


def p95(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=20)[18] if len(samples) >= 20 else max(samples)


def main():
    setup_django(DB)
    from django.db.models import Sum

    from billing import invoices
    from billing.meter import meter_recheck, meter_run
    from billing.models import Invoice, UsageRecord, UsageRollup
    from billing.spend import month_so_far
    from tenants.models import Tenant

    start, end = month()
    began = time.perf_counter()
    made = fleet_and_work(start, end)
    print(f"setup: 10,240 GPUs, {TENANTS:,} tenants, {made:,} reservations in {time.perf_counter() - began:.0f} s")
    began = time.perf_counter()
    written = ledger_until(start, end - timedelta(hours=1))
    rollups(start, end - timedelta(hours=1))
    print(f"setup: the month's first {int((end - start).total_seconds() // 3600) - 1} hours in the ledger "
          f"({written:,} records) and rolled up in {time.perf_counter() - began:.0f} s")

    now = end + timedelta(minutes=5)
    timings = {}
    began = time.perf_counter()
    metered = meter_run(now=now)
    timings["meter_last_hour_s"] = time.perf_counter() - began
    began = time.perf_counter()
    corrections = meter_recheck(now=now)
    timings["recheck_s"] = time.perf_counter() - began
    began = time.perf_counter()
    closed = invoices.close_month(start, now=now)
    timings["invoices_s"] = time.perf_counter() - began
    close_s = sum(timings.values())
    print(f"close: the last hour metered ({metered['records']:,} records) in {timings['meter_last_hour_s']:.1f} s, "
          f"corrections looked for in {timings['recheck_s']:.1f} s ({corrections}), {closed['finalized']:,} invoices "
          f"in {timings['invoices_s']:.1f} s: {close_s:.1f} s in all (target 120 s)")

    records, digests = UsageRecord.objects.count(), sorted(Invoice.objects.values_list("digest", flat=True))
    began = time.perf_counter()
    again = (meter_run(now=now), meter_recheck(now=now), invoices.close_month(start, now=now))
    again_s = time.perf_counter() - began
    unchanged = (UsageRecord.objects.count() == records
                 and sorted(Invoice.objects.values_list("digest", flat=True)) == digests
                 and again[0]["windows"] == 0 and again[1] == 0 and again[2]["finalized"] == 0)
    print(f"close again: {again_s:.1f} s, {'nothing changed' if unchanged else 'SOMETHING CHANGED'}")
    ledger = UsageRecord.objects.aggregate(n=Sum("amount"))["n"]
    billed = Invoice.objects.aggregate(n=Sum("subtotal"))["n"]
    print(f"the ledger rates {ledger:,.2f} USD; the invoices bill {billed:,.2f} USD (lines rounded to the cent)")
    committed = UsageRecord.objects.filter(term="committed").aggregate(q=Sum("quantity"), n=Sum("amount"))
    print(f"commitments: {COMMITTED_GPUS} GPUs held all month, {committed['q'] / 3600:,.0f} GPU-hours at the "
          f"committed rate, {committed['n']:,.2f} USD")

    sample = list(Tenant.objects.filter(slug__startswith="bench-").order_by("slug")[:50])
    spend, draft = [], []
    for tenant in sample:
        began = time.perf_counter()
        month_so_far(UsageRollup.objects.filter(tenant=tenant), end - timedelta(seconds=1))
        spend.append((time.perf_counter() - began) * 1000)
        began = time.perf_counter()
        invoices.draft(tenant.pk, start, now=now)
        draft.append((time.perf_counter() - began) * 1000)
    print(f"reads, p95 over {len(sample)} tenants: month-to-date spend {p95(spend):.1f} ms, "
          f"the month's invoice draft {p95(draft):.1f} ms (target 50 ms)")
    if not os.environ.get("BENCH_KEEP"):
        drop_database(DB)
    print("RESULT " + json.dumps({
        "reservations": made, "records": records, "close_s": round(close_s, 1),
        **{k: round(v, 1) for k, v in timings.items()}, "invoices": closed["finalized"],
        "close_again_s": round(again_s, 1), "close_again_unchanged": unchanged,
        "spend_p95_ms": round(p95(spend), 1), "draft_p95_ms": round(p95(draft), 1)}))


if __name__ == "__main__":
    main()
