"""
The Django admin is where staff *look*: every change goes through the API and its services, so
it is checked (transitions, caps, last owner) and audited. Only users stay editable there.
"""

from django.contrib import admin


class ReadOnlyAdmin(admin.ModelAdmin):
    """Browse and search, never add, change or delete: writes go through services."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
