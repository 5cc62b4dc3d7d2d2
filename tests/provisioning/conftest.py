"""Fixtures of the provisioning tests."""

import pytest

from provisioning import lifecycle
from tests.provisioning.pipeline import Steps


@pytest.fixture
def steps(monkeypatch) -> Steps:
    """The lifecycle's tasks, collected and run here in order (``steps.run()``) instead of by Celery."""
    collected = Steps()
    monkeypatch.setattr(lifecycle, "_enqueue", collected.enqueue)
    monkeypatch.setattr(lifecycle, "provision_when_due", collected.when_due)
    return collected
