"""
The `meridian` CLI against a live server: login stores a 0600 profile; reserve --wait follows the
reservation to active (plain lines when not on a terminal); ls, show, score, release; -o json and
yaml; documented exit codes; `skypilot pool` writes an SSH Node Pool SkyPilot reads.
"""

from __future__ import annotations

import json
import stat

import pytest
import yaml
from click.testing import CliRunner
from meridian import resources
from meridian.cli import main

from tests.world import small_fleet, vm_offering

pytestmark = pytest.mark.django_db(transaction=True)
NO_SUCH = "00000000-0000-0000-0000-000000000000"


@pytest.fixture
def run(live_server, world, tmp_path, monkeypatch):
    monkeypatch.setenv("MERIDIAN_CONFIG", str(tmp_path / "profiles.json"))
    monkeypatch.delenv("MERIDIAN_URL", raising=False)
    monkeypatch.delenv("MERIDIAN_TOKEN", raising=False)
    runner = CliRunner()

    def invoke(*args, persona="t1_member"):
        env = {"MERIDIAN_URL": live_server.url, "MERIDIAN_TOKEN": world.tokens[persona] if persona else ""}
        return runner.invoke(main, list(args), env=env, catch_exceptions=False)
    return invoke


def test_login_checks_the_token_and_keeps_it_readable_by_its_owner_only(live_server, world, tmp_path, monkeypatch):
    monkeypatch.setenv("MERIDIAN_CONFIG", str(tmp_path / "meridian" / "profiles.json"))
    done = CliRunner().invoke(main, ["login", "--url", live_server.url, "--token", world.tokens["t1_owner"]])
    assert done.exit_code == 0, done.output
    path = tmp_path / "meridian" / "profiles.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text())["default"]["token"] == world.tokens["t1_owner"]
    refused = CliRunner().invoke(main, ["login", "--url", live_server.url, "--token", "mrd_nonsense"])
    assert refused.exit_code == 4 and "Error:" in refused.output


def test_reserve_wait_ls_show_score_release_and_a_skypilot_pool(run, steps, monkeypatch, tmp_path):
    small_fleet(4)
    monkeypatch.setattr(resources.time, "sleep", lambda s: steps.run())  # the pipeline moves while the CLI polls
    made = run("reserve", "cli-train", "--offering", vm_offering().slug, "--gpus", "1", "--region", "us-east-1",
               "--hours", "2", "--wait", "-o", "json")
    assert made.exit_code == 0, made.output
    reservation = json.loads(made.stdout)
    assert reservation["state"] == "active"
    lines = made.stderr.splitlines()  # not a terminal: plain lines instead of a progress bar
    assert "cli-train: scheduled" in lines[0] and lines[-1].endswith("cli-train: active 100%")
    listed = run("ls", "--state", "active", "-o", "yaml")
    assert [r["id"] for r in yaml.safe_load(listed.output)] == [reservation["id"]]
    shown = run("show", reservation["id"], "-o", "json")
    assert json.loads(shown.output)["instances"][0]["ssh"].startswith("ssh ")
    assert "factors" in json.loads(run("score", reservation["id"], "-o", "json").output)
    assert run("ssh", reservation["id"], "--print").output.startswith("ssh ")
    pools = tmp_path / "sky" / "ssh_node_pools.yaml"
    pools.parent.mkdir()
    pools.write_text(yaml.safe_dump({"on-prem": {"hosts": ["10.0.0.1"]}}))
    written = run("skypilot", "pool", reservation["id"], "--file", str(pools), "--identity-file", "~/.ssh/meridian")
    assert written.exit_code == 0 and "sky ssh up --infra cli-train" in written.output
    assert_ssh_node_pools(yaml.safe_load(pools.read_text()))
    assert set(yaml.safe_load(pools.read_text())) == {"on-prem", "cli-train"}
    released = run("release", reservation["id"], "-o", "json")
    assert json.loads(released.output)["state"] == "releasing"
    table = run("ls")
    assert "cli-train" in table.output and "releasing" in table.output


def assert_ssh_node_pools(pools: dict) -> None:
    """SkyPilot's documented ~/.sky/ssh_node_pools.yaml: pool -> hosts (address or ip/user/identity_file/password)."""
    allowed_pool, allowed_host = {"hosts", "user", "identity_file", "password"}, {"ip", "user", "identity_file",
                                                                                  "password"}
    for name, pool in pools.items():
        assert isinstance(name, str) and isinstance(pool, dict) and set(pool) <= allowed_pool, pool
        assert isinstance(pool["hosts"], list) and pool["hosts"]
        for host in pool["hosts"]:
            assert isinstance(host, str) or (isinstance(host, dict) and set(host) <= allowed_host and "ip" in host)


def test_exit_codes_scripts_can_rely_on(run):
    assert run("show", NO_SUCH).exit_code == 3
    bad = run("reserve", "x", "--offering", vm_offering().slug, "--gpus", "0", "--region", "us-east-1",
              "--hours", "1")
    assert bad.exit_code == 1 and "[min_value]" in bad.output and "gpus" in bad.output
    assert run("ls", persona=None).exit_code == 4
    assert run("reserve", "x").exit_code == 2  # usage: missing options
    assert run("cancel", NO_SUCH).exit_code == 3


def test_endpoint_create_ls_scale_decisions_and_rm(run, settings, tmp_path):
    settings.MERIDIAN_BALANCER_CONFIG = str(tmp_path / "haproxy.cfg")
    small_fleet(4)
    vm_offering()
    made = run("endpoint", "create", "chat", "--gpu-model", "h100-80gb-sxm", "--region", "us-east-1", "--max", "3",
               "-o", "json")
    assert made.exit_code == 0, made.output
    endpoint = json.loads(made.stdout)
    assert endpoint["url"].startswith("https://chat--") and endpoint["max_replicas"] == 3
    listed = run("endpoint", "ls", "-o", "yaml")
    assert [e["name"] for e in yaml.safe_load(listed.output)] == ["chat"]
    scaled = run("endpoint", "scale", endpoint["id"], "--max", "6", "--target", "60", "-o", "json")
    assert json.loads(scaled.stdout)["max_replicas"] == 6 and json.loads(scaled.stdout)["target_utilization"] == 60
    assert run("endpoint", "decisions", endpoint["id"], "-o", "json").exit_code == 0
    refused = run("endpoint", "create", "bad", "--gpu-model", "h100-80gb-sxm", "--region", "us-east-1",
                  "--min", "5", "--max", "2")
    assert refused.exit_code == 1 and "min_over_max" in refused.output
    gone = run("endpoint", "rm", endpoint["id"])
    assert gone.exit_code == 0 and "draining" in gone.output
    assert run("endpoint", "show", NO_SUCH).exit_code == 3
