"""
``meridian``: the command line on the SDK (docs/cli.md). Every read takes ``-o table|json|yaml``.
Exit codes (for scripts): 0 done; 1 refused by the API (400, 409 and the like); 2 a usage error;
3 not found; 4 not signed in or not allowed (401, 403); 5 Meridian unreachable or unavailable;
6 a ``--wait`` that timed out or saw the reservation end otherwise.
Shell completion: ``eval "$(_MERIDIAN_COMPLETE=bash_source meridian)"`` (zsh_source, fish_source).
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from meridian import errors
from meridian.client import Client
from meridian.config import profile_save
from meridian.output import FORMATS, show
from meridian.skypilot import DEFAULT_PATH, pool_entry, pool_write

EXIT = {errors.NotFound: 3, errors.Unauthorized: 4, errors.Forbidden: 4, errors.Unreachable: 5,
        errors.Unavailable: 5}
RESERVATION_COLUMNS = ["id", "name", "state", "offering", "gpus", "region", "starts_at", "ends_at"]
output = click.option("-o", "--output", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
                      help="How to show what was read.")


class CLI(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except errors.MeridianError as exc:
            click.echo(f"Error: {exc.detail or exc.code} [{exc.code}]" + (f" (field: {exc.attr})" if exc.attr else ""),
                       err=True)
            ctx.exit(EXIT.get(type(exc), 5 if exc.status >= 500 else 1))
        except ValueError as exc:  # no URL configured, and such
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(2)


@click.group(cls=CLI)
@click.option("--profile", envvar="MERIDIAN_PROFILE", default=None, help="The profile of `meridian login` to use.")
@click.pass_context
def main(ctx, profile):
    """Meridian GPU cloud: reserve GPUs, watch them come up, log in, automate."""
    ctx.obj = {"profile": profile}


def client(ctx) -> Client:
    if "client" not in ctx.obj:
        ctx.obj["client"] = Client(profile=ctx.obj["profile"])
    return ctx.obj["client"]


@main.command()
@click.option("--url", required=True, help="Meridian's address, e.g. https://meridian.example.com")
@click.option("--token", prompt=True, hide_input=True, help="An API token (console: API tokens).")
@click.option("--tenant", default=None, help="The tenant's slug, when the token's user is in several.")
@click.option("--name", "profile_name", default="default", show_default=True, help="The profile's name.")
def login(url, token, tenant, profile_name):
    """Check the token and store it as a profile (its file readable by you only)."""
    me = Client(url, token=token, tenant=tenant).me()
    path = profile_save(profile_name, url=url, token=token, tenant=tenant)
    click.echo(f"Signed in as {me.get('email', '?')}; profile '{profile_name}' saved in {path}.")


@main.command()
@output
@click.pass_context
def offerings(ctx, fmt):
    """The catalogue: offerings, their prices now and what is free per region."""
    rows = list(client(ctx).offerings.list(is_active=True))
    if fmt == "table":
        rows = [{"slug": o["slug"], "name": o["name"], "kind": o["kind"], "gpus_per_unit": o["gpus_per_unit"],
                 **{f"{term}/GPU-h": price for term, price in (o.get("prices") or {}).items()},
                 "free": ", ".join(f"{a['region']}: {a['units']}" for a in o.get("availability", []))} for o in rows]
    show(rows, fmt)


@main.command()
@click.argument("name")
@click.option("--offering", required=True, help="An offering's slug (see `meridian offerings`).")
@click.option("--gpus", type=int, help="Whole GPUs (VMs and containers).")
@click.option("--nodes", type=int, help="Whole nodes (bare metal).")
@click.option("--slots", type=int, help="GPU slots (fractional offerings).")
@click.option("--region", "regions", multiple=True, required=True, help="Acceptable regions, preferred first.")
@click.option("--hours", type=float, required=True, help="How long.")
@click.option("--start", default=None, help="An advance reservation's start (ISO 8601); now when left out.")
@click.option("--term", type=click.Choice(["on_demand", "reserved", "spot"]), default="on_demand", show_default=True)
@click.option("--max-price", default=None, help="Spot: the most to pay per GPU-hour, e.g. 1.80.")
@click.option("--ssh-key-file", type=click.Path(exists=True, dir_okay=False), help="A public key for the instances.")
@click.option("--public-ip", is_flag=True, help="Give each instance a public address too.")
@click.option("--team", default=None, help="The team's id to book for.")
@click.option("--wait", is_flag=True, help="Wait until it is active, showing its progress.")
@click.option("--timeout", type=float, default=3600, show_default=True, help="Seconds --wait waits.")
@output
@click.pass_context
def reserve(ctx, name, offering, gpus, nodes, slots, regions, hours, start, term, max_price, ssh_key_file, public_ip,
            team, wait, timeout, fmt):
    """Reserve GPUs: placed at once when they are free, else queued (its place and ETA shown)."""
    body = {"name": name, "offering": offering, "regions": list(regions), "duration_hours": hours,
            "billing_term": term, "public_ip": public_ip}
    for key, value in {"gpus": gpus, "nodes": nodes, "slots": slots, "start": start, "spot_max_price": max_price,
                       "team": team}.items():
        if value is not None:
            body[key] = value
    if ssh_key_file:
        body["ssh_public_key"] = Path(ssh_key_file).read_text().strip()
    made = client(ctx).reservations.create(**body)
    if not wait:
        show(made, fmt)
        return
    show(watch(ctx, made, timeout), fmt)


def watch(ctx, reservation: dict, timeout: float) -> dict:
    """Follow a reservation to active: a progress bar on a terminal, plain lines otherwise."""
    api, tty = client(ctx), sys.stderr.isatty()
    console = Console(stderr=True)
    lines: list[str] = []

    def say(text: str) -> None:
        if not lines or lines[-1] != text:
            lines.append(text)
            if not tty:
                click.echo(text, err=True)

    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                        TimeElapsedColumn(), console=console, disable=not tty, transient=True)
    with progress:
        task = progress.add_task(f"{reservation['name']}: {reservation['state']}", total=100)

        def changed(current: dict) -> None:
            state, extra, done = current["state"], "", 0
            if state == "queued":
                score = api.reservations.score(current["id"])
                extra = (f" (#{score.get('queue_position') or '?'} in the queue, about "
                         f"{score.get('estimated_start') or 'unknown'})")
            elif state in ("scheduled", "provisioning"):
                operation = next(iter(api.operations.list(reservation=current["id"], kind="provision")), None)
                if operation:
                    done = operation.get("progress") or 0
                    extra = f" ({operation.get('step') or 'starting'})"
            elif state == "active":
                done = 100
            progress.update(task, description=f"{current['name']}: {state}{extra}", completed=done)
            say(f"{time.strftime('%H:%M:%S')} {current['name']}: {state}{extra} {done}%")

        try:
            return api.reservations.wait_until(reservation["id"], "active", timeout_s=timeout, poll_s=2.0,
                                               on_change=changed)
        except (TimeoutError, RuntimeError) as exc:
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(6)


@main.command("ls")
@click.option("--state", default=None, help="Only reservations in this state.")
@output
@click.pass_context
def list_reservations(ctx, state, fmt):
    """Your reservations, newest first."""
    show(list(client(ctx).reservations.list(state=state)), fmt, RESERVATION_COLUMNS)


@main.command("show")
@click.argument("reservation")
@output
@click.pass_context
def show_reservation(ctx, reservation, fmt):
    """One reservation, with its instances."""
    api = client(ctx)
    found = api.reservations.get(reservation)
    found["instances"] = [{"index": i["index"], "name": i["name"], "state": i["state"], "ssh": i["ssh_command"]}
                          for i in api.instances.list(reservation=reservation)]
    show(found, fmt)


@main.command()
@click.argument("reservation")
@output
@click.pass_context
def score(ctx, reservation, fmt):
    """Its priority score, factor by factor, its place in the queue and its estimated start."""
    show(client(ctx).reservations.score(reservation), fmt)


@main.command()
@click.argument("reservation")
@click.option("--hours", type=float, required=True, help="How much longer.")
@output
@click.pass_context
def extend(ctx, reservation, hours, fmt):
    """Make a reservation longer (when the GPUs are free after it)."""
    show(client(ctx).reservations.extend(reservation, hours=hours), fmt)


@main.command()
@click.argument("reservation")
@output
@click.pass_context
def release(ctx, reservation, fmt):
    """Release a reservation early: its GPUs are free from now."""
    show(client(ctx).reservations.release(reservation), fmt, RESERVATION_COLUMNS)


@main.command()
@click.argument("reservation")
@output
@click.pass_context
def cancel(ctx, reservation, fmt):
    """Cancel a reservation that is not active yet."""
    show(client(ctx).reservations.cancel(reservation), fmt, RESERVATION_COLUMNS)


@main.command()
@click.argument("reservation")
@click.argument("index", type=int, default=0)
@click.option("--print", "print_only", is_flag=True, help="Print the command instead of running it.")
@click.pass_context
def ssh(ctx, reservation, index, print_only):
    """Log in to an instance of a reservation (the first unless INDEX says)."""
    instances = {i["index"]: i for i in client(ctx).instances.list(reservation=reservation)}
    instance = instances.get(index)
    if instance is None or not instance.get("ssh_command"):
        click.echo(f"Error: instance {index} of {reservation} cannot be logged in to yet "
                   f"({instance['state'] if instance else 'no such instance'}).", err=True)
        ctx.exit(1)
    if print_only:
        click.echo(instance["ssh_command"])
        return
    command = shlex.split(instance["ssh_command"])
    os.execvp(command[0], command)  # noqa: S606 -- the instance's ssh command, run in this process's place


@main.group()
def vpc():
    """InfiniBand VPCs."""


@vpc.command("ls")
@output
@click.pass_context
def vpc_list(ctx, fmt):
    show(list(client(ctx).vpcs.list()), fmt, ["id", "name", "state", "region", "team", "created_at"])


@vpc.command("create")
@click.argument("name")
@click.option("--region", required=True)
@click.option("--team", default=None, help="The team's id (left out: tenant-wide).")
@output
@click.pass_context
def vpc_create(ctx, name, region, team, fmt):
    body = {"name": name, "region": region, **({"team": team} if team else {})}
    show(client(ctx).vpcs.create(**body), fmt)


@vpc.command("rm")
@click.argument("vpc_id")
@click.pass_context
def vpc_delete(ctx, vpc_id):
    client(ctx).vpcs.delete(vpc_id)
    click.echo(f"VPC {vpc_id} is being deleted.")


@main.group()
def endpoint():
    """Inference endpoints: replicas behind one URL, scaled on GPU utilization."""


@endpoint.command("ls")
@output
@click.pass_context
def endpoint_list(ctx, fmt):
    rows = list(client(ctx).endpoints.list())
    if fmt == "table":  # replicas by state, as words
        rows = [{**e, "replicas": ", ".join(f"{n} {state}" for state, n in e["replicas"].items()) or "none"}
                for e in rows]
    show(rows, fmt, ["name", "url", "offering", "desired_replicas", "replicas", "bursting", "state"])


@endpoint.command("create")
@click.argument("name")
@click.option("--gpu-model", required=True, help="e.g. h100-80gb-sxm")
@click.option("--share", "kind", type=click.Choice(["gpu", "mig", "slot", "time_slice"]), default="gpu")
@click.option("--fraction", type=int, default=1, help="1/fraction of a GPU for mig, slot and time_slice shares.")
@click.option("--class", "time_slice_class", default="", help="time_slice shares: realtime, batch or training.")
@click.option("--region", "regions", multiple=True, required=True, help="Home first; repeat to burst into more.")
@click.option("--min", "min_replicas", type=int, default=1)
@click.option("--max", "max_replicas", type=int, default=4)
@click.option("--port", type=int, default=8000)
@click.option("--health-path", default="/healthz")
@output
@click.pass_context
def endpoint_create(ctx, name, gpu_model, kind, fraction, time_slice_class, regions, min_replicas, max_replicas,
                    port, health_path, fmt):
    share = {"gpu_model": gpu_model, "kind": kind, "fraction": fraction, "time_slice_class": time_slice_class}
    show(client(ctx).endpoints.create(name=name, share=share, regions=list(regions), min_replicas=min_replicas,
                                      max_replicas=max_replicas, port=port, health_path=health_path), fmt)


@endpoint.command("show")
@click.argument("endpoint_id")
@output
@click.pass_context
def endpoint_show(ctx, endpoint_id, fmt):
    show(client(ctx).endpoints.get(endpoint_id), fmt)


@endpoint.command("replicas")
@click.argument("endpoint_id")
@output
@click.pass_context
def endpoint_replicas(ctx, endpoint_id, fmt):
    show(client(ctx).endpoints.replicas(endpoint_id), fmt, ["name", "state", "region", "burst", "state_reason"])


@endpoint.command("decisions")
@click.argument("endpoint_id")
@output
@click.pass_context
def endpoint_decisions(ctx, endpoint_id, fmt):
    show(client(ctx).endpoints.decisions(endpoint_id), fmt,
         ["at", "action", "replicas_before", "replicas_after", "reason"])


@endpoint.command("scale")
@click.argument("endpoint_id")
@click.option("--min", "min_replicas", type=int, default=None)
@click.option("--max", "max_replicas", type=int, default=None)
@click.option("--target", "target_utilization", type=int, default=None, help="Target GPU utilization, percent.")
@output
@click.pass_context
def endpoint_scale(ctx, endpoint_id, min_replicas, max_replicas, target_utilization, fmt):
    changes = {k: v for k, v in {"min_replicas": min_replicas, "max_replicas": max_replicas,
                                 "target_utilization": target_utilization}.items() if v is not None}
    show(client(ctx).endpoints.update(endpoint_id, **changes), fmt)


@endpoint.command("rm")
@click.argument("endpoint_id")
@click.pass_context
def endpoint_delete(ctx, endpoint_id):
    client(ctx).endpoints.delete(endpoint_id)
    click.echo(f"Endpoint {endpoint_id} is draining and will be deleted.")


@main.group()
def keys():
    """Saved SSH keys."""


@keys.command("ls")
@output
@click.pass_context
def keys_list(ctx, fmt):
    show(list(client(ctx).ssh_keys.list()), fmt, ["id", "name", "fingerprint", "created_at"])


@keys.command("add")
@click.argument("name")
@click.argument("public_key_file", type=click.Path(exists=True, dir_okay=False))
@output
@click.pass_context
def keys_add(ctx, name, public_key_file, fmt):
    show(client(ctx).ssh_keys.create(name=name, public_key=Path(public_key_file).read_text().strip()), fmt)


@keys.command("rm")
@click.argument("key_id")
@click.pass_context
def keys_delete(ctx, key_id):
    client(ctx).ssh_keys.delete(key_id)
    click.echo(f"Key {key_id} removed.")


@main.group()
def tokens():
    """API tokens."""


@tokens.command("ls")
@output
@click.pass_context
def tokens_list(ctx, fmt):
    show(list(client(ctx).api_tokens.list()), fmt, ["id", "name", "scope", "expires_at", "last_used_at"])


@tokens.command("create")
@click.argument("name")
@click.option("--scope", type=click.Choice(["read", "read_write"]), default="read_write", show_default=True)
@output
@click.pass_context
def tokens_create(ctx, name, scope, fmt):
    """A new token (its secret is shown only now)."""
    show(client(ctx).api_tokens.create(name=name, scope=scope), fmt)


@tokens.command("revoke")
@click.argument("token_id")
@click.pass_context
def tokens_revoke(ctx, token_id):
    client(ctx).api_tokens.delete(token_id)
    click.echo(f"Token {token_id} revoked.")


@main.command()
@click.option("--since", default=None, help="ISO 8601; the month's start when left out.")
@output
@click.pass_context
def usage(ctx, since, fmt):
    """Metered usage by day, and the month's invoice so far."""
    rows = list(client(ctx).usage.list(period="day", since=since))
    show(rows, fmt, ["starts_at", "resource", "term", "quantity", "amount", "currency"])
    if fmt == "table":
        draft = client(ctx).invoices.current()
        click.echo(f"This month so far: {draft['total']} {draft['currency']}")


@main.group()
def skypilot():
    """SkyPilot on Meridian capacity."""


@skypilot.command("pool")
@click.argument("reservation")
@click.option("--name", default=None, help="The pool's name (the reservation's name when left out).")
@click.option("--identity-file", default="~/.ssh/id_ed25519", show_default=True,
              help="The private key of the public key the instances have.")
@click.option("--file", "path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_PATH,
              show_default=True)
@click.pass_context
def skypilot_pool(ctx, reservation, name, identity_file, path):
    """Write a reservation's instances as an SSH Node Pool; then `sky ssh up` makes them SkyPilot infra."""
    api = client(ctx)
    found = api.reservations.get(reservation)
    entry = pool_entry(list(api.instances.list(reservation=reservation)), identity_file=identity_file)
    pool = name or found["name"]
    written = pool_write(pool, entry, path)
    click.echo(f"Pool '{pool}' ({len(entry['hosts'])} hosts) written to {written}. Next: sky ssh up --infra {pool}")


if __name__ == "__main__":
    main()
