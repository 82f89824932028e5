"""tests/e2e/differential.py: counters compared by value through the documented vocabulary."""

from __future__ import annotations

from typing import Any

from tests.e2e.differential import OURS, THEIRS, slice_differences

UUID = "GPU-0"


def _offer(counters: dict[str, str], counter_set: str, names: dict[str, Any] | None = None) -> dict[str, Any]:
    attributes = {
        "type": {"string": "mig"},
        "parentUUID": {"string": UUID},
        "profile": {"string": "1g.10gb"},
        **(names or {}),
    }
    return {
        "name": "offer",
        "attributes": attributes,
        "consumesCounters": [
            {"counterSet": counter_set, "counters": {k: {"value": v} for k, v in counters.items()}}
        ],
    }


def _slice(devices: list[dict[str, Any]], counter_set: str, totals: dict[str, str]) -> dict[str, Any]:
    return {
        "spec": {
            "devices": devices,
            "sharedCounters": [
                {"name": counter_set, "counters": {k: {"value": v} for k, v in totals.items()}}
            ],
        }
    }


OURS_TOTALS = {"compute": "7", "memory": "80Gi", "memslice0": "1", "memslice1": "1", "decoders": "7"}
THEIR_TOTALS = {
    "multiprocessors": "132",
    "memory": "80Gi",
    "memory-slice-0": "1",
    "memory-slice-1": "1",
    "decoders": "7",
    "encoders": "0",
}


def _pair(
    ours_offer: dict[str, str], their_offer: dict[str, str], ours_totals: dict[str, str] = OURS_TOTALS
) -> set[tuple[str, ...]]:
    ours = [_slice([_offer(ours_offer, "gpu0")], "gpu0", ours_totals)]
    theirs = [_slice([_offer(their_offer, "gpu-0-counter-set")], "gpu-0-counter-set", THEIR_TOTALS)]
    return slice_differences(ours, theirs)


def test_the_same_counts_in_each_vocabulary_differ_only_in_the_names_each_driver_has_alone() -> None:
    found = _pair(
        {"compute": "1", "memory": "10Gi", "memslice1": "1", "decoders": "1"},
        {"multiprocessors": "16", "memory": "10Gi", "memory-slice-1": "1", "decoders": "1", "encoders": "0"},
    )
    assert found == {
        ("counter set names",),
        ("counter", "compute", OURS),
        ("counter", "multiprocessors", THEIRS),
    }


def test_an_offer_that_consumes_another_memory_slice_or_amount_is_a_difference() -> None:
    # Ours says the offer is at slice 1 (so the two are matched) but consumes slice 0, and twice the memory.
    ours = [
        _slice(
            [
                _offer(
                    {"compute": "1", "memory": "20Gi", "memslice0": "1", "decoders": "1"},
                    "gpu0",
                    {"placementStart": {"int": 1}},
                )
            ],
            "gpu0",
            OURS_TOTALS,
        )
    ]
    theirs = [
        _slice(
            [_offer({"multiprocessors": "16", "memory": "10Gi", "memory-slice-1": "1"}, "gpu-0-counter-set")],
            "gpu-0-counter-set",
            THEIR_TOTALS,
        )
    ]
    found = slice_differences(ours, theirs)
    assert ("device", "mig offer", OURS) not in found
    assert ("counter value", "mig offer consumes", "memory") in found
    assert ("counter value", "mig offer consumes", "memory-slice-N") in found


def test_a_counter_sets_total_that_differs_is_a_difference() -> None:
    found = _pair(
        {"compute": "1", "memory": "10Gi", "memslice1": "1", "decoders": "1"},
        {"multiprocessors": "16", "memory": "10Gi", "memory-slice-1": "1", "decoders": "1"},
        ours_totals={**OURS_TOTALS, "decoders": "5"},
    )
    assert ("counter value", "set totals", "decoders") in found
