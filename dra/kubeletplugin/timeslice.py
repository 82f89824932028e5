"""Setting GPUs' compute time slice for the claims that ask one, through the GPU library.

The decisions (which interval, conflicts, when to go back to Default) are in
dra.core.sharing; this applies them. Setting a level is idempotent, so the
state applies it again whenever it is unsure whether a crash came between
recording a claim and setting its GPUs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from dra.core import sharing
from dra.gpu.library import GpuHandle, GpuLibrary, GpuLibraryError

log = logging.getLogger(__name__)


class TimeSliceError(Exception):
    """A GPU's time slice could not be set; the message names the GPU and the library's error."""


class TimeSlicer:
    """Sets and restores the time slice of GPUs named by UUID."""

    def __init__(self, lib: GpuLibrary) -> None:
        self._lib = lib
        self._handles: dict[str, GpuHandle] = {}

    def _handle(self, uuid: str) -> GpuHandle:
        if uuid not in self._handles:
            # Indexes shift when a GPU leaves the bus; UUIDs do not, so look them up afresh.
            self._handles = {}
            for index in range(self._lib.device_count()):
                handle = self._lib.device_by_index(index)
                self._handles[self._lib.uuid(handle)] = handle
        try:
            return self._handles[uuid]
        except KeyError:
            raise TimeSliceError(f"GPU {uuid} is not on this node any more") from None

    def set(self, uuid: str, interval: str) -> None:
        """Run GPU `uuid` at `interval`; TimeSliceError when the library refuses."""
        try:
            self._lib.set_time_slice(self._handle(uuid), sharing.level(interval))
        except GpuLibraryError as err:
            raise TimeSliceError(f"cannot set time-slice interval {interval} on GPU {uuid}: {err}") from None
        log.info("GPU %s runs at time-slice interval %s", uuid, interval)

    def apply(self, wanted: Mapping[str, str]) -> None:
        """Set each GPU's interval (UUID -> interval); the first failure stops with TimeSliceError."""
        for uuid, interval in sorted(wanted.items()):
            self.set(uuid, interval)

    def restore(self, uuids: Iterable[str]) -> None:
        """Put GPUs back to Default; a failure is logged, since the claim is going away regardless."""
        for uuid in uuids:
            try:
                self.set(uuid, sharing.DEFAULT_INTERVAL)
            except TimeSliceError as err:
                log.error("%s; it keeps its interval until set by hand", err)
