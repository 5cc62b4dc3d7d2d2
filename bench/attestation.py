"""
How fast one core verifies a node's attestation evidence (security.attestation.verify): an
8-GPU node report, each GPU with a device certificate under a provisioning intermediate under a
trusted root (ECDSA P-384 throughout), checked against its nonce, the revocations, the reference
measurements and the node's GPUs. Pure Python and OpenSSL, no database.

  - warm: a ChainCache already holds the eight chains, as it does for a node that attests every
    few minutes; each report still costs eight evidence signatures;
  - cold: no cache, so each report also parses and verifies sixteen certificate links.

Target: at least 100 node reports a second warm, on one core. Reports a second are given from
wall time and from the process's CPU time; the target is judged on CPU time, which is what one
core spends and which other work on a shared machine does not inflate (the wall figure is there to
show how busy the machine was).

    .venv/bin/python bench/attestation.py [--warm-runs 1000] [--cold-runs 200]

It prints readable lines and one final ``RESULT {json}`` line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from security.attestation import ChainCache, NodeEvidence, NonceRecord, verify  # noqa: E402
from security.device_pki import (  # noqa: E402
    cert_to_pem,
    make_device,
    make_intermediate,
    make_root,
    reference_measurements,
    sign_gpu_evidence,
)

TARGET_REPORTS_PER_S = 100.0
GPUS = 8
MODEL, VBIOS, DRIVER = "h100-sxm", "96.00.89.00.01", "550.54.15"
NONCE = "5e" * 32
REVOCATIONS = 1000  # a realistic CRL: lookups must not grow with it


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def scenario(now: datetime) -> tuple[NodeEvidence, dict]:
    """One honest 8-GPU report and everything verify() checks it against."""
    root_key, root = make_root("Bench Device Root")
    inter_key, inter = make_intermediate(root_key, root, "Bench Device Provisioner")
    reference = reference_measurements(MODEL, VBIOS, DRIVER)
    gpus, owned = [], {}
    for index in range(GPUS):
        uuid, serial = f"GPU-{index:08x}-0000-4000-8000-000000000000", f"1650124{index:06d}"
        key, cert = make_device(inter_key, inter, gpu_uuid=uuid, serial=serial)
        gpus.append(sign_gpu_evidence(key, [cert_to_pem(cert), cert_to_pem(inter)], uuid=uuid, serial=serial,
                                      gpu_model=MODEL, vbios=VBIOS, driver=DRIVER, measurements=reference,
                                      nonce=NONCE, generated_at=int(now.timestamp()) - 1))
        owned[uuid] = (serial, MODEL)
    context = {
        "nonce": NonceRecord(NONCE, now - timedelta(seconds=5), now + timedelta(seconds=60), used=False),
        "roots": [root],
        "revoked": {(inter.subject.rfc4514_string(), serial) for serial in range(1, REVOCATIONS + 1)},
        "references": {(MODEL, VBIOS, DRIVER): reference},
        "node_gpus": owned,
        "now": now,
    }
    return NodeEvidence(node="bench-node-01", nonce=NONCE, gpus=gpus), context


def measure(evidence: NodeEvidence, context: dict, runs: int, cache_for_run) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each verification; ``cache_for_run`` gives the cache to use."""
    wall_ms, cpu_ms = [], []
    for _ in range(runs):
        cache = cache_for_run()
        started, cpu_started = time.perf_counter(), time.process_time()
        verdict = verify(evidence, cache=cache, **context)
        wall_ms.append((time.perf_counter() - started) * 1000)
        cpu_ms.append((time.process_time() - cpu_started) * 1000)
        assert verdict.status == "pass", verdict.reasons
    return wall_ms, cpu_ms


def summary(name: str, wall_ms: list[float], cpu_ms: list[float]) -> dict:
    per_second = 1000 * len(wall_ms) / sum(wall_ms)
    cpu_per_second = 1000 * len(cpu_ms) / max(sum(cpu_ms), 1e-9)
    p50, p99 = percentile(wall_ms, 50), percentile(wall_ms, 99)
    cpu_p50, cpu_p99 = percentile(cpu_ms, 50), percentile(cpu_ms, 99)
    print(f"{name}: {cpu_per_second:.0f} reports/s of one core's CPU time ({cpu_per_second * GPUS:.0f} GPUs/s), "
          f"CPU p50 {cpu_p50:.2f} ms, p99 {cpu_p99:.2f} ms per {GPUS}-GPU report; wall clock {per_second:.0f} "
          f"reports/s, p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    return {"cpu_reports_per_s": round(cpu_per_second, 1), "cpu_p50_ms": round(cpu_p50, 3),
            "cpu_p99_ms": round(cpu_p99, 3), "reports_per_s": round(per_second, 1), "p50_ms": round(p50, 3),
            "p99_ms": round(p99, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--warm-runs", type=int, default=1000)
    parser.add_argument("--cold-runs", type=int, default=200)
    args = parser.parse_args()

    evidence, context = scenario(datetime.now(UTC))
    shared = ChainCache()
    measure(evidence, context, 5, lambda: shared)  # fills the cache and pays first-call costs
    warm = summary("warm (chains cached)", *measure(evidence, context, args.warm_runs, lambda: shared))
    cold = summary("cold (no cache)", *measure(evidence, context, args.cold_runs, lambda: None))
    assert shared.misses == GPUS, "the warm runs should never have missed the cache"

    result = {"bench": "attestation", "gpus_per_report": GPUS, "warm_runs": args.warm_runs,
              "cold_runs": args.cold_runs, "warm": warm, "cold": cold,
              "speedup": round(warm["cpu_reports_per_s"] / cold["cpu_reports_per_s"], 2),
              "target_reports_per_s": TARGET_REPORTS_PER_S,
              "meets_target": warm["cpu_reports_per_s"] >= TARGET_REPORTS_PER_S}
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
