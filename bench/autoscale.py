"""
Autoscaling and burst on a simulated fleet (issue 39), in real time: the real node agents (simulated
NVML) heartbeat every BENCH_TELEMETRY_S (10 s, the default heartbeat) with their GPU samples, the
autoscaler's pass runs every BENCH_AUTOSCALE_S (0.5 s: the scheduler's cycle, as the target counts it;
the beat's default, MERIDIAN_AUTOSCALE_SECONDS, is 5 s: a decision then comes up to 4.5 s later; each
pass's time per endpoint is reported), and the lifecycle runs in
this process with zero-latency simulated drivers ("instant drivers"). A replica is placed by the fast
path when it is created (no scheduler cycle to wait for).

1. Scale-out latency (BENCH_TRIALS, 3): an endpoint serves one replica at 50 % utilization; at a random
   moment of the telemetry period its load steps to 1.6 replicas' worth. Measured from the step to the
   scale-out decision (target: within one telemetry period plus one scheduler cycle: 10.5 s) and to the
   new replica serving (target: under 60 s).
2. Burst: an endpoint in us-east-1 then eu-north-1 under a load that wants more replicas; us-east-1 is
   then filled by other work so new replicas wait there. After BENCH_BURST_AFTER_S (300 s: the seed's
   5 minutes) above 85 %, measured from the end of those 5 minutes to a replica serving in eu-north-1
   (target: under 60 s).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/meridian .venv/bin/python bench/autoscale.py

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from datetime import timedelta

from common import Inline, drop_database, percentile, setup_django

DB = "meridian_bench_autoscale"
TELEMETRY_S = float(os.environ.get("BENCH_TELEMETRY_S", "10"))
AUTOSCALE_S = float(os.environ.get("BENCH_AUTOSCALE_S", "0.5"))
TRIALS = int(os.environ.get("BENCH_TRIALS", "3"))
BURST_AFTER_S = int(os.environ.get("BENCH_BURST_AFTER_S", "300"))
CYCLE_S = 0.5  # the seed's scheduler interval: the decision target is one telemetry period plus one cycle
os.environ["MERIDIAN_SIMULATION"] = json.dumps({"seed": 0})  # zero latency, no injected faults
os.environ["MERIDIAN_ENDPOINT_PROBE"] = "simulated"
os.environ["MERIDIAN_ENDPOINT_DRAIN_SECONDS"] = "0"
os.environ["MERIDIAN_BALANCER_CONFIG"] = os.path.join(tempfile.mkdtemp(prefix="meridian-bench-lb-"), "haproxy.cfg")


def seed():
    from cloud.catalogue import load_gpu_catalogue
    from cloud.fleet import FleetSpec, build_fleet
    from cloud.models import GPUModel, Offering
    from provisioning.drivers.simulated_devices import trust_simulated_fleet
    from tenants.choices import QuotaResource, TenantRole
    from tenants.models import Membership, Quota, Tenant, User
    from tenants.scoping import Principal

    load_gpu_catalogue(GPUModel)
    for first in (0, 4):  # us-east-1 and eu-north-1, both of H100s: 16 shared hosts (128 GPUs) each
        build_fleet(FleetSpec(regions=1, first_region=first, nodes_per_fabric=32, spare_ratio=0.0, shared_ratio=0.5))
    trust_simulated_fleet()
    made = {}
    for slug in ("serve", "other"):
        tenant = Tenant.objects.create(name=slug.title(), slug=slug)
        user = User.objects.create_user(f"{slug}@example.com")
        Membership.objects.create(tenant=tenant, user=user, role=TenantRole.OWNER)
        Quota.objects.create(tenant=tenant, resource=QuotaResource.GPUS, limit=100_000)
        made[slug] = Principal(user=user, tenant=tenant, role=TenantRole.OWNER)
    Offering.objects.create(slug="ct-h100x1", name="Container 1x H100", kind="container", gpus_per_unit=1,
                            price_per_gpu_hour="2.00", gpu_model=GPUModel.objects.get(slug="h100-80gb-sxm"))
    return made


class Fleet:
    """The shared hosts' agents (simulated NVML), heartbeating in process through the node API's own service."""

    def __init__(self):
        from cloud.models import Node
        from provisioning.agent.agent import Agent
        from provisioning.agent.nvml import SimulatedGPU, SimulatedNVML

        self.nodes = {n.hostname: n for n in Node.objects.filter(pool="shared").prefetch_related("gpus")}
        self.agents = {host: Agent(None, SimulatedNVML([SimulatedGPU(index=g.index, uuid=g.uuid,
                                                                     memory_mib=g.memory_mib)
                                                        for g in node.gpus.all()]), hostname=host)
                       for host, node in self.nodes.items()}

    def load(self, at: float) -> None:
        """Each serving replica's share of its endpoint's synthetic load on its GPUs (inference.load)."""
        from inference.load import gpu_targets

        targets = gpu_targets(at)
        for host, agent in self.agents.items():
            for index, gpu in agent.nvml.gpus.items():
                gpu.utilization_pct = targets.get((host, index), 0)

    def heartbeat(self) -> None:
        from operations.node_api.agents import heartbeat

        for host, agent in self.agents.items():
            gpus = agent.inventory()
            heartbeat(node=self.nodes[host], agent_version="bench", gpus=gpus, samples=agent.samples(gpus))


class Clock:
    """The fleet's two periodic duties on their own phases, and the lifecycle in between."""

    def __init__(self, fleet: Fleet, runner: Inline, rng: random.Random):
        self.fleet, self.runner = fleet, runner
        now = time.monotonic()
        self.next_beat = now + TELEMETRY_S * rng.random()
        self.next_scale = now + AUTOSCALE_S * rng.random()
        self.passes: list[float] = []  # each autoscaler pass (every endpoint, then the balancer), ms

    def run_until(self, done, timeout_s: float) -> float:
        from inference import balancer
        from inference.scaling import autoscale_all

        deadline = time.monotonic() + timeout_s
        while not done():
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"not done within {timeout_s:.0f} s")
            if now >= self.next_beat:
                self.fleet.load(time.time())
                self.fleet.heartbeat()
                self.next_beat += TELEMETRY_S
            if now >= self.next_scale:
                started = time.perf_counter()
                autoscale_all()
                balancer.sync()
                self.passes.append((time.perf_counter() - started) * 1000)
                self.next_scale += AUTOSCALE_S
            self.runner.drain()
            time.sleep(0.02)
        return time.time()


