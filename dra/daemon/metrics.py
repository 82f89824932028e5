"""Prometheus metrics and the HTTP endpoint that serves them with the health probes.

GET /metrics   Prometheus text format
GET /healthz   200 while the daemon's event loop runs (liveness)
GET /readyz    200 once registered with the kubelet and the slices are published (readiness)

The kubelet plugin also serves NVIDIA's DRA driver's metrics (nvidia_dra_*, pkg/metrics of
kubernetes-sigs/dra-driver-nvidia-gpu) under its names, labels, buckets and meaning, so that
dashboards and alerts written for that driver work here (docs/operations.md).

The device plugin, the node labeller and the webhook serve the same paths with their own
registries (DEVICE_PLUGIN_REGISTRY, LABELLER_REGISTRY, WEBHOOK_REGISTRY),
so no process shows another's metrics as zeros.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

# CollectorRegistry and Gauge are re-exported: the daemons name them without importing prometheus_client.
from prometheus_client import CollectorRegistry as CollectorRegistry
from prometheus_client import Counter, Histogram, make_wsgi_app
from prometheus_client import Gauge as Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dra import __version__
from dra.core.devicestatus import JOIN_LABELS
from dra.core.usage import CLAIM_LABELS, DEVICE_LABELS, Value

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry()

PREPARE_SECONDS = Histogram(
    "dra_gpu_node_prepare_seconds",
    "Time to prepare one claim (API read, decisions, CDI spec, checkpoint).",
    ["result"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
UNPREPARE_SECONDS = Histogram(
    "dra_gpu_node_unprepare_seconds",
    "Time to unprepare one claim.",
    ["result"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1),
    registry=REGISTRY,
)
PUBLISHED_DEVICES = Gauge(
    "dra_gpu_published_devices", "Devices in this node's ResourceSlices.", registry=REGISTRY
)
UNHEALTHY_DEVICES = Gauge(
    "dra_gpu_unhealthy_devices", "Devices marked unhealthy by XID errors.", registry=REGISTRY
)
UNWATCHED_GPUS = Gauge(
    "dra_gpu_unwatched_gpus",
    "GPUs whose XID errors NVML cannot watch: their devices are reported healthy, unknowingly.",
    registry=REGISTRY,
)
SLICE_WRITES = Counter(
    "dra_gpu_resourceslice_writes", "ResourceSlice writes by operation.", ["operation"], registry=REGISTRY
)
RECONCILE_ERRORS = Counter(
    "dra_gpu_resourceslice_reconcile_errors", "Failed ResourceSlice reconciliations.", registry=REGISTRY
)
CLAIM_STATUS_WRITES = Counter(
    "dra_gpu_claim_status_writes",
    "Writes of prepared claims' status.devices, by operation (set) and result.",
    ["operation", "result"],
    registry=REGISTRY,
)
CLAIM_INFO_SAMPLES = Counter(
    "dra_gpu_claim_device_info_samples",
    "Samples of dra_gpu_claim_device_info, by result (error: the kubelet's pod-resources did not answer).",
    ["result"],
    registry=REGISTRY,
)


class InfoSeries(Collector):
    """A gauge of value 1 per label set, the whole set replaced at once.

    A scrape sees the series of one sample or the next, never a mix: Gauge.clear() followed by
    setting each series again would show a scrape in between an empty or partial set.
    """

    def __init__(self, name: str, documentation: str, labels: Sequence[str], registry: CollectorRegistry):
        self._name = name
        self._documentation = documentation
        self._labels = list(labels)
        self._series: tuple[tuple[str, ...], ...] = ()
        registry.register(self)

    def set(self, series: Iterable[tuple[str, ...]]) -> None:
        """Replace every series by these label values (in the order of the labels)."""
        self._series = tuple(series)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The series as the last set() left them."""
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        for values in self._series:
            family.add_metric(values, 1)
        yield family


CLAIM_DEVICE_INFO = InfoSeries(
    "dra_gpu_claim_device_info",
    "1 per prepared claim's device and container using it; UUID, GPU_I_ID and GPU_I_PROFILE as "
    "dcgm-exporter labels its series, to join them with the claim, pod and container.",
    JOIN_LABELS,
    REGISTRY,
)


