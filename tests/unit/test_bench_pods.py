"""The pod benchmark's pure parts: the kubelet's metrics and log read into stages, and the report."""

from __future__ import annotations

from datetime import datetime

from localcluster.kubereleases import api_limit_flags, kubelet_api_limit

from tests.bench.bench_pods import (
    DEVICE_PLUGIN,
    DRA_GPU,
    GO,
    NVIDIA,
    Route,
    _claim_pod,
    _limits_pod,
    report,
)
from tests.bench.podphases import (
    DRA_GPU_PREPARE,
    NVIDIA_PREPARE,
    UNPREPARE,
    histograms,
    kubelet_log_stages,
    phases,
)

DRA = "dra_grpc_operations_duration_seconds"
ALLOC = "kubelet_device_plugin_alloc_duration_seconds"


def _series(metric: str, labels: str, seconds: float, calls: int) -> str:
    # As the kubelet of v1.34 writes a histogram on /metrics (labels sorted), buckets left out.
    return f"{metric}_sum{{{labels}}} {seconds}\n{metric}_count{{{labels}}} {calls}\n"


def _grpc(driver: str, method: str) -> str:
    return f'driver_name="{driver}",grpc_status_code="OK",method_name="/v1.DRAPlugin/{method}"'


METRICS = (
    f"# TYPE {DRA} histogram\n"
    + _series(DRA, _grpc("gpu.nvidia.com", "NodePrepareResources"), 0.5, 10)
    + _series(DRA, _grpc("gpu.nvidia.com", "NodeUnprepareResources"), 9, 9)
    + _series(DRA, _grpc("test-driver.cdi.k8s.io", "NodePrepareResources"), 0.1, 4)
    + _series(ALLOC, 'resource_name="nvidia.com/gpu"', 0.02, 4)
    + f'{ALLOC}_bucket{{resource_name="nvidia.com/gpu",le="0.005"}} 4\n'
)


def test_the_kubelets_prepare_and_allocate_times_are_read_per_driver() -> None:
    assert histograms(METRICS) == {
        (DRA, "NodePrepareResources", "gpu.nvidia.com"): (0.5, 10.0),
        (DRA, "NodePrepareResources", "test-driver.cdi.k8s.io"): (0.1, 4.0),
        (ALLOC, "nvidia.com/gpu", ""): (0.02, 4.0),
    }


def test_the_kubelets_unprepare_calls_are_counted_apart_per_driver() -> None:
    # A sample waits for them: they are not part of a pod's start, so the report leaves them out.
    assert histograms(METRICS, UNPREPARE) == {(DRA, "NodeUnprepareResources", "gpu.nvidia.com"): (9.0, 9.0)}


# klog lines of the kubelet at --v=2 (kubelet.go's sync loop), for two pods.
SYNC, PLEG = '8770 kubelet.go:2520] "SyncLoop', '8770 kubelet.go:2600] "SyncLoop (PLEG): event for pod"'
STARTED = 'event={"ID":"u","Type":"ContainerStarted","Data":"s"}'
KUBELET_LOG = f"""\
I1126 11:17:28.002108 {SYNC} ADD" source="api" pods=["ns/dra-gpu-1","ns/dra-gpu-2"]
I1126 11:17:28.500000 {SYNC} ADD" source="api" pods=["ns/dra-gpu-1"]
I1126 11:17:29.250000 {PLEG} pod="ns/dra-gpu-1" {STARTED}
I1126 11:17:29.300000 {PLEG} pod="ns/dra-gpu-1" {STARTED}
I1126 11:17:29.400000 {SYNC} DELETE" source="api" pods=["ns/dra-gpu-2"]
"""


def test_the_kubelets_log_gives_each_pods_first_sync_and_first_lifecycle_event() -> None:
    def at(text: str) -> float:
        return datetime.strptime(f"2026{text}", "%Y%m%d %H:%M:%S.%f").timestamp()

    assert kubelet_log_stages(KUBELET_LOG, 2026) == {
        ("dra-gpu-1", "kubelet sync"): at("1126 11:17:28.002108"),
        ("dra-gpu-2", "kubelet sync"): at("1126 11:17:28.002108"),
        ("dra-gpu-1", "started (PLEG)"): at("1126 11:17:29.250000"),
    }


