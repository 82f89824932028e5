"""The DRA kubelet services: NodePrepareResources / NodeUnprepareResources (v1 and v1beta1) and health.

They run on grpcio's synchronous server (dra.kubeletplugin.server): each call on a thread of its
pool, which reads the claim, runs the state and answers, with no event loop in between (issue 44:
the hand-offs between grpc.aio's poller, the loop and a worker thread cost more CPU than the
state's own work). Every claim of a request is handled on its own, concurrently: one bad claim
gets its own error string and never fails the others. Errors the admin can act
on (wrong UID, another node's device, bad configuration) are also recorded as
Warning events on the ResourceClaim. What a prepared claim's devices are goes
into its status.devices after the kubelet is answered (dra.kubeletplugin.claimstatus); an
unprepared one's entries go when the claim is deallocated.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

import grpc

from dra.adapters.kube import KubeError, NotFoundError
from dra.core.plan import read_allocation
from dra.daemon import metrics
from dra.daemon.health import HealthTracker
from dra.kubeletplugin.claimstatus import ClaimStatusWriter
from dra.kubeletplugin.state import DeviceState
from dra.model.allocation import ClaimError
from dra.model.node import ClaimRead
from dra.model.prepared import PreparedClaim, PreparedDevice
from dra.pb.dra.v1 import dra_pb2
from dra.pb.dra.v1 import dra_pb2_grpc as v1_grpc
from dra.pb.dra.v1beta1 import dra_pb2_grpc as v1beta1_grpc
from dra.pb.drahealth.v1 import health_pb2 as health_v1
from dra.pb.drahealth.v1 import health_pb2_grpc as health_v1_grpc
from dra.pb.drahealth.v1alpha1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

Context = grpc.ServicerContext
#: Threads that take the claims of one request beside the one serving it (their GETs overlap).
CLAIM_WORKERS = 8
_Answer = TypeVar("_Answer", dra_pb2.NodePrepareResourceResponse, dra_pb2.NodeUnprepareResourceResponse)


class ClaimSource(Protocol):
    """The part of the Kubernetes adapter the service needs."""

    def read_resource_claim(self, namespace: str, name: str) -> dict[str, Any]:
        """GET a ResourceClaim (blocking the calling thread)."""

    def write_event(self, involved: dict[str, Any], reason: str, message: str, *, host: str = "") -> None:
        """Record a Warning event about an object (blocking the calling thread)."""


def prepared_counts(prepared: Mapping[str, PreparedClaim]) -> tuple[int, Counter[str]]:
    """What the node has prepared: claims (ours), and devices by NVIDIA's device_type."""
    counts = Counter(_device_type(d) for claim in prepared.values() for d in claim.devices)
    return len(prepared), counts


def _device_type(device: PreparedDevice) -> str:
    """NVIDIA's device_type of a prepared device: a GPU passed through is `vfio`, as its driver counts it."""
    if device.vfio_group >= 0:
        return "vfio"
    # A MIG device's UUID says what it is (NVML's MIG-...); a device not made yet has none.
    return ("mig" if device.uuid.startswith("MIG-") else "gpu") if device.uuid else "unknown"


def _response(claim: PreparedClaim) -> dra_pb2.NodePrepareResourceResponse:
    return dra_pb2.NodePrepareResourceResponse(
        devices=[
            dra_pb2.Device(
                request_names=list(d.request_names),
                pool_name=d.pool,
                device_name=d.device,
                cdi_device_ids=list(d.cdi_device_ids),
                share_id=d.share_id or None,
            )
            for d in claim.devices
        ]
    )