class UsageSeries(Collector):
    """The usage series of one sample (dra.kubeletplugin.usage), replaced at once as InfoSeries' are.

    A utilisation NVML could not measure has no series (absent, never 0).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._claims: Mapping[tuple[str, ...], Value] = {}
        self._unattributed: Mapping[tuple[str, ...], Value] = {}
        self._busy: Mapping[tuple[str, ...], float] = {}
        registry.register(self)

    def set(
        self,
        claims: Mapping[tuple[str, ...], Value],
        unattributed: Mapping[tuple[str, ...], Value],
        busy: Mapping[tuple[str, ...], float],
    ) -> None:
        """Replace every series: claims' and unattributed values, claims' busy seconds so far."""
        self._claims, self._unattributed, self._busy = dict(claims), dict(unattributed), dict(busy)

    def collect(self) -> Iterator[Metric]:
        """The series as the last set() left them."""
        claims, unattributed, busy = self._claims, self._unattributed, self._busy
        labels, device = list(CLAIM_LABELS), list(DEVICE_LABELS)
        memory = GaugeMetricFamily(
            "dra_gpu_claim_memory_used_bytes",
            "Device memory a claim's containers use on a GPU or MIG device (labelled as "
            "dra_gpu_claim_device_info).",
            labels=labels,
        )
        utilization = GaugeMetricFamily(
            "dra_gpu_claim_utilization_ratio",
            "Share of the time (0-1) a claim's containers kept the GPU or MIG device busy; absent where NVML "
            "cannot measure it.",
            labels=labels,
        )
        seconds = CounterMetricFamily(
            "dra_gpu_claim_busy_seconds",
            "Seconds of device time a claim's containers used (utilisation times the sampling interval), "
            "for chargeback.",
            labels=labels,
        )
        for values, value in claims.items():
            memory.add_metric(values, value.memory)
            if value.utilization is not None:
                utilization.add_metric(values, value.utilization)
            if values in busy:
                seconds.add_metric(values, busy[values])
        free_memory = GaugeMetricFamily(
            "dra_gpu_unattributed_memory_used_bytes",
            "Device memory used on a GPU or MIG device that no claim is credited with.",
            labels=device,
        )
        free_utilization = GaugeMetricFamily(
            "dra_gpu_unattributed_utilization_ratio",
            "Share of the time (0-1) a GPU or MIG device was busy that no claim is credited with.",
            labels=device,
        )
        for values, value in unattributed.items():
            free_memory.add_metric(values, value.memory)
            if value.utilization is not None:
                free_utilization.add_metric(values, value.utilization)
        yield from (memory, utilization, seconds, free_memory, free_utilization)


def claim_usage(text: str) -> dict[tuple[str, str, str], tuple[float, float | None]]:
    """From a scrape of the kubelet plugin: (claim namespace, claim name, device) -> (memory, utilisation).

    Summed over the claim's containers; the utilisation is None where the scrape has none.
    """
    # Only `dra-gpu top` parses a scrape: the daemons that import this module never load the parser.
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[tuple[str, str, str], tuple[float, float | None]] = {}
    wanted = {"dra_gpu_claim_memory_used_bytes": 0, "dra_gpu_claim_utilization_ratio": 1}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            column = wanted.get(sample.name)
            if column is None:
                continue
            labels = sample.labels
            key = (
                labels.get("dra_claim_namespace", ""),
                labels.get("dra_claim_name", ""),
                labels.get("dra_device_name", ""),
            )
            memory, utilization = found.get(key, (0.0, None))
            if column == 0:
                memory += sample.value
            else:
                utilization = (utilization or 0.0) + sample.value
            found[key] = (memory, utilization)
    return found


USAGE = UsageSeries(REGISTRY)
USAGE_SERIES_DROPPED = Counter(
    "dra_gpu_usage_series_dropped",
    "Claim usage series left out of a sample because there were more than --usage-max-series.",
    registry=REGISTRY,
)
USAGE_SAMPLE_SECONDS = Histogram(
    "dra_gpu_usage_sample_duration_seconds",
    "Time to read, attribute and publish one usage sample.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
    registry=REGISTRY,
)

# NVIDIA's: ExponentialBuckets(0.05, 2, 9), 50 ms to 12.8 s.
NVIDIA_REQUEST_SECONDS = Histogram(
    "nvidia_dra_request_duration_seconds",
    "Duration of DRA prepare and unprepare requests.",
    ["driver", "operation"],
    buckets=tuple(0.05 * 2**i for i in range(9)),
    registry=REGISTRY,
)
NVIDIA_REQUESTS = Counter(
    "nvidia_dra_requests_total",
    "Total number of DRA prepare and unprepare requests.",
    ["driver", "operation"],
    registry=REGISTRY,
)
NVIDIA_REQUESTS_INFLIGHT = Gauge(
    "nvidia_dra_requests_inflight",
    "Number of in-flight DRA prepare and unprepare requests.",
    ["driver", "operation"],
    registry=REGISTRY,
)
NVIDIA_PREPARE_ERRORS = Counter(
    "nvidia_dra_node_prepare_errors_total",
    "Total number of failures during DRA node prepare for kubelet plugins.",
    ["driver", "error_type"],
    registry=REGISTRY,
)
NVIDIA_UNPREPARE_ERRORS = Counter(
    "nvidia_dra_node_unprepare_errors_total",
    "Total number of failures during DRA node unprepare for kubelet plugins.",
    ["driver", "error_type"],
    registry=REGISTRY,
)
#: NVIDIA's device_type values; each is set, 0 included, so that a type gone from the node reads 0.
NVIDIA_DEVICE_TYPES = ("gpu", "mig", "vfio", "unknown")


#: The results of dra_gpu_node_prepare_seconds and dra_gpu_node_unprepare_seconds.
RESULTS = ("success", "error")


def start_request_series(driver: str) -> None:
    """Create the request series at zero, NVIDIA's as its driver does and ours for each result.

    The first scrape has them, and the first prepare (or error) counts in rate() and increase():
    a series that is born with its first event shows no increase for that event.
    """
    for operation in ("prepare", "unprepare"):
        NVIDIA_REQUESTS.labels(driver, operation)
        NVIDIA_REQUEST_SECONDS.labels(driver, operation)
        NVIDIA_REQUESTS_INFLIGHT.labels(driver, operation)
    for result in RESULTS:
        PREPARE_SECONDS.labels(result)
        UNPREPARE_SECONDS.labels(result)


#: Claims prepared, and prepared devices by NVIDIA's device_type, as they are now.
PreparedCounts = Callable[[], tuple[int, Mapping[str, int]]]


class PreparedSeries(Collector):
    """dra_gpu_prepared_claims and NVIDIA's prepared_devices, counted when scraped.

    Counted by the scrape rather than set by each prepare and unprepare: counting walks every
    prepared claim, a cost that grew with the node's claims on every kubelet call, while a
    scrape comes every few seconds at most.
    """

    _CLAIMS = ("dra_gpu_prepared_claims", "Claims prepared on this node.")
    _DEVICES = ("nvidia_dra_prepared_devices", "Current number of prepared devices by device type.")
    _DEVICE_LABELS = ("node", "driver", "device_type")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._node = self._driver = ""
        self._count: PreparedCounts | None = None
        registry.register(self)

    def follow(self, node: str, driver: str, count: PreparedCounts) -> None:
        """Count what `count` answers at each scrape (the last call wins)."""
        self._node, self._driver, self._count = node, driver, count

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """Both families, so that the registry knows their names before anything is prepared."""
        yield GaugeMetricFamily(*self._CLAIMS)
        yield GaugeMetricFamily(*self._DEVICES, labels=self._DEVICE_LABELS)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The claims, and a series per NVIDIA device type (0 included) once something is followed."""
        claims, devices = self._count() if self._count is not None else (0, {})
        yield GaugeMetricFamily(*self._CLAIMS, value=claims)
        family = GaugeMetricFamily(*self._DEVICES, labels=self._DEVICE_LABELS)
        if self._count is not None:
            for device_type in NVIDIA_DEVICE_TYPES:
                family.add_metric([self._node, self._driver, device_type], devices.get(device_type, 0))
        yield family


