"""Rotate the key attestation receipts are signed with: ``manage.py rotate_receipt_key``."""

from django.core.management.base import BaseCommand

from security.receipts import receipt_key_rotate


class Command(BaseCommand):
    help = "Make a new receipt signing key; the previous one retires but stays published. Prints the new kid."

    def handle(self, *args, **options):
        key = receipt_key_rotate(actor=None)
        self.stdout.write(key.kid)
