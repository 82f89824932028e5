"""Claims this node has prepared, as the checkpoint records them and the kubelet was told."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as reported to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    admin_access: bool = False
    #: The physical device: names follow NVML indexes, which shift when a GPU leaves the bus.
    uuid: str = ""

    def is_device(self, name: str, uuid: str) -> bool:
        """Whether this entry is that device (by UUID when recorded, else by name)."""
        return self.uuid == uuid if self.uuid else self.device == name


@dataclass(frozen=True)
class PreparedClaim:
    """A claim this node has prepared."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]

    def holds(self, name: str, uuid: str) -> bool:
        """Whether this claim holds that device exclusively (admin access shares)."""
        return any(d.is_device(name, uuid) for d in self.devices if not d.admin_access)