PREPARED = PreparedSeries(REGISTRY)


DEVICE_PLUGIN_REGISTRY = CollectorRegistry()

DP_REGISTRATIONS = Counter(
    "dra_gpu_deviceplugin_registrations",
    "Successful registrations with the kubelet, by resource (one more after each kubelet restart).",
    ["resource"],
    registry=DEVICE_PLUGIN_REGISTRY,
)
DP_ALLOCATIONS = Counter(
    "dra_gpu_deviceplugin_allocations",
    "Containers answered by Allocate, by resource and result.",
    ["resource", "result"],
    registry=DEVICE_PLUGIN_REGISTRY,
)
DP_DEVICES = Gauge(
    "dra_gpu_deviceplugin_devices",
    "Devices advertised to the kubelet, by resource and health.",
    ["resource", "health"],
    registry=DEVICE_PLUGIN_REGISTRY,
)
DP_UNWATCHED_GPUS = Gauge(
    "dra_gpu_deviceplugin_unwatched_gpus",
    "GPUs whose XID errors NVML cannot watch: their devices are sent Healthy, unknowingly.",
    registry=DEVICE_PLUGIN_REGISTRY,
)


LABELLER_REGISTRY = CollectorRegistry()

LABEL_WRITES = Counter(
    "dra_gpu_node_label_writes",
    "Patches of the Node's labels (only made when a label changed).",
    registry=LABELLER_REGISTRY,
)
LABEL_ERRORS = Counter(
    "dra_gpu_node_label_errors", "Failed reads or patches of the Node's labels.", registry=LABELLER_REGISTRY
)
LABELLER_UNWATCHED_GPUS = Gauge(
    "dra_gpu_labeller_unwatched_gpus",
    "GPUs whose XID errors NVML cannot watch: the labels count them as healthy, unknowingly.",
    registry=LABELLER_REGISTRY,
)


