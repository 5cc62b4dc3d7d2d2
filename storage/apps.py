from django.apps import AppConfig


class StorageConfig(AppConfig):
    name = "storage"
    verbose_name = "Storage"

    def ready(self):
        # Provisioning asks registered sources for an instance's mounts and for what a hand-over
        # waits for, and the quota pages for what volumes use: the apps below may not import storage.
        # The imports wait for the apps' models to load.
        from provisioning.mounts import handover_wait, isolation_source, mount_source
        from storage.checkpoints import restores_pending
        from storage.mounts import export_report, reservation_mounts
        from storage.services import KIND_QUOTAS, storage_in_use
        from tenants.choices import QuotaResource
        from tenants.quotas import usage_counter

        mount_source(reservation_mounts)
        handover_wait(restores_pending)
        isolation_source(export_report)
        usage_counter(QuotaResource.STORAGE_GIB, storage_in_use)
        for kind, resource in KIND_QUOTAS.items():
            usage_counter(resource, lambda tenant_id, team_id, kind=kind: storage_in_use(tenant_id, team_id, kind))
