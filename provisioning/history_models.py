"""
What Meridian samples over time for the console's charts (``provisioning.history``): each queued
reservation's place and estimated start, and the fleet's occupancy by GPU model and region.
Loaded with provisioning's models.
"""

from django.db import models


class QueueSample(models.Model):
    """One queued reservation's place in its GPU model's queue and its estimated start at ``at``."""

    reservation = models.ForeignKey("provisioning.Reservation", on_delete=models.CASCADE, related_name="queue_samples")
    at = models.DateTimeField()
    position = models.PositiveIntegerField(help_text="1 = next to be placed among those wanting its GPU model.")
    estimated_start = models.DateTimeField(null=True, blank=True, help_text="Empty: current work never frees enough.")

    class Meta:
        indexes = [models.Index(fields=["reservation", "at"], name="queue_sample_idx"),
                   models.Index(fields=["at"], name="queue_sample_at_idx")]

    def __str__(self):
        return f"#{self.position} at {self.at:%Y-%m-%d %H:%M}"


class OccupancySample(models.Model):
    """Sellable GPUs of one model in one region and pool at ``at``, and how many of them were held."""

    at = models.DateTimeField()
    region = models.ForeignKey("cloud.Region", on_delete=models.CASCADE, related_name="+")
    gpu_model = models.ForeignKey("cloud.GPUModel", on_delete=models.CASCADE, related_name="+")
    pool = models.CharField(max_length=16)
    gpus = models.PositiveIntegerField(help_text="Sellable GPUs (healthy or degraded, not spares).")
    held = models.PositiveIntegerField(help_text="Of those, held by a reservation at that moment.")

    class Meta:
        indexes = [models.Index(fields=["at"], name="occupancy_sample_at_idx")]
        constraints = [models.CheckConstraint(condition=models.Q(held__lte=models.F("gpus")),
                                              name="occupancy_held_within_gpus")]

    def __str__(self):
        return f"{self.held}/{self.gpus} at {self.at:%Y-%m-%d %H:%M}"
