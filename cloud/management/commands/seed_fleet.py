"""Build a simulated fleet: ``manage.py seed_fleet --regions 1 --nodes 1280`` (the benchmark fleet)."""

import time

from django.core.management.base import BaseCommand, CommandError

from cloud.fleet import REGION_NAMES, FleetSpec, build_fleet


class Command(BaseCommand):
    help = "Create regions, InfiniBand fabrics (leaf switches of 32 nodes), nodes of 8 GPUs and spares."

    def add_arguments(self, parser):
        parser.add_argument("--regions", type=int, default=2, help="How many regions (default 2).")
        parser.add_argument("--nodes", type=int, default=64, help="Nodes per fabric (default 64).")
        parser.add_argument("--fabrics", type=int, default=1, help="Fabrics per region (default 1).")
        parser.add_argument("--spare-ratio", type=float, default=0.04, help="Share of bare-metal spares (0.04).")
        parser.add_argument("--shared-ratio", type=float, default=0.25,
                            help="Share of nodes that are shared hosts for VMs and containers (0.25).")
        parser.add_argument("--first-region", type=int, default=0, help="Index of the first region name to use.")

    def handle(self, *args, regions, nodes, fabrics, spare_ratio, shared_ratio, first_region, **options):
        if not 1 <= regions <= 64 or not 1 <= nodes <= 20_000 or not 1 <= fabrics <= 26:
            raise CommandError("--regions must be 1-64, --nodes 1-20000 and --fabrics 1-26.")
        if not (0 <= spare_ratio < 1 and 0 <= shared_ratio <= 1):
            raise CommandError("--spare-ratio must be in [0, 1) and --shared-ratio in [0, 1].")
        spec = FleetSpec(regions=regions, nodes_per_fabric=nodes, fabrics_per_region=fabrics,
                         spare_ratio=spare_ratio, shared_ratio=shared_ratio, first_region=first_region)
        started = time.perf_counter()
        report = build_fleet(spec, progress=lambda line: self.stdout.write(f"  built {line}"))
        elapsed = time.perf_counter() - started
        self.stdout.write(self.style.SUCCESS(
            f"Fleet: {report.regions} new regions, {report.fabrics} fabrics, {report.switches} switches, "
            f"{report.nodes} nodes, {report.gpus} GPUs in {elapsed:.1f} s "
            f"(region names start at {REGION_NAMES[first_region % len(REGION_NAMES)]})."
        ))
