"""Billing's Celery tasks: thin wrappers around billing.meter."""

from celery import shared_task


@shared_task(name="billing.meter")
def meter() -> dict:
    """Meter the windows that closed since the last run, then record corrections of recent ones."""
    from billing.meter import meter_recheck, meter_run

    done = meter_run()
    done["corrections"] = meter_recheck()
    return done
