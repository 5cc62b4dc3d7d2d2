from django.apps import AppConfig

from provisioning.mounts import mount_source


class StorageConfig(AppConfig):
    name = "storage"
    verbose_name = "Storage"

    def ready(self):
        # Provisioning asks registered sources for an instance's mounts (it may not import storage).
        from storage.mounts import reservation_mounts  # the app's models load first

        mount_source(reservation_mounts)
