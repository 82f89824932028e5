"""The MIG devices dynamic MIG makes for claims, as programs of steps: make, destroy, adopt, repair.

Each device is recorded as intent in the checkpoint before it is made and as
done once it exists, so that a crash at any step is repaired at start-up: a
device done for a prepared claim is adopted, every other instance on a
dynamic-MIG GPU is destroyed (docs/mig.md, "Crash safety").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from dra.core.gpusteps import NVML_INSUFFICIENT_RESOURCES, GpuRunner
from dra.core.runner import Records
from dra.model.allocation import ClaimAllocation, ClaimError
from dra.model.devices import Gpu, Inventory, MigDevice, MigPartition
from dra.model.node import Facts, Node, StepError
from dra.model.prepared import MIG_CREATE, MIG_MODE, DeviceAction, Holders, PreparedClaim


class MigRunner(GpuRunner, Records, Protocol):
    """What runs dynamic MIG's programs: the GPU's steps, and a claim's own (save, set_inventory);
    every larger program's runner is one."""

    def set_inventory(self, inventory: Inventory) -> None:
        """Prepares from now on see this inventory (MIG devices made or destroyed)."""


@dataclass(frozen=True)
class CreateMig:
    """Make the MIG device of a dynamic-MIG offer the claim was allocated."""

    partition: MigPartition

    @property
    def device(self) -> str:
        """The allocated device's name."""
        return self.partition.name

    @property
    def placement(self) -> str:
        """Where it goes, for messages: "3g.40gb at memory slices 4-7 of GPU 0 (GPU-...)"."""
        p = self.partition
        last = p.placement_start + p.placement_size - 1
        gpu = f"GPU {p.parent.index} ({p.parent.uuid})"
        return f"{p.profile} at memory slices {p.placement_start}-{last} of {gpu}"


def _gpu_of(inventory: Inventory, action: DeviceAction) -> Gpu | None:
    return next((g for g in inventory.gpus if g.uuid == action.params["gpu"]), None)


def held(facts: Facts) -> set[tuple[str, int]]:
    """(GPU UUID, GPU instance ID) of every MIG device made for a prepared claim."""
    return {
        (str(a.params["gpu"]), int(a.result["gpuInstance"]))
        for a in facts.actions
        if a.done and a.kind == MIG_CREATE and a.claim_uid in facts.prepared
    }


def made_for_offer(
    partition: MigPartition, uid: str, holders: Holders, inventory: Inventory, stale: Mapping[str, str]
) -> MigDevice | None:
    """The MIG device made for this offer for a live claim other than `uid`, known by the offer's name.

    A share of a shared offer uses the device the first share made (the holder checks then say
    whether the two may share it); a stale holder's device goes with its release, so a new one is made.
    """
    for claim, entry in holders.named(partition.name):
        if claim.uid == uid or claim.uid in stale or not entry.uuid:
            continue
        made = inventory.by_uuid(entry.uuid)
        if isinstance(made, MigDevice):
            return replace(made, name=partition.name)
    return None


def to_be_made(partition: MigPartition) -> MigDevice:
    """The MIG device a dynamic-MIG offer becomes, as far as it is known before it is made: no UUID yet."""
    return MigDevice(
        name=partition.name,
        uuid="",
        parent=partition.parent,
        profile=partition.profile,
        gpu_instance_id=0,
        compute_instance_id=0,
        memory_bytes=partition.memory_bytes,
        engines=partition.engines,
        device_nodes=(),
    )


def _mode_word(mode: int) -> str:
    return "on" if mode else "off"


