"""
The demo world's storage (``make run``): Acme's language-model team keeps its training checkpoints
on a shared file system with checkpoint tiers to an archive bucket, and its datasets on another.
The simulated backend holds the checkpoints' files; the first tier pass (run here) starts moving
the two old ones to the cold tier, so the console shows moves in progress when the worker starts.
"""

from __future__ import annotations

import secrets
from datetime import timedelta

from django.utils import timezone

from provisioning.models import SimulatedDevice
from security.crypto import encrypt
from storage.checkpoints import tier_pass
from storage.choices import StorageKind
from storage.drivers.simulated import PREFIX, SimulatedStorage
from storage.models import CheckpointPolicy, StorageClass, Volume

GIB = 1024**3
# (checkpoint, hours since it was written): the newest two stay hot, the rest go cold.
CHECKPOINTS = (("step-12000", 30), ("step-16000", 20), ("step-20000", 3), ("step-24000", 1))


def seed_demo_storage(tenant, team, region) -> None:
    classes = {c.kind: c for c in StorageClass.objects.filter(region=region)}
    made = {}
    for name, kind, size in (("llm-checkpoints", StorageKind.SHARED_FS, 4096), ("datasets", StorageKind.SHARED_FS,
                                                                                 10240),
                             ("llm-archive", StorageKind.OBJECT, 20480)):
        volume = Volume.objects.create(tenant=tenant, team=team, name=name, storage_class=classes[kind],
                                       size_gib=size, target_gib=size, state="available",
                                       wrapped_key=encrypt(secrets.token_hex(32)))
        SimulatedStorage().create(ref=volume.backend_ref, kind=kind, size_gib=size)
        made[name] = volume
    now = timezone.now()
    files = {f"checkpoints/{step}/{part}": {"size": size * GIB, "modified": (now - timedelta(hours=age)).isoformat()}
             for step, age in CHECKPOINTS for part, size in (("model.safetensors", 14), ("optimizer.pt", 28))}
    key = PREFIX + made["llm-checkpoints"].backend_ref
    SimulatedDevice.objects.filter(key=key).update(state={**SimulatedStorage.state(made["llm-checkpoints"].backend_ref),
                                                          "files": files})
    CheckpointPolicy.objects.create(tenant=tenant, volume=made["llm-checkpoints"], cold_volume=made["llm-archive"],
                                    demote_after_hours=6, keep_hot=2)
    tier_pass(now=now)
