"""make demo: the driver on fake GPUs serving pods on a real local cluster.

Starts the local Kubernetes cluster, runs `dra-gpu kubelet-plugin` on the fake
profile h100x8-mig (DEMO_PROFILE overrides), applies the DeviceClasses and the
workloads of docs/examples/demo.yaml, and prints, for each container, the
devices of the claims (or requests) it references and the devices it sees as
the container runtime resolved them from the driver's CDI specs; the exit
status says whether every container saw exactly its own. On the fake runtime
(the default) that is what the runtime recorded; with CONTAINER_RUNTIME=containerd
the pods are real containers of a busybox image that run `nvidia-smi -L`,
`ls /dev/nvidia*` and `env` themselves, and the table shows what they printed. With
DEMO_INSTALL=helm (containerd only) the driver is not a process of the machine but the chart's
DaemonSet, installed with helm as an admin installs it, from the image localcluster.driverimage
builds (localcluster.release): the chart's fake GPUs have no device nodes, so what a container
sees is the devices its CDI environment names (DRA_GPU_<DEVICE>_NAME). DEMO_DRIVER=nvidia runs
NVIDIA's DRA driver instead (localcluster.nvidiadriver: its kubelet plugin and DeviceClasses, over
the fake NVML of a fake node with the profile's GPUs), serving the same pods; what a container sees
is then read from the device nodes the runtime gave it. With DEMO_KEEP=1
everything stays up until Ctrl-C (or SIGTERM, or SIGHUP: a closed terminal),
for exploring with kubectl. Whatever ends it, it stops everything it started;
if it is killed outright, `make cluster-down` does (the cluster lives in
localcluster.clusterinfo.demo_dir()).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from pathlib import Path

from fakenvml.node import FakeNode

from localcluster import release
from localcluster.binaries import ensure_binary
from localcluster.chart import HelmError
from localcluster.cluster import LocalCluster
from localcluster.clusterinfo import ClusterError, ClusterInfo, demo_dir
from localcluster.driverimage import driver_image
from localcluster.driverprocess import DaemonProcess, DriverProcess
from localcluster.gomodule import BuildError
from localcluster.kube import Kube, Obj, WaitTimeoutError, load_manifests
from localcluster.nvidiadriver import NvidiaDriverProcess, device_classes
from localcluster.processes import Stopped, stop_on_signals, stop_run_dir
from localcluster.workloads import (
    allocated_devices,
    committed_device_classes,
    container_record,
    ensure_device_classes,
    observed,
    pod_claims,
    seen,
    visible_devices,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples" / "demo.yaml"


def _say(text: str) -> None:
    # A closed terminal must not keep the demo from cleaning up.
    with contextlib.suppress(OSError):
        print(text, flush=True)


def _container_row(
    kube: Kube, info: ClusterInfo, pod: str, container: Obj, uuids: dict[str, str]
) -> list[str]:
    """The table's line: what the container's claims (or requests) got, and what it sees; then the MIG
    devices dynamic MIG made for it, with their UUIDs (the offers it was allocated have none)."""
    refs = container.get("resources", {}).get("claims", [])
    claims = pod_claims(kube, "default", pod) if refs else {}
    got = sorted({d for ref in refs for d in allocated_devices(claims[ref["name"]], ref.get("request"))})
    record = container_record(info, "default", pod, container["name"])
    sees = visible_devices(record, uuids)
    mark = "" if sees == got else "!"
    visible = record["env"].get("NVIDIA_VISIBLE_DEVICES", "(not set)")
    label = f"{mark}{pod}/{container['name']}"
    env = record["env"]
    made = [
        f"    made for it: {name} = {env.get(key.removesuffix('_NAME') + '_UUID', '?')}"
        for key, name in sorted(env.items())
        if key.startswith("DRA_GPU_") and key.endswith("_NAME") and name in got and name not in uuids
    ]
    return [f"{label:<16} {', '.join(got) or '-':<38} {', '.join(sees) or '-':<38} {visible}", *made]


def _node_row(
    kube: Kube, info: ClusterInfo, node: FakeNode, pod: str, container: Obj, devices: dict[str, Obj]
) -> list[str]:
    """The table's line for any driver on a fake node: what the claims got and the devices whose nodes the
    container has. A MIG device made at prepare has no UUID in the slices: it is the allocated offer of
    its GPU and profile."""
    refs = container.get("resources", {}).get("claims", [])
    claims = pod_claims(kube, "default", pod) if refs else {}
    got = sorted({d for ref in refs for d in allocated_devices(claims[ref["name"]], ref.get("request"))})
    record = container_record(info, "default", pod, container["name"])
    by_uuid = {
        d["attributes"]["uuid"]["string"]: name for name, d in devices.items() if "uuid" in d["attributes"]
    }

    def offer(parent: str | None, profile: str | None) -> str | None:
        return next(
            (
                name
                for name in got
                if "uuid" not in devices[name]["attributes"]
                and devices[name]["attributes"].get("parentUUID", {}).get("string") == parent
                and devices[name]["attributes"].get("profile", {}).get("string") == profile
            ),
            None,
        )

    sees = sorted(
        by_uuid.get(s.uuid) or offer(s.parent, s.profile) or s.uuid
        for s in node.devices_seen(n["path"] for n in record["deviceNodes"])
    )
    mark = "" if sees == got else "!"
    visible = record["env"].get("NVIDIA_VISIBLE_DEVICES", "(not set)")
    label = f"{mark}{pod}/{container['name']}"
    return [f"{label:<16} {', '.join(got) or '-':<38} {', '.join(sees) or '-':<38} {visible}"]


def _seen_rows(kube: Kube, info: ClusterInfo, pod: str, container: Obj, uuids: dict[str, str]) -> list[str]:
    """On a real runtime: the table line from what the container printed, and the prints."""
    refs = container.get("resources", {}).get("claims", [])
    claims = pod_claims(kube, "default", pod) if refs else {}
    got = sorted({d for ref in refs for d in allocated_devices(claims[ref["name"]], ref.get("request"))})
    saw = seen(info, "default", pod, container["name"])
    by_uuid = {uuid: name for name, uuid in uuids.items()}
    # A MIG device's parent GPU is listed too; it is no device of its own here.
    sees = sorted(by_uuid[u] for u in re.findall(r"\(UUID: (\S+)\)", "\n".join(saw.smi)) if u in by_uuid)
    mark = "" if sees == got else "!"
    visible = saw.env.get("NVIDIA_VISIBLE_DEVICES", "(not set)")
    label = f"{mark}{pod}/{container['name']}"
    claim_env = sorted(k for k in saw.env if k.startswith("DRA_GPU_CLAIM_"))
    return [
        f"{label:<16} {', '.join(got) or '-':<38} {', '.join(sees) or '-':<38} {visible}",
        *(f"    $ nvidia-smi -L   {line}" for line in saw.smi),
        f"    $ ls /dev/nvidia*  {' '.join(saw.dev) or '(none)'}",
        f"    $ env             NVIDIA_VISIBLE_DEVICES={visible}, {len(claim_env)} DRA_GPU_CLAIM_* set",
    ]


def _env_rows(kube: Kube, info: ClusterInfo, pod: str, container: Obj) -> list[str]:
    """With the chart's fake GPUs (no device nodes, no nvidia-smi): the devices the CDI environment names."""
    refs = container.get("resources", {}).get("claims", [])
    claims = pod_claims(kube, "default", pod) if refs else {}
    got = sorted({d for ref in refs for d in allocated_devices(claims[ref["name"]], ref.get("request"))})
    saw = seen(info, "default", pod, container["name"])
    names = {k: v for k, v in saw.env.items() if k.startswith("DRA_GPU_") and k.endswith("_NAME")}
    sees = sorted(names.values())
    mark = "" if sees == got else "!"
    visible = saw.env.get("NVIDIA_VISIBLE_DEVICES", "(not set)")
    label = f"{mark}{pod}/{container['name']}"
    return [
        f"{label:<16} {', '.join(got) or '-':<38} {', '.join(sees) or '-':<38} {visible}",
        *(f"    $ env             {key}={value}" for key, value in sorted(names.items())),
    ]


