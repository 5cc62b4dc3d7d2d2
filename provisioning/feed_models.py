"""
The capacity change feed: one row per node whose capacity changed, written by PostgreSQL triggers
in the same transaction as the change (provisioning/migrations/0031_capacity_change_feed.py), so
the scheduler loop keeps its index from what changed instead of reading the fleet every cycle
(provisioning.scheduling.change_feed). Loaded with provisioning's models.
"""

from django.db import models


class CapacityChange(models.Model):
    """A node whose allocations, whose right to take work, or the fleet's shape changed in transaction ``xid``."""

    ALLOCATIONS, RIGHTS, SHAPE = 0, 1, 2
    KINDS = [(ALLOCATIONS, "allocations"), (RIGHTS, "may take work"), (SHAPE, "hardware or cabling")]

    id = models.BigAutoField(primary_key=True)
    # The writing transaction's id (pg_current_xact_id): a reader asks for every row at or after
    # its last snapshot's xmin, which holds every transaction that snapshot could not yet see.
    xid = models.BigIntegerField(db_index=True)
    kind = models.PositiveSmallIntegerField(choices=KINDS)
    node_id = models.UUIDField(null=True, blank=True)  # empty: a change of the fleet's shape as a whole

    class Meta:
        db_table = "provisioning_capacity_change"

    def __str__(self):
        return f"{self.get_kind_display()} of {self.node_id or 'the fleet'} in {self.xid}"