# The steps podphases.KUBELET_LOGGING adds, as v1.34.12's kubelet logs them (one pod, endpoint shortened).
CLAIM = "9fc8938a-ea54-4660-a263-ae226f4c7788"
RPC = 'driverName="gpu.nvidia.com" endpoint="/k/plugins/gpu.nvidia.com/dra.sock"'
STEPS_LOG = f"""\
I1129 11:09:03.958821   32516 kubelet.go:2520] "SyncLoop ADD" source="api" pods=["ns/dra-gpu-0"]
I1129 11:09:04.261482   32516 kuberuntime_manager.go:1290] "Creating PodSandbox for pod" pod="ns/dra-gpu-0"
I1129 11:09:04.264356   32516 dra_plugin.go:144] "Calling NodePrepareResources rpc" {RPC} \
request="&NodePrepareResourcesRequest{{Claims:[]*Claim{{&Claim{{Namespace:ns,UID:{CLAIM},Name:dra-gpu-0-gpu-q5ssf,}},}},}}"
I1129 11:09:04.285741   32516 dra_plugin.go:163] "Done calling NodePrepareResources rpc" {RPC} \
response="&NodePrepareResourcesResponse{{Claims:map[string]*NodePrepareResourceResponse{{{CLAIM}: \
&NodePrepareResourceResponse{{Devices:[]*Device{{&Device{{RequestNames:[gpu],PoolName:gpu-node-1,DeviceName:gpu-0,\
CDIDeviceIDs:[k8s.gpu.nvidia.com/claim={CLAIM}-gpu-0],}},}},Error:,}},}},}}" err=null
I1129 11:09:04.289439   32516 kuberuntime_manager.go:1361] "Created PodSandbox for pod" \
podSandboxID="dra-gpu-0_ns_2e5c98f1-3f85-4ec3-b5ac-50f88a14a7ba_0" pod="ns/dra-gpu-0"
I1129 11:09:04.290217   32516 kuberuntime_manager.go:1434] "Creating container in pod" \
containerType="container" container="main" pod="ns/dra-gpu-0"
I1129 11:09:04.672605   32516 kubelet.go:2551] "SyncLoop (PLEG): event for pod" pod="ns/dra-gpu-0" {STARTED}
"""


def test_the_kubelets_log_gives_each_step_of_a_pods_start_and_maps_claims_to_pods() -> None:
    stages = kubelet_log_stages(STEPS_LOG, 2026, {CLAIM: "dra-gpu-0"})
    milestones = {
        stage: round((at - stages["dra-gpu-0", "kubelet sync"]) * 1000, 3)
        for (_, stage), at in stages.items()
    }
    assert milestones == {
        "kubelet sync": 0.0,
        "sandbox start": 302.661,
        "prepare called": 305.535,
        "prepared": 326.92,
        "sandbox created": 330.618,
        "container creating": 331.396,
        "started (PLEG)": 713.784,
    }
    # Without the claim's pod, the prepare calls are nobody's.
    assert ("dra-gpu-0", "prepared") not in kubelet_log_stages(STEPS_LOG, 2026, {})


def test_a_klog_value_written_over_several_lines_is_read_whole() -> None:
    text = (
        f'I1129 11:09:04.264356   1 dra_plugin.go:144] "Calling NodePrepareResources rpc" request=<\n'
        f"\tclaims: {{uid: {CLAIM}}}\n >\n"
        'I1129 11:09:04.300000   1 kubelet.go:2520] "SyncLoop ADD" source="api" pods=["ns/other"]\n'
    )
    assert set(kubelet_log_stages(text, 2026, {CLAIM: "p"})) == {
        ("p", "prepare called"),
        ("other", "kubelet sync"),
    }


def test_each_phase_runs_from_the_milestone_before_it() -> None:
    # A device-plugin pod has no claim: its binding counts from its create.
    assert phases({"bound": 10.0, "kubelet sync": 12.0, "running": 900.0}) == {
        "bound": 10.0,
        "kubelet sync": 2.0,
        "running": 888.0,
        "total": 900.0,
    }


