"""How to converge on the desired ResourceSlices: the fewest writes from the server's slices to them.

Pure: both sides come in as dicts (dra.core.slices builds the desired ones), the writes go out
as a Plan that the publisher carries out. A key the server fills in with a default does not
count as drift; the generation rules are ``plan``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]


def _is_empty(value: object) -> bool:
    return value is None or value is False or value == [] or value == {} or value == ""


def _same(desired: object, actual: object) -> bool:
    """Equal, except that a key the server added with an empty/default value does not count."""
    if isinstance(desired, Mapping) and isinstance(actual, Mapping):
        for key in desired.keys() | actual.keys():
            if key in desired and key in actual:
                if not _same(desired[key], actual[key]):
                    return False
            elif not _is_empty(desired.get(key, actual.get(key))):
                return False
        return True
    if isinstance(desired, list) and isinstance(actual, list):
        return len(desired) == len(actual) and all(_same(d, a) for d, a in zip(desired, actual, strict=True))
    return desired == actual


def _content(obj: Obj) -> Obj:
    """What the driver owns in a slice, generation aside."""
    spec = dict(obj.get("spec") or {})
    pool = dict(spec.get("pool") or {})
    pool.pop("generation", None)
    spec["pool"] = pool
    return {"spec": spec, "ownerReferences": (obj.get("metadata") or {}).get("ownerReferences")}


def _generation(obj: Obj) -> int:
    return int(((obj.get("spec") or {}).get("pool") or {}).get("generation") or 0)


@dataclass
class Plan:
    """Writes that bring the server to the desired slices."""

    generation: int
    create: list[Obj] = field(default_factory=list)
    update: list[Obj] = field(default_factory=list)
    delete: list[Obj] = field(default_factory=list)

    @property
    def writes(self) -> int:
        """How many API writes the plan makes."""
        return len(self.create) + len(self.update) + len(self.delete)


def _with_generation(obj: Obj, generation: int) -> Obj:
    return {**obj, "spec": {**obj["spec"], "pool": {**obj["spec"]["pool"], "generation": generation}}}


def plan(
    desired: Sequence[Obj],
    existing: Iterable[Obj],
    published_generation: int | None,
) -> Plan:
    """Decide the writes. `desired` carries no meaningful generation; this chooses it.

    published_generation is the generation under which this same desired
    content was last published by this process (None after a device change or
    at start-up). Then only drifted slices are repaired under that generation.
    Otherwise, if the server already holds exactly the desired content at one
    generation, it is adopted without a write; else the generation goes up and
    every slice is rewritten, since consumers read only the newest generation.
    """
    current = {obj["metadata"]["name"]: obj for obj in existing}
    wanted = {obj["metadata"]["name"]: obj for obj in desired}
    extras = [obj for name, obj in sorted(current.items()) if name not in wanted]

    if published_generation is None:
        generations = {_generation(obj) for obj in current.values()}
        matches = set(current) == set(wanted) and all(
            _same(_content(wanted[name]), _content(current[name])) for name in wanted
        )
        if matches and len(generations) == 1:
            return Plan(generation=generations.pop())
        generation = max(generations, default=0) + 1
    else:
        generation = published_generation

    result = Plan(generation=generation, delete=extras)
    for name, obj in wanted.items():
        target = _with_generation(obj, generation)
        if name not in current:
            result.create.append(target)
        elif not (
            _same(_content(target), _content(current[name])) and _generation(current[name]) == generation
        ):
            meta = {**target["metadata"], "resourceVersion": current[name]["metadata"].get("resourceVersion")}
            result.update.append({**target, "metadata": meta})
    return result
