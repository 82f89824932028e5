"""The GPU's steps (dra.core.gpusteps) run over a GpuLibrary, and the loop that runs a program of steps.

Both executors stand on it: the state (dra.kubeletplugin.state), whose programs make and destroy
the MIG devices of claims among their other steps, and static MIG layouts
(dra.kubeletplugin.miglayout), whose programs are GPU steps alone. It decides nothing: a step is
one call of dra.gpu.dynamic or of the library, and its failure goes back into the program.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator
from typing import Any, ClassVar, TypeVar

from dra.adapters import faults
from dra.core import gpusteps as g
from dra.core.steps import Log, Step, StepError
from dra.gpu import dynamic
from dra.gpu.discovery import profile_infos
from dra.gpu.library import GpuLibrary, GpuLibraryError, Placement
from dra.model.devices import MigDevice

T = TypeVar("T")
#: A runner: what a program's steps are run on, itself or a runner of more kinds of step.
S = TypeVar("S", bound="GpuSteps")

_LOG_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class GpuSteps:
    """Runs the GPU's steps over a GPU library (dra.core.gpusteps.GpuRunner), one method per kind, and Log."""

    #: What a step may fail with; it is thrown into the program as StepError, which decides what follows.
    step_errors: ClassVar[tuple[type[Exception], ...]] = (GpuLibraryError,)

    def __init__(self, lib: GpuLibrary | None, logger: logging.Logger) -> None:
        """`lib` is None where no program yields a GPU step (Node.mig); Log steps go to `logger`."""
        self._lib = lib
        self._logger = logger

    def _run_step(self: S, step: Step[S]) -> object:
        """Run one step: its kind's method (step.run names it)."""
        return step.run(self)

    def log(self, step: Log) -> None:
        """Write the line to the plugin's log."""
        self._logger.log(_LOG_LEVELS[step.level], "%s", step.message)

    def read_gpus(self, step: g.ReadGpus) -> tuple[g.GpuIdentity, ...]:
        """Every GPU's index, PCI device ID, UUID and name."""
        lib = self._gpus()
        handles = [(i, lib.device_by_index(i)) for i in range(lib.device_count())]
        return tuple(g.GpuIdentity(i, lib.pci_device_id(h), lib.uuid(h), lib.name(h)) for i, h in handles)

    def list_instance_profiles(self, step: g.ListInstanceProfiles) -> tuple[g.InstanceProfile, ...]:
        """The GPU's GPU-instance profiles and their placements."""
        lib = self._gpus()
        handle = lib.device_by_index(step.gpu_index)
        found = []
        for info in profile_infos(lib, handle):
            placements = lib.gpu_instance_possible_placements(handle, info.id)
            found.append(
                g.InstanceProfile(
                    info.name.removeprefix("MIG ").strip(),
                    info.id,
                    info.slice_count,
                    placements[0].size if placements else 0,
                    tuple(p.start for p in placements),
                    info.instance_count,
                )
            )
        return tuple(found)

    def list_gpu_instances(self, step: g.ListGpuInstances) -> tuple[g.GpuInstanceAt, ...]:
        """The GPU's instances, their profiles and where they sit."""
        return tuple(
            g.GpuInstanceAt(i.gpu_instance_id, i.profile_id, i.placement.start, i.placement.size)
            for i in dynamic.instances(self._gpus(), step.gpu_index)
        )

    def has_compute_instance(self, step: g.HasComputeInstance) -> bool:
        """Whether the GPU instance has a compute instance."""
        lib = self._gpus()
        return bool(
            lib.compute_instances(
                lib.gpu_instance_by_id(lib.device_by_index(step.gpu_index), step.gpu_instance_id)
            )
        )

    def create_gpu_instance(self, step: g.CreateGpuInstance) -> int:
        """Make the GPU instance at the placement."""
        placement = Placement(step.start, step.size)
        return dynamic.create_gpu_instance(self._gpus(), step.gpu_index, step.profile_id, placement)

    def create_compute_instance(self, step: g.CreateComputeInstance) -> int:
        """Make the compute instance spanning the GPU instance."""
        return dynamic.create_compute_instance(
            self._gpus(), step.gpu_index, step.gpu_instance_id, step.slices
        )

    def find_mig_device(self, step: g.FindMigDevice) -> MigDevice:
        """The MIG device the instances make."""
        return dynamic.find_mig_device(self._gpus(), step.gpu, step.gpu_instance_id, step.compute_instance_id)

    def read_mig_mode(self, step: g.ReadMigMode) -> tuple[int, int]:
        """The GPU's current and pending MIG mode."""
        return dynamic.mig_mode(self._gpus(), step.gpu_index)

    def set_mig_mode(self, step: g.SetMigMode) -> bool:
        """Ask for the MIG mode; whether it is current."""
        return dynamic.set_mig_mode(self._gpus(), step.gpu_index, step.mode)

    def destroy_gpu_instance(self, step: g.DestroyGpuInstance) -> None:
        """Destroy the GPU instance and its compute instances."""
        dynamic.destroy(self._gpus(), step.gpu_index, step.gpu_instance_id)

    def _gpus(self) -> GpuLibrary:
        assert self._lib is not None
        return self._lib


def execute(runner: S, program: Generator[Step[S], Any, T], hold: Callable[[bool], None] | None = None) -> T:
    """Run the program on the runner; its answer. Each step's result is sent back, a failure of the
    runner's step_errors thrown in as StepError (the program decides what follows), and the step's
    crash point passed. `hold`, where given, is told before each step whether the step runs locked.
    """
    run, errors = runner._run_step, runner.step_errors
    result: object = None
    failure: StepError | None = None
    while True:
        try:
            step = program.send(result) if failure is None else program.throw(failure)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        except StepError as failed:
            # The program did not handle it: the step's own error, as before there were steps.
            raise failed.__cause__ or failed from None
        if hold is not None:
            hold(step.locked)
        result, failure = None, None
        try:
            result = run(step)
        except errors as err:
            failure = StepError(str(err), getattr(err, "code", 0))
            failure.__cause__ = err
            continue
        if step.point:
            faults.point(step.point)