def endpoint(principal, name: str, regions: list[str], load: float, **fields):
    from inference.endpoints import Share, endpoint_create
    from inference.models import Endpoint

    made = endpoint_create(actor=principal, name=name, share=Share(gpu_model="h100-80gb-sxm"), regions=regions,
                           **fields)
    Endpoint.objects.filter(pk=made.pk).update(synthetic_load={"base": load, "peak": load})
    return made


def serving(made, **filters) -> int:
    return made.replicas.filter(state="serving", **filters).count()


def scale_out_trial(principal, clock: Clock, rng: random.Random, number: int) -> dict:
    from inference.models import Endpoint, ScalingDecision

    made = endpoint(principal, f"step-{number}", ["us-east-1"], 0.5, min_replicas=1, max_replicas=6)
    clock.run_until(lambda: serving(made) == 1, 120)
    settle = time.time() + TELEMETRY_S * (1 + rng.random())  # a sample at 50 %, then a random phase
    clock.run_until(lambda: time.time() >= settle, 60)
    Endpoint.objects.filter(pk=made.pk).update(synthetic_load={"base": 1.6, "peak": 1.6})
    stepped = time.time()
    decided = clock.run_until(lambda: ScalingDecision.objects.filter(endpoint=made, action="scale_out").exists(), 120)
    decision = ScalingDecision.objects.filter(endpoint=made, action="scale_out").earliest("at")
    clock.run_until(lambda: serving(made) >= 2, 120)
    second = made.replicas.filter(state="serving").order_by("-serving_since").first()
    Endpoint.objects.filter(pk=made.pk).update(state="deleting")
    return {"decision_s": round(decision.at.timestamp() - stepped, 2), "noticed_s": round(decided - stepped, 2),
            "serving_s": round(second.serving_since.timestamp() - stepped, 2),
            "replicas_after": decision.replicas_after}