def _device_lines(devices: dict[str, Obj]) -> list[str]:
    """The published devices: one line each, but one line per GPU for its dynamic-MIG offers."""
    lines: list[str] = []
    offers: dict[str, dict[str, int]] = {}
    for name, device in devices.items():
        attrs = device["attributes"]
        kind = attrs["type"]["string"]
        detail = (attrs.get("profile") or attrs["productName"])["string"]
        if kind == "mig" and "uuid" not in attrs:
            by_profile = offers.setdefault(name.split("-mig-")[0], {})
            by_profile[detail] = by_profile.get(detail, 0) + 1
            continue
        lines.append(f"    {name:<24} {kind:<4} {detail:<24} memory {device['capacity']['memory']['value']}")
    for gpu, by_profile in offers.items():
        counts = ", ".join(f"{profile} x{n}" for profile, n in sorted(by_profile.items()))
        lines.append(f"    {gpu:<24} offers MIG devices, made per claim: {counts}")
    return lines


#: The device type each DeviceClass of the demo's claims selects.
CLASS_TYPES = {"gpu.nvidia.com": "gpu", "mig.nvidia.com": "mig"}


def _unserved(pod: Obj, workloads: list[Obj], types: set[str]) -> list[str]:
    """The device classes the pod's claims ask that no published device is of (empty: it can run)."""
    templates = {w["metadata"]["name"]: w for w in workloads if w["kind"] == "ResourceClaimTemplate"}
    classes = {
        request["exactly"]["deviceClassName"]
        for claim in pod["spec"].get("resourceClaims", [])
        for request in templates[claim["resourceClaimTemplateName"]]["spec"]["spec"]["devices"]["requests"]
    }
    return sorted(c for c in classes if CLASS_TYPES.get(c) not in types)


