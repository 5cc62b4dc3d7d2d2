"""Billing's Celery tasks: thin wrappers around billing.meter."""

from celery import shared_task


@shared_task(name="billing.meter")
def meter() -> dict:
    """Meter the windows that closed since the last run, record corrections of recent ones, tell budgets crossed."""
    from billing.budgets import budgets_check
    from billing.meter import meter_recheck, meter_run

    done = meter_run()
    done["corrections"] = meter_recheck()
    done["budget_notices"] = budgets_check()
    return done


@shared_task(name="billing.invoices_close")
def invoices_close() -> dict:
    """Finalize last month's invoices once the month is metered (daily; a month closed already stays as it is)."""
    from datetime import timedelta

    from django.utils import timezone

    from billing.invoices import close_month, month_bounds
    from core.errors import Conflict

    this_month, _ = month_bounds(timezone.now())
    try:
        return close_month(this_month - timedelta(days=1))
    except Conflict as exc:  # not metered yet: tomorrow's pass closes it
        return {"waiting": str(exc)}


@shared_task(name="billing.spot_update")
def spot_update() -> dict:
    """Set the spot prices from how much is held, evict spot work priced out, prune old history."""
    from billing.spot import history_prune
    from billing.spot import spot_update as update

    done = update()
    done["pruned"] = history_prune()
    return done
