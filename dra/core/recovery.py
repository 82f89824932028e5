"""The start-up repair after a restart or a crash, as a program of steps over plain data.

Specs without a checkpoint entry go, prepared claims get their specs back,
MIG devices are adopted or destroyed (dra.core.migdevices), GPUs passed through
bound again or given back (dra.core.vfio), and GPU settings
are applied again (docs/architecture.md, "Crash safety").
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from dra.core import devicemetadata, migdevices, mpsdaemons, sharing, vfio
from dra.core.cdi import MissingDevice, respec
from dra.core.prepare import NodeRunner
from dra.model.devices import Inventory
from dra.model.node import Facts, Node, StepError
from dra.model.prepared import PreparedClaim

Obj = dict[str, Any]


class RecoveryRunner(NodeRunner, Protocol):
    """What runs the start-up repair: every step of a prepare, and the two only start-up takes."""

    def remove_leftovers(self, *, point: str = "") -> None: ...
    def spec_uids(self) -> frozenset[str]: ...


@dataclass(frozen=True)
class RecoverPlan:
    """At start-up: remove specs of claims not prepared, (re)write the specs of prepared ones."""

    remove: tuple[str, ...]
    write: tuple[tuple[str, Obj], ...]
    missing: tuple[MissingDevice, ...]
    #: Claims' metadata directories (KEP-5304) no prepared claim has: a crash between write and record.
    remove_metadata: tuple[str, ...] = ()
    #: The metadata files of prepared claims that have them, written again like their specs.
    write_metadata: tuple[devicemetadata.ClaimMetadata, ...] = ()


def decide_recover(
    prepared: Mapping[str, PreparedClaim],
    inventory: Inventory,
    specs: Collection[str],
    node: Node,
    *,
    metadata_dirs: Collection[str] = (),
) -> RecoverPlan:
    """After a restart, given the UIDs of the claim specs on disk: which to remove, which to write again.

    A spec without a checkpoint entry is a prepare that crashed before recording
    (the kubelet retries it); a prepared claim without its spec lost it in a crash
    or by hand, and gets it back with the devices still on the node. A spec that
    is there is written again too (the store leaves identical bytes alone), so
    that one an older driver wrote gets the current layout before a container of
    the claim restarts; but not when one of its devices vanished, since the old
    spec still names it and its edits do no harm. `metadata_dirs` (the claim directories
    under the node's metadata root) go the same way: those of prepared claims are written again.
    """
    writes: list[tuple[str, Obj]] = []
    missing: list[MissingDevice] = []
    metadata: list[devicemetadata.ClaimMetadata] = []
    for uid, claim in prepared.items():
        again = respec(claim, inventory, node)
        missing.extend(again.missing)
        if again.spec is not None and (uid not in specs or not again.missing):
            writes.append((uid, again.spec))
            if again.metadata is not None:
                metadata.append(again.metadata)
    kept = {devicemetadata.claim_dir(c.namespace, c.name) for c in prepared.values() if c.metadata}
    return RecoverPlan(
        remove=tuple(sorted(uid for uid in specs if uid not in prepared)),
        write=tuple(writes),
        missing=tuple(missing),
        remove_metadata=tuple(sorted(d for d in metadata_dirs if d not in kept)),
        write_metadata=tuple(metadata),
    )


def recover(steps: RecoveryRunner, node: Node, facts: Facts) -> None:
    """Drop specs of claims not prepared, (re)write prepared ones', settle MIG devices, apply GPU settings."""
    steps.remove_leftovers(point="recover.leftovers-removed")
    vfio.recover(steps, facts)
    if node.mig:
        facts = migdevices.recover(steps, node, facts)
    facts = _drop_unfinished(steps, facts)
    plan = decide_recover(
        facts.prepared,
        facts.inventory,
        steps.spec_uids(),
        node,
        metadata_dirs=steps.metadata_dirs(),
    )
    for uid in plan.remove:
        steps.log("info", f"removing CDI spec of claim {uid}, which is not prepared")
        steps.remove_spec(uid, point="recover.spec-removed")
    for directory in plan.remove_metadata:
        steps.log("info", f"removing device metadata {directory} of a claim that is not prepared")
        steps.remove_metadata(directory, point="recover.metadata-removed")
    for gone in plan.missing:
        steps.log("warning", gone.message)
    for files in plan.write_metadata:
        # Before the spec that mounts them, as in a prepare.
        steps.write_metadata(files.directory, files.files, point="recover.metadata-written")
    for uid, spec in plan.write:
        steps.write_spec(uid, spec, point="recover.spec-written")
    if node.time_slicing:
        try:
            steps.apply_time_slices(sharing.wanted_time_slices(facts.prepared))
        except StepError as err:
            steps.log("error", str(err))
    if node.mps:
        mpsdaemons.stop_others(steps, facts.prepared)
        for claim in facts.prepared.values():
            try:
                mpsdaemons.start(steps, claim)
            except StepError as err:
                steps.log("error", f"claim {claim.namespace}/{claim.name}: {err}")


def _drop_unfinished(steps: RecoveryRunner, facts: Facts) -> Facts:
    """Drop the records of device actions never done or of claims not prepared, once undone above."""
    kept = facts.finished()
    if kept == facts.actions:
        return facts
    for action in facts.actions:
        if action not in kept:
            steps.log(
                "info",
                f"undid {action.kind} of {action.device} for claim {action.claim_uid}, which never completed",
            )
    steps.save(facts.prepared, kept)
    return replace(facts, actions=kept)
