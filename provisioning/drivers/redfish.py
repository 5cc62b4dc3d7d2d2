"""
Bare metal through the node's BMC with Redfish, using the ``sushy`` client (OpenStack Ironic's).

The node's ``bmc_address`` is the BMC's Redfish service root; a BMC manages one system (or, on
a chassis manager, the one named like the node). Errors say what failed and what to check,
never the credentials.
"""

from __future__ import annotations

import sushy
from django.conf import settings
from sushy import exceptions as sushy_errors

from provisioning.drivers.base import DriverError, PowerDriver, Target

BOOT_SOURCES = {"pxe": sushy.BootSource.PXE, "cd": sushy.BootSource.CD, "hdd": sushy.BootSource.HDD}
# Transitional states read as on: a server powering off (a reboot, a tenant's shutdown) or on has
# not lost its power, and failure detection must not take it for a server that is off.
ON_STATES = {sushy.PowerState.ON, sushy.PowerState.POWERING_ON, sushy.PowerState.POWERING_OFF}


class RedfishPower(PowerDriver):
    def _call(self, target: Target, what: str, action):
        try:
            # Fail fast: the pipeline retries transient errors with its own backoff, so sushy's
            # defaults (10 retries, no connect timeout) would only hold a worker for minutes.
            root = sushy.Sushy(target.bmc_address, username=target.bmc_username or None,
                               password=target.bmc_password or None,
                               verify=settings.MERIDIAN_REDFISH_VERIFY_TLS, server_side_retries=1,
                               server_side_retries_delay=1, connect_timeout=5, read_timeout=30)
            return action(self._system(root, target))
        except sushy_errors.AccessError as exc:
            raise DriverError(f"The BMC of {target.hostname} refused the credentials ({what}); "
                              "update the node's BMC username and password.", transient=False) from exc
        except sushy_errors.ResourceNotFoundError as exc:
            raise DriverError(f"The BMC of {target.hostname} has no such resource ({what}): {exc}.",
                              transient=False) from exc
        except sushy_errors.ConnectionError as exc:
            raise DriverError(f"The BMC of {target.hostname} did not answer ({what}); "
                              "check its address and network.") from exc
        except sushy_errors.HTTPError as exc:
            status = getattr(exc, "status_code", 0) or 0
            raise DriverError(f"The BMC of {target.hostname} answered {status} to {what}.",
                              transient=status >= 500 or status in (409, 429)) from exc
        except sushy_errors.SushyError as exc:
            # Anything else the BMC cannot do (an unsupported value, a missing action) will not
            # change on a retry.
            raise DriverError(f"The BMC of {target.hostname} could not {what}: {exc}.", transient=False) from exc

    @staticmethod
    def _system(root, target: Target):
        identities = list(root.get_system_collection().members_identities)
        if len(identities) == 1:
            return root.get_system(identities[0])
        for identity in identities:
            system = root.get_system(identity)
            if system.name == target.hostname:
                return system
        raise DriverError(f"The BMC at {target.bmc_address} manages {len(identities)} systems, none named "
                          f"{target.hostname}.", transient=False)

    @staticmethod
    def _cd(system):
        members = system.virtual_media.get_members()
        for media in members:
            if media.identity.lower() == "cd" or "CD" in [str(t) for t in (media.media_types or [])]:
                return media
        raise DriverError("The BMC offers no virtual CD drive.", transient=False)

    def power_state(self, target):
        return self._call(target, "read power", lambda s: "on" if s.power_state in ON_STATES else "off")

    def set_power(self, target, on):
        reset = sushy.ResetType.ON if on else sushy.ResetType.FORCE_OFF
        self._call(target, "power " + ("on" if on else "off"), lambda s: s.reset_system(reset))

    def boot_device(self, target):
        names = {source: name for name, source in BOOT_SOURCES.items()}
        return self._call(target, "read boot device", lambda s: names.get(s.boot.target, "none"))

    def set_boot_device(self, target, device):
        if device == "none":  # no override: the BIOS's own order
            self._call(target, "clear the boot override", lambda s: s.set_system_boot_options(
                enabled=sushy.BootSourceOverrideEnabled.DISABLED))
            return
        if device not in BOOT_SOURCES:
            raise DriverError(f"'{device}' is not a boot device (one of {', '.join(BOOT_SOURCES)}, none).",
                              transient=False)
        source = BOOT_SOURCES[device]
        self._call(target, f"boot from {device}", lambda s: s.set_system_boot_options(
            target=source, enabled=sushy.BootSourceOverrideEnabled.ONCE))

    def media(self, target):
        def read(system):
            cd = self._cd(system)
            return cd.image if cd.inserted else None
        return self._call(target, "read virtual media", read)

    def insert_media(self, target, url):
        self._call(target, "insert virtual media",
                   lambda s: self._cd(s).insert_media(url, inserted=True, write_protected=True))

    def eject_media(self, target):
        self._call(target, "eject virtual media", lambda s: self._cd(s).eject_media())

    def readings(self, target):
        """
        The system's health, and its chassis' Thermal temperatures and Power draw (Redfish
        Thermal.v1 ``Temperatures[].ReadingCelsius``/``PhysicalContext``; Power.v1
        ``PowerControl[].PowerConsumedWatts``, else the supplies' ``LastPowerOutputWatts``). A
        chassis without a Thermal or Power resource gives no temperatures or no power.
        """
        def read(system):
            chassis = next(iter(_optional(lambda: system.chassis) or []), None)
            thermal = _optional(lambda: chassis.thermal) if chassis is not None else None
            power = _optional(lambda: chassis.power) if chassis is not None else None
            temperatures = [{"name": t.name or t.identity, "context": t.physical_context or "",
                             "celsius": t.reading_celsius} for t in (thermal.temperatures if thermal else [])
                            if isinstance(t.reading_celsius, int | float)]
            status = system.status
            health = str(status.health.value).lower() if status and status.health else "unknown"
            return {"power_w": power_watts(power.json if power is not None else None),
                    "temperatures": temperatures, "health": health if health in HEALTH else "unknown"}
        return self._call(target, "read its sensors", read)


HEALTH = ("ok", "warning", "critical")


def _optional(read):
    """A sub-resource the BMC may not offer (no link, or a 404 behind it): None then."""
    try:
        return read()
    except (sushy_errors.MissingAttributeError, sushy_errors.ResourceNotFoundError):
        return None


def power_watts(document: dict | None) -> float | None:
    """The chassis' draw from a Redfish Power document: PowerControl first, else the supplies' output."""
    if not document:
        return None
    consumed = [c.get("PowerConsumedWatts") for c in document.get("PowerControl") or []]
    consumed = [w for w in consumed if isinstance(w, int | float)]
    if consumed:
        return float(consumed[0])  # the first control is the chassis' total; others are parts of it
    supplies = [s.get("LastPowerOutputWatts") for s in document.get("PowerSupplies") or []]
    supplies = [w for w in supplies if isinstance(w, int | float)]
    return float(sum(supplies)) if supplies else None
