"""Reservations, allocations, instances and operations arrive with the reservations issue."""
