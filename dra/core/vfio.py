"""GPU passthrough: which devices of a claim go to vfio-pci, and the steps that move them.

A GPU goes through when a claim's VfioDeviceConfig applies to it, or when the claim got the
GPU's passthrough twin (type vfio, NVIDIA's class vfio.gpu.nvidia.com), with or without one.

A GPU passed through leaves the nvidia driver for vfio-pci at prepare and comes back
at unprepare; the container (KubeVirt's virt-launcher) gets /dev/vfio/<group>, and
/dev/vfio/vfio with iommu.enableAPIDevice. Each move is a device action recorded
as intent before the first sysfs write and as done after the last, so that start-up
(`recover`) puts back what a crash left half done and binds again what a prepared
claim holds. The kernel hands a VFIO group to a user only when every function of the
group is bound to vfio-pci, to a driver that manages no DMA of its own (pci-stub,
pcieport) or to none (drivers/iommu/iommu.c iommu_group_claim_dma_owner): the other
functions of the GPU's own card (its HDMI audio) are unbound for the claim, as
NVIDIA's driver does, and a group that holds another card's bound function refuses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import NoReturn, Protocol

from dra.api.v1beta1 import GpuConfig, VfioDeviceConfig
from dra.core import config as deviceconfig
from dra.core.runner import Records
from dra.model.allocation import ClaimAllocation, ClaimError
from dra.model.devices import Device, Gpu, Inventory, is_vfio_twin
from dra.model.node import Facts, StepError
from dra.model.pci import IommuGroup, PciFunction, VfioHost
from dra.model.prepared import VFIO_BIND, DeviceAction, PreparedClaim

#: The driver passthrough binds GPUs to, and the one they come from, as /sys/bus/pci/drivers names them.
VFIO_PCI = "vfio-pci"
NVIDIA = "nvidia"
#: Drivers that may keep other functions of the group: they set driver_managed_dma (pci-stub,
#: pcieport) or are vfio-pci itself, so the group stays viable.
GROUP_SAFE_DRIVERS = frozenset({VFIO_PCI, "pci-stub", "pcieport"})
#: How a prepare that binds is turned on, for the refusal when it is off.
HOW_TO_ENABLE = "start the kubelet plugin with --vfio=true (chart value kubeletPlugin.vfio.enabled=true)"


class VfioRunner(Records, Protocol):
    """What runs passthrough's steps over sysfs (dra.kubeletplugin.devicesteps), and a claim's own (save).

    Each step is a call of one method; a step that fails raises StepError.
    """

    def read_vfio_host(self) -> VfioHost:
        """Whether the kernel runs with an IOMMU and has vfio-pci loaded."""

    def read_iommu_group(self, address: str) -> IommuGroup:
        """The IOMMU group of the PCI function at `address`, each member with its driver."""

    def bind_vfio(self, address: str, *, point: str = "") -> None:
        """Bind the PCI function at `address` to vfio-pci (override, unbind, bind); bound already is fine."""

    def restore_pci(self, address: str, driver: str, *, point: str = "") -> None:
        """Clear its driver_override, bind the function to `driver` ("": none); bound there is fine."""


def passthrough(allocation: ClaimAllocation, devices: Mapping[str, Device]) -> dict[str, bool]:
    """The claim's devices passed through, by name: whether each gets the IOMMU API device.

    Those a VfioDeviceConfig applies to, and every passthrough twin (without one, the API
    device is off, as in NVIDIA's default VfioDeviceConfig). The configs are valid
    (deviceconfig.problems ran first).
    """
    wanted: dict[str, bool] = {}
    for result in allocation.devices:
        device = devices.get(result.device)
        if device is None:
            continue
        config = deviceconfig.effective([c.parameters for c in allocation.configs_for(result)], device)
        if isinstance(config, VfioDeviceConfig):
            wanted[device.name] = bool(config.iommu.enable_api_device)
        elif is_vfio_twin(device):
            wanted[device.name] = False
    return wanted


def problems(
    allocation: ClaimAllocation,
    devices: Mapping[str, Device],
    wanted: Mapping[str, bool],
    inventory: Inventory,
    *,
    enabled: bool,
) -> list[str]:
    """Why the claim's passthrough cannot be served, from the claim and node settings alone.

    A dynamic-MIG GPU in MIG mode is fine: prepare turns MIG off for a claim of the whole GPU first.
    """
    if not wanted:
        return []
    if not enabled:
        return [f"GPU passthrough (VfioDeviceConfig) is off on this node: {HOW_TO_ENABLE}"]
    found: list[str] = []
    for result in allocation.devices:
        device = devices.get(result.device)
        if device is None or device.name not in wanted:
            continue
        if is_vfio_twin(device):
            # The scheduler keeps a GPU and its twin apart by their counters; this claim got both anyway.
            found.extend(
                f"device {device.name} is GPU {other.name} passed through: a claim gets one or the other"
                for other in devices.values()
                if other.uuid == device.uuid and other.name != device.name
            )
            if any(
                isinstance(deviceconfig.decode(c.parameters), GpuConfig)
                for c in allocation.configs_for(result)
            ):
                found.append(
                    f"device {device.name} is a GPU passed through (type vfio): a GpuConfig does not apply "
                    "to it, a VfioDeviceConfig does"
                )
        if result.admin_access:
            found.append(f"device {device.name}: admin access cannot pass a GPU through, it is not exclusive")
        if result.share_id:
            found.append(f"device {device.name}: a share of a GPU cannot be passed through, only a whole GPU")
        dynamic = any(g.uuid == device.uuid for g in inventory.dynamic_gpus)
        if isinstance(device, Gpu) and device.mig_enabled and not dynamic:
            found.append(f"device {device.name} is in MIG mode: passthrough takes a GPU with MIG mode off")
    return found


def _claimed_functions(gpu: Gpu, group: IommuGroup) -> tuple[list[PciFunction], list[PciFunction]]:
    """The group's other functions to unbind for the claim (the GPU card's own), and those that refuse it."""
    own = group.function(gpu.pci_bus_id)
    slot = own.slot if own is not None else gpu.pci_bus_id
    bound = [
        f
        for f in group.functions
        if f.address != gpu.pci_bus_id and f.driver and f.driver not in GROUP_SAFE_DRIVERS
    ]
    return [f for f in bound if f.slot == slot], [f for f in bound if f.slot != slot]


def bind(
    steps: VfioRunner,
    allocation: ClaimAllocation,
    claim: PreparedClaim,
    wanted: Mapping[str, bool],
    facts: Facts,
) -> tuple[PreparedClaim, Facts]:
    """Bind the claim's passed-through GPUs to vfio-pci; the claim with their IOMMU groups recorded.

    ClaimError, with every GPU of the claim given back, when the node or a group cannot serve it.
    """
    host = steps.read_vfio_host()
    refuse = f"cannot prepare ResourceClaim {allocation.ref}: "
    if not host.iommu:
        raise ClaimError(
            refuse + "this node has no IOMMU (/sys/kernel/iommu_groups is empty): passthrough needs one "
            "(boot with intel_iommu=on or amd_iommu=on)"
        )
    if not host.vfio_pci:
        raise ClaimError(refuse + "the vfio-pci driver is not loaded on this node (modprobe vfio-pci)")
    entries = list(claim.devices)
    for i, entry in enumerate(entries):
        gpu = facts.inventory.device_or_twin(entry.device)
        if entry.device not in wanted or not isinstance(gpu, Gpu):
            continue
        try:
            group = steps.read_iommu_group(gpu.pci_bus_id)
        except StepError as err:
            _refuse(
                steps, allocation.uid, facts, refuse + f"cannot read the IOMMU group of GPU {gpu.name}: {err}"
            )
        own = group.function(gpu.pci_bus_id)
        siblings, blockers = _claimed_functions(gpu, group)
        problem = ""
        if own is None or own.driver != NVIDIA:
            driver = own.driver if own is not None and own.driver else "no driver"
            problem = f"GPU {gpu.name} ({gpu.pci_bus_id}) is bound to {driver}, not nvidia"
        elif blockers:
            problem = (
                f"GPU {gpu.name} shares IOMMU group {group.number} with "
                + ", ".join(f"{f.address} (bound to {f.driver})" for f in blockers)
                + "; the kernel passes a group through whole, so those must be unbound or bound to vfio-pci"
            )
        if problem:
            _refuse(steps, allocation.uid, facts, refuse + problem)
        params: dict[str, str | int] = {
            "gpu": gpu.uuid,
            "address": gpu.pci_bus_id,
            "group": group.number,
            "siblings": ",".join(f"{f.address}={f.driver}" for f in siblings),
        }
        intent = DeviceAction(allocation.uid, gpu.name, VFIO_BIND, params)
        facts = replace(facts, actions=(*facts.actions, intent))
        steps.save(facts.prepared, facts.actions, point="vfio-intent-recorded")
        try:
            for sibling in siblings:
                steps.restore_pci(sibling.address, "", point="vfio-sibling-unbound")
            steps.bind_vfio(gpu.pci_bus_id, point="vfio-bound")
        except StepError as err:
            _refuse(
                steps,
                allocation.uid,
                facts,
                refuse + f"cannot bind GPU {gpu.name} ({gpu.pci_bus_id}) to vfio-pci: {err}",
            )
        facts = replace(
            facts, actions=tuple(replace(a, done=True) if a is intent else a for a in facts.actions)
        )
        steps.save(facts.prepared, facts.actions, point="vfio-recorded")
        entries[i] = replace(entry, vfio_group=group.number, vfio_api_device=wanted[entry.device])
    return replace(claim, devices=tuple(entries)), facts


def _refuse(steps: VfioRunner, uid: str, facts: Facts, message: str) -> NoReturn:
    """Give back what the claim bound so far (a failure is left to start-up), then refuse it."""
    with contextlib.suppress(StepError):
        release(steps, uid, facts)
    raise ClaimError(message)


def _siblings(action: DeviceAction) -> list[tuple[str, str]]:
    text = str(action.params["siblings"])
    return [tuple(s.split("=", 1)) for s in text.split(",")] if text else []  # type: ignore[misc]


def _give_back(steps: VfioRunner, action: DeviceAction) -> None:
    """The GPU back to nvidia, then its card's other functions to their drivers."""
    steps.restore_pci(str(action.params["address"]), NVIDIA, point="vfio-released")
    for address, driver in _siblings(action):
        steps.restore_pci(address, driver, point="vfio-sibling-restored")


def release(steps: VfioRunner, uid: str, facts: Facts) -> Facts:
    """Give the claim's passed-through GPUs back to nvidia, dropping their actions; StepError if one fails."""
    mine = [a for a in facts.actions if a.claim_uid == uid and a.kind == VFIO_BIND]
    if not mine:
        return facts
    for action in reversed(mine):
        _give_back(steps, action)
    facts = replace(facts, actions=tuple(a for a in facts.actions if a not in mine))
    steps.save(facts.prepared, facts.actions)
    return facts


def recover(steps: VfioRunner, facts: Facts) -> None:
    """At start-up: bind again what prepared claims pass through, give back what a crash left half done.

    The actions themselves are kept or dropped by dra.core.recovery, as the MIG ones.
    """
    for action in facts.actions:
        if action.kind != VFIO_BIND:
            continue
        try:
            if action.done and action.claim_uid in facts.prepared:
                for address, _driver in _siblings(action):
                    steps.restore_pci(address, "")
                steps.bind_vfio(str(action.params["address"]))
            else:
                _give_back(steps, action)
        except StepError as err:
            steps.log("error", f"claim {action.claim_uid}: GPU {action.params['address']}: {err}")