def switch_mig_mode(
    steps: MigRunner, node: Node, allocation: ClaimAllocation, gpu: Gpu, mode: int, facts: Facts
) -> Facts:
    """Put a dynamic-MIG GPU in MIG mode `mode` for a claim: recorded as intent, switched, recorded as done.

    ClaimError where NVML leaves the change pending until a GPU reset: it stays pending (a reset
    applies it), its record goes, and discovery offers the GPU as it is meanwhile.
    """
    if not node.mig:
        raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: this node does not manage MIG")
    current, pending = steps.read_mig_mode(gpu.index)
    if current == mode:
        return facts
    waits = (
        f"cannot prepare ResourceClaim {allocation.ref}: it needs MIG mode {_mode_word(mode)} on GPU "
        f"{gpu.index} ({gpu.uuid}), and NVML leaves that change pending until the GPU is reset "
        f"(nvidia-smi -i {gpu.index} -r, with no process on it); until then the GPU is offered as it is, "
        f"MIG {_mode_word(current)}"
    )
    if pending == mode:
        raise ClaimError(waits)
    params: dict[str, str | int] = {"gpu": gpu.uuid, "index": gpu.index, "mode": mode, "was": current}
    intent = DeviceAction(allocation.uid, gpu.name, MIG_MODE, params)
    steps.save(facts.prepared, (*facts.actions, intent), point="mig-mode-intent-recorded")
    try:
        now = steps.set_mig_mode(gpu.index, mode, point="mig-mode-set")
    except StepError as err:
        steps.save(facts.prepared, facts.actions)
        raise ClaimError(
            f"cannot prepare ResourceClaim {allocation.ref}: cannot turn MIG mode {_mode_word(mode)} on "
            f"GPU {gpu.index} ({gpu.uuid}): NVML error {err.code}: {err}"
        ) from None
    if not now:
        steps.save(facts.prepared, facts.actions)
        raise ClaimError(waits)
    actions = (*facts.actions, replace(intent, done=True))
    steps.save(facts.prepared, actions, point="mig-mode-recorded")
    return replace(facts, actions=actions)


def make(
    steps: MigRunner, node: Node, allocation: ClaimAllocation, creates: tuple[CreateMig, ...], facts: Facts
) -> tuple[dict[str, MigDevice], Inventory]:
    """Make these MIG devices, each recorded as intent, then done; them (by device name) and the inventory.

    ClaimError when one cannot be made; then none of the claim's is left.
    """
    if not node.mig:
        raise ClaimError(f"cannot prepare ResourceClaim {allocation.ref}: this node does not manage MIG")
    intents = [
        DeviceAction(
            allocation.uid,
            c.device,
            MIG_CREATE,
            {
                "gpu": c.partition.parent.uuid,
                "profile": c.partition.profile,
                "profileId": c.partition.profile_id,
                "start": c.partition.placement_start,
                "size": c.partition.placement_size,
            },
        )
        for c in creates
    ]
    actions = (*facts.actions, *intents)
    # Not fsynced, nor is the done record below: GPU and compute instances do not outlive what loses
    # the page cache (a reboot, a driver reload), and the claim's own save, fsynced before the
    # kubelet is answered, makes both durable with it. MIG mode, which persists, is fsynced.
    steps.save(facts.prepared, actions, durable=False, point="mig-intent-recorded")
    inventory = facts.inventory
    made: dict[str, MigDevice] = {}
    for create, intent in zip(creates, intents, strict=True):
        try:
            device = _make_one(steps, create)
        except StepError as err:
            left = replace(facts, actions=actions, inventory=inventory)
            left = destroy_claim_devices(steps, node, allocation.uid, left)
            raise ClaimError(_creation_failed(steps, node, left, allocation, create, err)) from None
        made[create.device] = device
        done = replace(intent, done=True, result=_made_result(device))
        actions = tuple(done if a.key == intent.key else a for a in actions)
        steps.save(facts.prepared, actions, durable=False, point="mig-recorded")
        inventory = replace(inventory, instances=(*inventory.instances, device))
        steps.set_inventory(inventory)
    return made, inventory


def _made_result(device: MigDevice) -> dict[str, str | int]:
    """A done MIG_CREATE action's result: what NVML made, as adoption and unprepare look it up."""
    return {
        "gpuInstance": device.gpu_instance_id,
        "computeInstance": device.compute_instance_id,
        "uuid": device.uuid,
    }


def _make_one(steps: MigRunner, create: CreateMig) -> MigDevice:
    """GPU instance, then compute instance; the GPU instance goes again if the compute instance fails."""
    p = create.partition
    gi = steps.create_gpu_instance(
        p.parent.index, p.profile_id, p.placement_start, p.placement_size, point="mig-gpu-instance-created"
    )
    try:
        ci = steps.create_compute_instance(p.parent.index, gi, p.slices, point="mig-compute-instance-created")
        return steps.find_mig_device(p.parent, gi, ci)
    except StepError:
        steps.destroy_gpu_instance(p.parent.index, gi)
        raise


