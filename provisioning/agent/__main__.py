"""
``python -m provisioning.agent``: run one node's agent. ``--nvml real`` reads the host's GPUs
through pynvml (nvidia-ml-py) and polices them by their processes' cgroups; ``--nvml simulated``
(the default) makes ``--gpus`` simulated ones.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import threading
import uuid
from pathlib import Path

from provisioning.agent.agent import Agent, ControlPlane, simulated_host
from provisioning.agent.attester import NvidiaAttester
from provisioning.agent.guest import GuestReporter
from provisioning.agent.nvml import RealNVML, SimulatedGPU, SimulatedNVML
from provisioning.agent.ports import SimulatedPorts, SysfsPorts
from provisioning.agent.topology import simulated_layout


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m provisioning.agent", description=__doc__)
    parser.add_argument("--url", help="The control plane, e.g. https://meridian.example (a node's agent).")
    parser.add_argument("--key-id", help="This node's key id (nk_...), from enrolment (a node's agent).")
    parser.add_argument("--secret-file", type=Path, help="A file holding this node's secret (a node's agent).")
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        help="Seconds between turns until the control plane says otherwise (10).",
    )
    parser.add_argument(
        "--nvml",
        choices=["simulated", "real"],
        default="simulated",
        help="The NVML backend: simulated GPUs, or the host's through pynvml.",
    )
    parser.add_argument(
        "--scrub-command",
        default="",
        help='How a real GPU is cleared between tenants, {index} its index, e.g. "nvidia-smi --gpu-reset -i {index}".',
    )
    parser.add_argument(
        "--mig-command", default="", help="How a real GPU is cut into a MIG layout, {index} and {layout} filled in."
    )
    parser.add_argument(
        "--time-slice-command", default="",
        help='How a real GPU is put on a time slice, {index} and {level} (1 short, 2 medium, 3 long) or {ms} '
             'filled in, e.g. "nvidia-smi compute-policy -i {index} --set-timeslice={level}".',
    )
    parser.add_argument(
        "--slot-scrub-command", default="",
        help="How one tenant's slot of a shared GPU is cleared without a reset, {index}, {mem_lo} and {mem_hi} "
             '(MiB) filled in, e.g. "/usr/local/bin/gpu-slot-scrub --gpu {index} --from-mib {mem_lo} --to-mib '
             '{mem_hi}" (a CUDA program that writes and reads back the range).',
    )
    parser.add_argument(
        "--stress-command", default="",
        help='The acceptance stress step of GPU {index}; it prints {"stress_tflops": ..., "memtest_errors": ...} '
             '(e.g. a wrapper around "dcgmi diag -r 3 -i {index}").',
    )
    parser.add_argument(
        "--fabric-test-command", default="",
        help='The acceptance fabric step; it prints {"nccl_busbw_gbs": ..., "ib_bandwidth_gbps": ...} (e.g. a '
             "wrapper running NCCL's all_reduce_perf across the leaf and ib_write_bw to a neighbour).",
    )
    parser.add_argument(
        "--guest", type=Path, default=None, metavar="CONFIG",
        help="Run as the in-guest agent of a VM or bare-metal server: post its GPUs' telemetry to the URL in "
             "CONFIG (/etc/meridian/guest-agent.json, written by the instance's config drive).",
    )
    parser.add_argument("--gpus", type=int, default=8, help="Simulated GPUs (the simulated NVML backend).")
    parser.add_argument("--memory-mib", type=int, default=81920, help="Memory of each simulated GPU (81920).")
    parser.add_argument(
        "--gpu-uuid", action="append", default=[], help="UUIDs of the simulated GPUs, in index order (as enrolled)."
    )
    parser.add_argument(
        "--port-guid",
        action="append",
        default=[],
        help="GUIDs of the simulated InfiniBand ports (as enrolled); real hosts read /sys.",
    )
    args = parser.parse_args(argv)
    if args.guest is None and not (args.url and args.key_id and args.secret_file):
        parser.error("a node's agent needs --url, --key-id and --secret-file (or run --guest CONFIG in an instance)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    host = {}
    if args.nvml == "real":
        nvml = RealNVML()
        host = {
            "attester": NvidiaAttester(nvml),
            "scrub_command": shlex.split(args.scrub_command) or None,
            "mig_command": shlex.split(args.mig_command) or None,
            "time_slice_command": shlex.split(args.time_slice_command) or None,
            "slot_scrub_command": shlex.split(args.slot_scrub_command) or None,
            "stress_command": shlex.split(args.stress_command) or None,
            "fabric_test_command": shlex.split(args.fabric_test_command) or None,
            "ports": SysfsPorts(),
        }
    else:
        uuids = args.gpu_uuid or [f"GPU-{uuid.uuid4()}" for _ in range(args.gpus)]
        layout = simulated_layout(len(uuids))  # an HGX board for 8 GPUs, PCIe cards for 4 (agent.topology)
        nvml = SimulatedNVML([SimulatedGPU(index=i, uuid=u, memory_mib=args.memory_mib, topology=layout[i])
                              for i, u in enumerate(uuids)])
        host = dict(zip(("process_owner", "kill"), simulated_host(nvml), strict=True))
        host["ports"] = SimulatedPorts(args.port_guid) if args.port_guid else None
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    if args.guest is not None:
        GuestReporter(nvml, args.guest).run(interval=args.interval, stop=stopping.is_set)
        return
    secret = args.secret_file.read_text().strip()
    Agent(ControlPlane(args.url, args.key_id, secret), nvml, **host).run(interval=args.interval, stop=stopping.is_set)


if __name__ == "__main__":
    main()
