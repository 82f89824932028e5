"""The NUMA nodes a PCI device is close to, read from sysfs as Kubernetes 1.37 defines them (KEP-5491).

The list form of the standard attribute `resource.kubernetes.io/numaNode` is the device's own
node (its PCI device's `numa_node`) first, then the other nodes of the same socket at the
smallest ACPI SLIT distance from it, ascending: with sub-NUMA clustering (Intel SNC, AMD NPS)
one socket is split in several nodes that are all equally close to its devices. Where the
distances cannot be read, the list is the device's node alone. This follows
k8s.io/dynamic-resource-allocation/deviceattribute (numa_linux.go) at v0.37.2, including its
choices: a node whose socket cannot be told (no CPUs, as a memory-only node) is counted in.
"""

from __future__ import annotations

from pathlib import Path


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpus(cpulist: str) -> list[int]:
    """The CPUs of a kernel cpulist ("0-3,8"); ValueError where it is not one."""
    cpus: list[int] = []
    for part in cpulist.split(","):
        first, _, last = part.partition("-")
        cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def _socket(sysfs: Path, node: int) -> int | None:
    """The physical package of the node's first CPU; None where the node has none or sysfs does not say."""
    cpulist = _read(sysfs / f"devices/system/node/node{node}/cpulist")
    try:
        cpus = _cpus(cpulist) if cpulist else []
    except ValueError:
        return None
    if not cpus:
        return None
    package = _read(sysfs / f"devices/system/cpu/cpu{cpus[0]}/topology/physical_package_id")
    try:
        return int(package) if package is not None else None
    except ValueError:
        return None


def same_socket_nodes(sysfs: Path, node: int) -> tuple[int, ...]:
    """`node` first, then the nodes of its socket at the minimum SLIT distance from it (ascending)."""
    text = _read(sysfs / f"devices/system/node/node{node}/distance")
    try:
        distances = [int(d) for d in text.split()] if text else []
    except ValueError:
        return (node,)
    if node >= len(distances):
        return (node,)
    others = [d for i, d in enumerate(distances) if i != node]
    if not others:
        return (node,)
    closest = min(others)
    mine = _socket(sysfs, node)
    siblings = []
    for other, distance in enumerate(distances):
        if other == node or distance != closest:
            continue
        theirs = _socket(sysfs, other) if mine is not None else None
        if theirs is not None and theirs != mine:
            continue
        siblings.append(other)
    return (node, *siblings)