def _creation_failed(
    steps: MigRunner, node: Node, facts: Facts, allocation: ClaimAllocation, create: CreateMig, err: StepError
) -> str:
    """The per-claim error; a taken placement first reconciles the GPU with the checkpoint."""
    message = (
        f"cannot prepare ResourceClaim {allocation.ref}: cannot make MIG device {create.device}, "
        f"{create.placement}: NVML error {err.code}: {err}"
    )
    if err.code != NVML_INSUFFICIENT_RESOURCES:
        return message
    try:
        reaped = destroy_unheld(steps, node, facts, [create.partition.parent])
    except StepError as failed:
        steps.log(
            "warning",
            f"cannot reconcile the MIG instances of GPU {create.partition.parent.index}: {failed}",
        )
        reaped = 0
    if reaped:
        return (
            f"{message}; the placement was taken by MIG instances no prepared claim held, "
            "now destroyed: the retry can succeed"
        )
    return f"{message}; a claim still prepared on this node holds the placement (the allocation is stale)"


def _heir(action: DeviceAction, uid: str, facts: Facts) -> str:
    """Another prepared claim holding (a share of) the MIG device `action` made for `uid`; "" if none."""
    made = str(action.result.get("uuid", "")) if action.kind == MIG_CREATE and action.done else ""
    if not made:
        return ""
    return next((c.uid for c in facts.holders.with_uuid(made) if c.uid != uid), "")


def destroy_claim_devices(steps: MigRunner, node: Node, uid: str, facts: Facts) -> Facts:
    """Destroy the MIG devices made for a claim and drop its actions (the claim's record stays).

    A MIG device that another claim holds a share of is handed to that claim instead (its action
    rewritten in the same checkpoint save), so the last share destroys it. A MIG mode it switched
    stays as it is here (release_mig_mode turns it off at unprepare).
    """
    mine = [a for a in facts.actions if a.claim_uid == uid]
    if not mine:
        return facts
    pairs = [(a, _heir(a, uid, facts)) for a in mine]
    for action, heir in pairs:
        if action.kind != MIG_CREATE or heir:
            continue
        gpu = _gpu_of(facts.inventory, action)
        if not node.mig or gpu is None:
            continue
        if action.done:
            steps.destroy_gpu_instance(gpu.index, int(action.result["gpuInstance"]), point="mig-destroyed")
            continue
        # Never recorded as done: whatever sits at its placement was made for it.
        for instance in steps.list_gpu_instances(gpu.index):
            if (instance.start, instance.size) == (int(action.params["start"]), int(action.params["size"])):
                steps.destroy_gpu_instance(gpu.index, instance.gpu_instance_id)
    gone = {str(a.result["uuid"]) for a, heir in pairs if "uuid" in a.result and not heir}
    inventory = replace(
        facts.inventory, instances=tuple(m for m in facts.inventory.instances if m.uuid not in gone)
    )
    steps.set_inventory(inventory)
    handed = tuple(replace(a, claim_uid=heir) for a, heir in pairs if heir)
    actions = tuple(a for a in facts.actions if a not in mine) + handed
    # Not fsynced, as the records of making them (make): after a reboot the instances are gone either way.
    steps.save(facts.prepared, actions, durable=False)
    return replace(facts, actions=actions, inventory=inventory)


#: Architectures whose MIG mode switches without a GPU reset: NVIDIA's driver turns MIG off after
#: the last MIG device on these only (supportsMIGModeToggle: Hopper and later). Elsewhere (Ampere)
#: the switch may wait for a reset, which would leave the GPU offered as neither.
RESETLESS_MIG_SWITCH = frozenset({"Hopper", "Blackwell", "Rubin"})


def claim_parents(uid: str, facts: Facts) -> list[Gpu]:
    """The GPUs the MIG devices made for a claim are on."""
    gpus = (_gpu_of(facts.inventory, a) for a in facts.actions if a.claim_uid == uid and a.kind == MIG_CREATE)
    return list(dict.fromkeys(g for g in gpus if g is not None))


