"""
Tests that must not pass by checking less: in CI (MERIDIAN_REQUIRE_ALL=1) a skipped browser or
libvirt test fails the run (tests/ci_required.py), and the browser tests fail on a missing page.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

SKIPPING = '''
import pytest


@pytest.fixture
def hypervisor():
    pytest.skip("libvirt-python is not installed")


@pytest.fixture
def chromium():
    pytest.skip("/usr/bin/chromium is not installed")


def test_a_vm(hypervisor):
    pass


def test_a_page(chromium):
    pass


def test_something_else():
    pytest.skip("not a browser or libvirt test")
'''


def run_pytest(tmp_path, **env) -> subprocess.CompletedProcess:
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:django", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-p", "tests.ci_required", "-c", os.devnull, "--rootdir", str(tmp_path), "-rA", str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env}, capture_output=True, text=True, timeout=120,
    )


def test_in_ci_a_skipped_browser_or_libvirt_test_fails_the_run(tmp_path):
    result = run_pytest(tmp_path, MERIDIAN_REQUIRE_ALL="1")
    assert result.returncode == 1, result.stdout
    assert "1 skipped, 2 errors" in result.stdout  # a skip in setup, turned into a failure, is an error
    assert "test_a_vm needs hypervisor and was skipped (Skipped: libvirt-python is not installed)" in result.stdout
    assert "test_a_page needs chromium and was skipped" in result.stdout


def test_elsewhere_they_are_skipped_as_usual(tmp_path):
    result = run_pytest(tmp_path, MERIDIAN_REQUIRE_ALL="0")
    assert result.returncode == 0, result.stdout
    assert "3 skipped" in result.stdout


def test_the_ci_script_requires_them():
    assert "MERIDIAN_REQUIRE_ALL=1" in (REPO / ".ci" / "run").read_text()


def test_a_missing_console_page_fails_the_page_tests():
    from tests.browser.pages import require_pages

    require_pages(["/reservations/", "/staff/fleet/"])
    with pytest.raises(pytest.fail.Exception, match="no page at /no-such-page/"):
        require_pages(["/reservations/", "/no-such-page/"])
