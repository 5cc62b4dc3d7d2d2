from django.apps import AppConfig

from provisioning.mounts import handover_wait, mount_source


class StorageConfig(AppConfig):
    name = "storage"
    verbose_name = "Storage"

    def ready(self):
        # Provisioning asks registered sources for an instance's mounts (it may not import storage).
        from storage.checkpoints import restores_pending  # the app's models load first
        from storage.mounts import reservation_mounts

        mount_source(reservation_mounts)
        handover_wait(restores_pending)
