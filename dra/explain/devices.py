"""The node's devices as the scheduler reads its ResourceSlices: the newest generation of each pool,
the devices other claims hold, and the shared counters (dynamic MIG) those leave.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra.cel import Quantity, QuantityError

Obj = Mapping[str, Any]


def newest(slices: Iterable[Obj]) -> list[Obj]:
    """The slices of the newest generation of each pool (consumers read no other)."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, 0), int(s["spec"]["pool"].get("generation", 0)))
    return [
        s
        for s in slices
        if int(s["spec"]["pool"].get("generation", 0))
        == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
    ]


def slice_devices(slices: Iterable[Obj]) -> list[tuple[str, str, Obj]]:
    """(driver, pool, device) of every device of the newest generation of each pool."""
    found = [
        (s["spec"]["driver"], s["spec"]["pool"]["name"], d)
        for s in newest(slices)
        for d in s["spec"].get("devices") or []
    ]
    return sorted(found, key=lambda entry: (entry[0], entry[1], _natural(entry[2]["name"])))


CounterKey = tuple[str, str, str]


@dataclass
class Counter:
    """A shared counter of a device's counter set: its total and what is free."""

    total: int
    free: int


def _amount(counter: Obj) -> int:
    try:
        return Quantity.parse(str(counter.get("value", "0"))).as_int64() or 0
    except QuantityError:
        return 0


def counters_left(
    slices: Iterable[Obj], held: Iterable[tuple[str, str, str]]
) -> dict[CounterKey, dict[str, Counter]]:
    """(driver, pool, counter set) -> counter -> its total and what the devices other claims hold leave."""
    current = newest(slices)
    left: dict[CounterKey, dict[str, Counter]] = {}
    for s in current:
        spec = s["spec"]
        for counter_set in spec.get("sharedCounters") or []:
            key = (spec["driver"], spec["pool"]["name"], counter_set["name"])
            left[key] = {
                name: Counter(_amount(c), _amount(c))
                for name, c in (counter_set.get("counters") or {}).items()
            }
    by_device = {(driver, pool, d["name"]): d for driver, pool, d in slice_devices(current)}
    for entry in held:
        for consumed in (by_device.get(entry) or {}).get("consumesCounters") or []:
            remaining = left.get((entry[0], entry[1], consumed["counterSet"]), {})
            for name, c in (consumed.get("counters") or {}).items():
                if name in remaining:
                    remaining[name].free -= _amount(c)
    return left


def _gpu_label(counter_set: str) -> str:
    # This driver names a GPU's counter set gpu<N> after the GPU's device gpu-<N>.
    number = counter_set.removeprefix("gpu")
    return f"gpu-{number}" if number.isdigit() else counter_set


def counter_shortage(
    device: Obj, driver: str, pool: str, left: Mapping[CounterKey, Mapping[str, Counter]]
) -> str | None:
    """Why a device's counters have too little left: "gpu-3: 2 of 7 compute slices free; 3g.40gb needs 3"."""
    profile = ((device.get("attributes") or {}).get("profile") or {}).get("string") or device["name"]
    for consumed in device.get("consumesCounters") or []:
        remaining = left.get((driver, pool, consumed["counterSet"]), {})
        gpu = _gpu_label(consumed["counterSet"])
        # Compute first: it is the shortage people reason about; then memory, then memory slices.
        for name, c in sorted(
            (consumed.get("counters") or {}).items(), key=lambda i: (i[0] != "compute", i[0])
        ):
            counter = remaining.get(name)
            need = _amount(c)
            if counter is None or need <= counter.free:
                continue
            if name.startswith("memslice"):
                return (
                    f"{gpu}: memory slice {name.removeprefix('memslice')} is in use; {profile} here needs it"
                )
            what = "compute slices" if name == "compute" else name
            return f"{gpu}: {max(counter.free, 0)} of {counter.total} {what} free; {profile} needs {need}"
    return None


def _natural(name: str) -> list[Any]:
    parts: list[Any] = []
    for chunk in name.replace("-", " - ").split():
        parts.append((0, int(chunk)) if chunk.isdigit() else (1, chunk))
    return parts


def allocated_devices(
    claims: Iterable[Obj], except_uid: str | None = None
) -> dict[tuple[str, str, str], str]:
    """(driver, pool, device) -> "namespace/name" of the claim that holds it (admin access aside)."""
    held: dict[tuple[str, str, str], str] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        if except_uid and meta.get("uid") == except_uid:
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or []:
            if not result.get("adminAccess"):
                held[(result["driver"], result["pool"], result["device"])] = (
                    f"{meta.get('namespace')}/{meta.get('name')}"
                )
    return held
