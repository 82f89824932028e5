"""Following the driver's own Node: a GET, then a watch from its resourceVersion, again after any failure.

The device plugin (its named config) and the kubelet plugin (its MIG layout)
both act on labels of their Node; each gets every state of the Node, the
first one at once, and the API server's outages are retried with backoff.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio

from dra.adapters.kube import KubeClient, KubeError, Obj

log = logging.getLogger(__name__)

_RETRY_MAX = 30.0


def labels_of(node: Obj) -> dict[str, str]:
    """A Node's labels."""
    return dict(node.get("metadata", {}).get("labels") or {})


async def follow_node(kube: KubeClient, node_name: str, consider: Callable[[Obj], Awaitable[None]]) -> None:
    """Call `consider` with the Node now and with each change of it, until cancelled."""
    backoff = 1.0
    while True:
        try:
            node = await kube.get_node(node_name)
            await consider(node)
            version = str(node["metadata"].get("resourceVersion", ""))
            async for kind, obj in kube.watch_node(node_name, version):
                if kind in ("ADDED", "MODIFIED"):
                    await consider(obj)
            backoff = 1.0
        except KubeError as err:
            log.warning("watching Node %s failed, again in %.0fs: %s", node_name, backoff, err)
            await anyio.sleep(backoff)
            backoff = min(backoff * 2, _RETRY_MAX)
