"""What two drivers published, and gave a container, set side by side: the differences as stable keys.

Devices are matched across the drivers by what they are, not by name: a GPU or a MIG device by its
UUID, a dynamic-MIG offer (no UUID) by its GPU, profile and first memory slice. For each pair every
attribute and capacity is compared by name, type and value; names, counter sets and the slices
they sit in are compared as a whole. A difference is a key such as
("attribute", "gpu", "index", "ours only"), the same whatever the profile's size, so that a test
can hold the list of the ones docs/migration.md explains.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, ...]

#: The side each driver is on in a key.
OURS, THEIRS = "ours only", "nvidia only"


def _kind(device: Obj) -> str:
    attributes = device.get("attributes", {})
    kind = str(attributes.get("type", {}).get("string", "?"))
    return "mig offer" if kind == "mig" and "uuid" not in attributes else kind


def _first_slice(device: Obj) -> int | None:
    """The first memory slice a dynamic-MIG offer would take, from whatever the driver published."""
    attributes = device.get("attributes", {})
    if "placementStart" in attributes:
        return int(attributes["placementStart"]["int"])
    slices = [
        int(match.group(1))
        for consumed in device.get("consumesCounters", [])
        for name in consumed.get("counters", {})
        if (match := re.fullmatch(r"mem(?:ory-)?slice-?(\d+)", name))
    ]
    return min(slices) if slices else None


def identity(device: Obj) -> tuple[str, ...]:
    """What a device is, whichever driver named it."""
    attributes = device.get("attributes", {})
    if "uuid" in attributes:
        return ("uuid", str(attributes["uuid"]["string"]))
    return (
        "offer",
        str(attributes.get("parentUUID", {}).get("string")),
        str(attributes.get("profile", {}).get("string")),
        str(_first_slice(device)),
    )


def devices(slices: Iterable[Obj]) -> dict[tuple[str, ...], Obj]:
    """The devices of a pool's slices by identity."""
    return {identity(d): d for s in slices for d in s["spec"].get("devices") or []}


def _values(ours: Mapping[str, Obj], theirs: Mapping[str, Obj], what: str, kind: str) -> set[Key]:
    found: set[Key] = set()
    for name in set(ours) | set(theirs):
        if name not in theirs:
            found.add((what, kind, name, OURS))
        elif name not in ours:
            found.add((what, kind, name, THEIRS))
        elif ours[name] != theirs[name]:
            same_type = set(ours[name]) == set(theirs[name])
            found.add((what, kind, name, "value" if same_type else "type"))
    return found


def slice_differences(ours: list[Obj], theirs: list[Obj]) -> set[Key]:
    """How two drivers' slices for one node differ, as keys (see the module's docstring)."""
    found: set[Key] = set()
    mine, others = devices(ours), devices(theirs)
    for key in set(mine) | set(others):
        if key not in others:
            found.add(("device", _kind(mine[key]), OURS))
            continue
        if key not in mine:
            found.add(("device", _kind(others[key]), THEIRS))
            continue
        a, b = mine[key], others[key]
        kind = _kind(a)
        if a["name"] != b["name"]:
            found.add(("name", kind))
        found |= _values(a.get("attributes", {}), b.get("attributes", {}), "attribute", kind)
        capacities = [{n: {"value": v["value"]} for n, v in d.get("capacity", {}).items()} for d in (a, b)]
        found |= _values(capacities[0], capacities[1], "capacity", kind)
        for field in ("taints", "allowMultipleAllocations"):
            if a.get(field) != b.get(field):
                found.add((field, kind))
        if bool(a.get("consumesCounters")) != bool(b.get("consumesCounters")):
            found.add(("consumes counters", kind, OURS if a.get("consumesCounters") else THEIRS))
    found |= _counter_differences(ours, theirs)
    if len(ours) != len(theirs):
        found.add(("slices", "count"))
    return found


def _counter_differences(ours: list[Obj], theirs: list[Obj]) -> set[Key]:
    """Counter sets are each driver's own vocabulary: compare what is counted, per GPU, by name."""

    def counted(slices: list[Obj]) -> tuple[set[str], set[str]]:
        sets = [c for s in slices for c in s["spec"].get("sharedCounters") or []]
        return {c["name"] for c in sets}, {name for c in sets for name in c["counters"]}

    (mine_sets, mine_counters), (their_sets, their_counters) = counted(ours), counted(theirs)
    found: set[Key] = set()
    if mine_sets != their_sets:
        found.add(("counter set names",))
    found |= {("counter", _generic(name), OURS) for name in mine_counters - their_counters}
    found |= {("counter", _generic(name), THEIRS) for name in their_counters - mine_counters}
    return found


def _generic(counter: str) -> str:
    """A counter's name with its slice number left out: memslice3 and memslice5 are one kind."""
    return re.sub(r"\d+$", "N", counter)


def edit_differences(ours: Obj, theirs: Obj) -> set[Key]:
    """How the container edits two drivers gave the same claim differ (runtime records), as keys."""
    found: set[Key] = set()
    nodes = [{n["path"]: n.get("hostPath") for n in r["deviceNodes"]} for r in (ours, theirs)]
    if set(nodes[0]) != set(nodes[1]):
        found.add(("device nodes", "container paths"))
    if any(nodes[0][path] != nodes[1][path] for path in set(nodes[0]) & set(nodes[1])):
        found.add(("device nodes", "host paths"))
    env = [dict(r["env"]) for r in (ours, theirs)]
    for name in set(env[0]) | set(env[1]):
        if name in env[0] and name in env[1] and env[0][name] != env[1][name]:
            found.add(("env", name, "value"))
        elif name not in env[1]:
            found.add(("env", _generic_env(name), OURS))
        elif name not in env[0]:
            found.add(("env", _generic_env(name), THEIRS))
    mounts = [{m["containerPath"] for m in r["mounts"]} for r in (ours, theirs)]
    found |= {("mount", _generic_path(p), OURS) for p in mounts[0] - mounts[1]}
    found |= {("mount", _generic_path(p), THEIRS) for p in mounts[1] - mounts[0]}
    # A hook is its stage and its subcommand (nvidia-cdi-hook create-symlinks ...).
    hooks = [
        {f"{h['hookName']} {' '.join(h.get('args', [])[1:2])}" for h in r["hooks"]} for r in (ours, theirs)
    ]
    found |= {("hook", hook, OURS) for hook in hooks[0] - hooks[1]}
    found |= {("hook", hook, THEIRS) for hook in hooks[1] - hooks[0]}
    return found


def _generic_env(name: str) -> str:
    """A variable with its device or claim left out: DRA_GPU_GPU_0_UUID is of a kind with _GPU_3_UUID."""
    if name.startswith("DRA_GPU_CLAIM_"):
        return "DRA_GPU_CLAIM_*"
    return re.sub(r"^DRA_GPU_.+?_(NAME|UUID|PRODUCT|PROFILE|PARENT_UUID|INDEX)$", r"DRA_GPU_*_\1", name)


def _generic_path(path: str) -> str:
    """A driver file's container path by kind: a library's SONAME link, or the directory it is in."""
    return "*.so.1" if path.endswith(".so.1") else re.sub(r"/[^/]*$", "/*", path)
