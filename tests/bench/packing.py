"""The best a node's devices allow for a sequence of claims, computed offline; and the packing report. Pure.

tests.bench.bench_packing has the real scheduler place pods one after the other and counts those it
places before the first it cannot. This module says what the same devices could hold at best,
whatever device each claim was given: the longest prefix of the same arrivals that fits on the node
at once (`best`), and the fewest GPUs that prefix needs.

The devices a kind of claim may get are those whose selectors match, as `dra-gpu explain` evaluates
them (dra.explain: the scheduler's CEL rules). Devices are grouped by GPU (a MIG device's or offer's
parentUUID, a GPU's uuid). For each GPU, every combination of claims it can hold at once is
enumerated: an exclusive device once, a shared one (allowMultipleAllocations) while its capacities
last, as the scheduler rounds each request up to the capacity's request policy, and no counter set
overdrawn. A dynamic programme over the GPUs then says whether a number of claims of each kind fits,
and on how few GPUs. Claims ask for one device each (no constraints, no prioritized lists).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra.cel import Quantity, QuantityError
from dra.explain.devices import slice_devices
from dra.explain.report import explain_claim

Obj = dict[str, Any]


@dataclass(frozen=True)
class Ask:
    """What one pod's claim asks for: one device of a class, the request's selectors and capacity requests."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    #: Consumable capacity requests (capacity.requests), name to quantity.
    capacity: tuple[tuple[str, str], ...] = ()

    def request(self) -> Obj:
        """The claim's one request."""
        exactly: Obj = {"deviceClassName": self.device_class}
        if self.selectors:
            exactly["selectors"] = [{"cel": {"expression": e}} for e in self.selectors]
        if self.capacity:
            exactly["capacity"] = {"requests": dict(self.capacity)}
        return {"name": "gpu", "exactly": exactly}

    def claim(self, name: str, namespace: str) -> Obj:
        """A ResourceClaim with the request."""
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": [self.request()]}},
        }


def _int(value: object) -> int:
    try:
        return Quantity.parse(str(value)).as_int64() or 0
    except QuantityError:
        return 0