#: How the demo runs the driver (DEMO_INSTALL): a process of the machine, or the chart with helm.
INSTALLS = ("process", "helm")


def _install_chart(cluster: LocalCluster, info: ClusterInfo, profile: str) -> None:
    """Build (or reuse) the driver's image, import it, and helm install the chart as an admin would."""
    _say("building (or reusing) the driver's image from deploy/Dockerfile's recipe, without Docker ...")
    image = driver_image()
    cluster.import_image(image)
    _say(f"  {image.name}: {image.size / 2**20:.0f} MiB, imported into the node's containerd")
    values = release.node_values(info, image, profile)
    shown = " ".join(f"--set {k}={v}" for k, v in _flat(values))
    chart_args = f"{release.RELEASE} deploy/helm/dra-gpu -n {release.NAMESPACE} --create-namespace"
    _say(f"helm install {chart_args} {shown} --wait")
    began = time.monotonic()
    with release.chart_at(None) as chart_dir:
        release.Helm(info).install(chart_dir, values)
    seconds = time.monotonic() - began
    _say(f"  the DaemonSet's pod is ready (registered with the kubelet, slices published) in {seconds:.1f}s")


def _flat(values: dict[str, object], prefix: str = "") -> list[tuple[str, object]]:
    """Chart values as the `--set` pairs an admin would type."""
    pairs: list[tuple[str, object]] = []
    for key, value in values.items():
        if isinstance(value, dict):
            pairs += _flat(value, f"{prefix}{key}.")
        else:
            pairs.append((f"{prefix}{key}", str(value).lower() if isinstance(value, bool) else value))
    return pairs


def main() -> int:
    """Run the demo; the exit status says whether every pod got what it asked for."""
    try:
        with stop_on_signals():
            return _run()
    except Stopped as stop:
        return stop.exit_status
    except (BuildError, ClusterError, HelmError) as err:
        _say(f"error: {err}")
        return 1


