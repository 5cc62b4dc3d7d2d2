"""Fixtures of the provisioning tests."""

import pytest

from provisioning import lifecycle
from tests.provisioning.pipeline import Steps


@pytest.fixture
def steps(monkeypatch, settings) -> Steps:
    """
    The lifecycle's tasks, collected and run here in order (``steps.run()``) instead of by Celery,
    one step per task (tests of chained steps turn MERIDIAN_STEP_CHAIN_SECONDS back on).
    """
    settings.MERIDIAN_STEP_CHAIN_SECONDS = 0
    collected = Steps()
    monkeypatch.setattr(lifecycle, "_enqueue", collected.enqueue)
    monkeypatch.setattr(lifecycle, "provision_when_due", collected.when_due)
    return collected