@dataclass(frozen=True)
class Capacity:
    """One capacity of a device: its value and the request policy a shared device gives it."""

    value: int
    policy: Mapping[str, Any] | None = None

    def consumed(self, requested: str | None) -> int | None:
        """What a claim asking `requested` (None: nothing) takes of it, as the scheduler rounds it; None if
        the policy refuses it."""
        policy = self.policy
        if requested is None:
            return _int(policy["default"]) if policy and policy.get("default") is not None else self.value
        amount = _int(requested)
        if not policy:
            return amount
        if policy.get("default") is not None and amount == _int(policy["default"]):
            return amount
        valid_range, valid_values = policy.get("validRange"), policy.get("validValues")
        if valid_range and valid_range.get("min") is not None:
            least, step = _int(valid_range["min"]), valid_range.get("step")
            if amount < least:
                amount = least
            elif step:
                amount = least + -(-(amount - least) // _int(step)) * _int(step)
            if valid_range.get("max") is not None and amount > _int(valid_range["max"]):
                return None
            return amount
        if valid_values:
            fitting = [v for v in (_int(v) for v in valid_values) if v >= amount]
            return min(fitting) if fitting else None
        return amount


@dataclass(frozen=True)
class Device:
    """A device of the node as packing sees it: its GPU, the counters it consumes, its capacities."""

    name: str
    gpu: str
    #: (counter set, counter, amount) it consumes.
    counters: tuple[tuple[str, str, int], ...] = ()
    capacity: Mapping[str, Capacity] = field(default_factory=dict)
    shared: bool = False


def _attribute(device: Mapping[str, Any], name: str) -> str | None:
    value = (device.get("attributes") or {}).get(name)
    return None if value is None else str(next(iter(value.values())))


def devices_of(slices: Iterable[Obj]) -> tuple[list[Device], dict[str, dict[str, int]]]:
    """The devices of `slices` (newest generation), and their counter sets: set to counter to total."""
    slices = list(slices)
    totals = {
        counter_set["name"]: {name: _int(c["value"]) for name, c in counter_set["counters"].items()}
        for s in slices
        for counter_set in s["spec"].get("sharedCounters") or []
    }
    devices = []
    for _, _, entry in slice_devices(slices):
        consumes = tuple(
            (c["counterSet"], name, _int(amount["value"]))
            for c in entry.get("consumesCounters") or []
            for name, amount in c["counters"].items()
        )
        gpu = _attribute(entry, "parentUUID") or _attribute(entry, "uuid") or entry["name"]
        capacity = {
            name: Capacity(_int(c["value"]), c.get("requestPolicy")) for name, c in entry["capacity"].items()
        }
        devices.append(
            Device(entry["name"], gpu, consumes, capacity, bool(entry.get("allowMultipleAllocations")))
        )
    return devices, totals


def candidates(asks: Sequence[Ask], slices: Sequence[Obj], classes: Sequence[Obj]) -> list[frozenset[str]]:
    """For each ask, the devices whose class and request selectors match (dra-gpu explain's verdict)."""
    found = []
    for ask in asks:
        report = explain_claim(ask.claim("packing", "default"), classes, slices)
        found.append(frozenset(report.requests[0].matching))
    return found


Vector = tuple[int, ...]


@dataclass(frozen=True)
class Kind:
    """One ask on one GPU: what each of the GPU's devices it may take would consume of its capacities."""

    takes: Mapping[int, Mapping[str, int]]


def kinds_on(
    asks: Sequence[Ask], matching: Sequence[frozenset[str]], devices: Sequence[Device]
) -> list[Kind]:
    """Each ask on one GPU's `devices`: those it matches whose capacities its requests fit."""
    kinds = []
    for ask, names in zip(asks, matching, strict=True):
        requested = dict(ask.capacity)
        takes: dict[int, Mapping[str, int]] = {}
        for index, device in enumerate(devices):
            if device.name not in names or any(name not in device.capacity for name in requested):
                continue
            consumed = {name: c.consumed(requested.get(name)) for name, c in device.capacity.items()}
            amounts = {name: n for name, n in consumed.items() if n is not None}
            if len(amounts) == len(consumed) and all(
                n <= device.capacity[name].value for name, n in amounts.items()
            ):
                takes[index] = amounts if device.shared else {}
        kinds.append(Kind(takes))
    return kinds


def holdings(
    devices: Sequence[Device], totals: Mapping[str, Mapping[str, int]], kinds: Sequence[Kind]
) -> list[Vector]:
    """The most claims of each kind one GPU's `devices` hold at once: the maximal vectors, counts per kind.

    A device is taken by one claim, or by several while its capacities last where it is shared, and
    its counters are drawn once, however many claims share it.
    """
    found: set[Vector] = set()

    def place(
        kind: int,
        start: int,
        held: dict[int, dict[str, int]],
        drawn: dict[tuple[str, str], int],
        counts: list[int],
    ) -> None:
        found.add(tuple(counts))
        for k in range(kind, len(kinds)):
            for index in sorted(kinds[k].takes):
                # Each kind takes devices in index order, so that every combination is seen once.
                if k == kind and index < start:
                    continue
                device, takes = devices[index], kinds[k].takes[index]
                if index in held and not device.shared:
                    continue
                use = held.get(index, {})
                if any(use.get(name, 0) + n > device.capacity[name].value for name, n in takes.items()):
                    continue
                drawing = dict(drawn)
                if index not in held:
                    for counter_set, counter, amount in device.counters:
                        drawing[(counter_set, counter)] = drawing.get((counter_set, counter), 0) + amount
                    if any(n > totals[s][c] for (s, c), n in drawing.items()):
                        continue
                after = {**held, index: {name: use.get(name, 0) + n for name, n in takes.items()}}
                counts[k] += 1
                place(k, index, after, drawing, counts)
                counts[k] -= 1

    place(0, 0, {}, {}, [0] * len(kinds))
    return [
        v for v in found if not any(o != v and all(a >= b for a, b in zip(o, v, strict=True)) for o in found)
    ]


def fewest_gpus(demand: Vector, gpus: Sequence[Sequence[Vector]]) -> int | None:
    """The fewest GPUs that hold `demand` (claims per kind), each one of its vectors; None if none do."""
    states = {demand: 0}
    for vectors in gpus:
        after = dict(states)
        for left, used in states.items():
            if not any(left):
                continue
            for vector in vectors:
                rest = tuple(max(0, n - m) for n, m in zip(left, vector, strict=True))
                if rest != left and after.get(rest, used + 2) > used + 1:
                    after[rest] = used + 1
        states = after
    return states.get(tuple(0 for _ in demand))


@dataclass(frozen=True)
class Packing:
    """How many of the arrivals fit at best before one does not, and on how few GPUs."""

    placed: int
    gpus: int


class Node:
    """A node's devices, ready to say what they hold at best for asks of given kinds."""

    def __init__(self, slices: Sequence[Obj], classes: Sequence[Obj], asks: Sequence[Ask]) -> None:
        self.asks = list(asks)
        devices, totals = devices_of(slices)
        self.gpu_of = {d.name: d.gpu for d in devices}
        matching = candidates(self.asks, slices, classes)
        by_gpu: dict[str, list[Device]] = {}
        for device in devices:
            by_gpu.setdefault(device.gpu, []).append(device)
        self.gpus = [holdings(g, totals, kinds_on(self.asks, matching, g)) for g in by_gpu.values()]

    def best(self, arrivals: Sequence[int]) -> Packing:
        """The longest prefix of `arrivals` (indexes into the asks) that fits at once, and its fewest GPUs."""

        def gpus(count: int) -> int | None:
            demand = [0] * len(self.asks)
            for kind in arrivals[:count]:
                demand[kind] += 1
            return fewest_gpus(tuple(demand), self.gpus)

        low, high = 0, len(arrivals)
        while low < high:
            middle = (low + high + 1) // 2
            if gpus(middle) is None:
                high = middle - 1
            else:
                low = middle
        return Packing(low, gpus(low) or 0)

    def gpus_used(self, devices: Iterable[str]) -> int:
        """How many GPUs the devices are on."""
        return len({self.gpu_of[d] for d in devices})
