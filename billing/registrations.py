"""What billing tells the apps below it (which may not import billing): admission checks, and the prices that apply."""

from __future__ import annotations

from billing.budgets import budget_stop
from billing.prices import prices_now
from billing.spot import spot_admission
from cloud.pricing import price_source
from provisioning.admission import admission_check


def register() -> None:
    admission_check(budget_stop)
    admission_check(spot_admission)
    price_source(prices_now)