def test_v134s_successful_prepare_labelled_as_an_error_is_counted() -> None:
    # v1.34's kubelet passes err == nil as is_error; v1.37 err != nil: both mean a success here.
    text = _series(
        "dra_operations_duration_seconds", 'is_error="true",operation_name="PrepareResources"', 0.02, 2
    )
    assert histograms(text) == {("dra_operations_duration_seconds", "PrepareResources", ""): (0.02, 2.0)}


def test_pods_ask_for_a_gpu_by_claim_or_by_limit() -> None:
    claim = _claim_pod("p", "dra-gpu", "pause")["spec"]
    assert claim["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "dra-gpu"}]
    assert claim["containers"][0]["resources"] == {"claims": [{"name": "gpu"}]}
    limits = _limits_pod("p", "pause")["spec"]["containers"][0]["resources"]
    assert limits == {"limits": {"nvidia.com/gpu": "1"}}


def _pod(name: str) -> dict[str, object]:
    return _limits_pod(name, "pause")


def test_the_report_gives_dra_gpus_ratio_to_each_path_and_the_stages() -> None:
    routes = [Route(DRA_GPU, _pod), Route(DEVICE_PLUGIN, _pod), Route(GO, _pod)]
    for route, ms in zip(routes, (800.0, 400.0, 1000.0), strict=True):
        route.samples = {"1 pod": [ms], "2 pods": [ms, 2 * ms]}
        route.pods["1 pod"]["p"] = {"bound": ms / 2, "running": ms}
    routes[0].calls["1 pod"]["NodePrepareResources (its metric), gpu.nvidia.com"] = [15.0, 5.0]
    lines = report(routes, 2)
    assert lines[0] == (
        "1 pod p50: dra-gpu 800 ms, device plugin 400 ms, go driver 1000 ms, ratio dra/dp 2.00x, dra/go 0.80x"
    )
    assert lines[3].startswith("2 pods p99: dra-gpu 1600 ms, device plugin 800 ms, go driver 2000 ms,")
    table = lines[lines.index("where the time goes, 1 pod (the kubelet's metrics: the pod's own):") + 1 :]
    assert table[0].endswith("p50 / p99) | dra-gpu | device plugin | go driver |")
    assert "| pod bound (scheduler) | 400.0 / 400.0 | 200.0 / 200.0 | 500.0 / 500.0 |" in table
    assert "| status written, seen Running | 400.0 / 400.0 | 200.0 / 200.0 | 500.0 / 500.0 |" in table
    assert "| NodePrepareResources (its metric), gpu.nvidia.com | 5.0 / 15.0 | - | - |" in table


def test_the_report_gives_dra_gpus_ratio_to_nvidias_driver_too() -> None:
    routes = [Route(DRA_GPU, _pod), Route(DEVICE_PLUGIN, _pod), Route(NVIDIA, _pod)]
    for route, ms in zip(routes, (800.0, 400.0, 1600.0), strict=True):
        route.samples = {"1 pod": [ms]}
    assert report(routes, 2)[0] == (
        "1 pod p50: dra-gpu 800 ms, device plugin 400 ms, nvidia 1600 ms, "
        "ratio dra/dp 2.00x, dra/nvidia 0.50x"
    )


def test_a_control_plane_components_api_limit_is_raised_only_when_asked() -> None:
    assert api_limit_flags(0) == ()
    assert api_limit_flags(100) == ("--kube-api-qps=100", "--kube-api-burst=200")


def test_the_kubelets_api_limit_is_raised_only_when_asked() -> None:
    assert kubelet_api_limit(0) == {}
    assert kubelet_api_limit(300) == {"kubeAPIQPS": 300, "kubeAPIBurst": 600}


def test_each_drivers_own_prepare_time_is_read_from_its_page() -> None:
    page = _series("dra_gpu_node_prepare_seconds", 'result="success"', 0.012, 3) + _series(
        "dra_gpu_node_prepare_seconds", 'result="error"', 5, 1
    )
    theirs = "nvidia_dra_request_duration_seconds"
    nvidia = _series(theirs, 'driver="gpu.nvidia.com",operation="prepare"', 0.3, 2)
    ours = {("dra_gpu_node_prepare_seconds", "success", ""): (0.012, 3.0)}
    assert histograms(page, DRA_GPU_PREPARE) == ours
    assert histograms(page + nvidia, NVIDIA_PREPARE) == {(theirs, "prepare", ""): (0.3, 2.0)}
