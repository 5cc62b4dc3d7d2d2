"""Security records: the audit trail and incidents; attestation, isolation and keys come later."""

import uuid

from django.db import models

from tenants.scoping import TenantScopedQuerySet


class AuditEvent(models.Model):
    """
    One state change made through a service: who, in which tenant, what, on which object, the
    values before and after, and the request it came from. Written in the same transaction as
    the change (security.audit.audit_record is the only writer) and never updated.

    Plain ids, not foreign keys: the trail outlives the objects and people it names.
    """

    # The sequence gives commit order to the sealer; the public id is a UUID, so a tenant reading
    # its own events learns nothing of how many others' there are.
    id = models.BigAutoField(primary_key=True)
    public_id = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    occurred_at = models.DateTimeField(auto_now_add=True, db_index=True)
    actor_id = models.UUIDField(null=True, blank=True)
    actor_email = models.CharField(max_length=254, blank=True)
    token_id = models.UUIDField(null=True, blank=True)
    tenant_id = models.UUIDField(null=True, blank=True, db_index=True)
    action = models.CharField(max_length=64, db_index=True)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "tenant_id"
    team_path = None

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return f"{self.action} {self.target_type}:{self.target_id} by {self.actor_email or 'system'}"


class Incident(models.Model):
    """
    Something found wrong with the platform that an operator must look at: what (``kind``), where
    (plain ids, like the audit trail: an incident outlives what it names), the evidence and when
    it was detected. The affected tenant, when there is one, may read its own.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=64, db_index=True)
    summary = models.CharField(max_length=500)
    evidence = models.JSONField(default=dict)
    tenant_id = models.UUIDField(null=True, blank=True, db_index=True)
    node_id = models.UUIDField(null=True, blank=True)
    fabric_id = models.UUIDField(null=True, blank=True)
    detected_at = models.DateTimeField(auto_now_add=True, db_index=True)
    resolved_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_path = "tenant_id"
    team_path = None

    class Meta:
        ordering = ["-detected_at"]

    def __str__(self):
        return f"{self.kind}: {self.summary}"
