"""The prepare, unprepare and recover decisions: plain data in, plans out, no files."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace

import pytest

from dra.core import cdi
from dra.core.cdi import MissingDevice, respec
from dra.core.plan import (
    PreparePlan,
    Refusal,
    Release,
    UnpreparePlan,
    conflicts,
    decide_prepare,
    decide_unprepare,
    stale_reasons,
    unanswered,
)
from dra.core.recovery import RecoverPlan, decide_recover
from dra.model.allocation import AllocatedDevice, ClaimAllocation, OpaqueConfig
from dra.model.devices import Inventory
from dra.model.node import ClaimRead, Node
from dra.model.prepared import Holders, PreparedClaim, PreparedDevice
from tests.unit.helpers import DRIVER, NODE, inventory

UID_A = "aaaaaaaa-0000-4000-8000-00000000000a"
UID_B = "bbbbbbbb-0000-4000-8000-00000000000b"
UID_C = "cccccccc-0000-4000-8000-00000000000c"
MIG = "gpu-4-mig-3g40gb-1-0"
INVENTORY = inventory("h100x8-mig")
ON = Node(driver=DRIVER, pool=NODE)


def _allocation(
    uid: str,
    *devices: str,
    admin: bool = False,
    pool: str = NODE,
    configs: tuple[OpaqueConfig, ...] = (),
) -> ClaimAllocation:
    return ClaimAllocation(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid[0]}",
        devices=tuple(AllocatedDevice("gpu", pool, d, admin_access=admin) for d in devices),
        configs=configs,
    )


def _uuid(name: str, inv: Inventory = INVENTORY) -> str:
    device = inv.get(name)
    assert device is not None
    return device.uuid


def _prepared(uid: str, *devices: str, admin: bool = False) -> PreparedClaim:
    return PreparedClaim(
        uid=uid,
        namespace="team-a",
        name=f"claim-{uid[0]}",
        devices=tuple(
            PreparedDevice(
                ("gpu",),
                NODE,
                d,
                (cdi.qualified_name(DRIVER, uid, d),),
                admin_access=admin,
                uuid=_uuid(d),
            )
            for d in devices
        ),
    )


def _spec(uid: str, *devices: str, inv: Inventory = INVENTORY) -> dict[str, object]:
    found = [inv.get(d) for d in devices]
    return cdi.build_spec(DRIVER, uid, [d for d in found if d is not None], inv)


def _decide(
    allocation: ClaimAllocation,
    prepared: Mapping[str, PreparedClaim] | None = None,
    *,
    stale: Mapping[str, str] | None = None,
    has_spec: bool = False,
    inv: Inventory = INVENTORY,
) -> PreparePlan | Refusal:
    return decide_prepare(allocation, inv, prepared or {}, ON, stale=stale or {}, has_spec=has_spec)


def _refusal(plan: PreparePlan | Refusal) -> str:
    assert isinstance(plan, Refusal), plan
    return plan.message


def _by_uid(*claims: PreparedClaim) -> dict[str, PreparedClaim]:
    return {c.uid: c for c in claims}


# -- a new claim -----------------------------------------------------------------------------


def test_a_new_claim_is_written_and_recorded_with_its_cdi_ids() -> None:
    plan = _decide(_allocation(UID_A, "gpu-0", MIG))
    assert plan == PreparePlan(claim=_prepared(UID_A, "gpu-0", MIG), write=True, record=True)
    assert respec(plan.claim, INVENTORY, ON).spec == _spec(UID_A, "gpu-0", MIG)


def test_one_device_of_two_requests_is_one_entry_naming_each_request_once() -> None:
    allocation = ClaimAllocation(
        uid=UID_A,
        namespace="team-a",
        name="claim-a",
        devices=(
            AllocatedDevice("train/h100", NODE, "gpu-0"),
            AllocatedDevice("train/a100", NODE, "gpu-0"),
            AllocatedDevice("eval", NODE, "gpu-0"),
        ),
    )
    plan = _decide(allocation)
    assert isinstance(plan, PreparePlan)
    assert [(d.device, d.request_names) for d in plan.claim.devices] == [("gpu-0", ("train", "eval"))]


# -- a claim prepared before -----------------------------------------------------------------


def test_a_prepared_claim_with_its_spec_needs_nothing() -> None:
    held = _prepared(UID_A, "gpu-0")
    assert _decide(_allocation(UID_A, "gpu-0"), _by_uid(held), has_spec=True) == PreparePlan(claim=held)


def test_a_prepared_claim_without_its_spec_gets_it_back_and_is_not_recorded_again() -> None:
    held = _prepared(UID_A, "gpu-0", MIG)
    plan = _decide(_allocation(UID_A, "gpu-0", MIG), _by_uid(held))
    assert plan == PreparePlan(claim=held, write=True)
    assert respec(held, INVENTORY, ON).spec == _spec(UID_A, "gpu-0", MIG)


def test_a_missing_spec_is_rebuilt_from_the_devices_still_there() -> None:
    held = _prepared(UID_A, "gpu-0", MIG)
    without_mig = inventory("h100x8")
    plan = _decide(_allocation(UID_A, "gpu-0", MIG), _by_uid(held), inv=without_mig)
    assert plan == PreparePlan(claim=held, write=True)
    again = respec(held, without_mig, ON)
    assert (again.spec, again.missing) == (
        _spec(UID_A, "gpu-0", inv=without_mig),
        (MissingDevice(held, MIG),),
    )
    assert again.missing[0].message == (
        f"prepared claim team-a/claim-a uses {MIG}, which this node no longer has"
    )


def test_a_prepared_claim_is_not_refused_over_holders_it_had_when_prepared() -> None:
    # Both hold gpu-0 (a state only a hand-edited checkpoint can reach): a retry still gets its answer.
    held = _prepared(UID_A, "gpu-0")
    other = _prepared(UID_B, "gpu-0")
    prepared = _by_uid(held, other)
    assert conflicts(_allocation(UID_A, "gpu-0"), INVENTORY, prepared, pool=NODE) == []
    assert _decide(_allocation(UID_A, "gpu-0"), prepared, has_spec=True) == PreparePlan(claim=held)


def test_a_claim_allocated_anew_is_prepared_with_its_new_devices_replacing_the_record() -> None:
    old = _prepared(UID_A, "gpu-0")
    plan = _decide(_allocation(UID_A, "gpu-1"), _by_uid(old), has_spec=True)
    assert plan == PreparePlan(claim=_prepared(UID_A, "gpu-1"), write=True, record=True, replaces=old)


# -- holders -----------------------------------------------------------------------------------


def test_conflicts_are_the_exclusive_holders_of_the_devices_asked_for() -> None:
    a = _prepared(UID_A, "gpu-0", "gpu-1")
    b = _prepared(UID_B, "gpu-2")
    monitor = _prepared(UID_C, "gpu-3", admin=True)
    prepared = _by_uid(a, b, monitor)
    assert conflicts(_allocation("d", "gpu-1", "gpu-0", "gpu-2"), INVENTORY, prepared, pool=NODE) == [a, b]
    # Admin access neither blocks nor is blocked; devices of another pool or not on the node are no one's.
    assert conflicts(_allocation("d", "gpu-3"), INVENTORY, prepared, pool=NODE) == []
    assert conflicts(_allocation("d", "gpu-0", admin=True), INVENTORY, prepared, pool=NODE) == []
    assert conflicts(_allocation("d", "gpu-0", pool="node-b"), INVENTORY, prepared, pool=NODE) == []
    assert conflicts(_allocation("d", "gpu-99"), INVENTORY, prepared, pool=NODE) == []


def test_a_gpu_renamed_by_renumbering_is_still_held_by_uuid() -> None:
    before = inventory("h100x8")
    held = PreparedClaim(
        UID_A,
        "team-a",
        "claim-a",
        (PreparedDevice(("gpu",), NODE, "gpu-1", (), uuid=_uuid("gpu-1", before)),),
    )
    shifted = Inventory(
        devices=tuple(replace(g, name=f"gpu-{i}", index=i) for i, g in enumerate(before.gpus[1:])),
        driver_version=before.driver_version,
        cuda_driver_version=before.cuda_driver_version,
        gpus=before.gpus[1:],
    )
    # What was gpu-1 is gpu-0 now: the claim that asks for gpu-0 meets the holder; gpu-1 is free.
    assert conflicts(_allocation(UID_B, "gpu-0"), shifted, _by_uid(held), pool=NODE) == [held]
    assert conflicts(_allocation(UID_B, "gpu-1"), shifted, _by_uid(held), pool=NODE) == []


def test_a_live_holder_refuses_the_claim_naming_it() -> None:
    prepared = _by_uid(_prepared(UID_A, "gpu-0", "gpu-1"))
    assert _refusal(_decide(_allocation(UID_B, "gpu-2", "gpu-1"), prepared)) == (
        "cannot prepare ResourceClaim team-a/claim-b: "
        f"device gpu-1 is already prepared for claim team-a/claim-a ({UID_A})"
    )


def test_a_stale_holder_is_released_before_the_claim_is_recorded() -> None:
    gone = _prepared(UID_A, "gpu-0", "gpu-1")
    plan = _decide(_allocation(UID_B, "gpu-1"), _by_uid(gone), stale={UID_A: "the claim no longer exists"})
    assert plan == PreparePlan(
        claim=_prepared(UID_B, "gpu-1"),
        write=True,
        record=True,
        release=(Release(gone, "the claim no longer exists"),),
    )


def test_a_stale_holder_beside_a_live_one_changes_nothing() -> None:
    stale = _prepared(UID_A, "gpu-0")
    live = _prepared(UID_C, "gpu-1")
    plan = _decide(
        _allocation(UID_B, "gpu-0", "gpu-1"), _by_uid(stale, live), stale={UID_A: "the claim was re-created"}
    )
    assert _refusal(plan) == (
        "cannot prepare ResourceClaim team-a/claim-b: "
        f"device gpu-1 is already prepared for claim team-a/claim-c ({UID_C})"
    )


def test_a_stale_claim_that_blocks_nothing_is_not_released() -> None:
    bystander = _prepared(UID_A, "gpu-3")
    plan = _decide(
        _allocation(UID_B, "gpu-0"), _by_uid(bystander), stale={UID_A: "the claim no longer exists"}
    )
    assert isinstance(plan, PreparePlan)
    assert plan.release == ()


def test_admin_access_claims_share_with_everyone() -> None:
    exclusive = _prepared(UID_A, "gpu-2")
    monitor = _prepared(UID_C, "gpu-2", admin=True)
    plan = _decide(_allocation(UID_B, "gpu-2", admin=True), _by_uid(exclusive))
    assert isinstance(plan, PreparePlan)
    assert plan.claim.devices[0].admin_access
    assert isinstance(_decide(_allocation(UID_B, "gpu-2"), _by_uid(monitor)), PreparePlan)


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("allocation", "problem"),
    [
        (_allocation(UID_A, "gpu-0", "gpu-99"), "device gpu-99 does not exist on node node-a"),
        (_allocation(UID_A, "gpu-4"), "device gpu-4 does not exist on node node-a"),
        (
            _allocation(UID_A, "gpu-0", pool="node-b"),
            "device gpu-0 is in pool 'node-b', not this node's pool 'node-a'",
        ),
        (
            _allocation(
                UID_A,
                "gpu-0",
                configs=(
                    OpaqueConfig(
                        "FromClaim",
                        (),
                        {
                            "apiVersion": "resource.nvidia.com/v1beta1",
                            "kind": "GpuConfig",
                            "sharing": {"timeSlicingConfig": {"interval": "VeryLong"}},
                        },
                    ),
                ),
            ),
            "invalid configuration for device gpu-0: GpuConfig.sharing.timeSlicingConfig.interval: "
            '"VeryLong" is not one of',
        ),
    ],
    ids=["missing device", "mig-mode gpu", "other pool", "bad config"],
)
def test_a_claim_that_cannot_be_prepared_is_refused_with_the_reason(
    allocation: ClaimAllocation, problem: str
) -> None:
    message = _refusal(_decide(allocation))
    assert message.startswith(f"cannot prepare ResourceClaim team-a/claim-a: {problem}")


def test_every_problem_of_a_claim_is_reported_at_once() -> None:
    prepared = _by_uid(_prepared(UID_A, "gpu-0"))
    message = _refusal(_decide(_allocation(UID_B, "gpu-0", "gpu-77"), prepared))
    assert message == (
        "cannot prepare ResourceClaim team-a/claim-b: "
        f"device gpu-0 is already prepared for claim team-a/claim-a ({UID_A}); "
        "device gpu-77 does not exist on node node-a"
    )


def test_a_refused_reallocation_keeps_the_record() -> None:
    old = _prepared(UID_A, "gpu-0")
    assert isinstance(_decide(_allocation(UID_A, "gpu-99"), _by_uid(old), has_spec=True), Refusal)


# -- unprepare and recover ---------------------------------------------------------------------


def test_unprepare_drops_a_prepared_claim_and_only_the_spec_of_an_unknown_one() -> None:
    held = _prepared(UID_A, "gpu-0")
    assert decide_unprepare(UID_A, _by_uid(held)) == UnpreparePlan(UID_A, held)
    assert decide_unprepare(UID_C, _by_uid(held)) == UnpreparePlan(UID_C, None)


def test_recover_removes_unrecorded_specs_and_writes_every_prepared_ones() -> None:
    a = _prepared(UID_A, "gpu-0")
    b = _prepared(UID_B, "gpu-3")
    plan = decide_recover(_by_uid(a, b), INVENTORY, [UID_A, UID_C, "dddd"], ON)
    # UID_A's spec is there but is written again: one an older driver wrote gets the current layout.
    assert plan == RecoverPlan(
        remove=(UID_C, "dddd"),
        write=((UID_A, _spec(UID_A, "gpu-0")), (UID_B, _spec(UID_B, "gpu-3"))),
        missing=(),
    )


def test_recover_keeps_an_existing_spec_whose_claim_lost_a_device() -> None:
    a = _prepared(UID_A, "gpu-0", MIG)
    plan = decide_recover(_by_uid(a), inventory("h100x8"), [UID_A], ON)
    assert plan == RecoverPlan(remove=(), write=(), missing=(MissingDevice(a, MIG),))


def test_recover_leaves_devices_gone_out_and_writes_no_spec_for_a_claim_with_none_left() -> None:
    a = _prepared(UID_A, "gpu-0", MIG)
    b = _prepared(UID_B, "gpu-5-mig-3g40gb-1-0")
    without_mig = inventory("h100x8")
    plan = decide_recover(_by_uid(a, b), without_mig, [], ON)
    assert plan == RecoverPlan(
        remove=(),
        write=((UID_A, _spec(UID_A, "gpu-0", inv=without_mig)),),
        missing=(MissingDevice(a, MIG), MissingDevice(b, "gpu-5-mig-3g40gb-1-0")),
    )


#: The devices the random claims below hold one or two of.
_NAMES = [f"gpu-{i}" for i in range(4)] + ["gpu-0-mig-1g10gb-at0"]


def _random_claim(
    rng: random.Random, uid: str, name: str, admin: float, uuids: tuple[str, ...], shares: tuple[str, ...]
) -> PreparedClaim:
    """A claim on one or two of _NAMES: admin access with chance `admin`, a UUID of `uuids` ({name}:
    the device's) and a share of `shares`, each drawn from `rng`."""
    devices = tuple(
        PreparedDevice(
            ("r",),
            "node",
            device,
            (),
            admin_access=rng.random() < admin,
            uuid=rng.choice([u.format(name=device) for u in uuids]),
            share_id=rng.choice(shares),
        )
        for device in rng.sample(_NAMES, rng.randint(1, 2))
    )
    return PreparedClaim(uid, "ns", name, devices)


def test_the_holders_index_finds_what_a_scan_of_every_claim_finds() -> None:
    # Holders answers "who holds this device" from an index; every question must get the answer a
    # scan of every prepared claim with PreparedClaim.holds gives, in the claims' order.
    rng = random.Random(7)
    names = _NAMES
    prepared: dict[str, PreparedClaim] = {}
    for n in range(60):
        uuids, shares = ("", "GPU-{name}", "GPU-other"), ("", "", "s1", "s2")
        prepared[f"uid-{n}"] = _random_claim(rng, f"uid-{n}", f"c{n}", 0.15, uuids, shares)
    holders = Holders(prepared)
    for name in names:
        for uuid in ("", f"GPU-{name}", "GPU-other", "GPU-unknown"):
            for share in ("", "s1", "s3"):
                for uid in ("uid-0", "uid-5", "new"):
                    scan = [c for c in prepared.values() if c.uid != uid and c.holds(name, uuid, share)]
                    assert holders.of(name, uuid, uid, share) == scan, (name, uuid, share, uid)
        with_uuid = [c for c in prepared.values() if any(d.uuid == f"GPU-{name}" for d in c.devices)]
        assert holders.with_uuid(f"GPU-{name}") == with_uuid


def test_an_index_carried_over_saves_answers_as_one_built_afresh() -> None:
    # The executor carries Holders over each save that names its changed claims (Holders.updated):
    # after any run of adds, replacements and drops, every question gets a fresh index's answer.
    rng = random.Random(11)
    names = _NAMES

    def claim(uid: str) -> PreparedClaim:
        return _random_claim(rng, uid, f"c-{uid}", 0.3, ("", "GPU-{name}"), ("", "s1"))

    prepared: dict[str, PreparedClaim] = {f"uid-{n}": claim(f"uid-{n}") for n in range(20)}
    holders = Holders(prepared)
    for step in range(300):
        updated = dict(prepared)
        changed = set()
        for _ in range(rng.randint(1, 3)):
            uid = rng.choice([*updated, f"new-{step}-{rng.random()}"]) if updated else f"new-{step}"
            if uid in updated and rng.random() < 0.5:
                del updated[uid]
            else:
                updated[uid] = claim(uid)
            changed.add(uid)
        earlier = holders
        holders = holders.updated(updated, frozenset(changed))
        assert earlier.prepared is prepared, "the index carried over stays the old one's"
        prepared = updated
        fresh = Holders(prepared)
        for name in names:
            assert holders.named(name) == fresh.named(name), (step, name)
            for uuid in ("", f"GPU-{name}"):
                for uid in ("uid-0", "new"):
                    assert holders.of(name, uuid, uid, "s1") == fresh.of(name, uuid, uid, "s1"), (step, name)


def test_a_holder_is_stale_when_its_claim_is_gone_re_created_or_deallocated_and_live_otherwise() -> None:
    allocated: dict[str, object] = {"status": {"allocation": {"devices": {"results": []}}}}
    reads = {
        "a": ClaimRead(None, 404, "not found"),
        "b": ClaimRead({"metadata": {"uid": "another"}, **allocated}),
        "c": ClaimRead({"metadata": {"uid": "c"}, "status": {}}),
        "d": ClaimRead({"metadata": {"uid": "d"}, **allocated}),
        # The API server could not be asked: refusing now loses nothing, the kubelet retries.
        "e": ClaimRead(None, 403, "forbidden"),
        "f": ClaimRead(None, 503, "the server is shutting down"),
        "g": ClaimRead(None, 0, "connection refused"),
    }
    assert stale_reasons(reads) == {
        "a": "the claim no longer exists",
        "b": "the claim was re-created",
        "c": "the claim is no longer allocated",
    }
    # Each error the API server gave, for the refusal's message: not one "unreadable" for all.
    assert unanswered(reads) == {
        "e": "HTTP 403: forbidden",
        "f": "HTTP 503: the server is shutting down",
        "g": "connection refused",
    }


def test_a_holder_the_api_server_could_not_be_asked_about_refuses_the_claim_with_its_error() -> None:
    held = _by_uid(_prepared(UID_A, "gpu-0"))
    plan = decide_prepare(
        _allocation(UID_B, "gpu-0"),
        INVENTORY,
        held,
        ON,
        stale={},
        has_spec=False,
        unknown={UID_A: "HTTP 403: x"},
    )
    assert _refusal(plan).endswith(
        f"device gpu-0 is already prepared for claim team-a/claim-a ({UID_A}), which the API server could "
        "not be asked about (HTTP 403: x)"
    )
