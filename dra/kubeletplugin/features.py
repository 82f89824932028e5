"""Which gated resource.k8s.io fields the API server keeps, found out once at start."""

from __future__ import annotations

import logging

from dra.adapters.kube import KubeClient, KubeError
from dra.core import slices

log = logging.getLogger(__name__)

#: PartitionableDevices is beta, so on by default, from 1.36.
PARTITIONABLE_DEVICES_ON_BY_DEFAULT = 36


async def partitionable_devices(kube: KubeClient, driver: str, node_name: str, minor: int) -> bool:
    """Whether the server keeps shared counters: on by default from 1.36, else a dry-run create says.

    A server whose gate is off drops the field silently, so the probe checks
    that the answer still carries it.
    """
    if minor >= PARTITIONABLE_DEVICES_ON_BY_DEFAULT:
        return True
    probe = {
        "apiVersion": slices.API_VERSION,
        "kind": "ResourceSlice",
        "metadata": {"name": slices.slice_name(node_name, driver, 0) + "-probe"},
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 0, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "probe", "counters": {slices.COMPUTE_COUNTER: {"value": "1"}}}],
        },
    }
    try:
        answer = await kube.create_resource_slice(probe, dry_run=True)
    except KubeError as err:
        log.warning("cannot find out whether the API server accepts shared counters (%s): assuming not", err)
        return False
    kept = bool((answer.get("spec") or {}).get("sharedCounters"))
    log.info("the API server %s shared counters (DRAPartitionableDevices)", "keeps" if kept else "drops")
    return kept
