"""The node as the programs of dra.core see it: its settings, its state, and what its steps answer.

`Node` is what is fixed while the plugin runs, `Facts` the prepared claims, device actions and
inventory a program decides on, `ClaimRead` what the API server answered about a prepared claim,
and `StepError` a step of the node that failed (a file, NVML, an MPS daemon), which the program
that called it decides about.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dra.model.devices import Inventory
from dra.model.prepared import DeviceAction, Holders, PreparedClaim

#: A log line's level, as a program asks its runner to log it.
Level = Literal["debug", "info", "warning", "error"]


class StepError(Exception):
    """A step failed (a file, NVML, nvidia-smi, an MPS daemon); raised to the program that called it.

    `code`: NVML's return code (nvml.h's nvmlReturn_t) where the step was an NVML call, else 0.
    """

    def __init__(self, message: str, code: int = 0) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ClaimRead:
    """What the API server answered to a GET of a prepared claim's ResourceClaim.

    The object, or the error: its HTTP status (404: not found; 0: the server was not reached) and
    message. What it means for the claim's devices is dra.core.plan's to decide (stale_reasons).
    """

    claim: Mapping[str, Any] | None = None
    status: int = 0
    error: str = ""


@dataclass(frozen=True)
class Node:
    """What a program needs to know of the node, fixed while the plugin runs."""

    driver: str
    pool: str
    #: Where claims' MPS daemons keep their directories ("": the node runs none).
    mps_root: str = ""
    #: Whether MIG devices are made and destroyed here: a GPU of the node can do MIG (the state has the
    #: GPU library only then, dra.kubeletplugin.daemon.mig_library); else no program enters MIG code.
    mig: bool = False
    #: Whether time-slice intervals are set here.
    time_slicing: bool = False
    #: The checkpoint's path, for messages.
    checkpoint: str = ""
    #: Where claims' device metadata files go (KEP-5304), a host path.
    metadata_root: str = ""
    #: Whether claims prepared from now on get device metadata files (those that have them keep them).
    device_metadata: bool = False
    #: Whether claims may pass GPUs through (VfioDeviceConfig binds them to vfio-pci).
    vfio: bool = False
    #: N where shareable devices are divided into N equal shares (--consumable-shares=N), else 0.
    equal_shares: int = 0

    @property
    def mps(self) -> bool:
        """Whether the node runs claims' MPS control daemons."""
        return bool(self.mps_root)


@dataclass(frozen=True)
class Facts:
    """The node's state as the state holds it: prepared claims, device actions, inventory."""

    prepared: Mapping[str, PreparedClaim]
    actions: tuple[DeviceAction, ...]
    inventory: Inventory

    @functools.cached_property
    def holders(self) -> Holders:
        """The prepared claims by device, built once for these facts."""
        return Holders(self.prepared)

    def finished(self) -> tuple[DeviceAction, ...]:
        """The device actions done for prepared claims: those start-up keeps (the others it undoes)."""
        return tuple(a for a in self.actions if a.done and a.claim_uid in self.prepared)

    @classmethod
    def indexed(
        cls,
        prepared: Mapping[str, PreparedClaim],
        actions: tuple[DeviceAction, ...],
        inventory: Inventory,
        holders: Holders,
    ) -> Facts:
        """Facts with this holders index (the state keeps one up to date; a replace() builds its own)."""
        facts = cls(prepared, actions, inventory)
        facts.__dict__["holders"] = holders  # the cached property's slot
        return facts
