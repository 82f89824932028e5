"""Preparing and unpreparing a claim: the programs that carry out a plan, step by step.

`prepare` reads as the example driver's prepare does: decide (the plan, dra.core.plan.decide_prepare,
after asking about stale holders), make the devices the plan says (MIG mode and devices, GPUs bound
to vfio-pci), build the CDI spec once from what the claim then has, write it, save the checkpoint,
apply the sharing settings, and (without the lock) sync; `unprepare` undoes it. Each step is a
call of its runner's method (`NodeRunner`, whose one implementation is dra.kubeletplugin.state's),
in the order that a crash at any step leaves recoverable (docs/architecture.md, "Preparing a claim,
step by step"). Nothing here touches a file, a GPU or the API server but through the runner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

from dra.core import devicemetadata, migdevices, mpsdaemons, sharing, vfio
from dra.core.cdi import Respec, respec
from dra.core.devicemetadata import MetadataRunner
from dra.core.migdevices import MigRunner
from dra.core.mpsdaemons import MpsRunner
from dra.core.plan import (
    PreparePlan,
    Refusal,
    conflicts,
    decide_prepare,
    decide_unprepare,
    recorded,
    stale_reasons,
    unanswered,
)
from dra.core.sharing import TimeSliceRunner
from dra.core.vfio import VfioRunner
from dra.model.allocation import ClaimAllocation, ClaimError
from dra.model.node import ClaimRead, Facts, Node, StepError
from dra.model.prepared import PreparedClaim

Obj = dict[str, Any]


class NodeRunner(MigRunner, VfioRunner, MpsRunner, TimeSliceRunner, MetadataRunner, Protocol):
    """What runs every step of prepare, unprepare and start-up: each feature's, and a claim's own that
    no feature calls (here; `log`, `save` and `set_inventory` come with the features' protocols).

    Each method is one step; one that fails raises StepError, and the program decides what follows.
    `point` names the crash point the runner passes right after the step. All but `ask_stale` and
    `sync` run holding the state's lock. The one implementation, whose methods say what each step
    does, is dra.kubeletplugin.state's CallSteps.
    """

    def read_state(self) -> Facts: ...
    def has_spec(self, uid: str) -> bool: ...
    def ask_stale(self, holders: tuple[PreparedClaim, ...]) -> Mapping[str, ClaimRead]: ...
    def missing_host_paths(self, spec: Obj) -> tuple[str, ...]: ...
    def mark(self, point: str) -> None: ...
    def write_spec(self, uid: str, spec: Obj, *, compare: bool = True, point: str = "") -> None: ...
    def remove_spec(self, uid: str, *, point: str = "") -> None: ...
    def sync(self, ticket: int, *, point: str = "") -> None: ...


def prepare(steps: NodeRunner, node: Node, allocation: ClaimAllocation, facts: Facts) -> PreparedClaim:
    """Prepare a claim, or give its recorded answer; ClaimError when it cannot be, and then nothing changes.

    Prepared claims holding a device the allocation needs are asked about first (ask_stale): those the
    API server says are gone are released, the others refuse the claim.
    """
    plan, facts = _decide(steps, node, allocation, facts)
    plan, facts = _make_devices(steps, node, allocation, plan, facts)
    # Build the spec, once, from what the claim now has: its MIG devices made, its GPUs' groups known.
    outputs = respec(plan.claim, facts.inventory, node) if plan.write else Respec(None, None, ())
    if outputs.spec is not None:
        _refuse_missing_paths(steps, node, allocation, plan, outputs, facts)
    # Write it, and save the record (not yet durable).
    _release_stale(steps, allocation, plan)
    _write_files(steps, allocation, plan, outputs, facts)
    ticket, facts = _record(steps, node, allocation, plan, facts) if plan.record else (0, facts)
    steps.mark("sharing-before-gpu-settings")
    _gpu_settings(steps, node, allocation, plan, facts)
    if ticket:
        # Unlock, then sync: prepares of other claims go on, and concurrent ones share one fsync.
        _sync(steps, node, allocation, plan, ticket)
    return plan.claim


def _decide(
    steps: NodeRunner, node: Node, allocation: ClaimAllocation, facts: Facts
) -> tuple[PreparePlan, Facts]:
    """The plan (ClaimError for a refusal), the holders asked about without the lock; and the state."""
    live = conflicts(allocation, facts.inventory, facts.prepared, pool=node.pool, holders=facts.holders)
    reads: Mapping[str, ClaimRead] = {}
    if live:
        reads = steps.ask_stale(tuple(live))
        # Decided on the state as it is now: a holder that appeared meanwhile counts as live.
        facts = steps.read_state()
    # Only a recorded claim's answer depends on its spec being there; a new claim's is written anyway.
    has_spec = allocation.uid in facts.prepared and steps.has_spec(allocation.uid)
    plan = decide_prepare(
        allocation,
        facts.inventory,
        facts.prepared,
        node,
        stale=stale_reasons(reads),
        has_spec=has_spec,
        holders=facts.holders,
        unknown=unanswered(reads),
    )
    if isinstance(plan, Refusal):
        raise ClaimError(plan.message)
    return plan, facts


def _make_devices(
    steps: NodeRunner, node: Node, allocation: ClaimAllocation, plan: PreparePlan, facts: Facts
) -> tuple[PreparePlan, Facts]:
    """What the plan makes: the released holders' devices given back, MIG mode, MIG devices, vfio-pci.

    The plan comes back with what its claim then has (its MIG devices' UUIDs, its GPUs' groups).
    """
    for uid in plan.given_back:
        facts = _give_back_gpus(steps, allocation, uid, facts)
        facts = migdevices.destroy_claim_devices(steps, node, uid, facts)
    if plan.mig_off or plan.mig_on:
        facts = migdevices.switch_for_claim(steps, node, allocation, plan.mig_off, plan.mig_on, facts)
    if plan.create:
        made, _ = migdevices.make(steps, node, allocation, plan.create, facts)
        plan = plan.made(made)
        facts = steps.read_state()
    if plan.vfio:
        bound, facts = vfio.bind(steps, allocation, plan.claim, plan.vfio, facts)
        plan = replace(plan, claim=bound)
    return plan, facts


def _give_back_gpus(steps: NodeRunner, allocation: ClaimAllocation, uid: str, facts: Facts) -> Facts:
    """The GPUs claim `uid` passed through, back to nvidia before another claim or a failure moves on."""
    try:
        return vfio.release(steps, uid, facts)
    except StepError as err:
        raise ClaimError(
            f"cannot prepare ResourceClaim {allocation.ref}: cannot give the GPUs of claim {uid} back to "
            f"the nvidia driver: {err}"
        ) from None


def _refuse_missing_paths(
    steps: NodeRunner,
    node: Node,
    allocation: ClaimAllocation,
    plan: PreparePlan,
    outputs: Respec,
    facts: Facts,
) -> None:
    """ClaimError, after undoing what the prepare made, when the spec names a host path not on the node.

    The runtime would fail every container of the claim on it. The paths the prepare makes itself
    (its metadata files, its MPS daemon's directories) are not asked about.
    """
    assert outputs.spec is not None
    gone = outputs.missing_paths(steps.missing_host_paths(outputs.spec))
    if not gone:
        return
    facts = _give_back_gpus(steps, allocation, allocation.uid, facts)
    migdevices.destroy_claim_devices(steps, node, allocation.uid, facts)
    raise ClaimError(
        f"cannot prepare ResourceClaim {allocation.ref}: its CDI spec would name "
        f"{', '.join(gone)}, not on this node (a GPU or the driver changed since discovery)"
    )


def _release_stale(steps: NodeRunner, allocation: ClaimAllocation, plan: PreparePlan) -> None:
    """Say why the claim is prepared again or a holder released; each released holder's files go."""
    if plan.replaces is not None:
        # The kubelet unprepares before a claim is allocated anew; if it did not, the
        # claim's current allocation is the truth, not the record.
        steps.log(
            "warning",
            f"claim {allocation.ref} ({allocation.uid}) is prepared with {sorted(recorded(plan.replaces))} "
            f"but now allocated {sorted(recorded(plan.claim))}: preparing it again",
        )
    for release in plan.release:
        holder = release.holder
        steps.log(
            "warning",
            f"releasing {holder.namespace}/{holder.name} ({holder.uid}), prepared but stale: "
            + release.reason,
        )
        steps.remove_spec(holder.uid, point="prepare.stale-spec-removed")
        if holder.metadata and (holder.namespace, holder.name) != (plan.claim.namespace, plan.claim.name):
            steps.remove_metadata(devicemetadata.claim_dir(holder.namespace, holder.name))


def _write_files(
    steps: NodeRunner, allocation: ClaimAllocation, plan: PreparePlan, outputs: Respec, facts: Facts
) -> None:
    """Write the claim's metadata files, then its spec that mounts them; a failure removes both again."""
    for gone in outputs.missing:
        steps.log("warning", gone.message)
    if outputs.metadata is not None:
        try:
            steps.write_metadata(
                outputs.metadata.directory, outputs.metadata.files, point="prepare.metadata-written"
            )
        except StepError as err:
            _drop_unrecorded_metadata(steps, plan.claim, facts)
            raise ClaimError(
                f"cannot write the device metadata files of claim {allocation.ref}: {err}"
            ) from None
    if outputs.spec is not None:
        steps.mark("prepare.before-cdi-write")
        try:
            steps.write_spec(plan.claim.uid, outputs.spec, compare=False, point="prepare.cdi-written")
        except StepError as err:
            _drop_unrecorded_spec(steps, plan.claim.uid, facts)
            _drop_unrecorded_metadata(steps, plan.claim, facts)
            raise ClaimError(f"cannot write the CDI spec of claim {allocation.ref}: {err}") from None


def _record(
    steps: NodeRunner, node: Node, allocation: ClaimAllocation, plan: PreparePlan, facts: Facts
) -> tuple[int, Facts]:
    """Save the claim in the checkpoint, its released holders dropped; the ticket to sync, and the facts."""
    released = {r.holder.uid for r in plan.release}
    # Copied whole and then trimmed: a C copy, not a Python pass over a thousand claims.
    updated = dict(facts.prepared)
    for uid in released:
        updated.pop(uid, None)
    updated[plan.claim.uid] = plan.claim
    actions = tuple(a for a in facts.actions if a.claim_uid not in released)
    try:
        ticket = steps.save(updated, actions, durable=False, changed=frozenset({*released, plan.claim.uid}))
    except StepError as err:
        # A failed directory fsync comes after the rename: put back the record the kubelet is told of.
        with contextlib.suppress(StepError):
            steps.save(facts.prepared, facts.actions)
        _drop_unrecorded_spec(steps, plan.claim.uid, facts)
        _drop_unrecorded_metadata(steps, plan.claim, facts)
        raise ClaimError(
            f"cannot record claim {allocation.ref} in the checkpoint {node.checkpoint}: {err}"
        ) from None
    steps.log(
        "info",
        f"prepared claim {allocation.ref} ({plan.claim.uid}): "
        + ", ".join(d.device for d in plan.claim.devices),
    )
    return ticket, replace(facts, prepared=updated, actions=actions)


def _sync(steps: NodeRunner, node: Node, allocation: ClaimAllocation, plan: PreparePlan, ticket: int) -> None:
    """Make the save durable (without the lock); a failure unprepares the claim again."""
    try:
        steps.sync(ticket, point="prepare.checkpoint-saved")
    except StepError as err:
        now = steps.read_state()
        if now.prepared.get(plan.claim.uid) is plan.claim:
            unprepare(steps, node, plan.claim.uid, now)
        raise ClaimError(
            f"cannot record claim {allocation.ref} in the checkpoint {node.checkpoint}: {err}"
        ) from None


def _drop_unrecorded_spec(steps: NodeRunner, uid: str, facts: Facts) -> None:
    """After a failed write: remove the claim's spec unless the checkpoint records the claim."""
    if uid in facts.prepared:
        return
    # Best effort on a failing disk: a spec that stays is removed, a GPU given back, at the next start-up.
    with contextlib.suppress(StepError):
        steps.remove_spec(uid)
    with contextlib.suppress(StepError):
        vfio.release(steps, uid, facts)


def _drop_unrecorded_metadata(steps: NodeRunner, claim: PreparedClaim, facts: Facts) -> None:
    """After a failed write: remove the claim's metadata files unless the checkpoint records them."""
    recorded_claim = facts.prepared.get(claim.uid)
    if not claim.metadata or (recorded_claim is not None and recorded_claim.metadata):
        return
    # Best effort, as for the spec: start-up removes what stays.
    with contextlib.suppress(StepError):
        steps.remove_metadata(devicemetadata.claim_dir(claim.namespace, claim.name))


def _gpu_settings(
    steps: NodeRunner, node: Node, allocation: ClaimAllocation, plan: PreparePlan, facts: Facts
) -> None:
    """Set the claim's time slices, start its MPS daemon (again, on a retry); a failure undoes the prepare."""
    timed = node.time_slicing and plan.claim.uses_time_slices
    wanted = sharing.wanted_time_slices({plan.claim.uid: plan.claim}) if timed else {}
    try:
        if wanted:
            steps.apply_time_slices(wanted)
        if node.mps and plan.replaces is not None and plan.replaces.uses_mps:
            # The daemon of the old allocation's devices, unless the new one or another claim uses it.
            mpsdaemons.release(steps, plan.replaces, facts.prepared)
        if node.mps and plan.mps:
            mpsdaemons.start(steps, plan.claim)
    except StepError as err:
        unprepare(steps, node, plan.claim.uid, facts)
        raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: {err}") from None


def unprepare(steps: NodeRunner, node: Node, uid: str, facts: Facts) -> PreparedClaim | None:
    """Undo a prepare; an unknown claim is fine (its stray spec, if any, goes too)."""
    plan = decide_unprepare(uid, facts.prepared, facts.actions)
    if plan.claim is None:
        steps.remove_spec(uid)
        return None
    claim = plan.claim
    steps.remove_spec(uid, point="unprepare.spec-removed")
    if claim.metadata:
        # After the spec: no container can start with a mount of a file that is gone.
        steps.remove_metadata(
            devicemetadata.claim_dir(claim.namespace, claim.name), point="unprepare.metadata-removed"
        )
    others = dict(facts.prepared)
    others.pop(uid, None)
    restore = (
        sharing.time_slices_to_restore(uid, facts.prepared)
        if node.time_slicing and claim.uses_time_slices
        else []
    )
    if restore:
        # Most claims set no interval: their unprepare takes no step for it.
        steps.restore_time_slices(tuple(restore))
    if node.mps and plan.mps:
        mpsdaemons.release(steps, claim, others)
    steps.mark("sharing-before-unrecord")
    if plan.passthrough:
        try:
            facts = vfio.release(steps, uid, facts)
        except StepError as err:
            raise ClaimError(
                f"cannot unprepare claim {claim.namespace}/{claim.name}: giving its GPU back to the nvidia "
                f"driver failed ({err}); the kubelet retries"
            ) from None
    if plan.mig:
        parents = migdevices.claim_parents(uid, facts)
        try:
            facts = migdevices.destroy_claim_devices(steps, node, uid, facts)
        except StepError as err:
            raise ClaimError(
                f"cannot unprepare claim {claim.namespace}/{claim.name}: destroying its MIG "
                f"device failed (NVML error {err.code}: {err}); the kubelet retries"
            ) from None
        migdevices.release_mig_mode(steps, node, parents, facts)
    # Not fsynced: an entry back after a power loss is a stale holder, released when needed.
    steps.save(
        others, facts.actions, durable=False, changed=frozenset({uid}), point="unprepare.checkpoint-saved"
    )
    # At debug, as NVIDIA's driver logs an unprepare (its V(6), below its chart's verbosity): the
    # line was a fifth of an unprepare's CPU in the plugin (issue 44). A prepare's stays at info.
    steps.log("debug", f"unprepared claim {claim.namespace}/{claim.name} ({uid})")
    return claim
