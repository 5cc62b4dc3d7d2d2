"""How the CLI shows what it read: a table (rich), JSON or YAML (``-o``)."""

from __future__ import annotations

import json
import sys

import click
import yaml
from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json", "yaml")


def show(data, fmt: str, columns: list[str] | None = None, title: str | None = None) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, default=str))
        return
    if fmt == "yaml":
        click.echo(yaml.safe_dump(data, sort_keys=False, default_flow_style=False).rstrip())
        return
    rows = data if isinstance(data, list) else None
    # Piped or captured, a table is not cut to 80 columns: scripts and logs read all of it.
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 240)
    if rows is None:  # one object: a field per line
        table = Table(show_header=False, title=title, box=None)
        table.add_column(style="bold")
        table.add_column()
        for key, value in data.items():
            table.add_row(key, _cell(value))
        console.print(table)
        return
    columns = columns or (list(rows[0]) if rows else [])
    table = Table(title=title)
    for column in columns:
        table.add_column(column.replace("_", " "))
    for row in rows:
        table.add_row(*(_cell(row.get(column)) for column in columns))
    console.print(table if rows else "[dim]none[/dim]")


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, list | dict):
        return json.dumps(value, default=str) if not isinstance(value, list) or len(value) > 3 or \
            any(isinstance(v, dict) for v in value) else ", ".join(map(str, value))
    return str(value)