def release_mig_mode(steps: MigRunner, node: Node, gpus: Iterable[Gpu], facts: Facts) -> None:
    """MIG mode off on these dynamic-MIG GPUs where no MIG device is left, as NVIDIA's driver turns
    it off when it destroys a GPU's last MIG device (maybeDisableMigMode).

    Best effort and not recorded: either mode is one the driver starts from, and a GPU left in MIG
    mode (an architecture outside RESETLESS_MIG_SWITCH, an NVML error, a crash midway) is switched
    off by the next claim that gets it whole (switch_for_claim).
    """
    if not node.mig:
        return
    kept = {uuid for uuid, _ in held(facts)}
    dynamic = set(facts.inventory.dynamic_gpus)
    for gpu in gpus:
        if gpu not in dynamic or gpu.uuid in kept or gpu.architecture not in RESETLESS_MIG_SWITCH:
            continue
        try:
            current, pending = steps.read_mig_mode(gpu.index)
            if (current, pending) != (1, 1) or steps.list_gpu_instances(gpu.index):
                continue
            if steps.set_mig_mode(gpu.index, 0):
                steps.log("info", f"GPU {gpu.index} ({gpu.uuid}): its last MIG device is gone, MIG mode off")
            else:
                steps.log("warning", f"GPU {gpu.index} ({gpu.uuid}): MIG mode off waits for a GPU reset")
        except StepError as err:
            steps.log(
                "warning",
                f"GPU {gpu.index} ({gpu.uuid}): MIG mode stays on ({err}); "
                "the next whole-GPU claim turns it off",
            )


def destroy_unheld(steps: MigRunner, node: Node, facts: Facts, gpus: Iterable[Gpu]) -> int:
    """Destroy the MIG instances on these GPUs that no prepared claim holds; how many there were."""
    if not node.mig:
        return 0
    kept, destroyed = held(facts), 0
    for gpu in gpus:
        for instance in steps.list_gpu_instances(gpu.index):
            if (gpu.uuid, instance.gpu_instance_id) in kept:
                continue
            steps.log(
                "warning",
                f"destroying MIG instance {instance.gpu_instance_id} (memory slices {instance.start}-"
                f"{instance.start + instance.size - 1}) on GPU {gpu.index}: no prepared claim holds it "
                "(left by a crash, or made by hand on a GPU in dynamic MIG mode)",
            )
            steps.destroy_gpu_instance(gpu.index, instance.gpu_instance_id)
            destroyed += 1
    return destroyed


def recover(steps: MigRunner, node: Node, facts: Facts) -> Facts:
    """At start-up: adopt the MIG devices made for prepared claims, destroy the others on dynamic-MIG GPUs,
    put back the MIG modes of prepares that never completed (dra.core.recovery then drops their records).
    """
    kept = facts.finished()
    known = held(facts)
    destroy_unheld(steps, node, facts, facts.inventory.dynamic_gpus)
    # Latest first, so that a GPU switched twice ends as it was before the first.
    for action in reversed(facts.actions):
        if action not in kept and action.kind == MIG_MODE:
            _undo_mig_mode(steps, node, action, known)
    found = {m.uuid for m in facts.inventory.instances}
    inventory = replace(
        facts.inventory,
        instances=tuple(m for m in facts.inventory.instances if (m.parent.uuid, m.gpu_instance_id) in known),
    )
    steps.set_inventory(inventory)
    facts = replace(facts, inventory=inventory)
    for action in kept:
        if action.kind == MIG_CREATE and str(action.result.get("uuid", "")) not in found:
            facts = _make_again(steps, node, action, facts)
    return facts


def _make_again(steps: MigRunner, node: Node, action: DeviceAction, facts: Facts) -> Facts:
    """A MIG device a prepared claim holds that discovery did not find under its UUID.

    After a reboot or a driver reload every instance is gone (and the kubelet prepares the claim
    again): it is made again at its placement. Where its GPU instance is still there with its
    compute instance, it is taken under the UUID NVML gives it now, never destroyed. Either way the
    UUID is recorded for every claim holding it, so that their specs name it. When it cannot be made,
    it stays missing, said in the log (the claim's containers would not find it).
    """
    old = str(action.result["uuid"])
    partition = facts.inventory.partition(action.device)
    if not node.mig or partition is None:
        return facts
    create = CreateMig(partition)
    try:
        device = _still_there(steps, partition, action)
        if device is None:
            device = _make_one(steps, create)
    except StepError as err:
        steps.log("warning", f"cannot make MIG device {create.device} ({create.placement}) again: {err}")
        return facts
    again = replace(action, result=_made_result(device))
    actions = tuple(again if a is action else a for a in facts.actions)
    prepared = {uid: _with_uuid(claim, old, device.uuid) for uid, claim in facts.prepared.items()}
    steps.save(prepared, actions, point="mig-made-again")
    inventory = replace(facts.inventory, instances=(*facts.inventory.instances, device))
    steps.set_inventory(inventory)
    steps.log("info", f"MIG device {create.device} ({create.placement}) is now {device.uuid}: {old} was gone")
    return Facts(prepared, actions, inventory)


