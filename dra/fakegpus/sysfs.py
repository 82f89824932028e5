"""A fake PCI sysfs tree whose writes behave as the kernel's do, for passthrough without hardware.

`FakeSysfs.build` lays out, under a root, what a node with an IOMMU shows
(/sys/bus/pci/devices/<bdf> -> /sys/devices/..., `driver` and `iommu_group`
links, /sys/kernel/iommu_groups/N/devices, /sys/bus/pci/drivers/<name> with its
`bind`, `unbind` and one link per bound device) and `FakeSysfs.write` is the
kernel's side of a write to one of its attributes. What it follows, from Linux 6.x:

- `driver_override` (drivers/pci/pci-sysfs.c driver_override_store, drivers/base/driver.c
  driver_set_override): EINVAL from PAGE_SIZE - 1 bytes on; the text up to the first
  newline is the override, and an empty one clears it (it reads back "(null)"). Nothing
  is bound or unbound by it.
- `drivers/<drv>/unbind` (drivers/base/bus.c unbind_store): ENODEV unless the device
  exists and is bound to that driver; else it is released.
- `drivers/<drv>/bind` (bus.c bind_store, drivers/base/dd.c __driver_probe_device):
  ENODEV unless the device exists and the driver matches it; EBUSY when the device is
  bound already. Matching is pci_match_device (drivers/pci/pci-driver.c): a set
  driver_override matches only the driver of that name, and then always; without one
  the ID tables decide, and vfio-pci's table is override-only
  (PCI_DRIVER_OVERRIDE_DEVICE_VFIO), so it never matches by ID.
- `drivers_probe` (bus.c drivers_probe_store): ENODEV for an unknown device; an unbound
  one is given the first matching driver, if any (registration order on a node, name
  order here); success either way.
- A file without a store method (vendor, class, ...): EACCES, as kernfs gives at open.
- /dev/vfio/<group> appears when the first function of the group binds vfio-pci and goes
  with the last (drivers/vfio/group.c); /dev/vfio/vfio is there while vfio is loaded.

Device nodes are character devices (mknod, as dra.fakegpus.node makes the GPUs') so that
a container runtime accepts them in a CDI spec; opening one does nothing useful.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dra.core.vfio import NVIDIA, VFIO_PCI

#: VFIO's misc device, /dev/vfio/vfio (include/linux/miscdevice.h VFIO_MINOR).
MISC_MAJOR = 10
VFIO_MINOR = 196
#: The groups' major is dynamic on a real node; a stand-in from the local/experimental range 120-127.
VFIO_GROUP_MAJOR = 122
PAGE_SIZE = 4096
NVIDIA_VENDOR = "0x10de"


@dataclass(frozen=True)
class FakeFunction:
    """A PCI function of the fake tree: address, vendor, class code, IOMMU group, driver bound at start."""

    address: str
    group: int
    driver: str = NVIDIA
    class_code: str = "0x030200"
    vendor: str = NVIDIA_VENDOR


def _matches_by_id(driver: str, function: tuple[str, str]) -> bool:
    """Whether a driver's ID table takes the function without an override (vendor, class code)."""
    vendor, class_code = function
    if driver == NVIDIA:
        # nvidia's table: every NVIDIA display controller (class 0x03xxxx).
        return vendor == NVIDIA_VENDOR and class_code.startswith("0x03")
    if driver == "snd_hda_intel":
        return class_code.startswith("0x0403")
    # vfio-pci (override-only) and anything else this fake registers match by override alone.
    return False


