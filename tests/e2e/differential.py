"""What two drivers published, and gave a container, set side by side: the differences as stable keys.

Devices are matched across the drivers by what they are, not by name: a GPU or a MIG device by its
UUID, a dynamic-MIG offer (no UUID) by its GPU, profile and first memory slice. For each pair every
attribute and capacity is compared by name, type and value; names and the slices they sit in are
compared as a whole. Counters are each driver's own vocabulary: those that count the same thing
(VOCABULARY: memory, memory slices, media engines) are compared by value, in each device's
consumption and in each counter set's totals (a set matched to the other driver's by the devices
that consume from it), and the others by name. A difference is a key such as
("attribute", "gpu", "index", "ours only"), the same whatever the profile's size, so that a test
can hold the list of the ones docs/migration.md explains.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from dra.model.quantity import Quantity

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
        found |= _consumption_differences(a, b, kind)
    found |= _counter_set_differences(ours, theirs)
    if len(ours) != len(theirs):
        found.add(("slices", "count"))
    return found


#: Counters that count the same thing, by this driver's name and NVIDIA's (docs/migration.md); a
#: memory slice is memsliceN here, memory-slice-N there. A counter either leaves out counts 0.
VOCABULARY = {
    "memory": "memory",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegengines": "jpeg-engines",
    "ofaengines": "ofa-engines",
}


def _in_their_words(counters: Mapping[str, Obj], ours: bool) -> dict[str, Quantity]:
    """Counters by NVIDIA's names where the vocabulary maps them, else by their own; zeros left out."""
    named: dict[str, Quantity] = {}
    for name, counter in counters.items():
        value = Quantity.parse(str(counter["value"]))
        if value == Quantity.from_int(0):
            continue
        if ours and (match := re.fullmatch(r"memslice(\d+)", name)):
            name = f"memory-slice-{match.group(1)}"
        named[VOCABULARY.get(name, name) if ours else name] = value
    return named


def _counter_keys(mine: Mapping[str, Obj], others: Mapping[str, Obj], where: str) -> set[Key]:
    """Counters of the shared vocabulary that differ in value; the others by name (ours only, nvidia only)."""
    a, b = _in_their_words(mine, True), _in_their_words(others, False)
    shared = set(VOCABULARY.values())
    found: set[Key] = set()
    for name in set(a) | set(b):
        mapped = name in shared or name.startswith("memory-slice-")
        if mapped:
            if a.get(name) != b.get(name):
                found.add(("counter value", where, _generic(name)))
        elif name not in b:
            found.add(("counter", _generic(name), OURS))
        elif name not in a:
            found.add(("counter", _generic(name), THEIRS))
    return found


def _consumption_differences(a: Obj, b: Obj, kind: str) -> set[Key]:
    """What a device consumes of its GPU's counters, under each driver."""
    consumed = [d.get("consumesCounters") or [] for d in (a, b)]
    if bool(consumed[0]) != bool(consumed[1]):
        return {("consumes counters", kind, OURS if consumed[0] else THEIRS)}
    if len(consumed[0]) != len(consumed[1]):
        return {("consumes counters", kind, "sets")}
    found: set[Key] = set()
    for mine, others in zip(consumed[0], consumed[1], strict=True):
        found |= _counter_keys(mine["counters"], others["counters"], f"{kind} consumes")
    return found


def _counter_set_differences(ours: list[Obj], theirs: list[Obj]) -> set[Key]:
    """Each counter set's totals; sets are matched by the devices consuming from them."""
    sets = [
        {c["name"]: c["counters"] for s in side for c in s["spec"].get("sharedCounters") or []}
        for side in (ours, theirs)
    ]
    mine, others = devices(ours), devices(theirs)
    pairs: set[tuple[str, str]] = set()
    for key in set(mine) & set(others):
        a, b = (d.get("consumesCounters") or [] for d in (mine[key], others[key]))
        pairs |= {(x["counterSet"], y["counterSet"]) for x, y in zip(a, b, strict=False)}
    found: set[Key] = set()
    if len({a for a, _ in pairs}) != len(pairs) or len({b for _, b in pairs}) != len(pairs):
        found.add(("counter sets", "not one to one"))
    if len(pairs) != len(sets[0]) or len(pairs) != len(sets[1]):
        found.add(("counter sets", "count"))
    if any(a != b for a, b in pairs):
        found.add(("counter set names",))
    for a, b in pairs:
        found |= _counter_keys(sets[0].get(a, {}), sets[1].get(b, {}), "set totals")
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
