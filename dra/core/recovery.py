"""The start-up repair after a restart or a crash, as a program of steps over plain data.

Specs without a checkpoint entry go, prepared claims get their specs back,
MIG devices are adopted or destroyed (dra.core.migdevices), GPUs passed through
bound again or given back (dra.core.vfio), and GPU settings
are applied again (docs/architecture.md, "Crash safety").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from dra.core import migdevices, sharing, vfio
from dra.core.prepare import MissingDevice, respec
from dra.core.steps import (
    ApplyTimeSlices,
    Facts,
    Log,
    Node,
    Program,
    RemoveLeftovers,
    RemoveSpec,
    SpecUids,
    StartMps,
    StepError,
    StopOtherMps,
    WriteSpec,
    ask,
)
from dra.model.devices import Inventory
from dra.model.prepared import PreparedClaim

Obj = dict[str, Any]


@dataclass(frozen=True)
class RecoverPlan:
    """At start-up: remove specs of claims not prepared, (re)write the specs of prepared ones."""

    remove: tuple[str, ...]
    write: tuple[tuple[str, Obj], ...]
    missing: tuple[MissingDevice, ...]


def decide_recover(
    prepared: Mapping[str, PreparedClaim],
    inventory: Inventory,
    specs: Collection[str],
    *,
    driver: str,
    mps_root: str = "",
) -> RecoverPlan:
    """After a restart, given the UIDs of the claim specs on disk: which to remove, which to write again.

    A spec without a checkpoint entry is a prepare that crashed before recording
    (the kubelet retries it); a prepared claim without its spec lost it in a crash
    or by hand, and gets it back with the devices still on the node. A spec that
    is there is written again too (the store leaves identical bytes alone), so
    that one an older driver wrote gets the current layout before a container of
    the claim restarts; but not when one of its devices vanished, since the old
    spec still names it and its edits do no harm.
    """
    writes: list[tuple[str, Obj]] = []
    missing: list[MissingDevice] = []
    for uid, claim in prepared.items():
        spec, gone = respec(claim, inventory, driver, mps_root)
        missing.extend(gone)
        if spec is not None and (uid not in specs or not gone):
            writes.append((uid, spec))
    return RecoverPlan(
        remove=tuple(sorted(uid for uid in specs if uid not in prepared)),
        write=tuple(writes),
        missing=tuple(missing),
    )


def recover(node: Node, facts: Facts) -> Program[None]:
    """Drop specs of claims not prepared, (re)write prepared ones', settle MIG devices, apply GPU settings."""
    yield RemoveLeftovers(point="recover.leftovers-removed")
    yield from vfio.recover(facts)
    facts = yield from migdevices.recover(node, facts)
    plan = decide_recover(
        facts.prepared,
        facts.inventory,
        (yield from ask(SpecUids())),
        driver=node.driver,
        mps_root=node.mps_root,
    )
    for uid in plan.remove:
        yield Log("info", f"removing CDI spec of claim {uid}, which is not prepared")
        yield RemoveSpec(uid, point="recover.spec-removed")
    for gone in plan.missing:
        yield Log("warning", gone.message)
    for uid, spec in plan.write:
        yield WriteSpec(uid, spec, point="recover.spec-written")
    if node.time_slicing:
        try:
            yield ApplyTimeSlices(sharing.wanted_time_slices(facts.prepared))
        except StepError as err:
            yield Log("error", str(err))
    if node.mps:
        yield StopOtherMps(facts.prepared)
        for claim in facts.prepared.values():
            try:
                yield StartMps(claim)
            except StepError as err:
                yield Log("error", f"claim {claim.namespace}/{claim.name}: {err}")
