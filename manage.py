#!/usr/bin/env python
"""Meridian's command-line utility for administrative tasks."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from django.core.management import execute_from_command_line

    from config.tracing import setup_for_command

    setup_for_command(sys.argv)  # the commands that do work trace when MERIDIAN_TRACING=1 (config.tracing)

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
