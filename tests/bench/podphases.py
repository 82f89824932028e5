"""Where a pod's start goes, phase by phase: the kubelet's log and metrics read for bench_pods.

The kubelet is told to log a few more of its steps (`KUBELET_LOGGING`: two files at -v=4 through its
configuration's vmodule, the rest at --v=2), each stamped by its clock with microseconds:

- kubelet.go (-v=2): "SyncLoop ADD", the pod reaches its sync loop; "SyncLoop (PLEG): event for pod",
  its first lifecycle event, found by relisting the runtime once a second;
- kuberuntime_manager.go (-v=4): "Creating PodSandbox for pod" (SyncPod starts the sandbox: DRA's
  prepare runs first, inside it), "Created PodSandbox for pod" (RunPodSandbox answered),
  "Creating container in pod" (then CreateContainer and StartContainer);
- dra_plugin.go (-v=4): "Calling NodePrepareResources rpc" and "Done calling NodePrepareResources rpc",
  around the gRPC call to the driver; they name claims by UID, which the benchmark's claim watch
  maps to pods.

Those lines are the same in v1.34 and v1.37. The kubelet's metrics add what its log does not time:
the runtime's calls (kubelet_runtime_operations_duration_seconds), its whole PrepareResources step
(dra_operations_duration_seconds: the claim GET, the gRPC call, its checkpoint) and each DRA call
(dra_grpc_operations_duration_seconds). They are histograms whose buckets are far too coarse
(DRA's start at 0.1 s), so a sample reads their sum and count before and after: for one pod that is
the pod's own figure, for a burst the mean per call.
"""

from __future__ import annotations

import re
import ssl
import urllib.request
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path

import yaml
from localcluster.clusterinfo import ClusterInfo

from tests.bench.bench_driver import _percentile

GPU = "nvidia.com/gpu"
#: KubeletConfiguration fields that log the steps above (its --v=2 flag leaves vmodule alone).
KUBELET_LOGGING = {
    "logging": {
        "vmodule": [
            {"filePattern": "dra_plugin", "verbosity": 4},
            {"filePattern": "kuberuntime_manager", "verbosity": 4},
        ]
    }
}
#: A pod's milestones in order, as the watches (client clock) and the kubelet's log (its clock) see
#: them; each phase of the table is the time from the pod's previous milestone to this one.
STAGES = (
    "claim created",
    "claim allocated",
    "bound",
    "kubelet sync",
    "sandbox start",
    "prepare called",
    "prepared",
    "sandbox created",
    "container creating",
    "started (PLEG)",
    "running",
)
#: What happens before each milestone, as the table's rows read.
PHASE_NAMES = {
    "claim created": "claim created (controller manager)",
    "claim allocated": "claim allocated (scheduler)",
    "bound": "pod bound (scheduler)",
    "kubelet sync": "kubelet sync loop has it",
    "sandbox start": "pod worker: volumes mounted (polled every 300 ms)",
    "prepare called": "kubelet before its prepare call (claim GET)",
    "prepared": "NodePrepareResources (the driver, kubelet's clock)",
    "sandbox created": "checkpoint + RunPodSandbox (runtime)",
    "container creating": "to the container's create",
    "started (PLEG)": "create + start container, PLEG relist",
    "running": "status written, seen Running",
}
#: klog's header (severity, date, time, pid, file:line) and the message, quoted.
KLOG_LINE = re.compile(r'^I(\d{4} \d\d:\d\d:\d\d\.\d{6})\s+\d+ [\w.]+:\d+\] "([^"]*)"(.*)$')
#: Message -> milestone. The kuberuntime lines name one pod (pod="ns/name"); the sync loop's ADD a
#: list of them; the PLEG line one pod, then its event.
MESSAGES = {
    "SyncLoop ADD": "kubelet sync",
    "SyncLoop (PLEG): event for pod": "started (PLEG)",
    "Creating PodSandbox for pod": "sandbox start",
    "Created PodSandbox for pod": "sandbox created",
    "Creating container in pod": "container creating",
    "Calling NodePrepareResources rpc": "prepare called",
    "Done calling NodePrepareResources rpc": "prepared",
}
POD_REF = re.compile(r'"[^"/ ]+/([^"/ ]+)"')
UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

