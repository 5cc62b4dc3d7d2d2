"""
In CI, the browser, libvirt, HAProxy, NVIDIA-sample and promtool tests must run, not skip: with
MERIDIAN_REQUIRE_ALL=1 (set by .ci/run) a skip of a test that uses the ``chromium``, ``hypervisor``,
``haproxy``, ``nvidia_samples_dir`` or ``promtool`` fixture -- Chromium, libvirt-python, HAProxy or
promtool missing, NVIDIA's samples not downloadable, or any other reason -- is reported as a failure
saying why.
A developer's machine without them still runs the rest of the suite, the skips shown as skips.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ALL = "MERIDIAN_REQUIRE_ALL"
REQUIRED_FIXTURES = frozenset({"chromium", "hypervisor", "haproxy", "nvidia_samples_dir", "promtool"})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get(REQUIRE_ALL) != "1":
        return
    needs = sorted(REQUIRED_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if needs:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} needs {', '.join(needs)} and was skipped ({reason}); "
                           f"with {REQUIRE_ALL}=1 (CI) it must run.")
