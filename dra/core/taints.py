"""The taint an unhealthy device carries in its ResourceSlice. Pure.

A device with a critical XID, fallen off the bus or failing NVML stays
published, with one taint `<driver>/unhealthy=<reason>:<effect>`: the scheduler
no longer gives it to a claim that does not tolerate the taint, and with
NoExecute the controller manager evicts the pods already using it. The taint's
timeAdded is the moment the device became unhealthy, so that republishing the
same health writes nothing. The driver owns these taints; admins taint devices
by hand with DeviceTaintRule objects, which the driver never touches.
"""

from __future__ import annotations

import datetime
import enum
import re
from dataclasses import dataclass
from typing import Any

#: The last part of the taint key; the driver name is the first.
KEY_NAME = "unhealthy"
#: A taint value is a label value: 63 characters of [A-Za-z0-9_.-], alphanumeric at both ends.
MAX_VALUE = 63
_NOT_IN_VALUE = re.compile(r"[^A-Za-z0-9_.-]+")


class Effect(enum.StrEnum):
    """What a taint does to claims that do not tolerate it (resource.k8s.io/v1 DeviceTaintEffect)."""

    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


def parse_effect(text: str) -> Effect:
    """--unhealthy-taint-effect's value; ValueError naming the valid ones."""
    try:
        return Effect(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a taint effect: expected {' or '.join(e.value for e in Effect)}"
        ) from None


@dataclass(frozen=True)
class DeviceTaint:
    """One device's taint."""

    key: str
    value: str
    effect: Effect
    #: Unix seconds; the API stores whole seconds.
    time_added: int

    def entry(self) -> dict[str, Any]:
        """As in a ResourceSlice device's `taints`."""
        added = datetime.datetime.fromtimestamp(self.time_added, datetime.UTC)
        return {
            "key": self.key,
            "value": self.value,
            "effect": self.effect.value,
            "timeAdded": added.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def taint_key(driver: str) -> str:
    """gpu.nvidia.com/unhealthy for the default driver name."""
    return f"{driver}/{KEY_NAME}"


def taint_value(reason: str) -> str:
    """A reason ("XID 79", "NVML error 15") in the form a taint value allows ("XID-79")."""
    value = _NOT_IN_VALUE.sub("-", reason)[:MAX_VALUE].strip("-_.")
    return value or "unknown"


def unhealthy_taint(driver: str, reason: str, effect: Effect, since: int) -> DeviceTaint:
    """The taint of a device unhealthy since `since` (Unix seconds) for `reason`."""
    return DeviceTaint(taint_key(driver), taint_value(reason), effect, since)
