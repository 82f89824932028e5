"""PCI functions and IOMMU groups as sysfs shows them: what passthrough (vfio-pci) reads of the node."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A PCIe root complex as sysfs names the first directory of a device's path (/sys/devices/pci0000:3a),
#: the value of the standard attribute resource.kubernetes.io/pcieRoot: pci<domain>:<bus>, hexadecimal.
PCIE_ROOT = re.compile(r"pci[0-9a-f]{4,}:[0-9a-f]{2}")


@dataclass(frozen=True)
class PciFunction:
    """One PCI function: its address in extended BDF form ("0000:3b:00.1") and the driver bound to it."""

    address: str
    #: The bound driver's name as /sys/bus/pci/drivers spells it ("vfio-pci"); "" when none is bound.
    driver: str

    @property
    def slot(self) -> str:
        """Domain, bus and device without the function: the functions of one card share it."""
        return self.address.rsplit(".", 1)[0]


@dataclass(frozen=True)
class IommuGroup:
    """An IOMMU group: the functions the IOMMU cannot isolate from each other, passed through together."""

    number: int
    functions: tuple[PciFunction, ...]

    def function(self, address: str) -> PciFunction | None:
        """The group's function at that address, if it has one."""
        return next((f for f in self.functions if f.address == address), None)


@dataclass(frozen=True)
class VfioHost:
    """What the node's kernel offers passthrough: an IOMMU in use, and the vfio-pci driver."""

    #: /sys/kernel/iommu_groups has groups (the kernel runs with an IOMMU).
    iommu: bool
    #: /sys/bus/pci/drivers/vfio-pci exists (the vfio-pci module is loaded).
    vfio_pci: bool
