"""Check that the ledger counts every allocation-second of a period exactly once (exit 1 when not)."""

from datetime import UTC, datetime, timedelta

from django.core.management.base import BaseCommand, CommandError

from billing.meter import hour_floor
from billing.models import MeterState
from billing.reconcile import reconcile


class Command(BaseCommand):
    help = "Check the usage ledger against the allocations of a period (default: the last 30 metered days)."

    def add_arguments(self, parser):
        parser.add_argument("--since", help="ISO date or time (UTC); default 30 days before --until")
        parser.add_argument("--until", help="ISO date or time (UTC); default where the meter is")

    def handle(self, *args, since=None, until=None, **options):
        state = MeterState.objects.filter(pk=1).first()
        end = _when(until) if until else (state.metered_until if state and state.metered_until else None)
        if end is None:
            raise CommandError("Nothing is metered yet: the meter runs every few minutes under the beat.")
        start = _when(since) if since else end - timedelta(days=30)
        problems = reconcile(start, end)
        for problem in problems[:50]:
            self.stdout.write(problem)
        if problems:
            raise CommandError(f"{len(problems)} difference(s) between the allocations and the ledger "
                               f"from {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC.")
        self.stdout.write(f"The ledger counts every allocation-second from {start:%Y-%m-%d %H:%M} to "
                          f"{end:%Y-%m-%d %H:%M} UTC exactly once.")


def _when(text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"'{text}' is not an ISO date or time (2026-11-01 or 2026-11-01T00:00).") from None
    return hour_floor(moment if moment.tzinfo else moment.replace(tzinfo=UTC))
