"""Benchmark: the local cluster on the fake CRI runtime against containerd and runc, the figures
of "Runtimes" in docs/testing.md.

    PYTHONPATH=deploy/local .venv/bin/python -m tests.bench.bench_runtimes [--runs 3] [--pods 5]

Per runtime: cluster start until the node is Ready (binaries and images already cached),
then, with the kubelet plugin on fake GPUs (h100x8-mig), the start latency of pods with a
one-GPU claim (create to Running, one after another) and of pods without a claim. On
containerd the pods are the observed busybox pods of the e2e tests (localcluster.workloads);
on the fake runtime the usual pause-image pods. Prints the median and range; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from localcluster.cluster import LocalCluster
from localcluster.driverprocess import DriverProcess
from localcluster.kube import Kube
from localcluster.workloads import claim_template, committed_device_classes, ensure_device_classes, observed

PROFILE = "h100x8-mig"


def _pod(name: str, claim: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
    }
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": spec,
    }


def _measure(runtime: str, pods: int) -> tuple[float, list[float], list[float]]:
    cluster = LocalCluster(runtime=runtime)
    started = time.monotonic()
    info = cluster.start(timeout=180)
    up = time.monotonic() - started
    claimed: list[float] = []
    plain: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        driver = DriverProcess(info, PROFILE, Path(tmp) / "driver.log").start()
        kube = Kube(info.kubeconfig)
        try:
            ensure_device_classes(kube, committed_device_classes())
            claim_template(kube, "default", "one-gpu")
            for index in range(pods):
                for claim, into in ((True, claimed), (False, plain)):
                    name = f"{'gpu' if claim else 'cpu'}-{index}"
                    pod = _pod(name, claim)
                    t0 = time.monotonic()
                    kube.create(observed(info, pod) if runtime == "containerd" else pod)
                    kube.wait_pod_phase(name, "default", timeout=120)
                    into.append(time.monotonic() - t0)
                    # One GPU-claiming pod at a time: free its GPU for the next.
                    kube.delete("v1", "Pod", name, "default", grace_period=0)
        finally:
            kube.close()
            driver.stop()
            cluster.stop()
    return up, claimed, plain


def _show(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"median {statistics.median(values):5.2f}s (min {low:5.2f}, max {high:5.2f}, n={len(values)})"


def main() -> None:
    """Print the figures of each runtime."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3, help="cluster starts per runtime")
    parser.add_argument("--pods", type=int, default=5, help="pods of each kind per cluster start")
    args = parser.parse_args()
    for runtime in ("fake", "containerd"):
        ups: list[float] = []
        claimed: list[float] = []
        plain: list[float] = []
        for _ in range(args.runs):
            up, with_claim, without = _measure(runtime, args.pods)
            ups.append(up)
            claimed += with_claim
            plain += without
        print(f"{runtime}:")
        print(f"  cluster start to node Ready    {_show(ups)}")
        print(f"  pod with a GPU claim, to Running {_show(claimed)}")
        print(f"  pod without a claim, to Running  {_show(plain)}", flush=True)


if __name__ == "__main__":
    main()
