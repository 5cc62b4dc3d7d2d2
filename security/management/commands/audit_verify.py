"""Verify the audit chain and its signed checkpoints; name the first broken link."""

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from security.audit_chain import audit_seal, audit_verify


class Command(BaseCommand):
    help = "Recompute the audit hash chain and check every signed checkpoint (exit 1 when broken)."

    def add_arguments(self, parser):
        parser.add_argument("--seal", action="store_true", help="Seal what is waiting first.")
        parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
        parser.add_argument("--published", action="append", default=[], metavar="PATH",
                            help="More published heads to hold the chain to (a file, or a folder of *.jsonl "
                                 "files, e.g. copies from other hosts), besides MERIDIAN_AUDIT_HEAD_DIR.")

    def handle(self, *args, seal, json: bool, published, **options):
        if seal:
            while audit_seal():
                pass
        report = audit_verify(published=[Path(p) for p in published])
        if json:
            self.stdout.write(_dumps(report.as_dict()))
        else:
            head = report.published_head
            self.stdout.write(f"{report.events_checked} sealed events, {report.checkpoints_checked} checkpoints, "
                              f"{report.unsealed} waiting to be sealed; newest published head: "
                              f"{head['seq'] if head else 'none'}.")
            for warning in report.warnings:
                self.stderr.write(self.style.WARNING(warning))
        if not report.ok:
            raise CommandError(f"The audit chain is broken: {report.first_broken['reason']} "
                               f"({len(report.problems)} problem(s) in all).")
        if not json:
            self.stdout.write(self.style.SUCCESS("The audit chain is intact."))


def _dumps(value) -> str:
    return json.dumps(value, indent=2)
