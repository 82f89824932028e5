"""dra_gpu_claim_device_info: which claim, pod and container hold which GPU, as DCGM names the GPU.

dcgm-exporter labels its series with UUID (the GPU's, the parent's for a MIG device),
GPU_I_ID and GPU_I_PROFILE, and cannot tell which claim holds a MIG device that dynamic MIG
made. This series, 1 per prepared device and container using it, carries the same labels
beside the claim's and the pod's, so that

    DCGM_FI_PROF_GR_ENGINE_ACTIVE * on(UUID, GPU_I_ID) group_left(pod, namespace, container,
        dra_claim_namespace, dra_claim_name) dra_gpu_claim_device_info

names the claim and pod of every GPU and MIG device. It is sampled every interval, off the
request path: the prepared claims from the state, the containers from the kubelet's
pod-resources List (its DynamicResources). Its size is the node's prepared devices times
the containers using each, bounded by the node's claims; no PID or other unbounded label.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
import grpc

from dra.core.devicestatus import DeviceIdentity, identities, join_labels
from dra.daemon import metrics
from dra.kubeletplugin.podresources import SOCKET, claim_consumers, rpc_error_text
from dra.kubeletplugin.state import DeviceState
from dra.kubeletplugin.usage import UsageSampler
from dra.model.prepared import PreparedClaim

log = logging.getLogger(__name__)


class ClaimDeviceInfo:
    """Samples the join metric every `interval` seconds."""

    def __init__(
        self,
        state: DeviceState,
        driver: str,
        kubelet_root: Path,
        interval: float,
        usage: UsageSampler | None = None,
    ) -> None:
        self._state = state
        self._driver = driver
        self.socket = kubelet_root / SOCKET
        self._interval = interval
        self._warned = False
        #: Identities by claim UID, computed once per prepared claim (and again when the inventory changes).
        self._known: dict[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]] = {}
        self._inventory = state.inventory
        #: Samples the usage series with the same claims and containers; None: no usage series.
        self.usage = usage

    async def run(self) -> None:
        """Sample until cancelled."""
        try:
            while True:
                await self.sample()
                await anyio.sleep(self._interval)
        finally:
            if self.usage is not None:
                self.usage.close()

    async def sample(self) -> None:
        """One sample: the series as the state and the kubelet say now."""
        try:
            consumers = await claim_consumers(self.socket, self._driver)
            metrics.CLAIM_INFO_SAMPLES.labels("success").inc()
            self._warned = False
        except (grpc.RpcError, OSError) as err:
            metrics.CLAIM_INFO_SAMPLES.labels("error").inc()
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot ask the kubelet (%s) which containers use which claims: %s; "
                    "dra_gpu_claim_device_info has no pod labels until it answers",
                    self.socket,
                    rpc_error_text(err),
                )
            consumers = []
        claims = self._claims()
        metrics.CLAIM_DEVICE_INFO.set(join_labels(claims, consumers))
        if self.usage is not None:
            await self.usage.sample(self._state.inventory, claims, consumers)

    def _claims(self) -> dict[str, tuple[PreparedClaim, tuple[DeviceIdentity, ...]]]:
        prepared, inventory = self._state.prepared, self._state.inventory
        if inventory is not self._inventory:
            self._inventory, self._known = inventory, {}
        # A claim prepared again (same UID, new record) is a new object: identified again.
        self._known = {
            uid: known
            if (known := self._known.get(uid)) is not None and known[0] is claim
            else (claim, identities(claim, inventory))
            for uid, claim in prepared.items()
        }
        return self._known