class DraService(v1_grpc.DRAPluginServicer, v1beta1_grpc.DRAPluginServicer):
    """Serves both API versions: their messages are the same on the wire.

    `on_prepared` is told each claim prepared, before the kubelet is answered, on the thread serving
    the call; it must not block.
    """

    def __init__(
        self,
        driver: str,
        node_name: str,
        state: DeviceState,
        kube: ClaimSource,
        status: ClaimStatusWriter | None = None,
        on_prepared: Callable[[PreparedClaim], object] | None = None,
    ) -> None:
        self.driver = driver
        self._on_prepared = on_prepared
        self.node_name = node_name
        self._state = state
        self._kube = kube
        self._status = status
        self._events_allowed = True
        #: Claims being prepared and unprepared now (NVIDIA's in-flight gauge), and their condition for
        #: wait_idle.
        self._in_flight = {"prepare": 0, "unprepare": 0}
        self._idle = threading.Condition()
        self._claims = ThreadPoolExecutor(CLAIM_WORKERS, thread_name_prefix="dra-claim")
        metrics.start_request_series(driver)
        # Each call's series, looked up once (a labels() call takes a lock and builds a key).
        calls = ("prepare", "unprepare")
        for call in calls:
            # Read when scraped from the count wait_idle keeps anyway: no gauge lock taken twice a call.
            gauge = metrics.NVIDIA_REQUESTS_INFLIGHT.labels(driver, call)
            gauge.set_function(functools.partial(self._in_flight.__getitem__, call))
        self._succeeded = {c: metrics.NVIDIA_REQUESTS.labels(driver, c) for c in calls}
        self._request_seconds = {c: metrics.NVIDIA_REQUEST_SECONDS.labels(driver, c) for c in calls}
        histograms = {"prepare": metrics.PREPARE_SECONDS, "unprepare": metrics.UNPREPARE_SECONDS}
        self._seconds = {c: {r: histograms[c].labels(r) for r in ("success", "error")} for c in calls}
        metrics.PREPARED.follow(node_name, driver, lambda: prepared_counts(state.prepared))

    def _record_event(self, claim: dict[str, Any], message: str) -> None:
        if not self._events_allowed:
            return
        try:
            self._kube.write_event(claim, "PrepareFailed", message, host=self.node_name)
        except KubeError as err:
            if err.status == 403:
                # Least-privilege RBAC grants no events; the kubelet still puts the error in pod events.
                self._events_allowed = False
                log.info("no permission to create events: prepare errors go to pod events only (%s)", err)
            else:
                log.warning(
                    "cannot record an event on ResourceClaim %s: %s", claim["metadata"].get("name"), err
                )

    def _read_holders(self, holders: Sequence[PreparedClaim]) -> dict[str, ClaimRead]:
        """The prepare's ask_stale step: each holder's ResourceClaim as the API server answered (dra.core.plan
        decides what that means for its devices)."""
        return {holder.uid: self._read_holder(holder) for holder in holders}

    def _read_holder(self, holder: PreparedClaim) -> ClaimRead:
        try:
            return ClaimRead(self._kube.read_resource_claim(holder.namespace, holder.name))
        except KubeError as err:
            return ClaimRead(None, err.status, str(err))

    def _prepare(self, ref: dra_pb2.Claim) -> dra_pb2.NodePrepareResourceResponse:
        started = time.perf_counter()
        name = f"{ref.namespace}/{ref.name}"
        read: list[dict[str, Any]] = []
        result = "error"
        try:
            read.append(self._kube.read_resource_claim(ref.namespace, ref.name))
            prepared = self._state.prepare(read_allocation(read[0], ref.uid, self.driver), self._read_holders)
            result = "success"
            # As NVIDIA's driver counts them: only the requests that succeed.
            self._succeeded["prepare"].inc()
            self._request_seconds["prepare"].observe(time.perf_counter() - started)
            if self._status is not None:
                # The inventory has the MIG devices this prepare made.
                self._status.prepared(prepared, self._state.inventory)
            if self._on_prepared is not None:
                self._on_prepared(prepared)
            return _response(prepared)
        except NotFoundError:
            return dra_pb2.NodePrepareResourceResponse(
                error=f"ResourceClaim {name} not found: it was deleted; the pod cannot start with it"
            )
        except KubeError as err:
            return dra_pb2.NodePrepareResourceResponse(error=f"cannot read ResourceClaim {name}: {err}")
        except ClaimError as err:
            log.warning("prepare %s (%s) failed: %s", name, ref.uid, err)
            if read:
                self._record_event(read[0], str(err))
            return dra_pb2.NodePrepareResourceResponse(error=str(err))
        except Exception as err:
            log.exception("internal error preparing %s (%s)", name, ref.uid)
            return dra_pb2.NodePrepareResourceResponse(error=f"internal error preparing {name}: {err!r}")
        finally:
            if result != "success":
                # NVIDIA's error_type: its prepare_devices covers all of prepare; reading the claim is
                # our own step (NVIDIA's framework reads it before its driver's code runs).
                metrics.NVIDIA_PREPARE_ERRORS.labels(
                    self.driver, "prepare_devices" if read else "get_claim"
                ).inc()
            self._seconds["prepare"][result].observe(time.perf_counter() - started)

    def _unprepare(self, ref: dra_pb2.Claim) -> dra_pb2.NodeUnprepareResourceResponse:
        started = time.perf_counter()
        result = "error"
        try:
            self._state.unprepare(ref.uid)
            result = "success"
            self._succeeded["unprepare"].inc()
            self._request_seconds["unprepare"].observe(time.perf_counter() - started)
            if self._status is not None:
                self._status.unprepared(ref.uid)
            return dra_pb2.NodeUnprepareResourceResponse()
        except Exception as err:
            log.exception("internal error unpreparing %s/%s (%s)", ref.namespace, ref.name, ref.uid)
            return dra_pb2.NodeUnprepareResourceResponse(
                error=f"cannot unprepare {ref.namespace}/{ref.name}: {err!r}"
            )
        finally:
            if result != "success":
                metrics.NVIDIA_UNPREPARE_ERRORS.labels(self.driver, "unprepare_devices").inc()
            self._seconds["unprepare"][result].observe(time.perf_counter() - started)

    def NodePrepareResources(  # noqa: N802 (gRPC method name)
        self, request: dra_pb2.NodePrepareResourcesRequest, context: Context
    ) -> dra_pb2.NodePrepareResourcesResponse:
        """Prepare every claim of the request, each on its own."""
        claims = len(request.claims)
        self._begin("prepare", claims)
        try:
            return dra_pb2.NodePrepareResourcesResponse(claims=self._each(request.claims, self._prepare))
        finally:
            self._end("prepare", claims)

    def NodeUnprepareResources(  # noqa: N802
        self, request: dra_pb2.NodeUnprepareResourcesRequest, context: Context
    ) -> dra_pb2.NodeUnprepareResourcesResponse:
        """Unprepare every claim of the request; unknown claims succeed."""
        claims = len(request.claims)
        self._begin("unprepare", claims)
        try:
            return dra_pb2.NodeUnprepareResourcesResponse(claims=self._each(request.claims, self._unprepare))
        finally:
            self._end("unprepare", claims)

    # A request's claims count as in flight from _begin to _end (a try/finally in each call: a
    # generator context manager cost more than the count it keeps). A request of no claims does nothing.
    def _begin(self, call: str, claims: int) -> None:
        with self._idle:
            self._in_flight[call] += claims

    def _end(self, call: str, claims: int) -> None:
        with self._idle:
            self._in_flight[call] -= claims
            if not any(self._in_flight.values()):
                self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Block until no prepare or unprepare is being answered, at most `timeout` seconds; whether so."""
        with self._idle:
            return self._idle.wait_for(lambda: not any(self._in_flight.values()), timeout)

    def _each(
        self, claims: Iterable[dra_pb2.Claim], handle: Callable[[dra_pb2.Claim], _Answer]
    ) -> dict[str, _Answer]:
        """Handle every claim, concurrently; the answers keyed by claim UID, as the kubelet expects."""
        refs = list(claims)
        if len(refs) <= 1:
            # Most requests carry one claim: handled on the serving thread, with no hand-off.
            return {ref.uid: handle(ref) for ref in refs}
        return dict(zip((ref.uid for ref in refs), self._claims.map(handle, refs), strict=True))


class HealthService(health_v1_grpc.DRAResourceHealthServicer):
    """Streams the health of every published device to the kubelet (ResourceHealthStatus), v1.

    A 1.37 kubelet asks this version; `alpha` serves the same stream as
    v1alpha1 for 1.34 to 1.36. v1 also says why a device is unhealthy. A stream holds
    one thread of the server's pool for as long as the kubelet keeps it open.
    """

    def __init__(self, pool: str, tracker: HealthTracker) -> None:
        self._pool = pool
        self._tracker = tracker
        self.alpha = _AlphaHealthService(self)

    def NodeWatchResources(  # noqa: N802
        self, request: health_v1.NodeWatchResourcesRequest, context: Context
    ) -> Generator[health_v1.NodeWatchResourcesResponse]:
        """The full list on connect and after every change, until the kubelet goes."""
        for snapshot in self._tracker.follow(context.is_active):
            yield health_v1.NodeWatchResourcesResponse(
                devices=[
                    health_v1.DeviceHealth(
                        device=health_v1.DeviceIdentifier(pool_name=self._pool, device_name=name),
                        health=health_v1.HEALTHY if status.healthy else health_v1.UNHEALTHY,
                        last_updated_time=status.since,
                        message=status.reason[:_MESSAGE_MAX],
                    )
                    for name, status in sorted(snapshot.items())
                ]
            )


#: The kubelet truncates longer health messages itself; say it in our own words instead.
_MESSAGE_MAX = 1024


class _AlphaHealthService(health_pb2_grpc.DRAResourceHealthServicer):
    """The v1alpha1 stream: the v1 stream without the fields v1alpha1 lacks (the same wire numbers)."""

    def __init__(self, v1: HealthService) -> None:
        self._v1 = v1

    def NodeWatchResources(  # noqa: N802
        self, request: health_pb2.NodeWatchResourcesRequest, context: Context
    ) -> Generator[health_pb2.NodeWatchResourcesResponse]:
        """The full list on connect and after every change, until the kubelet goes."""
        for answer in self._v1.NodeWatchResources(health_v1.NodeWatchResourcesRequest(), context):
            for device in answer.devices:
                device.ClearField("message")
            # Field numbers 1-3 are the same in both versions, so the bytes carry over unchanged.
            yield health_pb2.NodeWatchResourcesResponse.FromString(answer.SerializeToString())