def _still_there(steps: MigRunner, partition: MigPartition, action: DeviceAction) -> MigDevice | None:
    """The recorded instance at the placement, with its compute instance; None once the placement is free.

    A GPU instance there without a usable compute instance (a kill during an earlier attempt to
    make it again) is destroyed, so that it can be made.
    """
    gpu, found = partition.parent, None
    for instance in steps.list_gpu_instances(gpu.index):
        if (instance.start, instance.size) != (partition.placement_start, partition.placement_size):
            continue
        if instance.gpu_instance_id == int(action.result["gpuInstance"]):
            ci = int(action.result["computeInstance"])
            try:
                found = steps.find_mig_device(gpu, instance.gpu_instance_id, ci)
                continue
            except StepError:
                pass  # no usable compute instance: destroyed below
        steps.destroy_gpu_instance(gpu.index, instance.gpu_instance_id)
    return found


def _with_uuid(claim: PreparedClaim, old: str, new: str) -> PreparedClaim:
    """The claim with its devices of UUID `old` at `new`; the same object when it holds none."""
    if not any(d.uuid == old for d in claim.devices):
        return claim
    return replace(claim, devices=tuple(replace(d, uuid=new) if d.uuid == old else d for d in claim.devices))


def _undo_mig_mode(steps: MigRunner, node: Node, action: DeviceAction, held: set[tuple[str, int]]) -> None:
    """Put back the MIG mode an unfinished prepare switched, unless MIG devices of claims need it on."""
    index, was, gpu = int(action.params["index"]), int(action.params["was"]), str(action.params["gpu"])
    if not node.mig or (was == 0 and any(uuid == gpu for uuid, _ in held)):
        return
    try:
        current, _pending = steps.read_mig_mode(index)
        if current != was:
            steps.set_mig_mode(index, was, point="mig-mode-undone")
    except StepError as err:
        steps.log("warning", f"cannot put MIG mode {_mode_word(was)} back on GPU {index} ({gpu}): {err}")


def adopt(steps: MigRunner, node: Node, facts: Facts) -> Inventory:
    """The inventory with the MIG devices another instance made for its claims, without those it destroyed."""
    made = {str(a.result["uuid"]): a for a in facts.actions if a.done and a.kind == MIG_CREATE}
    known = [m for m in facts.inventory.instances if m.uuid in made]
    found = {m.uuid for m in known}
    for uuid, action in made.items():
        gpu = _gpu_of(facts.inventory, action)
        if uuid in found or gpu is None or not node.mig:
            continue
        try:
            known.append(
                steps.find_mig_device(
                    gpu, int(action.result["gpuInstance"]), int(action.result["computeInstance"])
                )
            )
        except StepError as err:
            steps.log("warning", f"claim {action.claim_uid}: cannot find MIG device {uuid}: {err}")
    inventory = replace(facts.inventory, instances=tuple(known))
    steps.set_inventory(inventory)
    return inventory


def switch_for_claim(
    steps: MigRunner,
    node: Node,
    allocation: ClaimAllocation,
    off: Iterable[Gpu],
    on: Iterable[Gpu],
    facts: Facts,
) -> Facts:
    """MIG mode off on the GPUs `off` (the plan's mig_off), on on the GPUs `on` (mig_on).

    Leftover MIG instances go before MIG turns off.
    """
    for gpu in off:
        destroy_unheld(steps, node, facts, [gpu])
        facts = switch_mig_mode(steps, node, allocation, gpu, 0, facts)
    for gpu in on:
        facts = switch_mig_mode(steps, node, allocation, gpu, 1, facts)
    return facts
