"""
What storage tells the apps below it, which may not import storage: provisioning asks for an
instance's mounts, for what a hand-over waits for and for the isolation report's storage rows;
the quota pages ask what volumes use of each storage limit. Registered once the apps are ready.
"""

from __future__ import annotations

from provisioning.mounts import handover_wait, isolation_source, mount_source
from storage.checkpoints import restores_pending
from storage.mounts import export_report, reservation_mounts
from storage.services import KIND_QUOTAS, storage_in_use
from tenants.choices import QuotaResource
from tenants.quotas import usage_counter


def register() -> None:
    mount_source(reservation_mounts)
    handover_wait(restores_pending)
    isolation_source(export_report)
    usage_counter(QuotaResource.STORAGE_GIB, storage_in_use)
    for kind, resource in KIND_QUOTAS.items():
        usage_counter(resource, lambda tenant_id, team_id, kind=kind: storage_in_use(tenant_id, team_id, kind))
