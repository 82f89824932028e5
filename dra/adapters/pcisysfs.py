"""The PCI part of sysfs: which driver a GPU is bound to, its IOMMU group, and moving it to vfio-pci and back.

Every path is under `root` ("/" on a node), so that tests point it at a fake tree
(dra.fakegpus.sysfs). The sequence is the kernel's documented one and the one
NVIDIA's DRA driver takes (go-nvlib's nvpassthrough): set driver_override, write the
address to the current driver's `unbind`, then to the new driver's `bind`. Writes go
through `write` so that the fake can stand in for the kernel's side of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from dra.core.vfio import VFIO_PCI
from dra.model.pci import IommuGroup, PciFunction, VfioHost

#: Writes text to a sysfs attribute; OSError with the kernel's errno when the kernel refuses it.
Writer = Callable[[Path, str], None]


def write_attribute(path: Path, text: str) -> None:
    """Write a sysfs attribute in one write(2), as the kernel's store methods take it (no temp file)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class PciSysfs:
    """The node's PCI devices and drivers through sysfs under `root`."""

    def __init__(self, root: Path | str = "/", write: Writer = write_attribute) -> None:
        self.root = Path(root)
        self._write = write
        self._sys = self.root / "sys"

    def _device(self, address: str) -> Path:
        return self._sys / "bus/pci/devices" / address

    def _driver_dir(self, driver: str) -> Path:
        return self._sys / "bus/pci/drivers" / driver

    def host(self) -> VfioHost:
        """Whether the kernel has an IOMMU in use and the vfio-pci driver registered."""
        groups = self._sys / "kernel/iommu_groups"
        iommu = groups.is_dir() and any(groups.iterdir())
        return VfioHost(iommu=iommu, vfio_pci=self._driver_dir(VFIO_PCI).is_dir())

    def function(self, address: str) -> PciFunction:
        """The function at `address` with its bound driver; FileNotFoundError when there is none."""
        device = self._device(address)
        if not device.exists():
            raise FileNotFoundError(f"no PCI device {address} in {device.parent}")
        link = device / "driver"
        return PciFunction(address, os.path.basename(os.readlink(link)) if link.is_symlink() else "")

    def iommu_group(self, address: str) -> IommuGroup:
        """The IOMMU group of the function at `address`, every member with its driver.

        FileNotFoundError when the function has no group (the kernel runs without an IOMMU).
        """
        link = self._device(address) / "iommu_group"
        if not link.is_symlink():
            raise FileNotFoundError(f"PCI device {address} has no IOMMU group ({link} is missing)")
        number = int(os.path.basename(os.readlink(link)))
        members = sorted(
            p.name for p in (self._sys / "kernel/iommu_groups" / str(number) / "devices").iterdir()
        )
        return IommuGroup(number, tuple(self.function(member) for member in members))

    def bind_vfio(self, address: str) -> None:
        """Bind the function to vfio-pci; one already there stays (so a retry after a crash finishes it)."""
        self._write(self._device(address) / "driver_override", VFIO_PCI)
        current = self.function(address).driver
        if current == VFIO_PCI:
            return
        if current:
            self._write(self._driver_dir(current) / "unbind", address)
        self._write(self._driver_dir(VFIO_PCI) / "bind", address)

    def restore(self, address: str, driver: str) -> None:
        """Give the function back to `driver` ("": leave it unbound), with driver_override cleared.

        From any state a crash leaves between the writes of `bind_vfio`, this ends the same.
        """
        # An empty override (a lone newline) clears it, so the kernel matches by ID tables again.
        self._write(self._device(address) / "driver_override", "\n")
        current = self.function(address).driver
        if current == driver:
            return
        if current:
            self._write(self._driver_dir(current) / "unbind", address)
        if driver:
            self._write(self._driver_dir(driver) / "bind", address)
