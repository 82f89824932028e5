"""Static MIG layouts (NVIDIA mig-parted's format) applied to the GPUs: the file, claims' instances, the run.

What a layout does to the GPUs (MIG mode, the plan of kept, held, destroyed and new instances,
destroy and create, the undo) is dra.core.miglayout's program; which layout, and when, is
dra.kubeletplugin.miglabel's. Here: the layout file read, the instances prepared claims use
found, and the program run on a GPU library, a crash point after each of its steps. The phases and
the states: docs/mig.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from dra import documents
from dra.core import miglayout as core_layout
from dra.core.migconfig import MigConfigError, MigConfigs, parse_mig_configs
from dra.core.miglayout import Applied
from dra.daemon.bootstrap import DaemonSettings, StartupError
from dra.gpu.discovery import discover
from dra.gpu.library import GpuLibrary, GpuLibraryError
from dra.kubeletplugin.devicesteps import GpuSteps
from dra.kubeletplugin.state import Steps
from dra.model.devices import MigDevice
from dra.model.migmode import STATIC, MigModes
from dra.model.prepared import MIG_CREATE, DeviceAction, PreparedClaim

log = logging.getLogger(__name__)


class MigLayoutError(StartupError):
    """The layout cannot be applied; nothing of this attempt is left. The driver exits with status 2."""

    exit_code = 2


class _LayoutSteps(Steps, GpuSteps):
    """What a static layout's program of the GPU's steps runs on: NVML's MIG calls, and log."""

    def __init__(self, lib: GpuLibrary) -> None:
        super().__init__(log)
        self._lib = lib


def load_configs(path: Path) -> MigConfigs:
    """Read and validate a layout file; MigLayoutError naming the file and the fault."""
    try:
        data = documents.load_yaml(
            documents.read_file(path, "--mig-config-file"), f"--mig-config-file {path}"
        )
    except documents.DocumentError as err:
        raise MigLayoutError(str(err)) from None
    try:
        return parse_mig_configs(data, str(path))
    except MigConfigError as err:
        raise MigLayoutError(str(err)) from None


def held_instances(
    lib: GpuLibrary, claims: Iterable[PreparedClaim], actions: Sequence[DeviceAction]
) -> set[tuple[int, int]]:
    """(GPU index, GPU instance ID) of every MIG device a prepared claim uses, by UUID or name."""
    claims = list(claims)
    inventory = discover(lib, MigModes(STATIC))
    held = {
        (m.parent.index, m.gpu_instance_id)
        for m in inventory.devices
        if isinstance(m, MigDevice) and any(c.holds(m.name, m.uuid) for c in claims)
    }
    by_uuid = {g.uuid: g.index for g in inventory.gpus}
    for action in actions:
        gpu = by_uuid.get(str(action.params.get("gpu", "")))
        if action.kind == MIG_CREATE and action.done and gpu is not None:
            held.add((gpu, int(action.result["gpuInstance"])))
    return held


def apply_layout(
    lib: GpuLibrary,
    configs: MigConfigs,
    name: str,
    held: set[tuple[int, int]],
    modes: MigModes,
    dry_run: bool = False,
) -> Applied:
    """Make the GPUs match the layout; MigLayoutError (nothing of this attempt left) when it cannot.

    `held`: the instances prepared claims use (held_instances). With dry_run nothing is changed:
    the plan is what would be done (a GPU whose MIG mode is off is planned only once it is on).
    """
    try:
        return core_layout.apply_layout(_LayoutSteps(lib), configs, name, held, modes, dry_run)
    except MigConfigError as err:
        raise MigLayoutError(str(err)) from None


def static_modes(modes: MigModes, applied: Applied) -> MigModes:
    """The MIG modes with every GPU the layout manages static."""
    layout = dict.fromkeys(applied.uuids, STATIC)
    kept = tuple((key, mode) for key, mode in modes.overrides if key not in layout)
    return replace(modes, overrides=(*kept, *layout.items()))


def apply_with_own_library(
    settings: DaemonSettings,
    configs: MigConfigs,
    name: str,
    modes: MigModes,
    claims: Iterable[PreparedClaim],
    actions: Sequence[DeviceAction],
) -> Applied:
    """apply_layout through a GPU library of its own, keeping what these claims hold; MigLayoutError."""
    lib = settings.library()
    try:
        lib.init()
        return apply_layout(lib, configs, name, held_instances(lib, claims, actions), modes)
    except GpuLibraryError as err:
        raise MigLayoutError(f"MIG layout {name!r}: cannot read the GPUs: {err}") from None
    finally:
        lib.shutdown()