class FakeSysfs:
    """The kernel's side of the PCI sysfs tree under `root`: its `write` goes to pcisysfs.PciSysfs."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.sys = self.root / "sys"

    # -- the tree ------------------------------------------------------------------------------

    def build(self, functions: Sequence[FakeFunction], drivers: Sequence[str] = (NVIDIA, VFIO_PCI)) -> None:
        """Lay out the tree: these functions, bound as given, and these drivers registered (loaded)."""
        for name in {*drivers, *(f.driver for f in functions if f.driver)}:
            self._register(name)
        (self.sys / "kernel/iommu_groups").mkdir(parents=True, exist_ok=True)
        (self.sys / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (self.sys / "bus/pci/drivers_probe").touch()
        for function in functions:
            self._add(function)
        if VFIO_PCI in drivers:
            self._node(self.root / "dev/vfio/vfio", MISC_MAJOR, VFIO_MINOR)

    def _register(self, driver: str) -> None:
        directory = self.sys / "bus/pci/drivers" / driver
        directory.mkdir(parents=True, exist_ok=True)
        for name in ("bind", "unbind", "new_id", "remove_id"):
            (directory / name).touch()

    def _add(self, function: FakeFunction) -> None:
        if self._device(function.address).is_symlink():
            # Built again by a restarted daemon: the function stays bound as it is.
            return
        domain, bus = function.address.split(":")[:2]
        device = self.sys / f"devices/pci{domain}:{bus}" / function.address
        device.mkdir(parents=True, exist_ok=True)
        (device / "vendor").write_text(function.vendor + "\n")
        (device / "class").write_text(function.class_code + "\n")
        (device / "driver_override").write_text("(null)\n")
        group = self.sys / "kernel/iommu_groups" / str(function.group)
        (group / "devices").mkdir(parents=True, exist_ok=True)
        _link(device / "iommu_group", os.path.relpath(group, device))
        _link(group / "devices" / function.address, os.path.relpath(device, group / "devices"))
        _link(
            self.sys / "bus/pci/devices" / function.address,
            os.path.relpath(device, self.sys / "bus/pci/devices"),
        )
        if function.driver:
            self._attach(function.address, function.driver)

    # -- the kernel's side of a write ----------------------------------------------------------

    def write(self, path: Path, text: str) -> None:
        """Do what the kernel does for a write of `text` to `path`; OSError with its errno if it refuses."""
        relative = Path(path).relative_to(self.sys).parts
        if not Path(path).exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        match relative:
            case ("bus", "pci", "devices", _, "driver_override"):
                self._set_override(Path(path), text)
            case ("bus", "pci", "drivers", driver, "unbind"):
                self._unbind(driver, _device_name(text))
            case ("bus", "pci", "drivers", driver, "bind"):
                self._bind(driver, _device_name(text))
            case ("bus", "pci", "drivers_probe"):
                self._probe(_device_name(text))
            case _:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def _set_override(self, path: Path, text: str) -> None:
        if len(text) >= PAGE_SIZE - 1:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(path))
        override = text.split("\n", 1)[0]
        path.write_text((override or "(null)") + "\n")

    def _unbind(self, driver: str, address: str) -> None:
        if self.driver_of(address) != driver:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), f"{driver}/unbind {address}")
        self._detach(address, driver)

    def _bind(self, driver: str, address: str) -> None:
        if not self._device(address).exists() or not self._matches(driver, address):
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), f"{driver}/bind {address}")
        if self.driver_of(address):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), f"{driver}/bind {address}")
        self._attach(address, driver)

    def _probe(self, address: str) -> None:
        if not self._device(address).exists():
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), f"drivers_probe {address}")
        if self.driver_of(address):
            return
        for driver in sorted(p.name for p in (self.sys / "bus/pci/drivers").iterdir()):
            if self._matches(driver, address):
                self._attach(address, driver)
                return

    def _matches(self, driver: str, address: str) -> bool:
        override = self.override_of(address)
        if override:
            return override == driver
        device = self._device(address)
        vendor, class_code = ((device / name).read_text().strip() for name in ("vendor", "class"))
        return _matches_by_id(driver, (vendor, class_code))

    # -- what a test looks at ------------------------------------------------------------------

    def _device(self, address: str) -> Path:
        return self.sys / "bus/pci/devices" / address

    def driver_of(self, address: str) -> str:
        """The driver the function is bound to ("" for none), from its `driver` link."""
        link = self._device(address) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else ""

    def override_of(self, address: str) -> str:
        """The function's driver_override ("" when cleared)."""
        text = (self._device(address) / "driver_override").read_text().strip()
        return "" if text == "(null)" else text

    def group_of(self, address: str) -> int:
        """The function's IOMMU group number."""
        return int(os.path.basename(os.readlink(self._device(address) / "iommu_group")))

    def group_node(self, group: int) -> Path:
        """/dev/vfio/<group> under the root."""
        return self.root / "dev/vfio" / str(group)

    # -- binding -------------------------------------------------------------------------------

    def _attach(self, address: str, driver: str) -> None:
        device = self._device(address).resolve()
        driver_dir = self.sys / "bus/pci/drivers" / driver
        _link(device / "driver", os.path.relpath(driver_dir, device))
        _link(driver_dir / address, os.path.relpath(device, driver_dir))
        if driver == VFIO_PCI:
            self._node(self.group_node(self.group_of(address)), VFIO_GROUP_MAJOR, self.group_of(address))

    def _detach(self, address: str, driver: str) -> None:
        device = self._device(address).resolve()
        (device / "driver").unlink()
        (self.sys / "bus/pci/drivers" / driver / address).unlink()
        if driver != VFIO_PCI:
            return
        group = self.group_of(address)
        members = (self.sys / "kernel/iommu_groups" / str(group) / "devices").iterdir()
        if not any(self.driver_of(m.name) == VFIO_PCI for m in members):
            self.group_node(group).unlink(missing_ok=True)

    def _node(self, path: Path, major: int, minor: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            return
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(major, minor))


def _device_name(text: str) -> str:
    # bus_find_device_by_name compares with sysfs_streq: one trailing newline is ignored.
    return text[:-1] if text.endswith("\n") else text


def _link(path: Path, target: str) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to(target)