class _QuietHandler(WSGIRequestHandler):
    # A client that connects and sends nothing is dropped instead of holding a thread forever.
    timeout = 10

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http: " + format, *args)


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request: a slow or idle client never delays the kubelet's probes."""

    daemon_threads = True


def serve(
    address: str,
    ready: Callable[[], bool],
    alive: Callable[[], bool] = lambda: True,
    registry: CollectorRegistry = REGISTRY,
) -> WSGIServer:
    """Serve /metrics, /healthz and /readyz on host:port in a daemon thread; return the server.

    /healthz answers 503 once `alive` says the event loop stopped beating, so the kubelet
    restarts a wedged daemon. Raises OSError when the address cannot be bound.
    """
    host, _, port = address.rpartition(":")
    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path == "/healthz":
            ok = alive()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"event loop stalled\n"]
        if path == "/readyz":
            ok = ready()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ready\n" if ok else b"not ready\n"]
        response: Iterable[bytes] = metrics_app(environ, start_response)
        return response

    server = make_server(
        host or "0.0.0.0", int(port), app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server


WEBHOOK_REGISTRY = CollectorRegistry()

WEBHOOK_REVIEWS = Counter(
    "dra_gpu_webhook_reviews",
    "AdmissionReviews answered, by object kind and result (allowed, denied, error: not a review).",
    ["kind", "result"],
    registry=WEBHOOK_REGISTRY,
)
WEBHOOK_REVIEW_SECONDS = Histogram(
    "dra_gpu_webhook_review_seconds",
    "Time to answer one AdmissionReview, from the request read to the response built.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
    registry=WEBHOOK_REGISTRY,
)
WEBHOOK_CERT_RELOADS = Counter(
    "dra_gpu_webhook_certificate_reloads",
    "Serving certificate reloads after its files changed, by result (a failed one keeps the old).",
    ["result"],
    registry=WEBHOOK_REGISTRY,
)

#: Every program's version as a series of its own, as Prometheus' components publish theirs
#: (prometheus_build_info): NVIDIA's gpu-kubelet-plugin serves none, and Kubernetes' own
#: kubernetes_build_info describes the Kubernetes libraries a Go binary was built with, so the name
#: is ours. A fleet mid-upgrade shows as two values of the label.
BUILD_INFO = "dra_gpu_build_info"


def _publish_build_info(registry: CollectorRegistry) -> None:
    info = Gauge(BUILD_INFO, "The running dra-gpu's version; always 1.", ["version"], registry=registry)
    info.labels(__version__).set(1)


for _registry in (REGISTRY, DEVICE_PLUGIN_REGISTRY, LABELLER_REGISTRY, WEBHOOK_REGISTRY):
    _publish_build_info(_registry)
