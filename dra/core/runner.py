"""The steps that more than one feature's runner protocol has, declared once.

Each program module of dra.core declares the protocol of the steps it calls; a step several
features call is declared here and their protocols extend it: `Logs` (the log, the root every
runner has: dra.kubeletplugin.state.Steps) and `Records` (a claim's own `save`, which dynamic
MIG and passthrough call between their steps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dra.model.node import Level
from dra.model.prepared import DeviceAction, PreparedClaim


class Logs(Protocol):
    """A runner: its programs write to the plugin's log."""

    def log(self, level: Level, message: str) -> None:
        """Tell the admin, in the plugin's log."""


class Records(Logs, Protocol):
    """A runner whose programs also record what they did in the checkpoint."""

    def save(
        self,
        prepared: Mapping[str, PreparedClaim],
        actions: tuple[DeviceAction, ...],
        *,
        durable: bool = True,
        changed: frozenset[str] | None = None,
        point: str = "",
    ) -> int:
        """Record these claims and actions in the checkpoint; the ticket `sync` makes durable (0: already)."""
