"""Meridian's project package and the infrastructure inventory."""

from .celery import app as celery_app

__all__ = ["celery_app"]
