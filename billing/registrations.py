"""What billing tells the apps below it (which may not import billing): provisioning asks before admitting work."""

from __future__ import annotations

from billing.budgets import budget_stop
from billing.spot import spot_admission
from provisioning.admission import admission_check


def register() -> None:
    admission_check(budget_stop)
    admission_check(spot_admission)
