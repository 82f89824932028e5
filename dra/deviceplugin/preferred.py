"""GetPreferredAllocation: which devices to give a container, when the kubelet asks. Pure.

The kubelet's `must_include` devices, then one device at a time: most chosen devices in its
group (parent GPU, PCIe root, NUMA node, finest first), then the best fit that keeps whole
groups free, then the node's order; replicas of a time-sliced resource are spread instead
(`spread_allocation`). docs/device-plugin.md tells the rule with examples.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where a device sits: its order on the node and its groups, finest first."""

    order: int
    groups: tuple[str | None, ...]


def preferred_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    placements: Mapping[str, Placement],
) -> list[str]:
    """The device IDs to allocate: `must_include` first, `size` in all when enough are available.

    IDs without a placement are still eligible, after every placed one.
    """
    chosen = list(dict.fromkeys(must_include))
    if len(chosen) >= size:
        return chosen
    pool = [d for d in dict.fromkeys(available) if d not in set(chosen)]
    levels = max((len(p.groups) for p in placements.values()), default=0)
    unplaced = Placement(order=len(placements), groups=(None,) * levels)

    def groups(device: str) -> tuple[str | None, ...]:
        return placements.get(device, unplaced).groups

    def order(device: str) -> tuple[int, str]:
        placement = placements.get(device)
        return (placement.order, "") if placement is not None else (len(placements), device)

    def together(group: str | None, level: int, others: Sequence[str]) -> int:
        if group is None:
            return 0
        return sum(1 for other in others if groups(other)[level] == group)

    def rank(need: int, device: str) -> tuple[object, ...]:
        mine = groups(device)
        shared = tuple(-together(mine[level], level, chosen) for level in range(levels))
        # Free devices in each of its groups, itself included (alone where the group is unknown).
        free = [max(together(mine[level], level, pool), 1) for level in range(levels)]
        fit = next((level for level in range(levels) if free[level] >= need), levels)
        # Best fit: the smallest groups that hold the rest; else the largest groups, coarsest first.
        sizes = tuple(free[fit:]) if fit < levels else tuple(-count for count in reversed(free))
        return (shared, fit, sizes, order(device))

    while len(chosen) < size and pool:
        best = min(pool, key=functools.partial(rank, size - len(chosen)))
        chosen.append(best)
        pool.remove(best)
    return chosen


def spread_allocation(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    parents: Mapping[str, str],
) -> list[str]:
    """Replica IDs to allocate from a time-sliced resource: `must_include` first, then spread over GPUs.

    Two replicas of one GPU give a container no more than one replica does, so
    each pick takes the GPU this container holds fewest replicas of, then the
    one with most free replicas (least shared with other containers), then the
    earliest in `available`. `parents` maps a replica to its device; a replica
    without one counts as a device of its own.
    """
    chosen = list(dict.fromkeys(must_include))
    pool = [d for d in dict.fromkeys(available) if d not in set(chosen)]
    rank = {device: i for i, device in enumerate(pool)}

    def parent(device: str) -> str:
        return parents.get(device, device)

    while len(chosen) < size and pool:
        held = collections.Counter(parent(d) for d in chosen)
        free = collections.Counter(parent(d) for d in pool)
        best = min(pool, key=lambda d: (held[parent(d)], -free[parent(d)], rank[d]))
        chosen.append(best)
        pool.remove(best)
    return chosen