def fill_home(other) -> int:
    """Hold every free shared GPU of us-east-1 for another tenant's work."""
    from django.utils import timezone

    from cloud.models import GPU, GPUModel, Offering
    from provisioning.models import Allocation, Reservation

    now = timezone.now()
    busy = set(Allocation.objects.holding(now).values_list("gpu_id", flat=True))
    free = [g for g in GPU.objects.filter(node__region__slug="us-east-1", node__pool="shared") if g.pk not in busy]
    h100 = GPUModel.objects.get(slug="h100-80gb-sxm")
    held = Reservation.objects.create(tenant=other.tenant, name="fill", offering=Offering.objects.get(slug="ct-h100x1"),
                                      gpu_model=h100, units=len(free), gpus=len(free), regions=["us-east-1"],
                                      duration=timedelta(hours=4), state="active", starts_at=now,
                                      ends_at=now + timedelta(hours=4))
    Allocation.objects.bulk_create(Allocation(reservation=held, gpu=g, node_id=g.node_id, mem_lo=0,
                                              mem_hi=g.memory_mib, starts_at=now, ends_at=now + timedelta(hours=4))
                                   for g in free)
    return len(free)


def burst_run(principals, clock: Clock) -> dict:
    from inference.models import Endpoint

    clock.run_until(lambda: not Endpoint.objects.filter(state="deleting").exists(), 120)  # the steps' replicas gone
    made = endpoint(principals["serve"], "burst", ["us-east-1", "eu-north-1"], 0.5, min_replicas=1, max_replicas=4,
                    burst_after_seconds=BURST_AFTER_S)
    clock.run_until(lambda: serving(made) == 1, 120)
    filled = fill_home(principals["other"])
    Endpoint.objects.filter(pk=made.pk).update(synthetic_load={"base": 1.6, "peak": 1.6})
    clock.run_until(lambda: Endpoint.objects.get(pk=made.pk).home_hot_since is not None, 60)
    hot_since = Endpoint.objects.get(pk=made.pk).home_hot_since.timestamp()
    print(f"  us-east-1 full ({filled} GPUs held by other work) and hot since the autoscaler saw it; waiting "
          f"{BURST_AFTER_S} s")
    served = clock.run_until(lambda: serving(made, burst=True) >= 1, BURST_AFTER_S + 180)
    replica = made.replicas.filter(state="serving", burst=True).select_related("reservation__region").first()
    mark = hot_since + BURST_AFTER_S
    for d in made.decisions.order_by("at", "id"):
        when = d.at.timestamp() - mark
        print(f"    {when:+7.2f} s  {d.action:9s} {d.replicas_before}->{d.replicas_after}  {d.reason}")
    return {"home_gpus_filled": filled, "burst_region": replica.reservation.region.slug,
            "serving_after_burst_mark_s": round(replica.serving_since.timestamp() - (hot_since + BURST_AFTER_S), 2),
            "noticed_s": round(served - (hot_since + BURST_AFTER_S), 2)}


def main() -> None:
    setup_django(DB)
    principals = seed()
    rng = random.Random(39)  # noqa: S311 -- the phases, reproducible
    clock = Clock(Fleet(), Inline(), rng)
    print(f"two regions of 16 shared hosts; telemetry every {TELEMETRY_S:g} s, autoscaler every {AUTOSCALE_S:g} s, "
          "instant drivers")
    try:
        trials = []
        for number in range(TRIALS):
            trial = scale_out_trial(principals["serve"], clock, rng, number)
            trials.append(trial)
            print(f"  step {number + 1}: scale-out decided {trial['decision_s']} s after the step "
                  f"(to {trial['replicas_after']}), the new replica serving at {trial['serving_s']} s")
        burst = burst_run(principals, clock)
        print(f"  burst: a replica serving in {burst['burst_region']} {burst['serving_after_burst_mark_s']} s after "
              f"the {BURST_AFTER_S} s above 85 %")
    finally:
        drop_database(DB)
    decision = [t["decision_s"] for t in trials]
    serve = [t["serving_s"] for t in trials]
    result = {"bench": "autoscale", "telemetry_s": TELEMETRY_S, "autoscale_s": AUTOSCALE_S, "trials": trials,
              "decision_s_p50": percentile(decision, 50), "decision_s_max": max(decision),
              "serving_s_max": max(serve), "burst": burst,
              "autoscale_pass_ms_p50": round(percentile(clock.passes, 50), 1),
              "autoscale_pass_ms_p99": round(percentile(clock.passes, 99), 1), "burst_after_s": BURST_AFTER_S,
              "target_decision_s": TELEMETRY_S + CYCLE_S, "target_serving_s": 60.0,
              "target_ok": max(decision) <= TELEMETRY_S + CYCLE_S and max(serve) < 60
              and burst["serving_after_burst_mark_s"] < 60}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
