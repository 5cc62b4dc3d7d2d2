"""Meridian's project package: settings, URLs, Celery, the supervisor and the demo world. Nothing imports it."""

from config.celery import app as celery_app

__all__ = ["celery_app"]