def _run() -> int:
    profile = os.environ.get("DEMO_PROFILE", "h100x8-mig")
    keep = os.environ.get("DEMO_KEEP") == "1"
    install = os.environ.get("DEMO_INSTALL", "process")
    if install not in INSTALLS:
        raise ClusterError(f"DEMO_INSTALL={install}: expected one of {', '.join(INSTALLS)}")
    started = time.monotonic()
    run_dir = demo_dir()
    if stop_run_dir(run_dir):
        _say(f"stopped the previous demo's cluster in {run_dir}")
    run_dir.mkdir(parents=True)
    cluster = LocalCluster(run_dir=run_dir)
    real = cluster.runtime == "containerd"
    helm = install == "helm"
    if helm and not real:
        raise ClusterError(
            "DEMO_INSTALL=helm runs the chart's DaemonSet in real containers: CONTAINER_RUNTIME=containerd"
        )
    runtime = "containerd and runc (real containers)" if real else "the fake CRI runtime"
    _say(
        f"starting a local Kubernetes {cluster.version} cluster (etcd, API server, scheduler, "
        f"controller manager, kubelet) on {runtime} ..."
    )
    driver: DaemonProcess | None = None
    nvidia = os.environ.get("DEMO_DRIVER", "dra-gpu") == "nvidia"
    node: FakeNode | None = None
    try:
        info = cluster.start()
        _say(f"  node {info.node_name} Ready in {time.monotonic() - started:.1f}s")
        kube = Kube(info.kubeconfig)
        if nvidia:
            if real:
                raise ClusterError(
                    "DEMO_DRIVER=nvidia runs on the fake runtime only (CONTAINER_RUNTIME unset)"
                )
            log = Path(info.run_dir) / "logs" / "nvidia-gpu-kubelet-plugin.log"
            _say(f"starting NVIDIA's gpu-kubelet-plugin over the fake NVML of a fake node ({profile}) ...")
            node = FakeNode(run_dir / "fake-node", profile, info.node_name).build()
            nvidia_driver = NvidiaDriverProcess(info, node, log)
            driver = nvidia_driver
            driver.start(timeout=60, on_spawn=lambda pid: cluster.add_process("gpu-kubelet-plugin", pid))
            ensure_device_classes(kube, device_classes(nvidia_driver.rendered))
        elif helm:
            _install_chart(cluster, info, profile)
        else:
            log = Path(info.run_dir) / "logs" / "dra-gpu.log"
            _say(f"starting dra-gpu kubelet-plugin on fake GPUs ({profile}) ...")
            driver = DriverProcess(info, profile, log)
            driver.start(on_spawn=lambda pid: cluster.add_process("dra-gpu", pid))
            # The committed render, so that a first demo does not wait for helm to build.
            ensure_device_classes(kube, committed_device_classes())
        slices = kube.list_objects("resource.k8s.io/v1", "ResourceSlice")
        # From 1.35 counter sets are published in slices of their own, without devices.
        devices = {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}
        _say(f"  registered with the kubelet; published {len(devices)} devices in {len(slices)} slice(s)")
        for line in _device_lines(devices):
            _say(line)

        workloads = load_manifests(EXAMPLES.read_text())
        types = {d["attributes"]["type"]["string"] for d in devices.values()}
        for pod in [w for w in workloads if w["kind"] == "Pod"]:
            missing = _unserved(pod, workloads, types)
            if missing:
                workloads.remove(pod)
                name = pod["metadata"]["name"]
                _say(f"  leaving out pod {name}: {profile} has no device of class {', '.join(missing)}")
        if real:
            workloads = [observed(info, w) if w["kind"] == "Pod" else w for w in workloads]
        _say(f"applying docs/examples/demo.yaml{' (each container reports what it sees)' if real else ''}")
        kube.create_all(workloads, namespace="default")
        pods = [w for w in workloads if w["kind"] == "Pod"]
        # A dynamic-MIG offer has no UUID: the MIG device a claim gets is made at prepare.
        uuids = {
            name: d["attributes"]["uuid"]["string"]
            for name, d in devices.items()
            if "uuid" in d["attributes"]
        }
        failed = False
        _say("")
        _say(f"{'CONTAINER':<16} {'ITS CLAIMS GOT':<38} {'IT SEES':<38} NVIDIA_VISIBLE_DEVICES")
        for pod in pods:
            name = pod["metadata"]["name"]
            try:
                kube.wait_pod_phase(name, "default", timeout=60)
            except WaitTimeoutError as err:
                failed = True
                _say(f"{name:<16} did not start: {err}")
                continue
            for container in pod["spec"]["containers"]:
                if node is not None:
                    rows = _node_row(kube, info, node, name, container, devices)
                elif helm:
                    rows = _env_rows(kube, info, name, container)
                elif real:
                    rows = _seen_rows(kube, info, name, container, uuids)
                else:
                    rows = _container_row(kube, info, name, container, uuids)
                failed |= rows[0].startswith("!")
                for row in rows:
                    _say(row)
        _say("")
        if node is not None:
            _say(
                f"Runtime: {runtime}. IT SEES: the devices whose device nodes the container got from NVIDIA's"
            )
            _say("CDI spec (a GPU's /dev/nvidiaN, a MIG device's two nvidia-caps nodes).")
        elif helm:
            _say(
                f"Runtime: {runtime}; the driver: the chart's DaemonSet. IT SEES: the devices the container's"
            )
            _say("environment names (DRA_GPU_<DEVICE>_NAME, from its CDI spec; the chart's fake GPUs have no")
            _say("device nodes).")
        elif real:
            _say(f"Runtime: {runtime}. IT SEES: the devices whose UUID the container's own `nvidia-smi -L`")
            _say("listed (the fake driver's nvidia-smi, mounted by the CDI spec, lists the GPUs whose")
            _say("device nodes the container has).")
        else:
            _say(f"Runtime: {runtime}. IT SEES: the devices the container's CDI edits name, plus any that")
            _say("NVIDIA's runtime hook would add from NVIDIA_VISIBLE_DEVICES (none and void add no GPU).")
        _say("A leading ! marks a container that sees more or fewer devices than its claims got.")
        _say("")
        specs = len([p for p in Path(info.cdi_dir).iterdir() if p.suffix in (".json", ".yaml")])
        _say(f"CDI specs written by the driver: {specs} in {info.cdi_dir}")
        kube.close()
        if keep:
            # Stopping is how a kept demo ends, as soon as it says so: the exit status stays the pods'.
            with contextlib.suppress(Stopped):
                kubectl = f"{ensure_binary('kubectl')} --kubeconfig {info.kubeconfig}"
                _say(f"\nthe cluster stays up; try:\n  {kubectl} get pods,resourceclaims,resourceslices")
                if helm:
                    _say(f"driver log: {kubectl} -n {release.NAMESPACE} logs daemonset/{release.RELEASE}")
                else:
                    _say(f"driver log: {log}")
                _say("Ctrl-C (or SIGTERM, SIGHUP) to stop and clean up")
                while True:
                    time.sleep(3600)
        return 1 if failed else 0
    finally:
        if driver is not None:
            driver.stop()
        cluster.stop()
        _say("stopped the driver and the cluster; nothing is left behind")


if __name__ == "__main__":
    sys.exit(main())
