"""
The lifecycle of reservations and nodes as operations of named steps run by Celery tasks: from
``scheduled`` to ``active`` and back (provisioning, release), node validation and attestation,
replacement of failed hardware and the periodic tick. Modules, bottom to top: dispatch, moves,
operation_state, start, release, validate, replacement, outcomes, runner, tick (docs/provisioning.md).
"""
