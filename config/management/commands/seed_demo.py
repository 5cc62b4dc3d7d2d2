"""Seed the demo world (first run only): fleet, offerings, two tenants, demo users."""

from django.core.management.base import BaseCommand

from config.demo import DEMO_PASSWORD, DEMO_USERS, seed_demo


class Command(BaseCommand):
    help = "Seed a small simulated fleet and two demo tenants with users, unless already seeded."

    def add_arguments(self, parser):
        parser.add_argument("--regions", type=int, default=2)
        parser.add_argument("--nodes", type=int, default=64, help="Nodes per fabric.")

    def handle(self, *args, regions, nodes, **options):
        if seed_demo(regions=regions, nodes=nodes, progress=lambda line: self.stdout.write(f"  built {line}")):
            self.stdout.write(self.style.SUCCESS("Demo world seeded."))
        else:
            self.stdout.write("Demo world already present; kept as it is.")
        for email, *_ in DEMO_USERS:
            self.stdout.write(f"  {email} / {DEMO_PASSWORD}")
