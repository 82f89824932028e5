"""The sysfs adapter of passthrough over the fake tree, and the fake against what the kernel does.

The kernel behaviour the fake follows is in dra/fakegpus/sysfs.py's docstring (pci-sysfs.c,
bus.c, dd.c, pci-driver.c): these tests pin it, then run the adapter's sequences over it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from dra.adapters.pcisysfs import PciSysfs
from dra.fakegpus.sysfs import FakeFunction, FakeSysfs

GPU = "0000:3b:00.0"
AUDIO = "0000:3b:00.1"
NIC = "0000:3c:00.0"


def _tree(
    root: Path, *functions: FakeFunction, drivers: tuple[str, ...] = ("nvidia", "vfio-pci")
) -> FakeSysfs:
    fake = FakeSysfs(root)
    fake.build(functions or (FakeFunction(GPU, group=7),), drivers)
    return fake


def _sysfs(fake: FakeSysfs) -> PciSysfs:
    return PciSysfs(fake.root, write=fake.write)


def _errno(fake: FakeSysfs, path: str, text: str) -> int:
    try:
        fake.write(fake.sys / path, text)
    except OSError as err:
        return err.errno or 0
    raise AssertionError(f"the write of {text!r} to {path} succeeded")


def test_the_tree_is_laid_out_as_the_kernel_shows_it(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    device = tmp_path / "sys/bus/pci/devices" / GPU
    assert os.readlink(device) == f"../../../devices/pci0000:3b/{GPU}"
    assert os.readlink(device / "driver") == "../../../bus/pci/drivers/nvidia"
    assert os.readlink(device / "iommu_group") == "../../../kernel/iommu_groups/7"
    assert (tmp_path / "sys/kernel/iommu_groups/7/devices" / GPU).resolve() == device.resolve()
    assert (tmp_path / "sys/bus/pci/drivers/nvidia" / GPU).resolve() == device.resolve()
    assert (device / "driver_override").read_text() == "(null)\n"
    assert stat.S_ISCHR((tmp_path / "dev/vfio/vfio").stat().st_mode)
    assert not fake.group_node(7).exists()


def test_driver_override_takes_the_first_line_and_an_empty_one_clears_it(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    override = fake.sys / "bus/pci/devices" / GPU / "driver_override"
    fake.write(override, "vfio-pci\nignored")
    assert fake.override_of(GPU) == "vfio-pci"
    fake.write(override, "\n")
    assert override.read_text() == "(null)\n"
    assert _errno(fake, f"bus/pci/devices/{GPU}/driver_override", "x" * 4095) == errno.EINVAL
    # Setting it binds nothing.
    assert fake.driver_of(GPU) == "nvidia"


def test_unbind_and_bind_answer_as_the_kernel_does(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    # Not bound to that driver, or no such device: ENODEV.
    assert _errno(fake, "bus/pci/drivers/vfio-pci/unbind", GPU) == errno.ENODEV
    assert _errno(fake, "bus/pci/drivers/nvidia/unbind", "0000:ff:00.0") == errno.ENODEV
    # Bound already: EBUSY, even to the driver it has.
    assert _errno(fake, "bus/pci/drivers/nvidia/bind", GPU) == errno.EBUSY
    fake.write(fake.sys / "bus/pci/drivers/nvidia/unbind", GPU + "\n")
    assert fake.driver_of(GPU) == ""
    assert not (fake.sys / "bus/pci/drivers/nvidia" / GPU).exists()
    # vfio-pci's ID table is override-only: no match without driver_override.
    assert _errno(fake, "bus/pci/drivers/vfio-pci/bind", GPU) == errno.ENODEV
    fake.write(fake.sys / "bus/pci/devices" / GPU / "driver_override", "vfio-pci")
    # ... and with one, only the driver it names matches.
    assert _errno(fake, "bus/pci/drivers/nvidia/bind", GPU) == errno.ENODEV
    fake.write(fake.sys / "bus/pci/drivers/vfio-pci/bind", GPU)
    assert fake.driver_of(GPU) == "vfio-pci"
    assert stat.S_ISCHR(fake.group_node(7).stat().st_mode)
    assert os.major(fake.group_node(7).stat().st_rdev) != 10


def test_drivers_probe_gives_an_unbound_device_the_driver_that_matches(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    fake.write(fake.sys / "bus/pci/drivers/nvidia/unbind", GPU)
    assert _errno(fake, "bus/pci/drivers_probe", "0000:ff:00.0") == errno.ENODEV
    fake.write(fake.sys / "bus/pci/drivers_probe", GPU)
    assert fake.driver_of(GPU) == "nvidia"


def test_read_only_and_missing_attributes_refuse_a_write(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    assert _errno(fake, f"bus/pci/devices/{GPU}/vendor", "0x1234") == errno.EACCES
    assert _errno(fake, "bus/pci/drivers/vfio_pci/bind", GPU) == errno.ENOENT


def test_the_adapter_reads_the_host_and_the_group(tmp_path: Path) -> None:
    fake = _tree(
        tmp_path,
        FakeFunction(GPU, group=7, class_code="0x030000"),
        FakeFunction(AUDIO, group=7, driver="snd_hda_intel", class_code="0x040300"),
    )
    sysfs = _sysfs(fake)
    assert sysfs.host().iommu
    assert sysfs.host().vfio_pci
    group = sysfs.iommu_group(GPU)
    assert group.number == 7
    assert [(f.address, f.driver) for f in group.functions] == [(GPU, "nvidia"), (AUDIO, "snd_hda_intel")]
    audio = group.function(AUDIO)
    assert audio is not None
    assert audio.slot == "0000:3b:00"


def test_a_node_without_iommu_or_vfio_pci_says_so(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel/iommu_groups").mkdir(parents=True)
    (tmp_path / "sys/bus/pci/drivers/nvidia").mkdir(parents=True)
    host = PciSysfs(tmp_path).host()
    assert (host.iommu, host.vfio_pci) == (False, False)


def test_bind_vfio_then_restore_round_trips_and_each_is_idempotent(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    sysfs = _sysfs(fake)
    sysfs.bind_vfio(GPU)
    sysfs.bind_vfio(GPU)
    assert (fake.driver_of(GPU), fake.override_of(GPU)) == ("vfio-pci", "vfio-pci")
    sysfs.restore(GPU, "nvidia")
    sysfs.restore(GPU, "nvidia")
    assert (fake.driver_of(GPU), fake.override_of(GPU)) == ("nvidia", "")
    assert not fake.group_node(7).exists()


@pytest.mark.parametrize("writes", [1, 2])
def test_restore_finishes_from_where_a_crash_left_bind_vfio(tmp_path: Path, writes: int) -> None:
    fake = _tree(tmp_path)
    done: list[str] = []

    def stop_after(path: Path, text: str) -> None:
        if len(done) == writes:
            raise KeyboardInterrupt
        done.append(path.name)
        fake.write(path, text)

    with pytest.raises(KeyboardInterrupt):
        PciSysfs(tmp_path, write=stop_after).bind_vfio(GPU)
    _sysfs(fake).restore(GPU, "nvidia")
    assert (fake.driver_of(GPU), fake.override_of(GPU)) == ("nvidia", "")


def test_a_build_again_keeps_what_is_bound(tmp_path: Path) -> None:
    fake = _tree(tmp_path)
    _sysfs(fake).bind_vfio(GPU)
    _tree(tmp_path)
    assert fake.driver_of(GPU) == "vfio-pci"


def test_a_function_the_kernel_cannot_find_is_an_error(tmp_path: Path) -> None:
    sysfs = _sysfs(_tree(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"no PCI device 0000:ff:00\.0"):
        sysfs.function("0000:ff:00.0")
    with pytest.raises(FileNotFoundError, match="no IOMMU group"):
        sysfs.iommu_group("0000:ff:00.0")
