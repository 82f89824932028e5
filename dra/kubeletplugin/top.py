"""`dra-gpu top`: a live terminal view of a node's claims, from what the driver wrote into them.

Each prepared claim's status.devices (dra.kubeletplugin.claimstatus) says what its devices are
and how they are shared; the claim's reservedFor says which pods use it. One list of the
claims every interval is all it reads, with the caller's kubeconfig: no access to the node.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any, TextIO

import anyio

from dra.adapters.kube import KubeClient, KubeError

HEADER = ("NAMESPACE", "POD", "CLAIM", "DEVICE", "UUID", "PROFILE", "SHARING", "MEMORY LIMIT")

#: ANSI: cursor home and clear the screen, so each refresh replaces the last.
_CLEAR = "\x1b[H\x1b[2J"


def _sharing(sharing: dict[str, Any]) -> str:
    strategy = str(sharing.get("strategy") or "-")
    if "interval" in sharing:
        strategy += f" ({sharing['interval']})"
    if "defaultActiveThreadPercentage" in sharing:
        strategy += f" {sharing['defaultActiveThreadPercentage']}% threads"
    if "shareID" in sharing:
        strategy += f" share {sharing['shareID']}"
    return strategy


def _memory_limit(sharing: dict[str, Any]) -> str:
    """What the claim may use of the device's memory: its share, the MPS pin, or all of it."""
    return str(sharing.get("shareMemory") or sharing.get("defaultPinnedDeviceMemoryLimit") or "device")


def rows(claims: Iterable[dict[str, Any]], driver: str, node: str) -> list[tuple[str, ...]]:
    """One row per device this driver prepared on `node` ("" for every node), sorted by namespace, claim."""
    found = []
    for claim in claims:
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        pods = [r["name"] for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        for entry in status.get("devices") or []:
            if entry.get("driver") != driver or (node and entry.get("pool") != node):
                continue
            data = entry.get("data") or {}
            sharing = data.get("sharing") or {}
            found.append(
                (
                    str(meta.get("namespace", "")),
                    ",".join(pods) or "-",
                    str(meta.get("name", "")),
                    str(entry.get("device", "")),
                    str(data.get("uuid") or "-"),
                    str(data.get("profile") or "-"),
                    _sharing(sharing),
                    _memory_limit(sharing),
                )
            )
    return sorted(found, key=lambda row: (row[0], row[2], row[3]))


def render(table: list[tuple[str, ...]]) -> str:
    """The rows under the header, in aligned columns."""
    lines = [HEADER, *table]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


async def run(
    kubeconfig: str | None, driver: str, node: str, interval: float, once: bool, out: TextIO = sys.stdout
) -> int:
    """Show the table, refreshed every `interval` seconds until interrupted (once: print it and return)."""
    kube = KubeClient(kubeconfig)
    try:
        while True:
            try:
                table = render(rows(await kube.list_resource_claims(), driver, node))
            except KubeError as err:
                table = f"cannot list ResourceClaims: {err}"
                if once:
                    print(table, file=sys.stderr)
                    return 1
            out.write(table + "\n" if once else _CLEAR + table + "\n")
            out.flush()
            if once:
                return 0
            await anyio.sleep(interval)
    finally:
        await kube.aclose()