#: Kubelet histograms read around each sample: (metric, the label value that picks the series).
#: Unprepare is left out: it runs after a sample's pods are gone.
KUBELET_METRICS = (
    ("dra_grpc_operations_duration_seconds", "NodePrepareResources"),
    ("dra_operations_duration_seconds", "PrepareResources"),
    ("kubelet_device_plugin_alloc_duration_seconds", GPU),
    ("kubelet_runtime_operations_duration_seconds", "run_podsandbox"),
    ("kubelet_runtime_operations_duration_seconds", "create_container"),
    ("kubelet_runtime_operations_duration_seconds", "start_container"),
)
#: The drivers' own time per claim prepare, from their /metrics pages. dra-gpu's spans its whole
#: handler (the claim GET, the prepare, the status hand-off); NVIDIA's its prepare after its framework
#: has read the claim and it holds its node lock. The kubelet's gRPC time less this one is the
#: call's transport, the server's hand-off to its handler, and (NVIDIA's) the claim GET.
DRA_GPU_PREPARE = (("dra_gpu_node_prepare_seconds", "success"),)
NVIDIA_PREPARE = (("nvidia_dra_request_duration_seconds", "prepare"),)
#: The kubelet's unprepare calls, counted to know when a sample's claims are released.
UNPREPARE = (("dra_grpc_operations_duration_seconds", "NodeUnprepareResources"),)
#: How each series reads in the report.
METRIC_NAMES = {
    "dra_grpc_operations_duration_seconds": "NodePrepareResources (its metric)",
    "dra_operations_duration_seconds": "kubelet's PrepareResources (its metric)",
    "kubelet_device_plugin_alloc_duration_seconds": "device plugin Allocate (its metric)",
    "kubelet_runtime_operations_duration_seconds": "runtime",
    "dra_gpu_node_prepare_seconds": "dra-gpu's prepare handler (its metric)",
    "nvidia_dra_request_duration_seconds": "NVIDIA's prepare after its claim GET (its metric)",
}


