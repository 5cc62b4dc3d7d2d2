"""
API latency and throughput on the benchmark fleet (1,280 nodes x 8 GPUs), through gunicorn
(2 workers x 4 threads) on 127.0.0.1, from 8 client threads. Prints p50/p95 per endpoint and
requests per second, to compare with a bare DRF view on the same machine (shared/peers: about
3,700 req/s for an empty APIView, 1,400 for a one-row detail, 870 for a 50-row list).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/api_latency.py
"""

import json
import os
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from common import drop_database, free_port, percentile, serve, setup_django

DB = "meridian_bench_api"
REQUESTS_PER_ENDPOINT = int(os.environ.get("BENCH_REQUESTS", "600"))
CLIENT_THREADS = 8


def prepare():
    from config.demo import seed_demo
    from tenants.models import Membership, Team, User
    from tests.world import issue_token

    seed_demo(regions=1, nodes=1280)
    alice = User.objects.get(email="alice@acme.example")
    staff = User.objects.get(email="admin@meridian.example")
    tenant = Membership.objects.get(user=alice).tenant
    for i in range(48):
        Team.objects.create(tenant=tenant, name=f"Team {i}", slug=f"team-{i}")
    return issue_token(alice, tenant), issue_token(staff, None)




def measure(url: str, token: str) -> dict:
    def one(_):
        started = time.perf_counter()
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request) as response:  # noqa: S310 -- loopback only
            response.read()
            assert response.status == 200
        return time.perf_counter() - started

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        list(pool.map(one, range(40)))  # warm-up
        started = time.perf_counter()
        latencies = list(pool.map(one, range(REQUESTS_PER_ENDPOINT)))
        wall = time.perf_counter() - started
    return {"p50_ms": round(percentile(latencies, 50) * 1000, 1), "p95_ms": round(percentile(latencies, 95) * 1000, 1),
            "req_per_s": round(len(latencies) / wall)}


def main():
    setup_django(DB)
    tenant_token, staff_token = prepare()
    from django.db import connections

    connections.close_all()
    port = free_port()
    server = serve(port)
    base = f"http://127.0.0.1:{port}/api/v1"
    endpoints = {
        "me": (f"{base}/me/", tenant_token),
        "teams list (50 rows)": (f"{base}/teams/?page_size=50", tenant_token),
        "offerings + availability over 10,240 GPUs": (f"{base}/offerings/", tenant_token),
        "nodes list (50 of 1,280, staff)": (f"{base}/nodes/?page_size=50", staff_token),
        "gpus list (50 of 10,240, staff)": (f"{base}/gpus/?page_size=50", staff_token),
    }
    results = {}
    try:
        for name, (url, token) in endpoints.items():
            results[name] = measure(url, token)
            print(f"{name:45s} {results[name]}")
    finally:
        server.terminate()
        server.wait()
    print("RESULT " + json.dumps({"bench": "api_latency", "requests": REQUESTS_PER_ENDPOINT,
                                  "clients": CLIENT_THREADS, "endpoints": results}))
    drop_database(DB)


if __name__ == "__main__":
    main()
