"""
A Celery worker for bench/provisioning.py with BENCH_ATTESTATION=off: the provisioning chains
run without their ``verify`` step, as issue 4's target was set ("attestation not yet in the
chain"). For measuring only: a deployment always attests before it hands a node over.

    python bench/worker_without_attestation.py worker -A config ...   (the arguments of ``celery``)
"""

from __future__ import annotations

import os
import sys

from common import REPO  # noqa: F401  (puts the project on the path)


def leave_out_attestation() -> None:
    """Drop ``verify`` from every provisioning pipeline (the dict the lifecycle reads, changed in place)."""
    from provisioning.choices import OperationKind
    from provisioning.lifecycle.steps import PIPELINES

    for (kind, offering_kind), steps in PIPELINES.items():
        if kind == OperationKind.PROVISION:
            PIPELINES[(kind, offering_kind)] = [step for step in steps if step.name != "verify"]


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    leave_out_attestation()  # before the pool's processes are forked, so they inherit it
    from celery.__main__ import main

    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(main())
