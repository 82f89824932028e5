"""`dra-gpu top`: a live terminal view of a node's claims, from what the driver wrote into them.

Each prepared claim's status.devices (dra.kubeletplugin.claimstatus) says what its devices are
and how they are shared; the claim's reservedFor says which pods use it. One list of the
claims every interval is all it reads, with the caller's kubeconfig: no access to the node.
Given the kubelet plugins' /metrics addresses (--metrics-url), it also scrapes them for what
the usage sampler (dra.kubeletplugin.usage) measured: memory used and utilisation per claim
and device, "-" where there is no such series.
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

import anyio
import anyio.to_thread

from dra.adapters.kube import KubeClient, KubeError
from dra.daemon.metrics import claim_usage

HEADER = ("NAMESPACE", "POD", "CLAIM", "DEVICE", "UUID", "PROFILE", "SHARING", "MEMORY LIMIT", "USED", "UTIL")

#: (claim namespace, claim name, device) -> (memory used in bytes, utilisation 0..1 or None).
Usage = Mapping[tuple[str, str, str], tuple[float, float | None]]
#: Seconds a scrape of one kubelet plugin may take.
_SCRAPE_TIMEOUT = 5.0

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


def _bytes(value: float) -> str:
    """Bytes in the largest binary unit that keeps a number of at least 1 ("1.5Gi")."""
    for unit, shift in (("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if value >= 1 << shift:
            return f"{value / (1 << shift):.1f}{unit}"
    return f"{value:.0f}"


def rows(
    claims: Iterable[dict[str, Any]], driver: str, node: str, usage: Usage | None = None
) -> list[tuple[str, ...]]:
    """One row per device this driver prepared on `node` ("" for every node), sorted by namespace, claim.

    `usage` fills the USED and UTIL columns where it has the claim's device; "-" elsewhere.
    """
    found = []
    for claim in claims:
        meta, status = claim.get("metadata") or {}, claim.get("status") or {}
        pods = [r["name"] for r in status.get("reservedFor") or [] if r.get("resource") == "pods"]
        for entry in status.get("devices") or []:
            if entry.get("driver") != driver or (node and entry.get("pool") != node):
                continue
            data = entry.get("data") or {}
            sharing = data.get("sharing") or {}
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")), str(entry.get("device", "")))
            memory, utilization = (usage or {}).get(key, (None, None))
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
                    "-" if memory is None else _bytes(memory),
                    "-" if utilization is None else f"{utilization:.0%}",
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


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=_SCRAPE_TIMEOUT) as response:
        return bytes(response.read()).decode()


async def scrape(
    urls: Sequence[str],
) -> tuple[dict[tuple[str, str, str], tuple[float, float | None]], list[str]]:
    """The claims' usage from every URL that answers, and one complaint per URL that does not."""
    usage: dict[tuple[str, str, str], tuple[float, float | None]] = {}
    failed = []
    for url in urls:
        try:
            usage.update(claim_usage(await anyio.to_thread.run_sync(_scrape, url)))
        except (OSError, ValueError) as err:
            failed.append(f"cannot scrape {url}: {err}")
    return usage, failed


async def run(
    kubeconfig: str | None,
    driver: str,
    node: str,
    interval: float,
    once: bool,
    out: TextIO = sys.stdout,
    metrics_urls: Sequence[str] = (),
) -> int:
    """Show the table, refreshed every `interval` seconds until interrupted (once: print it and return).

    With `metrics_urls`, the kubelet plugins' /metrics, the usage columns are filled from them.
    """
    try:
        kube = KubeClient(kubeconfig)
    except KubeError as err:
        print(err, file=sys.stderr)
        return 1
    try:
        while True:
            try:
                usage, failed = await scrape(metrics_urls)
                table = render(rows(await kube.list_resource_claims(), driver, node, usage))
                table = "\n".join([table, *failed])
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