def kubelet_histograms(
    cluster: ClusterInfo, metrics: tuple[tuple[str, str], ...] = KUBELET_METRICS
) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(metric, operation, driver or resource) -> (sum seconds, count) from the kubelet's /metrics.

    Read from the kubelet's own port with the API server's client certificate, at the node's
    address: a loopback one on the fake runtime, which the API server's node proxy refuses to dial,
    and the node's network namespace on containerd.
    """
    run = Path(cluster.run_dir)
    port = yaml.safe_load((run / "kubelet-config.yaml").read_text())["port"]
    context = ssl.create_default_context(cafile=str(run / "pki" / "ca.crt"))
    context.load_cert_chain(
        run / "pki" / "apiserver-kubelet-client.crt", run / "pki" / "apiserver-kubelet-client.key"
    )
    url = f"https://{cluster.node_ip}:{port}/metrics"
    with urllib.request.urlopen(url, context=context, timeout=10) as resp:
        return histograms(resp.read().decode(), metrics)


def histograms(
    text: str, metrics: tuple[tuple[str, str], ...] = KUBELET_METRICS
) -> dict[tuple[str, str, str], tuple[float, float]]:
    """`metrics` of a Prometheus text page: (metric, operation, driver) -> (sum, count).

    Failed calls are not told apart: v1.34's kubelet labels a successful PrepareResources
    is_error="true" (it passes err == nil; v1.37 passes err != nil), and the gRPC series count
    each status code apart, where a failure would show as calls beyond the pods.
    """
    totals: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    line_re = re.compile(r"^(\w+)_(sum|count)\{([^}]*)\} (\S+)$")
    for line in text.splitlines():
        match = line_re.match(line)
        if match is None:
            continue
        name, part, labels, value = match.groups()
        for metric, operation in metrics:
            if name != metric or (f'"{operation}"' not in labels and f'/{operation}"' not in labels):
                continue
            who = re.search(r'driver_name="([^"]*)"', labels)
            key = (metric, operation, who.group(1) if who else "")
            totals[key][0 if part == "sum" else 1] += float(value)
    return {k: (v[0], v[1]) for k, v in totals.items()}


def metric_name(key: tuple[str, str, str]) -> str:
    """How a kubelet series reads in the report: the runtime's by its call, DRA's by its driver."""
    metric, operation, driver = key
    if metric == "kubelet_runtime_operations_duration_seconds":
        return f"runtime {operation} (its metric)"
    name = METRIC_NAMES[metric]
    return f"{name}, {driver}" if driver else name


def kubelet_log_stages(
    text: str, year: int, claims: Mapping[str, str] | None = None
) -> dict[tuple[str, str], float]:
    """(pod name, milestone) -> the first time (epoch seconds) the kubelet's log shows the pod there.

    klog stamps carry no year: `year` gives it. `claims` maps a claim's UID to its pod, for the
    prepare calls, which name claims; a value that spans lines (klog writes it as `key=<` and
    indented lines) is read whole.
    """
    first: dict[tuple[str, str], float] = {}
    entries: list[list[str]] = []
    for line in text.splitlines():
        if KLOG_LINE.match(line):
            entries.append([line])
        elif entries and not line[:1].isalpha():
            entries[-1].append(line)
    for entry in entries:
        match = KLOG_LINE.match(entry[0])
        assert match is not None
        stamp, message, rest = match.groups()
        stage = MESSAGES.get(message)
        if stage is None:
            continue
        wall = datetime.strptime(f"{year}{stamp}", "%Y%m%d %H:%M:%S.%f").timestamp()
        if stage in ("prepare called", "prepared"):
            body = "\n".join([rest, *entry[1:]])
            pods = [(claims or {})[uid] for uid in UID.findall(body) if uid in (claims or {})]
        else:
            # A PLEG line names one pod, then its event (whose fields are quoted too).
            pods = POD_REF.findall(rest.split(" event=")[0])
        for pod in pods:
            first.setdefault((pod, stage), wall)
    return first


def phases(at: Mapping[str, float]) -> dict[str, float]:
    """One pod's milestones (ms from its create) -> each phase's ms, from the milestone before it."""
    out: dict[str, float] = {}
    before = 0.0
    for stage in STAGES:
        if stage in at:
            out[stage] = at[stage] - before
            before = at[stage]
    if "running" in at:
        out["total"] = at["running"]
    return out


def _cell(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return f"{_percentile(list(values), 50):.1f} / {_percentile(list(values), 99):.1f}"


def phase_table(
    labels: Sequence[str],
    pods: Mapping[str, Sequence[Mapping[str, float]]],
    calls: Mapping[str, Mapping[str, Sequence[float]]],
) -> list[str]:
    """A markdown table: each phase's p50 / p99 (ms) per path, then the kubelet's metrics per call.

    `pods`: path -> each pod's milestones (ms from create); `calls`: path -> series -> ms per call,
    one value a sample (a single pod's own, a burst's mean).
    """
    per_path = {label: [phases(at) for at in pods.get(label, [])] for label in labels}
    lines = [
        "| phase (ms from the milestone before; p50 / p99) | " + " | ".join(labels) + " |",
        "|---" * (len(labels) + 1) + "|",
    ]
    for stage in (*STAGES, "total"):
        cells = [_cell([p[stage] for p in per_path[label] if stage in p]) for label in labels]
        if any(cell != "-" for cell in cells):
            lines.append(f"| {PHASE_NAMES.get(stage, stage)} | " + " | ".join(cells) + " |")
    series = sorted({name for label in labels for name in calls.get(label, {})})
    for name in series:
        cells = [_cell(calls.get(label, {}).get(name, [])) for label in labels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
