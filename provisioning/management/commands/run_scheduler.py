"""``manage.py run_scheduler``: the scheduler loop. One process leads; standbys wait their turn."""

import gc
import logging
import signal
import time

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import connection

from cloud.leader import LeaderLock
from provisioning.scheduling.scheduler import LoopMemory, run_cycle

log = logging.getLogger("provisioning.scheduling.scheduler")


class Command(BaseCommand):
    help = ("Run the scheduler: every interval, rank the queue, plan and apply (leader only); at once again "
            "while cycles are cut short by their budget with work left.")

    def add_arguments(self, parser):
        parser.add_argument("--interval", type=float, default=None, help="Seconds between cycles (0.5).")
        parser.add_argument("--once", action="store_true", help="Run one cycle if leader, then exit.")

    def handle(self, *args, interval, once, **options):
        interval = interval if interval is not None else settings.MERIDIAN_SCHEDULER_INTERVAL
        stopping = []
        handlers = {sig: signal.signal(sig, lambda *_: stopping.append(True))
                    for sig in (signal.SIGINT, signal.SIGTERM)}
        lock = LeaderLock("scheduler")
        memory = LoopMemory.for_loop()
        leading = None  # neither yet: the first turn says which
        # Cycles pause the collector (provisioning.scheduling.scheduler.collector_paused); between them it
        # need not walk the long-lived objects of the process again and again.
        gc.freeze()
        try:
            while not stopping:
                started = time.monotonic()
                backlog = False
                try:
                    if lock.acquire():
                        if not leading:
                            log.info("Leading the scheduler.")
                            memory = LoopMemory.for_loop()  # another leader moved things
                            memory.prime()
                            leading = True  # only once primed: a failed priming is tried again
                        report = run_cycle(memory=memory, leader=lock.holder)
                        if report.placed or report.conflicts:
                            log.info("cycle: %s", report.as_dict())
                        # A budget that cut the cycle short keeps it short, not the queue waiting:
                        # the next cycle starts at once while cycles place work (one whose placements
                        # were all refused waits, so a standing conflict cannot spin the loop).
                        backlog = report.cut_short and report.placed > 0
                    elif leading is not False or once:
                        log.info("Standing by: another scheduler leads.")
                        leading = False
                except Exception:
                    # One bad cycle must not stop scheduling: log it, drop the (maybe broken)
                    # connection -- the lock is re-checked on the next one -- and go on.
                    log.exception("Scheduler cycle failed; retrying after a pause.")
                    connection.close()
                    leading = False  # the next turn starts from a fresh memory, primed again
                    time.sleep(min(5.0, interval * 4))
                if once:
                    break
                if not backlog:
                    time.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:
            lock.release()
            gc.unfreeze()
            for sig, handler in handlers.items():  # called in-process (tests), leave the caller's as they were
                signal.signal(sig, handler)
