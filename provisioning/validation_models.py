"""What a node's acceptance checks measured (security.acceptance judged it): the record staff read."""

import uuid

from django.db import models

from tenants.scoping import PlatformQuerySet


class NodeValidation(models.Model):
    """One run of a node's acceptance checks: every check's value and bound, and whether all passed."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey("cloud.Node", on_delete=models.CASCADE, related_name="validations")
    operation = models.ForeignKey("provisioning.Operation", on_delete=models.SET_NULL, null=True, blank=True,
                                  related_name="validations")
    passed = models.BooleanField()
    # [{"gpu": index or None, "check", "value", "bound", "passed"}], failures first
    results = models.JSONField(default=list)
    measured_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = PlatformQuerySet.as_manager()

    class Meta:
        ordering = ["-measured_at"]

    def __str__(self):
        return f"{self.node_id}: {'passed' if self.passed else 'failed'} at {self.measured_at:%Y-%m-%d %H:%M}"
